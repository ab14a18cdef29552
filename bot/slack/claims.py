"""One message, one answer.

A message that shares a log and mentions the bot reaches the bot twice: as a `file_share` message
event and as an `app_mention`, two event ids for one channel and ts. Each listener claims the
message before it downloads anything; the first claim answers, the other listener stays silent.

The claim is kept in two places:
- in this process, message -> the event id that answers it, so a retry of that same event (by
  Slack, or by a delivery worker) may still finish it while the other event is turned away;
- in the history, through the existing `claim_event`, under ids that cannot collide with Slack's
  event ids: `msg:<channel>:<ts>` (the message is taken) and `msg:<channel>:<ts>:<event id>` (by
  which event), so after a restart the owner's retry is still told from the other event.
It has no table of its own because the history's Slack tables belong to the delivery work
(issue 15); when those tables keep an event's state, this module is the one place to move.
"""
from __future__ import annotations

from weakref import WeakKeyDictionary

from bot.history.store import AsyncHistory

KEPT = 10_000  # claims remembered per process; the history remembers them all
_TAKEN_ELSEWHERE = ""  # no Slack event id is empty
_owners: WeakKeyDictionary[AsyncHistory, dict[str, str]] = WeakKeyDictionary()


async def claim_message(history: AsyncHistory, channel: str, ts: str, event_id: str) -> bool:
    """True when the event `event_id` is the one to answer the message at (`channel`, `ts`)."""
    key = f"msg:{channel}:{ts}"
    owners = _owners.setdefault(history, {})
    if key in owners:
        return owners[key] == event_id
    owners[key] = event_id  # set before any await: two listeners of this process cannot both pass
    if len(owners) > KEPT:
        del owners[next(iter(owners))]
    if await history.call("claim_event", key):
        await history.call("claim_event", f"{key}:{event_id}")
        return True
    # Taken in the history: before a restart, or by another process. Ours if our mark is there.
    if not await history.call("claim_event", f"{key}:{event_id}"):
        return True
    owners[key] = _TAKEN_ELSEWHERE
    return False
