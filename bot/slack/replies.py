"""Replies from the listeners: record a diagnosis as an incident together with its reply in the
outbox (one transaction), say something, put up a placeholder for long work, edit a reply when
on-call changes its status. Nothing here calls Slack: the outbox (bot/slack/outbox.py) posts,
edits and deletes every row, and decides at send time how a `Target` is reached."""
from __future__ import annotations

from dataclasses import dataclass, replace

import aiohttp

from bot import render
from bot.config import Settings
from bot.engine.diagnose import Diagnosis
from bot.history.store import AsyncHistory
from bot.kb.load import KnowledgeBase
from bot.slack import blocks
from bot.slack.outbox import Outbox, attempt, command_of, next_key, placeholder_key
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


@dataclass(frozen=True)
class Target:
    """Where an answer goes: a thread, or the channel itself (`thread_ts` None). For a slash command,
    `command` (outbox.command_of) lets the outbox answer through its response_url where the bot is
    not a member; `private` answers one user only (the command's, or `user`); `replaces` is the key
    of a placeholder the answer takes the place of."""

    channel: str
    thread_ts: str | None = None
    command: dict | None = None
    private: bool = False
    user: str | None = None
    replaces: str | None = None

    def payload(self, text: str, message_blocks: list[dict] | None = None) -> dict:
        extra = {"command": self.command, "private": self.private or None, "user": self.user, "replaces": self.replaces}
        return {"text": text, "blocks": message_blocks, **{k: v for k, v in extra.items() if v}}


def command_target(command: dict) -> Target:
    """The channel a slash command was typed in, with what it takes to answer it anywhere."""
    current = attempt()
    return Target(command["channel_id"], command=command_of(command, current.delivery, current.received))


def post_row(key: str, target: Target, text: str, message_blocks: list[dict] | None = None,
             incident: int | None = None) -> dict:
    return {"key": key, "kind": "post", "channel": target.channel, "thread_ts": target.thread_ts, "incident": incident,
            "payload": target.payload(text, message_blocks)}


async def post_diagnosis(deps: Deps, d: Diagnosis, target: Target, source: str, job: str | None = None,
                         notes: list[str] | None = None) -> dict:
    """Record `d` as an incident with its reply (in the thread, or the channel); return the incident."""
    key = next_key()

    def reply(incident: dict) -> list[dict]:  # runs inside the history's write transaction
        text, message_blocks, cut = blocks.diagnosis_message(d, incident)
        for note in notes or []:
            message_blocks.insert(-1, blocks.context_block(f":information_source: {blocks.escape(note)}"))
        if len(message_blocks) > blocks.BLOCKS_MAX:  # keep the buttons, which come last
            message_blocks = message_blocks[: blocks.BLOCKS_MAX - 1] + message_blocks[-1:]
        rows = [post_row(key, target, text, message_blocks, incident["id"])]
        if cut and not target.private:  # the full report as a file in the thread
            rows.append({"key": key + ".file", "kind": "upload", "channel": target.channel,
                         "thread_ts": target.thread_ts, "incident": incident["id"],
                         "payload": {"parent": key, "filename": f"trainmedic-incident-{incident['id']}.md",
                                     "title": "Full trainmedic report",
                                     "content": render.to_text(d, markdown=True, incident=incident, notes=notes)}})
        return rows

    incident = await deps.history.call("record", d, source=source, job=job, channel=target.channel,
                                       thread_ts=target.thread_ts, reply_key=key, replies=reply)
    deps.outbox.wake()
    return incident


async def say(deps: Deps, target: Target, text: str, message_blocks: list[dict] | None = None) -> None:
    """A message that is no diagnosis (help, a look-up, a warning), through the outbox."""
    await deps.history.call("enqueue", [post_row(next_key(), target, text, message_blocks)])
    deps.outbox.wake()


async def placeholder(deps: Deps, target: Target, text: str) -> Target:
    """Say at once that long work has started; the answer sent to the returned target takes its place
    (and so does the failure notice, should the work fail for good)."""
    key = placeholder_key(attempt().delivery)
    row = post_row(key, target, text)
    row["payload"]["placeholder"] = True
    await deps.history.call("enqueue", [row])
    deps.outbox.wake()
    return replace(target, replaces=key)


async def answers_message(deps: Deps, channel: str, ts: str) -> bool:
    """Whether this request is the one to answer the message at (channel, ts): a message that shares
    a log and mentions the bot arrives twice (file_share and app_mention), and gets one answer."""
    return await deps.history.call("claim_message", attempt().delivery, f"{channel}:{ts}")


async def refresh_reply(deps: Deps, incident_id: int) -> None:
    """Edit the incident's reply to show its new status (instead of posting a new message)."""
    await deps.history.call("enqueue", [{"key": next_key(), "kind": "update", "channel": await _channel_of(deps, incident_id),
                                         "incident": incident_id}])
    deps.outbox.wake()


async def _channel_of(deps: Deps, incident_id: int) -> str:
    """Where the reply is: an edit waits in that channel's queue, behind the post it edits."""
    row = await deps.history.call("get_row", incident_id)
    return row.get("channel") or "-"
