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
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from typing import Iterator

from bot.history.schema import connect, default_path, migrations
from bot.history.writes import Writes


class History(Writes):
    """Synchronous store: the writes and the queries over one connection. One instance per thread;
    the Slack side wraps it in one writer thread (AsyncHistory)."""

    def __init__(self, path: Path | str | None = None) -> None:
        self.path = Path(path) if path else default_path()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        # Switching a new file to WAL takes an exclusive lock that the busy timeout does not wait
        # for, so two processes opening a new file at once would fail: connect under the file lock.
        with self._lock():
            self.db = connect(self.path)
            migrations.apply(self.db)

    @contextmanager
    def _lock(self) -> Iterator[None]:
        # Migrations from two processes at once: the second waits, then finds nothing pending.
        with open(self.path.with_name(self.path.name + ".lock"), "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            yield

    def close(self) -> None:
        self.db.close()


class AsyncHistory:
    """The history for asyncio code: every call runs on one thread (the one writer), off the loop."""

    def __init__(self, path: Path | str | None = None) -> None:
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="history")
        self._history = self._executor.submit(History, path).result()

    async def call(self, method: str, *args, **kwargs):
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, partial(getattr(self._history, method), *args, **kwargs))

    def close(self) -> None:
        self._executor.submit(self._history.close).result()
        self._executor.shutdown()
