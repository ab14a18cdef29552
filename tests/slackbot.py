"""Harness for the Slack tests: the bot's service (intake, delivery worker, outbox, history) served
over real HTTP on 127.0.0.1 by the bot's own endpoint, talking to the FakeSlack Web API, with
requests signed exactly as Slack signs them (`running_bot`); or connected over Bolt's aiohttp Socket
Mode handler to the FakeSlack websocket, which delivers envelopes as Slack does and records every
acknowledgement (`socket_bot`)."""
from __future__ import annotations

import asyncio
import itertools
import json
import time
import urllib.parse
from contextlib import asynccontextmanager
from dataclasses import dataclass, replace

import aiohttp
from aiohttp import web
from slack_bolt.adapter.socket_mode.aiohttp import AsyncSocketModeHandler
from slack_fake import APP_TOKEN, BOT_TOKEN, SIGNING_SECRET, FakeSlack
from slack_sdk.signature import SignatureVerifier

from bot.config import Settings
from bot.slack import endpoint
from bot.slack.replies import Deps
from bot.slack.server import Service

CHANNEL = "C0INCIDENTS"
USER = "U0ONCALL"


def signed_headers(body: str, timestamp: int | None = None, secret: str = SIGNING_SECRET) -> dict:
    timestamp = int(time.time()) if timestamp is None else timestamp
    signature = SignatureVerifier(secret).generate_signature(timestamp=str(timestamp), body=body)
    return {"X-Slack-Request-Timestamp": str(timestamp), "X-Slack-Signature": signature}


def event_body(event: dict, event_id: str) -> str:
    return json.dumps({
        "token": "legacy", "team_id": "T1", "api_app_id": "A1", "type": "event_callback",
        "event_id": event_id, "event_time": int(time.time()), "event": event,
        "authorizations": [{"team_id": "T1", "user_id": "UBOT", "is_bot": True}],
    })


def command_body(fake: FakeSlack, text: str, channel: str = CHANNEL, user: str = USER,
                 trigger_id: str | None = None) -> str:
    return urllib.parse.urlencode({
        "token": "legacy", "team_id": "T1", "channel_id": channel, "user_id": user, "command": "/diagnose",
        "text": text, "response_url": f"{fake.url}/response/diagnose",
        "trigger_id": trigger_id or f"trig.{next(_TRIGGERS)}",
    })


_TRIGGERS = itertools.count(1)


def message(text: str, ts: str = "1700000100.000100", **extra) -> dict:
    return {"type": "message", "channel": CHANNEL, "channel_type": "channel", "user": USER, "text": text, "ts": ts, **extra}


async def eventually(read, done, what: str, timeout: float = 30.0):
    """What `read()` returns once `done` holds of it: Slack's side sees a call a moment before the
    outbox writes down what came of it, so a test that reads the history polls."""
    deadline = time.monotonic() + timeout
    while not done(value := await read()):
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.05)
    return value


@dataclass
class Bot:
    fake: FakeSlack
    url: str
    http: aiohttp.ClientSession
    deps: Deps

    async def post(self, body: str, content_type: str, headers: dict | None = None) -> aiohttp.ClientResponse:
        headers = {**signed_headers(body), "Content-Type": content_type, **(headers or {})}
        async with self.http.post(self.url + "/slack/events", data=body.encode(), headers=headers) as resp:
            await resp.read()
            return resp

    async def event(self, event: dict, event_id: str = "Ev0001", **headers) -> aiohttp.ClientResponse:
        return await self.post(event_body(event, event_id), "application/json", headers)

    async def command(self, text: str, channel: str = CHANNEL, user: str = USER,
                      trigger_id: str | None = None) -> aiohttp.ClientResponse:
        return await self.post(command_body(self.fake, text, channel, user, trigger_id), "application/x-www-form-urlencoded")

    async def interaction(self, payload: dict) -> aiohttp.ClientResponse:
        """Slack gives every interaction a trigger_id of its own; the intake keys interactions by it."""
        body = urllib.parse.urlencode({"payload": json.dumps({**payload, "trigger_id": f"trig.{next(_TRIGGERS)}"})})
        return await self.post(body, "application/x-www-form-urlencoded")

    async def kept_message(self, incident_id: int) -> dict:
        """The Slack message the history keeps for an incident, once the outbox has recorded it."""
        return await eventually(lambda: self.deps.history.call("message_for", incident_id),
                                lambda kept: kept is not None, f"incident {incident_id}'s recorded message")

    async def quiet(self, method: str = "chat.postMessage", seconds: float = 1.5) -> None:
        """Give the bot time to (wrongly) answer, then check it did not."""
        await asyncio.sleep(seconds)
        assert self.fake.called(method) == [], [c.params for c in self.fake.called(method)]


def test_settings(fake: FakeSlack, db, **overrides) -> Settings:
    settings = Settings(slack_bot_token=BOT_TOKEN, slack_signing_secret=SIGNING_SECRET, slack_api_url=fake.api_url,
                        db=str(db), shutdown_grace=5.0, slack_timeout=5.0)
    return replace(settings, **overrides)


@asynccontextmanager
async def running_bot(tmp_path, kb, scans, fake: FakeSlack | None = None, **overrides):
    own_fake = fake is None
    fake = fake or await FakeSlack().start()
    service = await Service.start(test_settings(fake, tmp_path / "incidents.db", **overrides), kb=kb, scans=scans)
    runner = web.AppRunner(endpoint.web_app(service.app, SIGNING_SECRET, service.settings.max_request_bytes))
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]
    http = aiohttp.ClientSession()
    try:
        yield Bot(fake, f"http://127.0.0.1:{port}", http, service.deps)
    finally:
        await http.close()
        await service.stop()
        await runner.cleanup()
        if own_fake:
            await fake.stop()


# What each kind of request is delivered as in Socket Mode.
ENVELOPE_TYPES = {"event_callback": "events_api", "block_actions": "interactive", "view_submission": "interactive"}
_ENVELOPES = itertools.count(1)


@dataclass
class SocketBot:
    fake: FakeSlack
    deps: Deps

    async def deliver(self, payload: dict, kind: str | None = None) -> str:
        """Send `payload` in an envelope over the bot's socket; its envelope_id."""
        envelope_id = f"env-{next(_ENVELOPES)}"
        await self.fake.send_envelope(payload, envelope_id, kind or ENVELOPE_TYPES[payload["type"]])
        return envelope_id

    async def wait_acked(self, envelope_ids: list[str], timeout: float = 10.0) -> list[str]:
        """The envelopes still not acknowledged after `timeout` seconds (Slack waits 3 s)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and not all(self.fake.acked(e) for e in envelope_ids):
            await asyncio.sleep(0.05)
        return [e for e in envelope_ids if not self.fake.acked(e)]


@asynccontextmanager
async def socket_bot(tmp_path, kb, scans, **overrides):
    fake = await FakeSlack().start()
    settings = test_settings(fake, tmp_path / "incidents.db", slack_app_token=APP_TOKEN, **overrides)
    service = await Service.start(settings, kb=kb, scans=scans)
    handler = AsyncSocketModeHandler(service.app, APP_TOKEN)
    await handler.connect_async()
    try:
        deadline = time.monotonic() + 10
        while not fake.sockets and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        yield SocketBot(fake, service.deps)
    finally:
        await handler.close_async()
        await service.stop()
        await fake.stop()
