"""`trainmedic serve`: the Bolt app over HTTP (POST /slack/events) or Socket Mode, with GET /healthz.

HTTP mode serves Bolt's own aiohttp application (request signatures checked by Bolt). Socket
Mode suits clusters behind a firewall: the bot dials out to Slack, and /healthz answers 503 while
the socket is down so an orchestrator can restart it.
"""
from __future__ import annotations

import asyncio
import logging
import signal
from typing import Awaitable, Callable

from aiohttp import web

from bot.config import ConfigError, Settings

log = logging.getLogger("trainmedic")


def _healthz(check: Callable[[], Awaitable[bool]]):
    async def handler(_request: web.Request) -> web.Response:
        ok = await check()
        return web.json_response({"ok": ok}, status=200 if ok else 503)

    return handler


async def build(settings: Settings):
    """(Bolt app, deps) with the knowledge base, worker pool and history ready."""
    from bot.history.store import AsyncHistory
    from bot.kb.load import load
    from bot.slack.app import create_app
    from bot.slack.replies import Deps
    from bot.sources.workers import ScanPool

    history = AsyncHistory(settings.db)
    if settings.retention_days:
        purged = await history.call("purge", settings.retention_days)
        if purged:
            log.info("purged %d incidents older than %d days", purged, settings.retention_days)
    deps = Deps(settings=settings, kb=load(), scans=ScanPool(), history=history)
    await deps.scans.text("warm-up")  # workers load and compile the knowledge base now, not on the first log
    return create_app(deps), deps


async def _close(deps) -> None:
    if deps.http is not None:
        await deps.http.close()
    deps.scans.close()
    deps.history.close()


async def run(settings: Settings, port: int, socket_mode: bool, host: str = "0.0.0.0") -> None:
    """Serve until SIGTERM or SIGINT."""
    if socket_mode and not settings.slack_app_token:
        raise ConfigError("Socket Mode needs SLACK_APP_TOKEN (an xapp- app-level token with connections:write)")
    if not socket_mode and not settings.slack_signing_secret:
        raise ConfigError("HTTP mode needs SLACK_SIGNING_SECRET to check that requests come from Slack")
    if not settings.slack_bot_token:
        raise ConfigError("SLACK_BOT_TOKEN is not set")
    if socket_mode:  # a refused app token ends the start here, not in a socket client's endless retries
        from bot.slack.tokens import check_app_token

        await check_app_token(settings)
    bolt, deps = await build(settings)
    socket = connecting = None
    if socket_mode:
        from slack_bolt.adapter.socket_mode.aiohttp import AsyncSocketModeHandler

        socket = AsyncSocketModeHandler(bolt, settings.slack_app_token)
        web_app = web.Application()
        web_app.router.add_get("/healthz", _healthz(socket.client.is_connected))
    else:
        web_app = bolt.web_app(path="/slack/events", port=port)

        async def always() -> bool:
            return True

        web_app.router.add_get("/healthz", _healthz(always))
    runner = web.AppRunner(web_app)
    await runner.setup()
    await web.TCPSite(runner, host, port).start()
    if socket is not None:  # /healthz answers 503 until the socket is up (the client retries on its own)
        connecting = asyncio.create_task(socket.connect_async())
    mode = "Socket Mode" if socket_mode else "HTTP"
    log.info("trainmedic serving on %s:%d (%s)", host, port, mode)
    print(f"trainmedic serving on {host}:{port} ({mode})", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        await stop.wait()
    finally:
        if socket is not None:
            connecting.cancel()
            await socket.close_async()
        await runner.cleanup()
        await _close(deps)
