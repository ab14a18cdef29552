"""The text of a Slack message as the user pasted it.

Slack changes what it carries: it escapes &, < and >, writes mentions as `<@U123>` and links as
`<https://host/path|label>`. Text that looks like a domain is linked too, and the label is what the
user typed: a log's `shm.cc:634` arrives as `<http://shm.cc:634|shm.cc:634>`, `train.sh` as
`<http://train.sh|train.sh>`, an address as `<mailto:a@b.org|a@b.org>`. Its composer sends a code
block with the fences glued to the first and last lines (```` ```[rank3]: ... ```` and
```` ...exit code 1``` ````). A fence left on a line would hide the line's rank prefix from the
scan and end up inside the evidence block.
"""
from __future__ import annotations

import html
import re

_MENTION = re.compile(r"<@[A-Z0-9]+(?:\|[^>]*)?>")
_LINK = re.compile(r"<((?:https?|ftp)://[^|>]+|mailto:[^|>]+)(?:\|([^>]*))?>")
_FENCE_AT_EDGE = re.compile(r"^```|```$", re.MULTILINE)


def unwrap_fences(text: str) -> str:
    """Code fences taken off: one at the start or end of a line belongs to no line; one between
    words starts a block on a line of its own, as Slack shows it."""
    return _FENCE_AT_EDGE.sub("", text).replace("```", "\n")


def pasted_text(text: str) -> str:
    """Text from Slack (a message, a slash command's text) as the user pasted it: no mentions,
    links as written (their label, else the address), no code fences."""
    return unwrap_fences(html.unescape(_LINK.sub(lambda m: m.group(2) or m.group(1), _MENTION.sub("", text))))


def message_text(message: dict) -> str:
    return pasted_text(message.get("text") or "")
