"""POST /slack/events: what reaches the Bolt app over HTTP.

Before Bolt sees a request: a body over the limit gets 413, a missing or malformed signature
header gets 401 or 400 (a timestamp must be whole seconds), a stale or wrong signature 401; each
refusal is one short log line naming the reason, never the body (anyone who can reach the port
could otherwise write into the log, and a replayed real request would put its pasted log there).
"""
from __future__ import annotations

import logging
import time

from aiohttp import web
from slack_bolt.adapter.aiohttp import to_aiohttp_response
from slack_bolt.async_app import AsyncApp
from slack_bolt.request.async_request import AsyncBoltRequest
from slack_sdk.signature import SignatureVerifier

log = logging.getLogger("trainmedic")

PATH = "/slack/events"
MAX_SKEW = 300  # seconds: Slack's own rule for a signed request's age


def refusal(headers, body: bytes, secret: str, now: float) -> tuple[int, str] | None:
    """(status, reason) when the request is not one Slack signed just now, else None."""
    timestamp = headers.get("X-Slack-Request-Timestamp")
    signature = headers.get("X-Slack-Signature")
    if not timestamp or not signature:
        return 401, "no signature headers"
    if not (timestamp.isascii() and timestamp.isdigit()):
        return 400, "malformed X-Slack-Request-Timestamp"
    if abs(now - int(timestamp)) > MAX_SKEW:
        return 401, "stale timestamp"
    if not SignatureVerifier(secret).is_valid(body, timestamp, signature):
        return 401, "bad signature"
    return None


def web_app(bolt: AsyncApp, secret: str, max_body: int) -> web.Application:
    """The aiohttp application serving PATH; the server adds /healthz."""

    async def events(request: web.Request) -> web.Response:
        try:
            body = await request.read()
        except web.HTTPRequestEntityTooLarge:
            log.warning("refused a request from %s: body over %d KB", request.remote, max_body >> 10)
            return web.Response(status=413, text="request body too large")
        refused = refusal(request.headers, body, secret, time.time())
        if refused:
            log.warning("refused a request from %s: %s", request.remote, refused[1])
            return web.Response(status=refused[0], text=refused[1])
        bolt_req = AsyncBoltRequest(body=body.decode("utf-8", "replace"), query=request.query_string,
                                    headers=dict(request.headers))
        return await to_aiohttp_response(await bolt.async_dispatch(bolt_req))

    app = web.Application(client_max_size=max_body)
    app.router.add_post(PATH, events)
    return app
