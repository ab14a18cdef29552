"""Many files of one job (one per rank: 64-1024 of them) scanned by several processes when more
than one core is free; the results are merged in file order.

The workers are forked from a process that has compiled the knowledge base, so they start in
milliseconds with the engine already built. Files are handed out in contiguous batches, a few per
worker: each worker holds one file open at a time, and the parent holds at most one bounded
result per batch, so memory and open files stay bounded whatever the number of files.
"""
from __future__ import annotations

import itertools
import multiprocessing
import os
import threading
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from bot.engine.diagnose import Diagnoser
from bot.engine.scan import ScanResult

MIN_BYTES = 32 << 20  # below this a job is scanned faster than processes start
MAX_WORKERS = 8
BATCHES_PER_WORKER = 4

_diagnoser: Diagnoser | None = None


def _init(diagnoser: Diagnoser) -> None:
    global _diagnoser
    _diagnoser = diagnoser


def _scan_batch(files: list[tuple[str, str]], max_bytes: int | None) -> ScanResult:
    from bot.sources.files import scan_files  # files.py calls this module

    return scan_files(_diagnoser, files, max_bytes)


def workers_for(files: list[tuple[str, str]]) -> int:
    """How many processes should scan these files: 1 unless there are several big enough files,
    cores that other processes leave free, and fork (the workers inherit the compiled engine) in a
    process without other threads (the CLI, the bot's scan workers)."""
    if len(files) < 2 or "fork" not in multiprocessing.get_all_start_methods() or threading.active_count() > 1:
        return 1  # forking a process that runs other threads can copy a lock some thread holds
    try:
        size = sum(os.stat(path).st_size for path, _ in files if path != "-")
    except OSError:
        return 1  # the scan in this process says what is wrong with the file
    if size < MIN_BYTES or any(path == "-" for path, _ in files):
        return 1
    free = len(os.sched_getaffinity(0)) - _busy()
    return max(1, min(int(free), len(files), MAX_WORKERS))


def _busy() -> float:
    """Cores other processes use now: the kernel's count of runnable tasks, less this one (the
    load average lags by a minute and counts this process's own previous work)."""
    try:
        running = Path("/proc/loadavg").read_text().split()[3].split("/")[0]
        return max(0, int(running) - 1)
    except (OSError, ValueError, IndexError):
        return os.getloadavg()[0]


def scan(diagnoser: Diagnoser, files: list[tuple[str, str]], max_bytes: int | None, workers: int) -> ScanResult:
    """Scan `files` in `workers` processes into one result, in file order."""
    n = min(len(files), workers * BATCHES_PER_WORKER)
    batches = [files[i * len(files) // n:(i + 1) * len(files) // n] for i in range(n)]
    result = ScanResult()
    context = multiprocessing.get_context("fork")
    with ProcessPoolExecutor(workers, mp_context=context, initializer=_init, initargs=(diagnoser,)) as pool:
        for part in pool.map(_scan_batch, batches, itertools.repeat(max_bytes)):
            result.merge(part)
    return result
