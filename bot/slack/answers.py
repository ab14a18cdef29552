"""Where an answer goes when a plain chat.postMessage in the thread is not the right delivery.

- Long work says so at once: a big upload or a Slurm job posts "Diagnosing `rank3.log.gz`
  (212 MB)..." and the answer, or the error, then edits that message (chat.update).
- `/diagnose` works in any conversation, but the bot may post only where it is a member: when
  Slack answers not_in_channel or channel_not_found, the answer goes through the command's
  response_url, in the channel (response_type in_channel) or, if Slack refuses that, to the user.
- Help, "no known failure" and low-confidence answers to a command go to its user only
  (ephemeral), so they add no noise to the incident channel.

`Answer` is the bot's Web API client for one answer, with these decisions applied to what it
posts, so `post_diagnosis` and `report_error` deliver through it unchanged. The calls it makes
beyond the plain post: chat.update (the placeholder), chat.delete (a placeholder whose answer is
private), the response_url POST, chat.postEphemeral (a private answer to an event), and it skips
files.uploadV2 where the answer has no message in the channel to attach the report to.
"""
from __future__ import annotations

import logging

from slack_bolt.context.respond.async_respond import AsyncRespond
from slack_sdk.errors import SlackApiError
from slack_sdk.web.async_client import AsyncWebClient

from bot.engine.diagnose import WELL_SUPPORTED, Diagnosis
from bot.slack.blocks import escape

log = logging.getLogger("trainmedic")

NOT_MEMBER = frozenset({"not_in_channel", "channel_not_found"})
SLOW_BYTES = 64 << 20  # uploads this big (together) take long enough to deserve a placeholder


def private_answer(d: Diagnosis) -> bool:
    """Whether a command's diagnosis goes to its user only: nothing known, or a weak guess."""
    return d.root is None or d.root.score < WELL_SUPPORTED


def progress_text(files: list[dict]) -> str | None:
    """The placeholder for downloading and scanning these files, or None when they are quick."""
    size = sum(int(f.get("size") or 0) for f in files)
    if size < SLOW_BYTES:
        return None
    names = ", ".join(f"`{escape(f.get('name') or f['id']).replace('`', '')}`" for f in files)
    return f":hourglass_flowing_sand: Diagnosing {names} ({size / (1 << 20):,.0f} MB)…"


class Answer(AsyncWebClient):
    """The bot's client for one answer: the same token, address and retries, its posts delivered
    as the module docstring says. `respond` and `user` come with a slash command."""

    def __init__(self, client: AsyncWebClient, respond: AsyncRespond | None = None, user: str | None = None) -> None:
        super().__init__(token=client.token, base_url=client.base_url, timeout=client.timeout, ssl=client.ssl,
                         proxy=client.proxy, session=client.session, headers=client.headers,
                         logger=client.logger, retry_handlers=client.retry_handlers)
        self.respond, self.user = respond, user
        self.private = False  # set before the answer is posted: it then goes to `user` only
        self._placeholder: tuple[str, str] | None = None  # (channel, ts) that the next post edits
        self._outside_channel = False  # the answer went through response_url or was ephemeral

    async def placeholder(self, channel: str, thread_ts: str | None, text: str) -> None:
        """Say at once that long work has started; the answer will take this message's place."""
        try:
            resp = await super().chat_postMessage(channel=channel, thread_ts=thread_ts, text=text)
        except SlackApiError as exc:
            if not self._can_respond(exc):
                raise
            await self.respond(text=text, response_type="ephemeral")
            return
        self._placeholder = (channel, resp["ts"])

    async def chat_postMessage(self, **message) -> dict:
        if self.private:
            return await self._to_user(message)
        if self._placeholder is not None:
            channel, ts = self._placeholder
            self._placeholder = None
            edit = {k: message[k] for k in ("text", "blocks") if message.get(k) is not None}
            return await self.chat_update(channel=channel, ts=ts, **edit)
        try:
            return await super().chat_postMessage(**message)
        except SlackApiError as exc:
            if not self._can_respond(exc):
                raise
            return await self._through_response_url(message)

    async def chat_postEphemeral(self, **message) -> dict:
        """How report_error tells the user: a pending placeholder becomes the error instead."""
        if self._placeholder is not None:
            return await self.chat_postMessage(channel=message["channel"], text=message.get("text"))
        return await self._to_user(message)

    async def files_upload_v2(self, **upload):
        if self._outside_channel:  # an ephemeral answer or a channel the bot is not in
            log.info("full report %s not attached: the answer has no message in the channel", upload.get("filename"))
            return None
        return await super().files_upload_v2(**upload)

    def _can_respond(self, exc: SlackApiError) -> bool:
        return self.respond is not None and exc.response.get("error") in NOT_MEMBER

    async def _to_user(self, message: dict) -> dict:
        if self._placeholder is not None:  # a private answer leaves nothing behind in the channel
            channel, ts = self._placeholder
            self._placeholder = None
            await self.chat_delete(channel=channel, ts=ts)
        self._outside_channel = True
        if self.respond is not None:
            resp = await self.respond(text=message.get("text") or "", blocks=message.get("blocks"),
                                      response_type="ephemeral")
            if resp.status_code != 200:
                raise RuntimeError(f"Slack refused the answer through response_url: {resp.status_code} {resp.body}")
        else:
            await super().chat_postEphemeral(channel=message["channel"], user=message.get("user") or self.user,
                                             text=message.get("text"), blocks=message.get("blocks"))
        return {"ok": True, "channel": message["channel"], "ts": None}  # no message anyone can edit

    async def _through_response_url(self, message: dict) -> dict:
        """In the channel when Slack allows it, else to the user; both through response_url."""
        text, blocks = message.get("text") or "", message.get("blocks")
        resp = await self.respond(text=text, blocks=blocks, response_type="in_channel")
        if resp.status_code != 200:
            log.info("response_url refused an in_channel answer (%s %s); answering the user only",
                     resp.status_code, resp.body)
            resp = await self.respond(text=text, blocks=blocks, response_type="ephemeral")
        if resp.status_code != 200:
            raise RuntimeError(f"Slack refused the answer through response_url: {resp.status_code} {resp.body}")
        self._outside_channel = True
        return {"ok": True, "channel": message["channel"], "ts": None}
