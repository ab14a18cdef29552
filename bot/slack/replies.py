"""Posting a diagnosis into Slack: record the incident, reply in the thread, attach a long report,
edit the reply when on-call changes its status, and turn failures into a message with an error id."""
from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass

import aiohttp
from slack_sdk.web.async_client import AsyncWebClient

from bot import render
from bot.config import Settings
from bot.engine.diagnose import Diagnosis
from bot.history.store import AsyncHistory
from bot.kb.load import KnowledgeBase
from bot.slack import blocks
from bot.sources.workers import ScanPool

log = logging.getLogger("trainmedic")


@dataclass
class Deps:
    """What the Slack listeners need; passed to handlers' register(app, deps), never put into Bolt's context."""

    settings: Settings
    kb: KnowledgeBase
    scans: ScanPool
    history: AsyncHistory
    http: aiohttp.ClientSession | None = None

    def session(self) -> aiohttp.ClientSession:
        if self.http is None or self.http.closed:
            self.http = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=600, sock_read=60))
        return self.http


async def post_diagnosis(client: AsyncWebClient, deps: Deps, d: Diagnosis, channel: str, thread_ts: str | None,
                         source: str, job: str | None = None, notes: list[str] | None = None) -> dict:
    """Record `d` as an incident and post it in the thread (or the channel); return the incident."""
    incident = await deps.history.call("record", d, source=source, job=job, channel=channel, thread_ts=thread_ts)
    text, message_blocks, cut = blocks.diagnosis_message(d, incident)
    for note in notes or []:
        message_blocks.insert(-1, blocks.context_block(f":information_source: {blocks.escape(note)}"))
    if len(message_blocks) > blocks.BLOCKS_MAX:  # keep the buttons, which come last
        message_blocks = message_blocks[: blocks.BLOCKS_MAX - 1] + message_blocks[-1:]
    resp = await client.chat_postMessage(channel=channel, thread_ts=thread_ts, text=text, blocks=message_blocks,
                                         unfurl_links=False)
    await deps.history.call("save_message", incident["id"], channel, resp["ts"], thread_ts, text, message_blocks)
    if cut:
        await client.files_upload_v2(
            channel=channel, thread_ts=resp["ts"] if thread_ts is None else thread_ts,
            content=render.to_text(d, markdown=True, incident=incident, notes=notes),
            filename=f"trainmedic-incident-{incident['id']}.md", title="Full trainmedic report",
        )
    return incident


async def refresh_reply(client: AsyncWebClient, deps: Deps, incident_id: int) -> None:
    """Edit the incident's reply to show its new status (instead of posting a new message)."""
    message = await deps.history.call("message_for", incident_id)
    if message is None:
        return
    status = blocks.status_line(await deps.history.call("get_row", incident_id))
    kept = [b for b in message["blocks"] if b.get("block_id") != "incident_status"]
    if status:
        kept.insert(len(kept) - 1, {"type": "context", "block_id": "incident_status",
                                    "elements": [{"type": "mrkdwn", "text": status}]})
    await client.chat_update(channel=message["channel"], ts=message["ts"], text=message["text"], blocks=kept)


async def report_error(client: AsyncWebClient, channel: str | None, thread_ts: str | None, what: str,
                       user: str | None = None) -> str:
    """Log the current exception with a short id and tell the user that id."""
    error_id = uuid.uuid4().hex[:8]
    log.exception("error %s while %s", error_id, what)
    if channel:
        text = (f":warning: trainmedic failed while {what} (error id `{error_id}`). "
                "Nothing was lost; on-call can find the details in the bot's log under that id.")
        try:
            if user:
                await client.chat_postEphemeral(channel=channel, user=user, text=text)
            else:
                await client.chat_postMessage(channel=channel, thread_ts=thread_ts, text=text)
        except Exception:  # noqa: BLE001 - the error is already logged; Slack itself may be the problem
            log.exception("could not report error %s to Slack", error_id)
    return error_id
