"""App Home: open incidents, the last 7 days by failure, flaky hosts, unknown failures to learn from."""
from __future__ import annotations

from slack_bolt.async_app import AsyncApp
from slack_sdk.web.async_client import AsyncWebClient

from bot.history.queries import thread_link
from bot.slack import blocks
from bot.slack.replies import Deps

LISTED = 8


def _link(row: dict) -> str:
    label = f"#{row['id']} {row.get('entry') or 'unknown'}"
    if row.get("channel") and row.get("thread_ts"):
        return f"<{thread_link(row['channel'], row['thread_ts'])}|{label}>"
    return label


def _lines(rows: list[dict], empty: str) -> str:
    if not rows:
        return empty
    return "\n".join(f"• {_link(r)} · {r['at'][:16].replace('T', ' ')}" + (f" · {r['host']}" if r.get("host") else "")
                     for r in rows[:LISTED])


def _unknown(groups: list[dict]) -> str:
    """One line per distinct unknown failure: its latest thread, how often, what it was grouped by."""
    if not groups:
        return "None."
    lines = []
    for g in groups[:LISTED]:
        failure = blocks.escape(g["failure"][:90]).replace("`", "'")
        lines.append(f"• {_link(g)} · ×{g['count']} since {g['first_seen'][:10]} · `{failure}`")
    return "\n".join(lines)


def _undelivered(row: dict) -> str:
    what = f"#{row['incident']} {row.get('entry') or 'unknown'}" if row.get("incident") else "a message"
    return f"{what} in <#{row['channel']}>: {blocks.escape(row.get('error') or 'unknown error')}"


async def home_view(deps: Deps) -> dict:
    open_rows = await deps.history.call("list", status="open", limit=LISTED)
    stats = await deps.history.call("stats", 7)
    unknown = await deps.history.call("unknown_groups", status="open", limit=LISTED)
    undelivered = await deps.history.call("undelivered", LISTED)
    most = max((r["incidents"] for r in stats["by_entry"]), default=0)
    by_failure = "\n".join(f"`{blocks.bar(r['incidents'], most)}` {r['incidents']:>3}  {r['entry']}"
                           for r in stats["by_entry"][:15]) or "No incidents this week."
    flaky = "\n".join(f"• *{h['host']}*: {h['incidents']} hardware incidents ({', '.join(h['entries'])})\n   `{h['drain']}`"
                      for h in stats["flaky_hosts"][:LISTED]) or "None."
    body = [
        {"type": "header", "text": {"type": "plain_text", "text": "trainmedic"}},
        blocks.context_block(f"{stats['incidents']} incidents in the last 7 days"),
        {"type": "section", "text": {"type": "mrkdwn", "text": "*Open incidents*\n" + _lines(open_rows, "None open.")}},
        {"type": "divider"},
        {"type": "section", "text": {"type": "mrkdwn", "text": "*Last 7 days by failure*\n" + by_failure}},
        {"type": "divider"},
        {"type": "section", "text": {"type": "mrkdwn", "text": "*Flaky hosts*\n" + flaky}},
        {"type": "divider"},
        {"type": "section", "text": {"type": "mrkdwn",
                                     "text": "*Unknown failures waiting for a knowledge entry*\n" + _unknown(unknown)}},
    ]
    if undelivered:
        body += [{"type": "divider"},
                 {"type": "section", "text": {"type": "mrkdwn", "text": "*Replies that could not be delivered*\n" + "\n".join(
                     f"• {_undelivered(r)}" for r in undelivered)}}]
    for block in body:  # every section within Slack's limit
        if block["type"] == "section":
            block["text"]["text"] = block["text"]["text"][: blocks.SECTION_MAX]
    return {"type": "home", "blocks": body[: blocks.HOME_BLOCKS_MAX]}


def register(app: AsyncApp, deps: Deps) -> None:
    @app.event("app_home_opened")
    async def on_home(event: dict, client: AsyncWebClient) -> None:
        if event.get("tab", "home") != "home":
            return
        await client.views_publish(user_id=event["user"], view=await home_view(deps))
