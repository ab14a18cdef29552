"""`trainmedic serve`: the bot over HTTP (POST /slack/events) or Socket Mode, with GET /healthz.

`Service` holds the running parts: the serve lock on the database, the history's writer thread,
the knowledge base, the scan workers, the Bolt app with its intake, the delivery worker and the
outbox. `run` serves until SIGTERM or SIGINT, then stops accepting (requests get 503, which Slack
retries), lets running work finish within TRAINMEDIC_SHUTDOWN_GRACE, leaves the rest stored for
the next start, and returns (exit 0). Every start-up failure is a ConfigError: one line, exit 2.
"""
from __future__ import annotations

import asyncio
import logging
import signal
import sqlite3
import time
from dataclasses import dataclass, field
from typing import IO, Awaitable, Callable

from aiohttp import web
from slack_bolt.async_app import AsyncApp

from bot.config import ConfigError, Settings
from bot.history.store import AsyncHistory, lock_for_serving
from bot.slack import endpoint
from bot.slack.app import create_app
from bot.slack.client import outbox_client
from bot.slack.deliveries import Deliveries
from bot.slack.intake import Intake
from bot.slack.outbox import Outbox
from bot.slack.replies import Deps
from bot.sources.workers import ScanPool

log = logging.getLogger("trainmedic")
FORGET_AFTER = 86400.0  # finished requests and sent replies kept this long, for dedup
HOUSEKEEPING_EVERY = 3600.0


@dataclass
class Service:
    settings: Settings
    lock: IO
    deps: Deps
    app: AsyncApp
    intake: Intake
    deliveries: Deliveries
    owns_scans: bool
    tasks: list[asyncio.Task] = field(default_factory=list)

    @classmethod
    async def start(cls, settings: Settings, kb=None, scans: ScanPool | None = None) -> "Service":
        """Open and check the database, resume what a previous run left, start the workers."""
        lock, history = _open_history(settings)
        _log_storage(await history.call("storage"))
        try:
            deps = Deps(settings=settings, kb=kb or _load_kb(), scans=scans or ScanPool(), history=history,
                        outbox=Outbox(history, outbox_client(settings.slack_bot_token, settings.slack_api_url,
                                                             settings.slack_timeout), settings.give_up_after))
        except BaseException:
            history.close()
            lock.close()
            raise
        if scans is None:
            await deps.scans.text("warm-up")  # workers load and compile the knowledge base now, not on the first log
        service: Service
        app, intake = create_app(deps, wake=lambda: service.deliveries.wake())
        service = cls(settings, lock, deps, app, intake, Deliveries(app, deps, settings.give_up_after), scans is None)
        resumed = await history.call("release_working")
        if resumed:
            log.info("resuming %d requests a previous run had not finished", resumed)
        service.tasks = [asyncio.create_task(deps.outbox.run()), asyncio.create_task(service.deliveries.run()),
                         asyncio.create_task(service._housekeeping())]
        return service

    async def _housekeeping(self) -> None:
        while True:
            try:
                await self.deps.history.call("forget_finished", FORGET_AFTER)
                if self.settings.retention_days:
                    purged = await self.deps.history.call("purge", self.settings.retention_days)
                    if purged:
                        log.info("purged %d incidents older than %d days", purged, self.settings.retention_days)
            except sqlite3.Error as exc:
                log.warning("housekeeping skipped: %s", exc)
            await asyncio.sleep(HOUSEKEEPING_EVERY)

    async def stop(self) -> None:
        """Stop accepting; finish what runs within the grace period; close everything."""
        self.intake.accepting = False
        deadline = time.monotonic() + self.settings.shutdown_grace
        await self.deliveries.stop(deadline)
        await self.deps.outbox.stop(deadline)
        for task in self.tasks:
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        if self.deps.http is not None:
            await self.deps.http.close()
        if self.owns_scans:
            self.deps.scans.close()
        self.deps.history.close()
        self.lock.close()


def _open_history(settings: Settings) -> tuple[IO, AsyncHistory]:
    try:
        lock = lock_for_serving(settings.db)
        try:
            history = AsyncHistory(settings.db, serves=True)
        except BaseException:
            lock.close()
            raise
    except (OSError, sqlite3.Error) as exc:
        raise ConfigError(f"cannot use the incident history {settings.db or '(default)'}: {exc} (TRAINMEDIC_DB)") from None
    return lock, history


def _log_storage(s: dict) -> None:
    log.info("history %s: SQLite %s, journal_mode=%s, synchronous=%s, busy_timeout=%d ms", s["path"],
             s["sqlite"], s["journal_mode"], s["synchronous"], s["busy_timeout_ms"])
    if s["journal_mode"] != "wal":
        log.warning("the history is not in WAL mode (%s): readers and the writer block each other", s["journal_mode"])
    if s["wal_reset_bug"]:
        log.warning("SQLite %s has the WAL-reset bug (fixed in 3.51.3, 3.50.7, 3.44.6): the bot writes through one "
                    "connection and other processes may not write this file while it serves; upgrade SQLite to share it",
                    s["sqlite"])


def _load_kb():
    from bot.kb.load import KnowledgeError, load

    try:
        return load()
    except KnowledgeError as exc:
        raise ConfigError(str(exc)) from None


def _healthz(check: Callable[[], Awaitable[bool]]):
    async def handler(_request: web.Request) -> web.Response:
        ok = await check()
        return web.json_response({"ok": ok}, status=200 if ok else 503)

    return handler


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
    service = await Service.start(settings)
    socket = None
    if socket_mode:
        from slack_bolt.adapter.socket_mode.aiohttp import AsyncSocketModeHandler

        socket = AsyncSocketModeHandler(service.app, settings.slack_app_token)
        web_app = web.Application()

        async def healthy() -> bool:
            return service.intake.accepting and await socket.client.is_connected()
    else:
        web_app = endpoint.web_app(service.app, settings.slack_signing_secret, settings.max_request_bytes)

        async def healthy() -> bool:
            return service.intake.accepting
    web_app.router.add_get("/healthz", _healthz(healthy))
    runner = web.AppRunner(web_app)
    await runner.setup()
    try:
        await web.TCPSite(runner, host, port).start()
    except OSError as exc:
        await runner.cleanup()
        await service.stop()
        raise ConfigError(f"cannot listen on {host}:{port}: {exc.strerror or exc} (--port, --host)") from None
    connecting = asyncio.create_task(socket.connect_async()) if socket is not None else None
    mode = "Socket Mode" if socket_mode else "HTTP"
    log.info("trainmedic serving on %s:%d (%s)", host, port, mode)
    print(f"trainmedic serving on {host}:{port} ({mode})", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    log.info("stopping: no new requests; running work has %.0f s", settings.shutdown_grace)
    service.intake.accepting = False
    if socket is not None:  # Slack redelivers what it sends to a closed socket
        connecting.cancel()
        await socket.close_async()
    await service.stop()
    await runner.cleanup()
    log.info("stopped")
