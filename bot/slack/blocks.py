"""Diagnoses, entries and the App Home as Slack Block Kit, within Slack's limits.

Limits: section text 3000 characters, header 150, 50 blocks a message (100 in App Home). Text that
comes from a log is escaped (&, <, >) and broadcast mentions are defused, so no @channel, @here or
user mention can come out of a log into a reply; inside a code block its backticks are kept apart
by a word joiner, so a quoted ``` cannot end the block early.
"""
from __future__ import annotations

import re

from bot import render
from bot.engine.diagnose import Diagnosis, Finding
from bot.kb.load import Entry

SECTION_MAX = 3000
HEADER_MAX = 150
BLOCKS_MAX = 50
HOME_BLOCKS_MAX = 100
ACTION_RESOLVE, ACTION_WRONG, ACTION_ENTRY = "incident_resolve", "incident_wrong", "entry_show"
_BROADCAST = re.compile(r"@(channel|here|everyone)\b", re.I)
_JOINER = "\u2060"  # WORD JOINER: invisible, and it keeps two characters from touching
_TOUCHING_BACKTICK = re.compile(r"`(?=`)|^`|`$")


def escape(text: str) -> str:
    """Log text made inert for mrkdwn: no markup, no links, no mentions."""
    text = text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    return _BROADCAST.sub(lambda m: "@" + _JOINER + m.group(1), text)


def code_text(text: str) -> str:
    """Log text for the inside of a code block: escaped, and no backtick touches another one or
    the block's fences (a quoted ``` would otherwise close the block and spill the rest as text)."""
    return _TOUCHING_BACKTICK.sub(_JOINER + "`" + _JOINER, escape(text))


def _clip(text: str, limit: int) -> tuple[str, bool]:
    return (text, False) if len(text) <= limit else (text[: limit - 1] + "…", True)


def _section(text: str) -> tuple[dict, bool]:
    text, clipped = _clip(text, SECTION_MAX)
    return {"type": "section", "text": {"type": "mrkdwn", "text": text}}, clipped


def _code(lines: list[str], title: str) -> tuple[dict, bool]:
    """A section holding a code block; lines are dropped (and said so) to stay within the limit."""
    budget = SECTION_MAX - len(title) - 20
    kept, used = [], 0
    for line in lines:
        if used + len(line) + 1 > budget:
            break
        kept.append(line)
        used += len(line) + 1
    more = len(lines) - len(kept)
    body = "\n".join(kept) + (f"\n… {more} more line(s) in the full report" if more else "")
    return {"type": "section", "text": {"type": "mrkdwn", "text": f"{title}\n```{body}```"}}, bool(more)


def context_block(text: str) -> dict:
    return {"type": "context", "elements": [{"type": "mrkdwn", "text": _clip(text, SECTION_MAX)[0]}]}


def _evidence_line(hit, d: Diagnosis) -> str:
    where = []
    if hit.rank is not None:
        where.append(f"rank {hit.rank}")
    if hit.host:
        where.append(hit.host)
    loc = (f"{d.scan.files[hit.file]}:" if len(d.scan.files) > 1 else "") + f"{hit.line}"
    return code_text(f"{loc} {'[' + ', '.join(where) + '] ' if where else ''}{hit.text}")


def first_line(d: Diagnosis) -> str | None:
    """The log line the answer stands on (redacted, as scanned): the root's first root line, else
    the last exception, else the first error line."""
    if d.root is not None:
        start = ((d.initiating or {}).get("file"), (d.initiating or {}).get("line"))
        return next((h for h in d.root.hits if (h.file, h.line) == start), d.root.first).text
    if d.scan.last_exceptions:
        return d.scan.last_exceptions[-1].text
    return d.scan.first_errors[0].text if d.scan.first_errors else None


def _headline(line: str | None, verdict: str) -> dict:
    """The reply's first lines: the log line itself, then what it is, so a reader sees at a glance
    whether it is the same error as last time."""
    quoted = f"```{code_text(line)}```\n" if line else ""
    return _section(quoted + verdict)[0]


def _steps(f: Finding, d: Diagnosis) -> str:
    lines = [f"*Fix:* {escape(d.fill(f.entry.data['fix']['summary'], f))}"]
    for i, step in enumerate(d.steps(f), 1):
        line = f"{i}. {escape(step['text'])}"
        if step["command"]:
            line += f"\n      `{escape(step['command'])}`"
        if step["code"]:
            line += f"\n```{escape(step['code'].rstrip())}```"
        lines.append(line)
    return "\n".join(lines)


def _buttons(incident_id: int | None, entry_id: str | None) -> dict:
    value = str(incident_id or 0)
    elements = [
        {"type": "button", "action_id": ACTION_RESOLVE, "text": {"type": "plain_text", "text": "Resolved"},
         "style": "primary", "value": value},
        {"type": "button", "action_id": ACTION_WRONG, "text": {"type": "plain_text", "text": "Wrong diagnosis"},
         "value": value},
    ]
    if entry_id:
        elements.append({"type": "button", "action_id": ACTION_ENTRY,
                         "text": {"type": "plain_text", "text": "Show full entry"}, "value": entry_id})
    return {"type": "actions", "block_id": "incident_actions", "elements": elements}


