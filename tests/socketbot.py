"""Harness for Socket Mode tests: the bot's Bolt app connected over Bolt's aiohttp Socket Mode
handler to the FakeSlack websocket on 127.0.0.1, which delivers envelopes as Slack does and records
every acknowledgement (`socket-ack` calls carry the envelope_id)."""
from __future__ import annotations

import asyncio
import itertools
import json
from contextlib import asynccontextmanager
from dataclasses import dataclass

from slack_bolt.adapter.socket_mode.aiohttp import AsyncSocketModeHandler
from slack_fake import APP_TOKEN, BOT_TOKEN, FakeSlack

from bot.config import Settings
from bot.history.store import AsyncHistory
from bot.slack.app import create_app
from bot.slack.replies import Deps

# What each kind of request is delivered as in Socket Mode.
ENVELOPE_TYPES = {"event_callback": "events_api", "block_actions": "interactive", "view_submission": "interactive"}
_ENVELOPES = itertools.count(1)


@dataclass
class SocketBot:
    fake: FakeSlack
    deps: Deps

    async def deliver(self, payload: dict, kind: str | None = None) -> str:
        """Send `payload` in an envelope over the bot's socket; its envelope_id."""
        kind = kind or ENVELOPE_TYPES[payload["type"]]
        envelope_id = f"env-{next(_ENVELOPES)}"
        await self.fake.sockets[-1].send_str(json.dumps({
            "envelope_id": envelope_id, "type": kind, "payload": payload,
            "accepts_response_payload": kind != "events_api"}))
        return envelope_id

    def acked(self, envelope_id: str) -> bool:
        return any(c.params.get("envelope_id") == envelope_id for c in self.fake.called("socket-ack"))

    async def wait_acked(self, envelope_ids: list[str], timeout: float = 10.0) -> list[str]:
        """The envelopes still not acknowledged after `timeout` seconds (Slack waits 3 s)."""
        deadline = asyncio.get_running_loop().time() + timeout
        while asyncio.get_running_loop().time() < deadline:
            if all(self.acked(e) for e in envelope_ids):
                break
            await asyncio.sleep(0.05)
        return [e for e in envelope_ids if not self.acked(e)]


@asynccontextmanager
async def socket_bot(tmp_path, kb, scans):
    fake = await FakeSlack().start()
    settings = Settings(slack_bot_token=BOT_TOKEN, slack_app_token=APP_TOKEN, slack_api_url=fake.api_url,
                        db=str(tmp_path / "incidents.db"))
    deps = Deps(settings=settings, kb=kb, scans=scans, history=AsyncHistory(settings.db))
    handler = AsyncSocketModeHandler(create_app(deps), APP_TOKEN)
    await handler.connect_async()
    try:
        for _ in range(200):
            if fake.sockets:
                break
            await asyncio.sleep(0.05)
        yield SocketBot(fake, deps)
    finally:
        await handler.close_async()
        if deps.http is not None:
            await deps.http.close()
        deps.history.close()
        await fake.stop()
