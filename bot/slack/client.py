"""The Slack Web API clients, and what a failed call means.

Listeners use `web_client`: connection errors, 429 (Retry-After, capped) and 5xx are retried a
few times, and what still fails makes the whole request retryable (bot/slack/deliveries.py).
The outbox uses `outbox_client`, which retries nothing itself: it keeps each reply as a row and
retries for as long as Slack needs (bot/slack/outbox.py). `failure()` tells both what an error is.
"""
from __future__ import annotations

import asyncio
import random
import sqlite3
from dataclasses import dataclass

import aiohttp
from slack_sdk.errors import SlackApiError
from slack_sdk.http_retry.builtin_async_handlers import (
    AsyncConnectionErrorRetryHandler,
    AsyncRateLimitErrorRetryHandler,
    AsyncServerErrorRetryHandler,
)
from slack_sdk.web.async_client import AsyncWebClient

MAX_RETRY_AFTER = 30.0  # seconds a listener's call waits on a 429 before its request is retried later

# ok:false errors that say nothing about the message itself: try again later. The first three
# may come after Slack did the work, so a post that got one is looked up before it is sent again.
UNCERTAIN_ERRORS = {"internal_error", "fatal_error", "request_timeout"}
TRANSIENT_ERRORS = UNCERTAIN_ERRORS | {"ratelimited", "service_unavailable", "team_added_to_org"}
# Where the bot may not post: a channel it was not invited to, a DM between two other people.
NOT_MEMBER = frozenset({"not_in_channel", "channel_not_found"})
# What the common permanent errors mean for the person reading App Home or `incidents show`.
REASONS = {
    "channel_not_found": "the channel was deleted, or the bot cannot see it",
    "not_in_channel": "the bot is not a member of the channel (/invite @trainmedic)",
    "is_archived": "the channel is archived",
    "msg_too_long": "the message is longer than Slack allows",
    "invalid_blocks": "Slack refused the message's blocks",
    "invalid_auth": "the bot token is not valid",
    "token_revoked": "the bot token was revoked",
    "account_inactive": "the bot was removed from the workspace",
    "missing_scope": "the app lacks a scope it needs (see deploy/slack-app-manifest.yaml)",
    "restricted_action": "a workspace setting forbids the bot to post there",
    "message_not_found": "the message it edits was deleted",
    "cant_update_message": "Slack does not let the bot edit that message",
    "edit_window_closed": "the message is too old to be edited",
}


@dataclass(frozen=True)
class Failure:
    """What a failed call means: try again (after `retry_after` if Slack said), or give up."""

    permanent: bool
    reason: str
    retry_after: float | None = None
    uncertain: bool = False  # the call may have done its work before it failed


class Unauthorized(Exception):
    """auth.test failed; its cause says whether that is worth retrying."""


class ResponseUrlError(Exception):
    """A slash command's response_url answered something else than 200."""

    def __init__(self, status: int, body: str) -> None:
        super().__init__(f"response_url answered {status} {body[:100]}".strip())
        self.status = status


def slack_error(exc: SlackApiError) -> str | None:
    """The `error` of Slack's answer (not_in_channel, message_not_found...), if it has one."""
    return exc.response.get("error") if isinstance(exc.response.data, dict) else None


def failure(exc: BaseException) -> Failure | None:
    """How to treat `exc` from a Slack call or our own I/O; None for anything else (a bug)."""
    if isinstance(exc, Unauthorized) and exc.__cause__ is not None:
        return failure(exc.__cause__)
    if isinstance(exc, ResponseUrlError):  # the answer went nowhere unless Slack says it was busy
        if exc.status == 429 or exc.status >= 500:
            return Failure(False, str(exc), uncertain=exc.status >= 500)
        return Failure(True, f"{exc}: Slack refused the answer")
    if isinstance(exc, SlackApiError):
        status = exc.response.status_code
        error = slack_error(exc)
        if status == 429 or error == "ratelimited":
            return Failure(False, "rate limited (429)", retry_after=_retry_after(exc.response.headers))
        if status >= 500:
            return Failure(False, f"Slack answered {status}", uncertain=True)
        if error in TRANSIENT_ERRORS:
            return Failure(False, error, uncertain=error in UNCERTAIN_ERRORS)
        code = error or f"HTTP {status}"
        return Failure(True, f"{code}: {REASONS[code]}" if code in REASONS else code)
    if isinstance(exc, aiohttp.ClientConnectorError):  # nothing was sent
        return Failure(False, f"cannot reach Slack ({exc.__class__.__name__})")
    if isinstance(exc, (aiohttp.ClientError, asyncio.TimeoutError, ConnectionError)):
        return Failure(False, f"no answer from Slack ({exc.__class__.__name__})", uncertain=True)
    if isinstance(exc, (sqlite3.OperationalError, TimeoutError)):
        return Failure(False, f"{exc.__class__.__name__}: {exc}")
    return None  # a bug, or a log that kills its scan worker (BrokenProcessPool): tried a few times only


def _retry_after(headers: dict) -> float:
    value = next((v for k, v in headers.items() if k.lower() == "retry-after"), "1")
    try:
        return max(0.0, float(value[0] if isinstance(value, list) else value))
    except ValueError:
        return 1.0


class CappedRateLimitRetryHandler(AsyncRateLimitErrorRetryHandler):
    """Waits what Slack's Retry-After says, but never longer than MAX_RETRY_AFTER."""

    async def prepare_for_next_attempt_async(self, *, state, request, response=None, error=None) -> None:
        if response is None:
            raise error
        state.next_attempt_requested = True
        await asyncio.sleep(min(_retry_after(response.headers), MAX_RETRY_AFTER) + random.random() * 0.1)
        state.increment_current_attempt()


class AnyServerErrorRetryHandler(AsyncServerErrorRetryHandler):
    """Retries every 5xx, not only 500 and 503."""

    async def _can_retry_async(self, *, state, request, response=None, error=None) -> bool:
        return response is not None and 500 <= response.status_code < 600


def web_client(token: str | None, base_url: str, timeout: float = 30) -> AsyncWebClient:
    return AsyncWebClient(
        token=token,
        base_url=base_url,
        timeout=int(timeout),
        retry_handlers=[
            AsyncConnectionErrorRetryHandler(max_retry_count=2),
            CappedRateLimitRetryHandler(max_retry_count=3),
            AnyServerErrorRetryHandler(max_retry_count=2),
        ],
    )


def outbox_client(token: str | None, base_url: str, timeout: float) -> AsyncWebClient:
    return AsyncWebClient(token=token, base_url=base_url, timeout=int(timeout), retry_handlers=[])
