"""The files of one job scanned by several processes when more than one core is free: many files
(one per rank: 64-1024 of them) in batches, or a big file cut into byte ranges at line starts; the
results are merged in file order.

The workers are forked from a process that has compiled the knowledge base, so they start in
milliseconds with the engine already built. Files are handed out in contiguous batches, a few per
worker: each worker holds one file open at a time, and the parent holds at most one bounded
result per batch or piece, so memory and open files stay bounded whatever the number of files.
A piece's result is bounded the same way, and its trend series comes back as the values it read
(bot/engine/trends.py: Recording), replayed in order, since a running level depends on all before.
"""
from __future__ import annotations

import io
import itertools
import multiprocessing
import os
import threading
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from bot.engine.diagnose import Diagnoser
from bot.engine.scan import Piece, ScanResult

MIN_BYTES = 32 << 20  # below this a job is scanned faster than processes start
MAX_WORKERS = 8
BATCHES_PER_WORKER = 4
_GZIP_MAGIC = b"\x1f\x8b"

_diagnoser: Diagnoser | None = None


def _init(diagnoser: Diagnoser) -> None:
    global _diagnoser
    _diagnoser = diagnoser


def _scan_batch(files: list[tuple[str, str]], max_bytes: int | None) -> ScanResult:
    from bot.sources.files import scan_files  # files.py calls this module

    return scan_files(_diagnoser, files, max_bytes)


class _Range(io.RawIOBase):
    """The bytes [start, stop) of an open file, read with pread (the file's position is not used)."""

    def __init__(self, fd: int, start: int, stop: int) -> None:
        self._fd, self._pos, self._stop = fd, start, stop

    def readable(self) -> bool:
        return True

    def readinto(self, b) -> int:
        with memoryview(b) as view:
            want = min(len(view), self._stop - self._pos)
            if want <= 0:
                return 0
            n = os.preadv(self._fd, [view[:want]], self._pos)
        self._pos += n
        return n


def _scan_piece(path: str, start: int, stop: int) -> Piece:
    with open(path, "rb") as f:
        return _diagnoser.scanner.scan_piece(_Range(f.fileno(), start, stop), start)


def _splittable(path: str) -> bool:
    """A plain local file (not stdin, not gzip: a compressed stream cannot be entered mid-way)."""
    if path == "-":
        return False
    try:
        with open(path, "rb") as f:
            return f.read(2) != _GZIP_MAGIC and Path(path).is_file()
    except OSError:
        return False  # the scan in this process says what is wrong with the file


def workers_for(files: list[tuple[str, str]]) -> int:
    """How many processes should scan these files: 1 unless they are big enough (several files,
    or one that can be cut into ranges), cores that other processes leave free, and fork (the
    workers inherit the compiled engine) in a process without other threads (the CLI, the bot's
    scan workers)."""
    if "fork" not in multiprocessing.get_all_start_methods() or threading.active_count() > 1:
        return 1  # forking a process that runs other threads can copy a lock some thread holds
    if any(path == "-" for path, _ in files) or (len(files) == 1 and not _splittable(files[0][0])):
        return 1
    try:
        size = sum(os.stat(path).st_size for path, _ in files)
    except OSError:
        return 1
    if size < MIN_BYTES:
        return 1
    free = len(os.sched_getaffinity(0)) - _busy()
    return max(1, min(int(free), MAX_WORKERS, max(len(files), size // (MIN_BYTES // 2))))


def _busy() -> float:
    """Cores other processes use now: the kernel's count of runnable tasks, less this one (the
    load average lags by a minute and counts this process's own previous work)."""
    try:
        running = Path("/proc/loadavg").read_text().split()[3].split("/")[0]
        return max(0, int(running) - 1)
    except (OSError, ValueError, IndexError):
        return os.getloadavg()[0]


def line_starts(path: str, pieces: int) -> list[int]:
    """Offsets cutting a file into about `pieces` ranges, each at the start of a line."""
    size = os.stat(path).st_size
    cuts = [0]
    with open(path, "rb") as f:
        for k in range(1, pieces):
            pos = max(cuts[-1], k * size // pieces)
            f.seek(pos)
            while (block := f.read(1 << 16)) and (i := block.find(b"\n")) == -1:
                pos += len(block)  # a very long line: the next line start is further on
            pos = pos + i + 1 if block else size
            if cuts[-1] < pos < size:
                cuts.append(pos)
    return cuts + [size]


def scan(diagnoser: Diagnoser, files: list[tuple[str, str]], max_bytes: int | None, workers: int) -> ScanResult:
    """Scan `files` in `workers` processes into one result, in file order."""
    context = multiprocessing.get_context("fork")
    with ProcessPoolExecutor(workers, mp_context=context, initializer=_init, initargs=(diagnoser,)) as pool:
        if len(files) < workers and max_bytes is None:
            return _scan_in_pieces(diagnoser, pool, files, workers)
        n = min(len(files), workers * BATCHES_PER_WORKER)
        batches = [files[i * len(files) // n:(i + 1) * len(files) // n] for i in range(n)]
        result = ScanResult()
        for part in pool.map(_scan_batch, batches, itertools.repeat(max_bytes)):
            result.merge(part)
        return result


def _scan_in_pieces(diagnoser: Diagnoser, pool: ProcessPoolExecutor, files: list[tuple[str, str]],
                    workers: int) -> ScanResult:
    """Fewer files than workers (and no cap, for which only a file's first bytes count): each plain
    file is cut into `workers` ranges, a gzip one is scanned whole by one worker."""
    from bot.sources.files import open_path  # files.py calls this module

    for path, name in files:
        with open_path(path, name, []):
            pass  # a binary, a folder or an unreadable file: its clear error before any worker starts
    plans = [(path, name, line_starts(path, workers) if _splittable(path) else None) for path, name in files]
    futures = [[pool.submit(_scan_piece, path, a, b) for a, b in itertools.pairwise(cuts)] if cuts
               else pool.submit(_scan_batch, [(path, name)], None) for path, name, cuts in plans]
    result = ScanResult()
    for (_path, name, cuts), future in zip(plans, futures):
        if cuts:
            diagnoser.scanner.join(name, [f.result() for f in future], result)
        else:
            result.merge(future.result())
    return result
