"""Replies from the listeners: record a diagnosis as an incident together with its reply in the
outbox (one transaction), say something in a thread, edit a reply when on-call changes its
status. Nothing here calls Slack: the outbox (bot/slack/outbox.py) posts every row."""
from __future__ import annotations

from dataclasses import dataclass

import aiohttp

from bot import render
from bot.config import Settings
from bot.engine.diagnose import Diagnosis
from bot.history.store import AsyncHistory
from bot.kb.load import KnowledgeBase
from bot.slack import blocks
from bot.slack.outbox import Outbox, next_key
from bot.sources.workers import ScanPool


@dataclass
class Deps:
    """What the Slack listeners need; passed to handlers' register(app, deps), never put into Bolt's context."""

    settings: Settings
    kb: KnowledgeBase
    scans: ScanPool
    history: AsyncHistory
    outbox: Outbox
    http: aiohttp.ClientSession | None = None

    def session(self) -> aiohttp.ClientSession:
        if self.http is None or self.http.closed:
            self.http = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=600, sock_read=60))
        return self.http


def post_row(key: str, channel: str, thread_ts: str | None, text: str, message_blocks: list[dict] | None = None,
             incident: int | None = None) -> dict:
    return {"key": key, "kind": "post", "channel": channel, "thread_ts": thread_ts, "incident": incident,
            "payload": {"text": text, "blocks": message_blocks}}


async def post_diagnosis(deps: Deps, d: Diagnosis, channel: str, thread_ts: str | None, source: str,
                         job: str | None = None, notes: list[str] | None = None) -> dict:
    """Record `d` as an incident with its reply (in the thread, or the channel); return the incident."""
    key = next_key()

    def reply(incident: dict) -> list[dict]:  # runs inside the history's write transaction
        text, message_blocks, cut = blocks.diagnosis_message(d, incident)
        for note in notes or []:
            message_blocks.insert(-1, blocks.context_block(f":information_source: {blocks.escape(note)}"))
        if len(message_blocks) > blocks.BLOCKS_MAX:  # keep the buttons, which come last
            message_blocks = message_blocks[: blocks.BLOCKS_MAX - 1] + message_blocks[-1:]
        rows = [post_row(key, channel, thread_ts, text, message_blocks, incident["id"])]
        if cut:  # the full report as a file in the thread
            rows.append({"key": key + ".file", "kind": "upload", "channel": channel, "thread_ts": thread_ts,
                         "incident": incident["id"],
                         "payload": {"parent": key, "filename": f"trainmedic-incident-{incident['id']}.md",
                                     "title": "Full trainmedic report",
                                     "content": render.to_text(d, markdown=True, incident=incident, notes=notes)}})
        return rows

    incident = await deps.history.call("record", d, source=source, job=job, channel=channel, thread_ts=thread_ts,
                                       reply_key=key, replies=reply)
    deps.outbox.wake()
    return incident


async def say(deps: Deps, channel: str, thread_ts: str | None, text: str) -> None:
    """A plain message in the thread (or the channel), through the outbox."""
    await deps.history.call("enqueue", [post_row(next_key(), channel, thread_ts, text)])
    deps.outbox.wake()


async def refresh_reply(deps: Deps, incident_id: int) -> None:
    """Edit the incident's reply to show its new status (instead of posting a new message)."""
    await deps.history.call("enqueue", [{"key": next_key(), "kind": "update", "channel": await _channel_of(deps, incident_id),
                                         "incident": incident_id}])
    deps.outbox.wake()


async def _channel_of(deps: Deps, incident_id: int) -> str:
    """Where the reply is: an edit waits in that channel's queue, behind the post it edits."""
    row = await deps.history.call("get_row", incident_id)
    return row.get("channel") or "-"
