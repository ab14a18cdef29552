"""The Slack Web API client: any base URL, 429 Retry-After honoured (capped), 5xx retried."""
from __future__ import annotations

import asyncio
import random

from slack_sdk.http_retry.builtin_async_handlers import (
    AsyncConnectionErrorRetryHandler,
    AsyncRateLimitErrorRetryHandler,
    AsyncServerErrorRetryHandler,
)
from slack_sdk.web.async_client import AsyncWebClient

MAX_RETRY_AFTER = 30.0  # seconds; a longer wait would outlive the user's patience


class CappedRateLimitRetryHandler(AsyncRateLimitErrorRetryHandler):
    """Waits what Slack's Retry-After says, but never longer than MAX_RETRY_AFTER."""

    async def prepare_for_next_attempt_async(self, *, state, request, response=None, error=None) -> None:
        if response is None:
            raise error
        value = next((v for k, v in response.headers.items() if k.lower() == "retry-after"), ["1"])
        try:
            wait = float(value[0] if isinstance(value, list) else value)
        except ValueError:
            wait = 1.0
        state.next_attempt_requested = True
        await asyncio.sleep(min(wait, MAX_RETRY_AFTER) + random.random() * 0.1)
        state.increment_current_attempt()


class AnyServerErrorRetryHandler(AsyncServerErrorRetryHandler):
    """Retries every 5xx, not only 500 and 503."""

    async def _can_retry_async(self, *, state, request, response=None, error=None) -> bool:
        return response is not None and 500 <= response.status_code < 600


def web_client(token: str | None, base_url: str) -> AsyncWebClient:
    return AsyncWebClient(
        token=token,
        base_url=base_url,
        retry_handlers=[
            AsyncConnectionErrorRetryHandler(max_retry_count=2),
            CappedRateLimitRetryHandler(max_retry_count=3),
            AnyServerErrorRetryHandler(max_retry_count=2),
        ],
    )
