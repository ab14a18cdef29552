"""Persist before ack: the Bolt middleware every request from Slack passes first (after the HTTP
signature check, before authorization), in HTTP and Socket Mode alike.

It stores the request under its delivery key in one short BEGIN IMMEDIATE transaction, ahead of
the history's queue, and only then answers Slack: 200 for every event, command and interaction
(with the command's acknowledgement text), whether or not a listener wants it. No listener runs
here; the delivery worker replays the stored request through the app (bot/slack/deliveries.py).
When the write cannot be done within the ack budget (another process holds the database's write
lock) or the bot is shutting down, the answer is 503: Slack retries an event (and redelivers an
unacked Socket Mode envelope), and the user of a slash command sees that it failed, never a 200
for something that was not kept.
"""
from __future__ import annotations

import hashlib
import json
import logging
import sqlite3
from typing import Awaitable, Callable

from slack_bolt.middleware.async_middleware import AsyncMiddleware
from slack_bolt.request.async_request import AsyncBoltRequest
from slack_bolt.response import BoltResponse

from bot.history.store import AsyncHistory

log = logging.getLogger("trainmedic")

REPLAYED = "trainmedic_delivery"  # context key: this request comes from the store, not from Slack
INTERACTIONS = {"block_actions", "view_submission", "view_closed", "shortcut", "message_action"}


def delivery_key(body: dict, raw: str) -> tuple[str, str] | None:
    """(kind, key) of a request: events by event_id; commands and interactions, which carry none,
    by trigger_id (a replayed signed body has the same one), else a hash of the body. None for
    Slack's own checks (url_verification, ssl_check), which Bolt answers."""
    if body.get("type") == "event_callback" and body.get("event_id"):
        return "event", f"event:{body['event_id']}"
    if "command" in body:
        kind, prefix = "command", "command"
    elif body.get("type") in INTERACTIONS:
        kind, prefix = "interaction", body["type"]
    elif body.get("type") == "event_callback":
        kind, prefix = "event", "event"
    else:
        return None
    ident = body.get("trigger_id") or hashlib.sha256((raw or json.dumps(body, sort_keys=True)).encode()).hexdigest()[:32]
    return kind, f"{prefix}:{ident}"


class Intake(AsyncMiddleware):
    """Stores each request from Slack before it is acked; lets replayed ones through to the listeners."""

    def __init__(self, history: AsyncHistory, ack_budget: float, wake: Callable[[], None],
                 command_acks: dict[str, Callable[[dict], str | None]]) -> None:
        self.history, self.ack_budget, self.wake = history, ack_budget, wake
        self.command_acks = command_acks
        self.accepting = True

    async def async_process(self, *, req: AsyncBoltRequest, resp: BoltResponse,
                            next: Callable[[], Awaitable[BoltResponse]]) -> BoltResponse:
        if req.context.get(REPLAYED):
            return await next()
        found = delivery_key(req.body, req.raw_body)
        if found is None:
            return await next()
        kind, key = found
        if not self.accepting:
            log.info("request %s refused with 503: shutting down (Slack retries it)", key)
            return BoltResponse(status=503, body="shutting down")
        body = req.raw_body if req.mode == "http" else json.dumps(req.body)
        try:
            outcome = await self.history.urgent("intake", key, kind, req.mode, body, budget=self.ack_budget)
        except (TimeoutError, sqlite3.Error) as exc:
            log.warning("request %s refused with 503: not stored within %.1f s (%s)", key, self.ack_budget, exc)
            return BoltResponse(status=503, body="busy, try again")
        if outcome == "finished":
            log.info("duplicate %s dropped: already finished", key)
        self.wake()
        return self._ack(kind, req.body) if outcome == "new" else BoltResponse(status=200, body="")

    def _ack(self, kind: str, body: dict) -> BoltResponse:
        text = self.command_acks[body["command"]](body) if kind == "command" and body["command"] in self.command_acks else None
        return BoltResponse(status=200, body={"text": text} if text else "")