def status_line(incident_row: dict | None) -> str | None:
    """How on-call closed the incident, for the edited reply."""
    if not incident_row or incident_row.get("status") == "open":
        return None
    if incident_row["status"] == "resolved":
        who = f" by <@{incident_row['resolved_by']}>" if incident_row.get("resolved_by") else ""
        return f":white_check_mark: Resolved{who}: {escape(incident_row.get('note') or '')}"
    return f":x: Marked wrong diagnosis; the right one is *{escape(incident_row.get('corrected_entry') or 'unknown')}*"


def with_status(message_blocks: list[dict], text: str, incident_row: dict) -> tuple[str, list[dict]]:
    """The reply's blocks showing the incident's current status, above the buttons (which come last)."""
    status = status_line(incident_row)
    kept = [b for b in message_blocks if b.get("block_id") != "incident_status"]
    if status:
        kept.insert(len(kept) - 1, {"type": "context", "block_id": "incident_status",
                                    "elements": [{"type": "mrkdwn", "text": status}]})
    return text, kept


def diagnosis_message(d: Diagnosis, incident: dict | None) -> tuple[str, list[dict], bool]:
    """(fallback text, blocks, whether something was cut so the full report should go as a file).

    The error comes first (the matched line, then the entry), the history of that error next, the
    explanation and the fix after them."""
    incident_id = incident["id"] if incident else None
    line = first_line(d)
    fallback = escape(f"{line[:200]}\n{render.verdict(d)}" if line else render.verdict(d))
    if d.root is None:
        blocks = [_headline(line, "*No known failure found*"), *_history(incident)]
        lines = [code_text(f"{m.line}: {m.text}") for m in d.likely_errors()]
        cut = False
        if len(lines) > 1:
            block, cut = _code(lines, "*Most likely error lines*")
            blocks.append(block)
        blocks.append(context_block(f"Scanned {d.scan.lines:,} lines. Kept as an unknown incident for the knowledge base."))
    else:
        f = d.root
        blocks = [_headline(line, f"*{f.entry.id}* · {escape(render.verdict(d))}"), *_history(incident),
                  _section(escape(" ".join(f.entry.data["summary"].split())))[0]]
        one_per_line = {(h.file, h.line): h for h in f.hits}.values()  # two fingerprints may match one line
        block, cut = _code([_evidence_line(h, d) for h in one_per_line], "*Evidence*")
        blocks.append(block)
        started = render.where(d)
        context = [escape(x) for x in (started and f"Started at {started}", render.progress(d)) if x]
        if context:
            blocks.append(context_block(" · ".join(context)))
        collateral = [x for x in d.findings[1:] if x.role == "collateral"]
        if collateral:
            names = ", ".join(f"{x.entry.id} ({len(x.ranks)} ranks)" if len(x.ranks) > 1 else x.entry.id for x in collateral)
            blocks.append(context_block(f"*Collateral (consequences, not the cause):* {names}"))
        block, clipped = _section(_steps(f, d))
        blocks.append(block)
        blocks.append(_section(f"*Verify:* `{escape(d.fill(f.entry.data['verify'], f))}`")[0])
        if f.entry.related:
            blocks.append(context_block("Related: " + ", ".join(f.entry.related)))
        cut = cut or clipped
    blocks.append(_buttons(incident_id, d.root.entry.id if d.root else None))
    return fallback, blocks[:BLOCKS_MAX], cut


def _history(incident: dict | None) -> list[dict]:
    lines = render.history_lines(incident)
    return [_section("\n".join(f":repeat: {escape(line)}" for line in lines))[0]] if lines else []


def entry_blocks(entry: Entry) -> list[dict]:
    """A knowledge entry as blocks (the "Show full entry" button, `/diagnose entry ID`)."""
    d = entry.data
    out = [{"type": "header", "text": {"type": "plain_text", "text": _clip(d["title"], HEADER_MAX)[0]}},
           context_block(f"`{d['id']}` · {d['category']} · {', '.join(d['tags'])}"),
           _section(f"{escape(' '.join(d['summary'].split()))}")[0],
           _section(f"*Mechanism*\n{escape(' '.join(d['mechanism'].split()))}")[0]]
    symptoms = "\n".join(f"• {escape(s['symptom'])} → {escape(s['meaning'])}" for s in d["symptoms"])
    out.append(_section(f"*Symptoms*\n{symptoms}")[0])
    confirm = "\n".join(f"• {escape(c['text'])}" + (f" `{escape(c['command'])}`" if "command" in c else "") for c in d["confirm"])
    out.append(_section(f"*How to confirm*\n{confirm}")[0])
    fix = "\n".join(f"{i}. {escape(s['text'])}" + (f"\n      `{escape(s['command'])}`" if "command" in s else "")
                    + (f"\n```{escape(s['code'].rstrip())}```" if "code" in s else "")
                    for i, s in enumerate(d["fix"]["steps"], 1))
    out.append(_section(f"*Fix:* {escape(d['fix']['summary'])}\n{fix}")[0])
    out.append(_section(f"*Verify:* `{escape(d['verify'])}`")[0])
    out.append(_section("*Prevention*\n" + "\n".join(f"• {escape(p)}" for p in d["prevention"]))[0])
    refs = " · ".join(f"<{r['url']}|{escape(r['title'])}>" for r in d["references"])
    out.append(context_block(f"Related: {', '.join(d['related']) or '-'} · References: {refs}"))
    return out[:BLOCKS_MAX]


def bar(count: int, most: int, width: int = 20) -> str:
    filled = round(width * count / most) if most else 0
    return "█" * filled + "░" * (width - filled)
