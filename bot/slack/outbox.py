"""The outbox: every reply the bot posts or edits is a row in the history until Slack has it.

A listener enqueues (in the same transaction as the incident, for a diagnosis); this sender posts.
- Keys: each row's key is the delivery's key and a counter (`Attempt.next_key`), so a retried
  listener enqueues the same keys and nothing twice. A post carries its key as message metadata.
- Per channel, rows go in order, one at a time, spaced by a token bucket (Slack allows about one
  message a second in a channel); other channels keep flowing.
- A 429 holds the channel for its Retry-After, however long; a 5xx, a timeout or no connection is
  retried with backoff (up to a minute apart) until the row is `give_up_after` seconds old.
- A call that may have reached Slack (a timeout, a 5xx) marks the row uncertain: before posting
  again, the sender looks for the message in the thread by its metadata (a file by its name), so
  a reply is never doubled. A crash between the call and its answer leaves the row uncertain too.
- A permanent error (channel_not_found, not_in_channel, is_archived...) ends the row `failed`
  with Slack's reason, which App Home and `trainmedic incidents show` display.
"""
from __future__ import annotations

import asyncio
import logging
import random
import time
from contextvars import ContextVar
from dataclasses import dataclass, field

from slack_sdk.web.async_client import AsyncWebClient

from bot.history.store import AsyncHistory
from bot.slack import blocks
from bot.slack.client import Failure, failure
from bot.slack.loop import WakeLoop

log = logging.getLogger("trainmedic")

METADATA_TYPE = "trainmedic_reply"
MAX_BACKOFF = 60.0
IN_FLIGHT = 8  # channels served at once


@dataclass
class Attempt:
    """One run of a listener for one delivery: the source of its replies' keys."""

    delivery: str
    count: int = 0

    def next_key(self) -> str:
        self.count += 1
        return f"{self.delivery}#{self.count}"


# Set by the delivery worker around each listener run (bot/slack/deliveries.py), so handlers
# need not pass the delivery along to get stable reply keys.
current_attempt: ContextVar[Attempt] = ContextVar("current_attempt")


def next_key() -> str:
    try:
        return current_attempt.get().next_key()
    except LookupError:
        raise RuntimeError("a reply is enqueued outside a delivery: listeners run through the delivery worker") from None


@dataclass
class Pacer:
    """A token bucket per channel: `rate` messages a second, `burst` at once; a 429 blocks it."""

    rate: float = 1.0
    burst: float = 1.0
    _tokens: dict[str, float] = field(default_factory=dict)
    _at: dict[str, float] = field(default_factory=dict)
    _blocked: dict[str, float] = field(default_factory=dict)

    def _refill(self, channel: str, now: float) -> float:
        tokens = min(self.burst, self._tokens.get(channel, self.burst) + (now - self._at.get(channel, now)) * self.rate)
        self._tokens[channel], self._at[channel] = tokens, now
        return tokens

    def ready_at(self, channel: str, now: float) -> float:
        tokens = self._refill(channel, now)
        return max(self._blocked.get(channel, 0.0), now + max(0.0, 1.0 - tokens) / self.rate)

    def take(self, channel: str, now: float) -> None:
        self._tokens[channel] = self._refill(channel, now) - 1.0

    def block(self, channel: str, until: float) -> None:
        self._blocked[channel] = max(until, self._blocked.get(channel, 0.0))


