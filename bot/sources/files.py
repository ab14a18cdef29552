"""Turn a path, stdin or bytes into a readable byte stream of log text (gzip undone, binaries refused)."""
from __future__ import annotations

import gzip
import io
import zlib
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO, Iterable, Iterator

from bot.engine.diagnose import Diagnoser, Diagnosis
from bot.engine.scan import ScanResult
from bot.sources import parallel

GZIP_MAGIC = b"\x1f\x8b"
_BINARY_MAGIC = {
    b"\x7fELF": "an ELF executable",
    b"\x89PNG": "a PNG image",
    b"\xff\xd8\xff": "a JPEG image",
    b"%PDF": "a PDF document",
    b"PK\x03\x04": "a zip archive (a PyTorch checkpoint is one)",
    b"7z\xbc\xaf": "a 7-zip archive",
    b"BZh": "a bzip2 file",
    b"\xfd7zXZ": "an xz file",
    b"\x28\xb5\x2f\xfd": "a zstd file",
    b"\x80\x02": "a Python pickle",
    b"\x93NUMPY": "a NumPy array",
    b"SQLite format 3": "an SQLite database",
}
_TEXT_CONTROL = set(b"\t\n\r\f\v\b\x1b")
SNIFF_BYTES = 8192


class InputError(Exception):
    """Input that cannot be diagnosed; the message says why in one line."""


def _binary_kind(head: bytes) -> str | None:
    for magic, kind in _BINARY_MAGIC.items():
        if head.startswith(magic):
            return kind
    if not head:
        return None
    control = sum(1 for b in head if b < 32 and b not in _TEXT_CONTROL)
    # NUL runs appear in real logs (a node crashed mid-write), so only a mostly-binary head counts.
    return "binary data" if control / len(head) > 0.3 else None


class _TruncationTolerantGzip(io.RawIOBase):
    """Reads a gzip stream; a truncated or corrupt tail ends the stream and is recorded, not raised."""

    def __init__(self, raw: BinaryIO, warnings: list[str], name: str) -> None:
        self._gz = gzip.GzipFile(fileobj=raw, mode="rb")
        self._warnings = warnings
        self._name = name
        self._done = False

    def readable(self) -> bool:
        return True

    def readinto(self, b) -> int:
        if self._done:
            return 0
        try:
            return self._gz.readinto(b)
        except (EOFError, OSError, zlib.error) as exc:
            self._done = True
            self._warnings.append(f"{self._name}: the gzip stream is damaged or truncated ({exc}); scanned what came before it")
            return 0


@contextmanager
def open_log(raw: BinaryIO, name: str, warnings: list[str]) -> Iterator[BinaryIO]:
    """A byte stream of the log text in `raw`, ungzipped when it is gzip; raise InputError for binaries."""
    buffered = raw if hasattr(raw, "peek") else io.BufferedReader(raw)  # type: ignore[arg-type]
    head = buffered.peek(SNIFF_BYTES)[:SNIFF_BYTES]
    if head.startswith(GZIP_MAGIC):
        stream: BinaryIO = io.BufferedReader(_TruncationTolerantGzip(buffered, warnings, name), 1 << 20)
        head = stream.peek(SNIFF_BYTES)[:SNIFF_BYTES]
    else:
        stream = buffered
    kind = _binary_kind(head)
    if kind:
        raise InputError(f"{name}: this is {kind}, not a text log")
    yield stream


@contextmanager
def open_path(path: str, name: str, warnings: list[str]) -> Iterator[BinaryIO]:
    """Open a local file (or '-' for stdin) as a log stream; InputError when it cannot be read."""
    if path == "-":
        import sys

        with open_log(sys.stdin.buffer, name, warnings) as stream:
            yield stream
        return
    p = Path(path)
    if p.is_dir():
        raise InputError(f"{path}: is a folder; give the log files inside it")
    try:
        raw = open(p, "rb")
    except OSError as exc:
        raise InputError(f"{path}: cannot open it: {exc.strerror or exc}") from None
    with raw, open_log(raw, name, warnings) as stream:
        yield stream


class Capped(io.RawIOBase):
    """Ends a stream after `limit` bytes and says so: the cap on decompressed text (gzip bombs)."""

    def __init__(self, stream: BinaryIO, limit: int, warnings: list[str], name: str) -> None:
        self._stream = stream
        self._left = limit
        self._limit = limit
        self._warnings = warnings
        self._name = name

    def readable(self) -> bool:
        return True

    def readinto(self, b) -> int:
        if self._left <= 0:
            if self._stream.read(1):
                self._warnings.append(
                    f"{self._name}: the text passed the {self._limit / 2**20:g} MB cap (a gzip bomb?); "
                    "scanned only what came before it")
            return 0
        with memoryview(b) as view:
            n = self._stream.readinto(view[: self._left])
        self._left -= n
        return n



def _capped(text: BinaryIO, name: str, warnings: list[str], max_bytes: int | None) -> BinaryIO:
    return io.BufferedReader(Capped(text, max_bytes, warnings, name), 1 << 20) if max_bytes else text


def _from_raw(raw: Iterable[tuple[str, BinaryIO]], warnings: list[str],
              max_bytes: int | None) -> Iterator[tuple[str, BinaryIO]]:
    for name, stream in raw:
        with open_log(stream, name, warnings) as text:
            yield name, _capped(text, name, warnings, max_bytes)


def _from_files(files: list[tuple[str, str]], warnings: list[str],
                max_bytes: int | None) -> Iterator[tuple[str, BinaryIO]]:
    # Each file is opened in turn and closed before the next, so a job of 1,000 files holds one.
    for path, name in files:
        with open_path(path, name, warnings) as text:
            yield name, _capped(text, name, warnings, max_bytes)


def diagnose_streams(diagnoser: Diagnoser, streams: Iterable[tuple[str, BinaryIO]], jobid: str | None = None,
                     max_bytes: int | None = None) -> Diagnosis:
    """Diagnose raw streams (gzip allowed) as one job, each cut after `max_bytes` of text if given;
    raises InputError for binaries."""
    warnings: list[str] = []
    return diagnoser.diagnose(_from_raw(streams, warnings, max_bytes), jobid, warnings)


def scan_files(diagnoser: Diagnoser, files: list[tuple[str, str]], max_bytes: int | None) -> ScanResult:
    """Scan files one after another in this process into one result."""
    result = ScanResult()
    for name, stream in _from_files(files, result.warnings, max_bytes):
        diagnoser.scanner.scan(stream, name, result)
    return result


def diagnose_files(diagnoser: Diagnoser, files: list[tuple[str, str]], jobid: str | None = None,
                   max_bytes: int | None = None) -> Diagnosis:
    """Diagnose files given as (path, name to show; '-' is stdin) as one job: local files,
    downloads, a Slurm job's log tails; many big files in several processes where cores are
    free (bot/sources/parallel.py). Raises InputError for what cannot be read."""
    workers = parallel.workers_for(files)
    if workers > 1:
        result = parallel.scan(diagnoser, files, max_bytes, workers)
    else:
        result = scan_files(diagnoser, files, max_bytes)
    return diagnoser.analyse(result, jobid)


def diagnose_paths(diagnoser: Diagnoser, paths: list[str], jobid: str | None = None) -> Diagnosis:
    """Diagnose local files ('-' is stdin), one per rank or one for the job, as one job."""
    return diagnose_files(diagnoser, [(p, "<stdin>" if p == "-" else p) for p in paths], jobid)
