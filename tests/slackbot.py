"""Harness for the Slack tests: the bot's Bolt app served over real HTTP on 127.0.0.1, talking to
the FakeSlack Web API, with requests signed exactly as Slack signs them."""
from __future__ import annotations

import asyncio
import json
import time
import urllib.parse
from contextlib import asynccontextmanager
from dataclasses import dataclass, replace

import aiohttp
from aiohttp import web
from slack_fake import BOT_TOKEN, SIGNING_SECRET, FakeSlack
from slack_sdk.signature import SignatureVerifier

from bot.config import Settings
from bot.history.store import AsyncHistory
from bot.slack.app import create_app
from bot.slack.replies import Deps

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


def message(text: str, ts: str = "1700000100.000100", **extra) -> dict:
    return {"type": "message", "channel": CHANNEL, "channel_type": "channel", "user": USER, "text": text, "ts": ts, **extra}


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

    async def command(self, text: str, channel: str = CHANNEL, user: str = USER) -> aiohttp.ClientResponse:
        body = urllib.parse.urlencode({
            "token": "legacy", "team_id": "T1", "channel_id": channel, "user_id": user, "command": "/diagnose",
            "text": text, "response_url": f"{self.fake.url}/response/diagnose", "trigger_id": "trig.1",
        })
        return await self.post(body, "application/x-www-form-urlencoded")

    async def interaction(self, payload: dict) -> aiohttp.ClientResponse:
        body = urllib.parse.urlencode({"payload": json.dumps(payload)})
        return await self.post(body, "application/x-www-form-urlencoded")

    async def quiet(self, method: str = "chat.postMessage", seconds: float = 1.5) -> None:
        """Give the bot time to (wrongly) answer, then check it did not."""
        await asyncio.sleep(seconds)
        assert self.fake.called(method) == [], [c.params for c in self.fake.called(method)]


@asynccontextmanager
async def running_bot(tmp_path, kb, scans, **overrides):
    fake = await FakeSlack().start()
    settings = Settings(slack_bot_token=BOT_TOKEN, slack_signing_secret=SIGNING_SECRET, slack_api_url=fake.api_url,
                        db=str(tmp_path / "incidents.db"))
    settings = replace(settings, **overrides)
    deps = Deps(settings=settings, kb=kb, scans=scans, history=AsyncHistory(settings.db))
    app = create_app(deps).web_app(path="/slack/events")
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]
    http = aiohttp.ClientSession()
    try:
        yield Bot(fake, f"http://127.0.0.1:{port}", http, deps)
    finally:
        await http.close()
        if deps.http is not None:
            await deps.http.close()
        await runner.cleanup()
        deps.history.close()
        await fake.stop()
