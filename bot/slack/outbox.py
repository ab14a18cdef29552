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

What a post row's payload may ask for besides its text and blocks:
- `replaces`: the key of a placeholder ("Diagnosing `rank3.log.gz` (212 MB)...") posted earlier in
  the same channel, hence sent before it. Once the placeholder is in Slack, the row edits it
  (chat.update with its ts) instead of posting; a placeholder Slack refused is `skipped`, and the
  row then posts as usual. A placeholder row itself carries `placeholder`.
- `command`: the slash command it answers (`command_of`). Where chat.postMessage answers
  not_in_channel or channel_not_found (a channel the bot is not in, a DM between two people), the
  answer goes through the command's response_url: in the channel, or to the user if Slack refuses
  that. A response_url lives 30 minutes and takes 5 answers (counted on the command's delivery), so
  such a row is retried before it expires and does not give up while the URL is still usable; such
  an answer cannot be looked up or edited (at least once, like an ephemeral). A public answer to a
  command that cannot be delivered is told to its user privately, with an error id.
- `private`: to the user only: through the command's response_url while it is usable, else with
  chat.postEphemeral (to `user`). A placeholder it replaces is deleted, and its report file is not
  uploaded (a report whose answer has no message in the channel is `skipped`).
"""
from __future__ import annotations

import asyncio
import logging
import random
import time
import uuid
from contextvars import ContextVar
from dataclasses import dataclass, field

from slack_sdk.errors import SlackApiError
from slack_sdk.web.async_client import AsyncWebClient
from slack_sdk.webhook.async_client import AsyncWebhookClient

from bot.history.store import AsyncHistory
from bot.slack import blocks
from bot.slack.client import NOT_MEMBER, Failure, ResponseUrlError, failure, slack_error
from bot.slack.loop import WakeLoop

log = logging.getLogger("trainmedic")

METADATA_TYPE = "trainmedic_reply"
MAX_BACKOFF = 60.0
IN_FLIGHT = 8  # channels served at once
RESPONSE_URL_LIFE = 29 * 60.0  # Slack keeps a command's response_url 30 minutes; a minute to spare
GONE = frozenset({"message_not_found", "cant_update_message", "edit_window_closed"})  # a placeholder that cannot be edited


@dataclass
class Attempt:
    """One run of a listener for one delivery: the source of its replies' keys."""

    delivery: str
    received: float  # when Slack sent the request (a command's response_url expires from then)
    count: int = 0

    def next_key(self) -> str:
        self.count += 1
        return f"{self.delivery}#{self.count}"


# Set by the delivery worker around each listener run (bot/slack/deliveries.py), so handlers
# need not pass the delivery along to get stable reply keys.
current_attempt: ContextVar[Attempt] = ContextVar("current_attempt")


def attempt() -> Attempt:
    try:
        return current_attempt.get()
    except LookupError:
        raise RuntimeError("a reply is enqueued outside a delivery: listeners run through the delivery worker") from None


def next_key() -> str:
    return attempt().next_key()


def placeholder_key(delivery: str) -> str:
    """The key of a delivery's placeholder: its answer, or its failure notice, replaces it."""
    return f"{delivery}#placeholder"


def command_of(body: dict, delivery: str, received: float) -> dict:
    """What a reply to a slash command carries (`command` in its payload)."""
    return {"delivery": delivery, "url": body["response_url"], "user": body["user_id"],
            "expires": received + RESPONSE_URL_LIFE}


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
        except _Skipped as skipped:
            log.info("reply %s to %s skipped: %s", row["key"], row["channel"], skipped.reason)
            await self.history.call("outbox_skipped", row["id"], skipped.reason)
        except _Refused as refused:
            await self._failed(row, refused.reason)
        except Exception as exc:  # noqa: BLE001 - sorted by failure(); a bug ends the row visibly
            why = failure(exc) or Failure(True, f"{exc.__class__.__name__}: {exc}")
            await self._retry_or_fail(row, why, uncertain=why.uncertain if posting else bool(row["uncertain"]))
        else:
            await self.history.call("outbox_sent", row["id"], ts)

    async def _retry_or_fail(self, row: dict, why: Failure, uncertain: bool) -> None:
        now = time.time()
        usable_until = (row["payload"].get("command") or {}).get("expires", 0.0)  # a response_url still to try
        if not why.permanent and now - row["created"] > self.give_up_after and now >= usable_until:
            why = Failure(True, f"gave up after {row['attempts'] + 1} attempts in {self.give_up_after:.0f} s: {why.reason}")
        if why.permanent:
            return await self._failed(row, why.reason)
        if why.retry_after is not None:
            delay = why.retry_after
            self.pacer.block(row["channel"], now + delay)
        else:
            # Waits grow with the row's age (a quarter of it, 1 s to a minute): an outage of any length is outlasted.
            delay = min(MAX_BACKOFF, max(1.0, (now - row["created"]) / 4)) * random.uniform(0.5, 1.0)
            if now < usable_until:  # the next try comes before the response_url expires
                delay = min(delay, max(1.0, (usable_until - now) / 2))
        log.warning("reply %s to %s not sent (%s); next try in %.1f s", row["key"], row["channel"], why.reason, delay)
        await self.history.call("outbox_retry", row["id"], delay, why.reason, uncertain)

    async def _failed(self, row: dict, reason: str) -> None:
        p = row["payload"]
        if p.get("placeholder"):  # not the answer: that row posts (or fails) on its own
            log.info("placeholder %s in %s not shown: %s", row["key"], row["channel"], reason)
            return await self.history.call("outbox_skipped", row["id"], reason)
        error_id = uuid.uuid4().hex[:8]
        log.error("error %s: reply %s to %s could not be delivered: %s", error_id, row["key"], row["channel"], reason)
        notice = []
        if p.get("command") and not p.get("private") and row["kind"] == "post":
            notice = [{"key": f"{row['key']}#undelivered", "kind": "post", "channel": row["channel"],
                       "payload": {"private": True, "command": p["command"], "text": (
                           f":warning: trainmedic could not deliver its answer here: {reason} (error id `{error_id}`; "
                           "on-call finds the details in the bot's log under that id).")}}]
        await self.history.call("outbox_failed", row["id"], reason, notice)

    async def _call(self, row: dict) -> str | None:
        """Do what the row says; the ts of the message it made or edited (None for one nobody can edit)."""
        p = row["payload"]
        if row["kind"] == "post":
            return await self._post(row)
        if row["kind"] == "upload":
            thread = await self._thread_of(row)
            await self.client.files_upload_v2(channel=row["channel"], thread_ts=thread, content=p["content"],
                                              filename=p["filename"], title=p["title"])
            return thread
        if row["kind"] == "update":
            return await self._update(row)
        raise _Refused(f"unknown outbox row kind {row['kind']!r}")

    async def _post(self, row: dict) -> str | None:
        p = row["payload"]
        replaced = await self.history.call("sent_ts", p["replaces"]) if p.get("replaces") else None
        if p.get("private"):
            if replaced:  # a private answer leaves nothing behind in the channel
                await self._delete(row["channel"], replaced)
            return await self._to_user(row)
        if replaced:
            try:
                await self.client.chat_update(channel=row["channel"], ts=replaced, text=p["text"], blocks=p.get("blocks"))
                return replaced
            except SlackApiError as exc:
                if slack_error(exc) not in GONE:
                    raise
                log.info("placeholder of %s is gone (%s): posting anew", row["key"], slack_error(exc))
        try:
            resp = await self.client.chat_postMessage(
                channel=row["channel"], thread_ts=row["thread_ts"], text=p["text"], blocks=p.get("blocks"),
                unfurl_links=False, metadata={"event_type": METADATA_TYPE, "event_payload": {"key": row["key"]}})
        except SlackApiError as exc:
            if not p.get("command") or p.get("placeholder") or slack_error(exc) not in NOT_MEMBER:
                raise
            return await self._through_response_url(row, slack_error(exc))
        return resp["ts"]

    async def _through_response_url(self, row: dict, error: str) -> None:
        """Where the bot is not a member: in the channel when Slack allows it, else to the user."""
        try:
            await self._respond(row, "in_channel")
        except ResponseUrlError as exc:
            if not failure(exc).permanent:
                raise
            log.info("response_url refused an answer in the channel (%s); answering the user only", exc)
            await self._respond(row, "ephemeral")
        except _Unusable as unusable:
            raise _Refused(f"{error} (the bot is not in the conversation), and {unusable.reason}") from None

    async def _to_user(self, row: dict) -> None:
        p = row["payload"]
        if p.get("command"):
            try:
                return await self._respond(row, "ephemeral")
            except _Unusable as unusable:
                log.info("reply %s: %s; sending it with chat.postEphemeral", row["key"], unusable.reason)
        await self.client.chat_postEphemeral(channel=row["channel"], user=p.get("user") or p["command"]["user"],
                                             thread_ts=row["thread_ts"], text=p["text"], blocks=p.get("blocks"))

    async def _respond(self, row: dict, response_type: str) -> None:
        """One answer through the command's response_url, while it lives and has uses left."""
        p = row["payload"]
        command = p["command"]
        if time.time() >= command["expires"]:
            raise _Unusable("the command's response_url has expired (Slack keeps it 30 minutes)")
        if not await self.history.call("use_response_url", command["delivery"]):
            raise _Unusable("the command's response_url is used up (Slack takes 5 answers through it)")
        webhook = AsyncWebhookClient(command["url"], timeout=self.client.timeout, retry_handlers=[])
        resp = await webhook.send(text=p["text"], blocks=p.get("blocks"), response_type=response_type,
                                  replace_original=False)
        if resp.status_code != 200:
            raise ResponseUrlError(resp.status_code, resp.body)

    async def _delete(self, channel: str, ts: str) -> None:
        try:
            await self.client.chat_delete(channel=channel, ts=ts)
        except SlackApiError as exc:
            if slack_error(exc) != "message_not_found":  # deleted already (an earlier try, or a person)
                raise

    async def _thread_of(self, row: dict) -> str:
        """An upload goes in its message's thread; a message posted in the channel starts that thread."""
        if row["thread_ts"]:
            return row["thread_ts"]
        parent = row["payload"]["parent"]
        ts = await self.history.call("sent_ts", parent)
        if ts is None:
            if await self.history.call("outbox_state", parent) == "sent":
                raise _Skipped("the answer has no message in the channel to attach the report to")
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
        if message["ts"] is None:
            raise _Skipped("the reply went to the user only or through a command's response_url: nobody can edit it")
        text, edited = blocks.with_status(message["blocks"], message["text"], await self.history.call("get_row", incident))
        await self.client.chat_update(channel=message["channel"], ts=message["ts"], text=text, blocks=edited)
        return message["ts"]

    async def _find(self, row: dict) -> str | None:
        """The ts of this row's message if an earlier try did reach Slack, else None."""
        p = row["payload"]
        if p.get("private") or (p.get("replaces") and await self.history.call("sent_ts", p["replaces"])):
            return None  # an ephemeral cannot be looked up, and an edit done twice shows the same
        try:
            return await self._look_up(row)
        except SlackApiError as exc:
            if p.get("command") and slack_error(exc) in NOT_MEMBER:
                return None  # it went through the response_url, which nobody can look up: sent again
            raise

    async def _look_up(self, row: dict) -> str | None:
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
    """The row cannot be done: it ends failed."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class _Skipped(_Refused):
    """Nothing to send after all: the row ends skipped, which is no failure."""


class _Unusable(_Refused):
    """The command's response_url has expired or is used up."""
