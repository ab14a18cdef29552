"""The incident history store: every diagnosis is an incident in SQLite; repeats are linked by signature.

Only redacted evidence lines are stored, never raw logs. The database runs in WAL mode so readers
never block the writer; `synchronous=NORMAL` (safe against a crashed process, may lose the last
transaction on power loss, which is acceptable for a history) and a 10 s busy timeout let several
processes (the bot, on-call's CLI) write to one file. Write transactions start with BEGIN
IMMEDIATE so two writers queue on the busy timeout instead of failing on a lock upgrade.
"""
from __future__ import annotations

import asyncio
import fcntl
import itertools
import logging
import os
import queue
import sqlite3
import threading
import time
from concurrent.futures import Future
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Callable, Iterator

from bot.history.schema import (
    connect,
    default_path,
    has_wal_reset_bug,
    migrations,
    storage,
)
from bot.history.writes import Writes

log = logging.getLogger("trainmedic")


class History(Writes):
    """Synchronous store: the writes and the queries over one connection. One instance per thread;
    the Slack side wraps it in one writer thread (AsyncHistory). `serves` is True in the bot, which
    holds the file's serve lock (`lock_for_serving`) and commits with synchronous=FULL."""

    def __init__(self, path: Path | str | None = None, serves: bool = False) -> None:
        self.path = Path(path) if path else default_path()
        self.serves = serves
        self.path.parent.mkdir(parents=True, exist_ok=True)
        # Switching a new file to WAL takes an exclusive lock that the busy timeout does not wait
        # for, so two processes opening a new file at once would fail: connect under the file lock.
        with self._lock():
            self.db = connect(self.path)
            if serves:  # the bot acks what it stored: a power cut must not take back the last commits
                self.db.execute("PRAGMA synchronous=FULL")
            pending = migrations.pending(self.db)
            if pending and self._has_data():
                self._backup(pending[0].name)
            migrations.apply(self.db)

    @contextmanager
    def _lock(self) -> Iterator[None]:
        # Migrations from two processes at once: the second waits, then finds nothing pending.
        with open(self.path.with_name(self.path.name + ".lock"), "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            yield

    def _has_data(self) -> bool:
        return any(self.db[t].count for t in self.db.table_names() if not t.startswith("_"))

    def _backup(self, migration: str) -> Path:
        """Copy the file with SQLite's online backup API before a migration changes it."""
        target = self.path.with_name(f"{self.path.name}.before-{migration}.bak")
        copy = sqlite3.connect(target)
        try:
            self.db.conn.backup(copy)
        finally:
            copy.close()
        log.info("backed up %s to %s before applying %s", self.path, target, migration)
        return target

    @contextmanager
    def write(self, busy_ms: int | None = None) -> Iterator:
        with self._shared_file_rule(), super().write(busy_ms) as db:
            yield db

    @contextmanager
    def _shared_file_rule(self) -> Iterator[None]:
        """With the WAL-reset bug, a second process does not write while a bot serves the file."""
        if self.serves or not has_wal_reset_bug():
            yield
            return
        with open(serve_lock_path(self.path), "a") as lock:
            try:
                fcntl.flock(lock, fcntl.LOCK_SH | fcntl.LOCK_NB)
            except BlockingIOError:
                raise sqlite3.OperationalError(
                    f"not written: `trainmedic serve` is using {self.path} and SQLite {sqlite3.sqlite_version} has "
                    "the WAL-reset bug (fixed in 3.51.3, 3.50.7, 3.44.6), which a second writer could trigger") from None
            yield

    def storage(self) -> dict:
        return {"path": str(self.path), **storage(self.db)}

    def close(self) -> None:
        self.db.close()


def serve_lock_path(path: Path) -> Path:
    return path.with_name(path.name + ".serve.lock")


def lock_for_serving(path: Path | str | None, wait: float = 5.0) -> IO:
    """Hold the file's serve lock for the bot's life (the kernel drops it however the bot dies): one
    bot per database, and no other writer while it serves on a SQLite with the WAL-reset bug."""
    path = Path(path) if path else default_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    lock = open(serve_lock_path(path), "a+")
    deadline = time.monotonic() + wait  # a CLI write holds it shared for milliseconds
    while True:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            break
        except BlockingIOError:
            if time.monotonic() > deadline:
                lock.seek(0)
                holder = lock.read().strip() or "another process"
                lock.close()
                raise sqlite3.OperationalError(f"{path} is in use by another `trainmedic serve` (pid {holder})") from None
            time.sleep(0.1)
    lock.truncate(0)
    lock.write(str(os.getpid()))
    lock.flush()
    return lock


class AsyncHistory:
    """The history for asyncio code: every call runs on one thread, the bot's one writing connection,
    off the loop. An urgent call (the write before an ack) goes ahead of the queue and gives up at its
    deadline instead of waiting out the busy timeout."""

    def __init__(self, path: Path | str | None = None, serves: bool = False) -> None:
        self._queue: queue.PriorityQueue = queue.PriorityQueue()
        self._order = itertools.count()
        ready: Future = Future()
        self._thread = threading.Thread(target=self._run, args=(path, serves, ready), name="history", daemon=True)
        self._thread.start()
        ready.result()

    def _run(self, path, serves: bool, ready: Future) -> None:
        try:
            self._history = History(path, serves=serves)
        except BaseException as exc:  # noqa: BLE001 - handed to the constructor's caller
            ready.set_exception(exc)
            return
        ready.set_result(None)
        while True:
            _, _, job = self._queue.get()
            if job is None:
                self._history.close()
                return
            job()

    def _submit(self, priority: int, fn: Callable) -> Future:
        future: Future = Future()

        def job() -> None:
            if future.set_running_or_notify_cancel():
                try:
                    future.set_result(fn())
                except BaseException as exc:  # noqa: BLE001 - the caller gets it
                    future.set_exception(exc)

        self._queue.put((priority, next(self._order), job))
        return future

    async def call(self, method: str, *args, **kwargs):
        return await asyncio.wrap_future(self._submit(1, lambda: getattr(self._history, method)(*args, **kwargs)))

    async def urgent(self, method: str, *args, budget: float):
        """`method(*args, busy_ms=...)` ahead of the queue; TimeoutError when it cannot be done within `budget` s."""
        deadline = time.monotonic() + budget

        def run():
            left_ms = int((deadline - time.monotonic()) * 1000)
            if left_ms <= 0:
                raise TimeoutError("the database was not free in time")
            return getattr(self._history, method)(*args, busy_ms=left_ms)

        future = self._submit(0, run)
        try:  # the margin covers the transaction itself; the job never starts a wait past the deadline
            return await asyncio.wait_for(asyncio.shield(asyncio.wrap_future(future)), budget + 0.25)
        except asyncio.TimeoutError:
            future.cancel()
            raise TimeoutError("the database was not free in time") from None

    def close(self) -> None:
        self._queue.put((2, next(self._order), None))
        self._thread.join()
