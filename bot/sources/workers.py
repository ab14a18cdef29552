"""Diagnoses run in worker processes, so a 200 MB upload never holds up the bot's event loop.

Each worker loads and compiles the knowledge base once (the compiled engines cannot be pickled);
logs reach it as files or bytes and the Diagnosis comes back pickled.
"""
from __future__ import annotations

import asyncio
import io
import multiprocessing
from concurrent.futures import ProcessPoolExecutor

from bot.engine.diagnose import Diagnoser, Diagnosis
from bot.sources.files import diagnose_files, diagnose_streams

_diagnoser: Diagnoser | None = None


def _init() -> None:
    global _diagnoser
    from bot.kb.load import load

    _diagnoser = Diagnoser(load())


def _diagnose_files(files: list[tuple[str, str]], jobid: str | None, max_bytes: int | None) -> Diagnosis:
    return diagnose_files(_diagnoser, files, jobid, max_bytes)


def _diagnose_bytes(data: bytes, name: str, jobid: str | None) -> Diagnosis:
    return diagnose_streams(_diagnoser, [(name, io.BytesIO(data))], jobid)


class ScanPool:
    """A small process pool; its methods are awaitable from the event loop."""

    def __init__(self, workers: int = 2) -> None:
        context = multiprocessing.get_context("spawn")  # no fork of a process running an event loop
        self._pool = ProcessPoolExecutor(max_workers=workers, mp_context=context, initializer=_init)

    async def text(self, text: str, name: str = "<paste>", jobid: str | None = None) -> Diagnosis:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._pool, _diagnose_bytes, text.encode("utf-8", "replace"), name, jobid)

    async def files(self, files: list[tuple[str, str]], jobid: str | None = None,
                    max_bytes: int | None = None) -> Diagnosis:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._pool, _diagnose_files, files, jobid, max_bytes)

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
