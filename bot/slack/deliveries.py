"""The delivery worker: drives every stored Slack request to its end, from the history, not from
tasks in memory.

It claims due requests (state received -> working), replays each through the Bolt app as a
request flagged `REPLAYED` (the intake middleware lets it through; `process_before_response`
makes the dispatch return when the listener is done) and ends it `done`. A listener that raises
leaves its request retryable with backoff: a Slack outage, a 429 or a busy database are retried
until the request is `give_up_after` seconds old, anything else (a bug, a scan worker killed by
the log it read) five times; then it ends `failed` and the user is told, with an error id that is in the log. Replaying
the request, rather than handing work to a queue of our own, keeps the listeners as they are:
Bolt parses, matches and injects exactly as for a live request. At start-up `release_working`
makes what a dead bot was doing due again; on SIGTERM `stop` lets running listeners finish
within the grace period and leaves the rest for the next start.
"""
from __future__ import annotations

import asyncio
import json
import logging
import random
import time
import uuid
from datetime import datetime

from slack_bolt.async_app import AsyncApp
from slack_bolt.request.async_request import AsyncBoltRequest
from slack_bolt.request.internals import parse_body

from bot.slack.client import Failure, failure
from bot.slack.intake import REPLAYED
from bot.slack.loop import WakeLoop
from bot.slack.outbox import Attempt, command_of, current_attempt, placeholder_key
from bot.slack.replies import Deps, Target, post_row

log = logging.getLogger("trainmedic")

ERROR = "trainmedic_error"  # context key: the exception a listener raised (see create_app's error handler)
BOT_USER = "trainmedic_bot_user"  # context key: the bot user an event was sent to (its `authorizations`)
MAX_ATTEMPTS = 5  # for errors that are not Slack's or the database's
MAX_BACKOFF = 300.0
# Requests replayed at once. Most of their time is waiting (Slurm, downloads, the scan pool, Slack),
# and a few hung /diagnose must not hold up a pasted log: the cluster commands have their own limits.
CONCURRENCY = 32


class Deliveries(WakeLoop):
    name = "deliveries"

    def __init__(self, app: AsyncApp, deps: Deps, give_up_after: float) -> None:
        super().__init__()
        self.app, self.deps, self.give_up_after = app, deps, give_up_after
        self._running: set[asyncio.Task] = set()

    async def start_due(self) -> float:
        free = CONCURRENCY - len(self._running)
        if free > 0:
            for row in await self.deps.history.call("claim_deliveries", free):
                task = asyncio.create_task(self._handle(row))
                self._running.add(task)
                task.add_done_callback(self._finished_one)
        due = await self.deps.history.call("next_delivery_at")
        return 5.0 if due is None else min(5.0, due - time.time())

    def _finished_one(self, task: asyncio.Task) -> None:
        self._running.discard(task)
        self._wake.set()

    async def stop(self, deadline: float) -> None:
        """Claim nothing more; wait for running listeners until the deadline; the rest stays for the next start."""
        self._stopping = True
        self.wake()
        if self._running:
            await asyncio.wait(set(self._running), timeout=max(0.0, deadline - time.monotonic()))
        for task in list(self._running):
            task.cancel()
        await asyncio.gather(*self._running, return_exceptions=True)
        released = await self.deps.history.call("release_working")
        if released:
            log.info("shutdown: %d requests left for the next start", released)

    # -- one request -------------------------------------------------------------------------

    async def _handle(self, row: dict) -> None:
        current_attempt.set(Attempt(row["key"], _epoch(row["received_at"])))  # this task's context only
        try:
            error = await self._replay(row)
            if error is None:
                await self.deps.history.call("finish_delivery", row["key"], "done")
            else:
                await self._failed(row, error)
        except asyncio.CancelledError:
            raise
        except Exception:  # noqa: BLE001 - the outcome could not be stored: the request stays working until released
            log.exception("delivery %s: outcome not recorded", row["key"])
        finally:
            self.deps.outbox.wake()

    async def _replay(self, row: dict) -> BaseException | None:
        body = _body(row)
        context = {REPLAYED: row["key"]}
        auth = (body.get("authorizations") or [{}])[0]
        if auth.get("is_bot") and auth.get("user_id"):
            context[BOT_USER] = auth["user_id"]
        if row["mode"] == "socket_mode":
            req = AsyncBoltRequest(body=body, mode="socket_mode", context=context)
        else:
            req = AsyncBoltRequest(body=row["body"], context=context)
        try:
            resp = await self.app.async_dispatch(req)
        except Exception as exc:  # noqa: BLE001 - Bolt catches listener errors; this is a safety net
            return exc
        error = req.context.get(ERROR)
        if error is None and resp.status >= 500:
            error = RuntimeError(f"the app answered {resp.status}")
        return error

    async def _failed(self, row: dict, error: BaseException) -> None:
        why = failure(error)
        age = time.time() - _epoch(row["received_at"])
        if why is None:
            why = Failure(row["attempts"] >= MAX_ATTEMPTS, f"{error.__class__.__name__}: {error}")
        elif not why.permanent and age > self.give_up_after:
            why = Failure(True, f"{why.reason}, for {age:.0f} s")
        if not why.permanent:
            delay = why.retry_after if why.retry_after is not None else \
                min(MAX_BACKOFF, 2 ** row["attempts"]) * random.uniform(0.5, 1.0)
            log.warning("delivery %s attempt %d failed (%s); next try in %.1f s", row["key"], row["attempts"],
                        why.reason, delay)
            await self.deps.history.call("retry_delivery", row["key"], delay, why.reason)
            return
        error_id = uuid.uuid4().hex[:8]
        log.error("error %s: delivery %s failed after %d attempts: %s", error_id, row["key"], row["attempts"],
                  why.reason, exc_info=error)
        await self.deps.history.call("finish_delivery", row["key"], "failed", f"{why.reason} (error id {error_id})")
        await self._tell(row, error_id, why.reason)

    async def _tell(self, row: dict, error_id: str, reason: str) -> None:
        """Say that it failed for good, and only that: in the thread (or to the user of a command);
        a placeholder of the request becomes this notice."""
        body = _body(row)
        text = (f":warning: trainmedic could not answer this: {reason} (error id `{error_id}`; on-call finds "
                "the details in the bot's log under that id).")
        shown = placeholder_key(row["key"])
        replaces = shown if await self.deps.history.call("outbox_state", shown) in ("pending", "sent") else None
        event = body.get("event") or {}
        if event.get("channel") and event.get("type") in ("message", "app_mention"):
            target = Target(event["channel"], event.get("thread_ts") or event["ts"], replaces=replaces)
            text += " Mention @trainmedic in the thread to try again."
        elif body.get("command") and body.get("channel_id"):
            command = command_of(body, row["key"], _epoch(row["received_at"]))
            target = Target(body["channel_id"], command=command, private=replaces is None, replaces=replaces)
            text += " Run the command again to retry."
        else:
            return
        await self.deps.history.call("enqueue", [post_row(f"{row['key']}#failed", target, text)])


def _body(row: dict) -> dict:
    return json.loads(row["body"]) if row["mode"] == "socket_mode" else parse_body(row["body"], None)


def _epoch(iso: str | None) -> float:
    return datetime.fromisoformat(iso).timestamp() if iso else time.time()
