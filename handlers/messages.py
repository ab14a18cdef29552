"""Pasted logs: a message that carries a failure gets the diagnosis in its thread; chatter gets silence.
A mention (or a DM) always gets an answer, diagnosing the thread's parent and earlier replies."""
from __future__ import annotations

import html
import re

from slack_bolt.async_app import AsyncApp
from slack_sdk.web.async_client import AsyncWebClient

from bot.slack.replies import Deps, post_diagnosis
from handlers.files import diagnose_shared_files

_MENTION = re.compile(r"<@[A-Z0-9]+>")


def message_text(message: dict) -> str:
    """The message's text as the user pasted it (Slack escapes &, < and >)."""
    return html.unescape(_MENTION.sub("", message.get("text") or ""))


def _ignored(event: dict) -> bool:
    # Other bots (and ourselves: Bolt drops our own events too), edits, deletions, joins...
    return bool(event.get("bot_id") or event.get("subtype") or event.get("hidden"))


def register(app: AsyncApp, deps: Deps) -> None:
    @app.event({"type": "message", "subtype": None})
    async def on_message(event: dict, client: AsyncWebClient, context) -> None:
        if _ignored(event):
            return
        bot_user = context.get("bot_user_id")
        if bot_user and f"<@{bot_user}>" in (event.get("text") or ""):
            return  # the app_mention listener answers this one
        direct = event.get("channel_type") == "im"
        thread = event.get("thread_ts") or event["ts"]
        # An error here is retried by the delivery worker, which tells the user if it gives up.
        d = await deps.scans.text(message_text(event))
        if d.root is not None or direct:
            await post_diagnosis(deps, d, event["channel"], thread, source="slack-paste")

    @app.event("app_mention")
    async def on_mention(event: dict, client: AsyncWebClient, context) -> None:
        if event.get("bot_id"):
            return
        thread = event.get("thread_ts") or event["ts"]
        await answer_thread(client, deps, event["channel"], thread, event, context.get("bot_user_id"))


async def answer_thread(client: AsyncWebClient, deps: Deps, channel: str, thread: str, event: dict,
                        bot_user: str | None) -> None:
    """Diagnose the thread's parent, the replies before the mention, and files shared in them."""
    resp = await client.conversations_replies(channel=channel, ts=thread, limit=200)
    messages = [m for m in resp.get("messages", []) if float(m["ts"]) <= float(event["ts"])] or [event]
    texts, shared = [], []
    for m in messages:
        if m.get("bot_id") or (bot_user and m.get("user") == bot_user):
            continue  # our own earlier answers are not part of the log
        texts.append(message_text(m))
        shared += m.get("files") or []
    if shared:
        await diagnose_shared_files(client, deps, shared, channel, thread, extra_text="\n".join(texts))
        return
    d = await deps.scans.text("\n".join(texts), name="<thread>")
    await post_diagnosis(deps, d, channel, thread, source="slack-mention")