class Outbox(WakeLoop):
    """Posts the outbox's rows; `run()` until `stop()`. `wake()` after enqueueing."""

    name = "outbox"

    def __init__(self, history: AsyncHistory, client: AsyncWebClient, give_up_after: float,
                 pacer: Pacer | None = None) -> None:
        super().__init__()
        self.history, self.client, self.give_up_after = history, client, give_up_after
        self.pacer = pacer or Pacer()
        self._busy: dict[str, asyncio.Task] = {}  # channel -> its one send in flight

    async def start_due(self) -> float:
        """Start a send for each channel whose next row is due; return when to look again."""
        now = time.time()
        wake_at = now + 5.0
        for row in await self._heads():
            channel = row["channel"]
            ready = max(row["next_at"] or 0.0, self.pacer.ready_at(channel, now))
            if ready > now:
                wake_at = min(wake_at, ready)
            elif len(self._busy) < IN_FLIGHT:
                self.pacer.take(channel, now)
                self._busy[channel] = asyncio.create_task(self._send(row))
                self._busy[channel].add_done_callback(self._sent_one(channel))
        return wake_at - now

    def _sent_one(self, channel: str):
        def done(_task: asyncio.Task) -> None:
            self._busy.pop(channel, None)
            self._wake.set()

        return done

    async def _heads(self) -> list[dict]:
        """The oldest pending row of each channel that has no send in flight."""
        heads: dict[str, dict] = {}
        for row in await self.history.call("outbox_pending"):
            heads.setdefault(row["channel"], row)
        return [r for c, r in heads.items() if c not in self._busy]

    async def idle(self) -> bool:
        return not self._busy and not await self.history.call("outbox_pending", 1)

    async def stop(self, deadline: float) -> None:
        """Keep sending until nothing is pending or the deadline; what is left waits for the next start."""
        while time.monotonic() < deadline and not await self.idle():
            self.wake()
            await asyncio.sleep(0.05)
        self._stopping = True
        self.wake()
        for task in list(self._busy.values()):
            task.cancel()  # its row stays uncertain: the next start looks before posting again
        await asyncio.gather(*self._busy.values(), return_exceptions=True)

    # -- one row ---------------------------------------------------------------------------

    async def _send(self, row: dict) -> None:
        try:
            await self._try(row)
        except Exception:  # noqa: BLE001 - the history could not take the outcome: the row stays uncertain
            log.exception("outbox: reply %s: outcome not recorded", row["key"])

    async def _try(self, row: dict) -> None:
        posting = False
        try:
            if row["uncertain"] and row["kind"] != "update":
                ts = await self._find(row)
                if ts is not None:
                    log.info("reply %s was already in Slack (ts %s): not posted again", row["key"], ts)
                    return await self.history.call("outbox_sent", row["id"], ts)
            await self.history.call("outbox_attempt", row["id"])
            posting = True
            ts = await self._call(row)
        except _Deferred as later:
            await self.history.call("outbox_retry", row["id"], later.delay, later.reason, False)
        except _Refused as refused:
            await self._failed(row, refused.reason)
        except Exception as exc:  # noqa: BLE001 - sorted by failure(); a bug ends the row visibly
            why = failure(exc) or Failure(True, f"{exc.__class__.__name__}: {exc}")
            await self._retry_or_fail(row, why, uncertain=why.uncertain if posting else bool(row["uncertain"]))
        else:
            await self.history.call("outbox_sent", row["id"], ts)

    async def _retry_or_fail(self, row: dict, why: Failure, uncertain: bool) -> None:
        if not why.permanent and time.time() - row["created"] > self.give_up_after:
            why = Failure(True, f"gave up after {row['attempts'] + 1} attempts in {self.give_up_after:.0f} s: {why.reason}")
        if why.permanent:
            return await self._failed(row, why.reason)
        if why.retry_after is not None:
            delay = why.retry_after
            self.pacer.block(row["channel"], time.time() + delay)
        else:
            # Waits grow with the row's age (a quarter of it, 1 s to a minute): an outage of any length is outlasted.
            delay = min(MAX_BACKOFF, max(1.0, (time.time() - row["created"]) / 4)) * random.uniform(0.5, 1.0)
        log.warning("reply %s to %s not sent (%s); next try in %.1f s", row["key"], row["channel"], why.reason, delay)
        await self.history.call("outbox_retry", row["id"], delay, why.reason, uncertain)

    async def _failed(self, row: dict, reason: str) -> None:
        log.error("reply %s to %s could not be delivered: %s", row["key"], row["channel"], reason)
        await self.history.call("outbox_failed", row["id"], reason)

    async def _call(self, row: dict) -> str:
        p = row["payload"]
        if row["kind"] == "post":
            resp = await self.client.chat_postMessage(
                channel=row["channel"], thread_ts=row["thread_ts"], text=p["text"], blocks=p.get("blocks"),
                unfurl_links=False, metadata={"event_type": METADATA_TYPE, "event_payload": {"key": row["key"]}})
            return resp["ts"]
        if row["kind"] == "upload":
            thread = await self._thread_of(row)
            await self.client.files_upload_v2(channel=row["channel"], thread_ts=thread, content=p["content"],
                                              filename=p["filename"], title=p["title"])
            return thread
        if row["kind"] == "update":
            return await self._update(row)
        raise _Refused(f"unknown outbox row kind {row['kind']!r}")

    async def _thread_of(self, row: dict) -> str:
        """An upload goes in its message's thread; a message posted in the channel starts that thread."""
        if row["thread_ts"]:
            return row["thread_ts"]
        parent = row["payload"]["parent"]
        ts = await self.history.call("sent_ts", parent)
        if ts is None:
            raise _Refused("the message it belongs to was not delivered")
        return ts

    async def _update(self, row: dict) -> str:
        """Edit an incident's reply to show its current status (read now: the latest status wins)."""
        incident = row["incident"]
        message = await self.history.call("message_for", incident)
        if message is None:
            reply = await self.history.call("reply_of", incident)
            if reply is not None and reply["state"] == "pending":
                raise _Deferred(2.0, "its reply is not posted yet")
            raise _Refused("the reply it edits was never delivered")
        text, edited = blocks.with_status(message["blocks"], message["text"], await self.history.call("get_row", incident))
        await self.client.chat_update(channel=message["channel"], ts=message["ts"], text=text, blocks=edited)
        return message["ts"]

    async def _find(self, row: dict) -> str | None:
        """The ts of this row's message if an earlier try did reach Slack, else None."""
        oldest = f"{row['created'] - 60:.6f}"
        if row["kind"] == "upload":
            thread = await self._thread_of(row)
            resp = await self.client.conversations_replies(channel=row["channel"], ts=thread, oldest=oldest, limit=200)
            name = row["payload"]["filename"]
            return thread if any(f.get("name") == name for m in resp["messages"] for f in m.get("files") or []) else None
        if row["thread_ts"]:
            resp = await self.client.conversations_replies(channel=row["channel"], ts=row["thread_ts"], oldest=oldest,
                                                           include_all_metadata=True, limit=200)
        else:
            resp = await self.client.conversations_history(channel=row["channel"], oldest=oldest,
                                                           include_all_metadata=True, limit=200)
        for m in resp["messages"]:
            meta = m.get("metadata") or {}
            if meta.get("event_type") == METADATA_TYPE and (meta.get("event_payload") or {}).get("key") == row["key"]:
                return m["ts"]
        return None


class _Deferred(Exception):
    def __init__(self, delay: float, reason: str) -> None:
        super().__init__(reason)
        self.delay, self.reason = delay, reason


class _Refused(Exception):
    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason
