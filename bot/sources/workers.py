"""Diagnoses run in worker processes, so a 200 MB upload never holds up the bot's event loop.

Each worker loads and compiles the knowledge base once (the compiled engines cannot be pickled);
logs reach it as files or bytes and the Diagnosis comes back pickled. A worker lives exactly as
long as its bot: it exits within a second of the bot's death, however the bot died (a kill -9
closes no pipe a worker would notice, so each one watches its parent), and ignores the Ctrl-C
meant for the bot, which stops it in its own time. A pool whose worker died (the OOM killer) is
replaced, so the next diagnosis finds a working one.
"""
from __future__ import annotations

import asyncio
import io
import multiprocessing
import os
import signal
import threading
import time
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool

from bot.engine.diagnose import Diagnoser, Diagnosis
from bot.sources.files import diagnose_files, diagnose_streams

_diagnoser: Diagnoser | None = None


def _init(parent: int) -> None:
    global _diagnoser
    from bot.engine import redact
    from bot.kb.load import load

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    threading.Thread(target=_exit_with, args=(parent,), name="parent-watch", daemon=True).start()
    _diagnoser = Diagnoser(load())
    redact.prepare(plugins=True)


def _exit_with(parent: int) -> None:
    while os.getppid() == parent:  # an orphan is adopted by another process
        time.sleep(0.5)
    os._exit(0)


def _diagnose_files(files: list[tuple[str, str]], jobid: str | None, max_bytes: int | None) -> Diagnosis:
    return diagnose_files(_diagnoser, files, jobid, max_bytes)


def _diagnose_bytes(data: bytes, name: str, jobid: str | None) -> Diagnosis:
    return diagnose_streams(_diagnoser, [(name, io.BytesIO(data))], jobid)


class ScanPool:
    """A small process pool; its methods are awaitable from the event loop."""

    def __init__(self, workers: int = 2) -> None:
        self._workers = workers
        self._pool = self._new_pool()

    def _new_pool(self) -> ProcessPoolExecutor:
        context = multiprocessing.get_context("spawn")  # no fork of a process running an event loop
        return ProcessPoolExecutor(max_workers=self._workers, mp_context=context, initializer=_init,
                                   initargs=(os.getpid(),))

    async def _run(self, fn, *args) -> Diagnosis:
        pool = self._pool
        try:
            return await asyncio.get_running_loop().run_in_executor(pool, fn, *args)
        except BrokenProcessPool:
            if pool is self._pool:  # the first caller to notice replaces it; the request is retried
                self._pool = self._new_pool()
                pool.shutdown(wait=False)
            raise

    async def text(self, text: str, name: str = "<paste>", jobid: str | None = None) -> Diagnosis:
        return await self._run(_diagnose_bytes, text.encode("utf-8", "replace"), name, jobid)

    async def files(self, files: list[tuple[str, str]], jobid: str | None = None,
                    max_bytes: int | None = None) -> Diagnosis:
        return await self._run(_diagnose_files, files, jobid, max_bytes)

    def close(self) -> None:
        """Stop now: a scan still running is ended (its request was left for the next start)."""
        processes = list((self._pool._processes or {}).values())  # Python 3.14 has terminate_workers()
        self._pool.shutdown(wait=False, cancel_futures=True)
        for process in processes:
            process.terminate()
