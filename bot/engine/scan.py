"""One streaming pass over a log: every fingerprint and marker matched at once, memory bounded.

Bytes are read with readinto() into one reused buffer and scanned a chunk at a time; only lines
that the engine reports are decoded, confirmed with RE2 and kept (a bounded number per
fingerprint), so the cost of a log is one engine pass plus work proportional to its hits.
"""
from __future__ import annotations

import bisect
from collections import deque
from dataclasses import dataclass, field
from typing import BinaryIO

from bot.engine import markers, trends
from bot.engine.context import line_context
from bot.engine.redact import clip, redact
from bot.kb.load import Fingerprint, KnowledgeBase
from bot.match import engines

CHUNK_BYTES = 16 << 20
MAX_HIT_LINE = 64 << 10  # bytes of a hit line that are examined
EVIDENCE_CHARS = 400
KEEP_HITS = 5  # first and last hits kept per fingerprint
KEEP_EXCEPTIONS = 8  # last exception lines kept: wrappers print several after the child's own
KEEP_SPREAD = 4096  # distinct ranks/hosts remembered per fingerprint
ITERATION_TAIL = 256 << 10  # bytes at the end of a chunk searched for its last iteration line
TAIL_BYTES = 128 << 10  # bytes at the end of a file read for progress trends (~1000 lines)
_CR_TO_LF = bytes.maketrans(b"\r", b"\n")


@dataclass(frozen=True)
class Hit:
    fingerprint: Fingerprint
    file: int
    line: int
    text: str
    rank: int | None
    host: str | None
    time: str | None
    time_key: tuple[str, float] | None
    groups: dict[str, str]
    iteration: str | None  # training progress when this line was written
    checkpoint: str | None

    @property
    def order(self) -> tuple[int, int]:
        return (self.file, self.line)


@dataclass
class FingerprintHits:
    count: int = 0
    first: list[Hit] = field(default_factory=list)
    last: deque = field(default_factory=lambda: deque(maxlen=KEEP_HITS))
    ranks: set[int] = field(default_factory=set)
    hosts: set[str] = field(default_factory=set)

    def add(self, hit: Hit) -> None:
        self.count += 1
        if len(self.first) < KEEP_HITS:
            self.first.append(hit)
        else:
            self.last.append(hit)
        if hit.rank is not None and len(self.ranks) < KEEP_SPREAD:
            self.ranks.add(hit.rank)
        if hit.host is not None and len(self.hosts) < KEEP_SPREAD:
            self.hosts.add(hit.host)

    @property
    def hits(self) -> list[Hit]:
        return self.first + list(self.last)


@dataclass(frozen=True)
class Marked:
    file: int
    line: int
    text: str


@dataclass
class ScanResult:
    """Everything a diagnosis needs from the text, independent of its size."""

    files: list[str] = field(default_factory=list)
    hits: dict[Fingerprint, FingerprintHits] = field(default_factory=dict)
    lines: int = 0
    bytes: int = 0
    iteration: str | None = None
    checkpoint: str | None = None
    tracebacks: int = 0
    first_errors: list[Marked] = field(default_factory=list)
    last_exceptions: deque = field(default_factory=lambda: deque(maxlen=KEEP_EXCEPTIONS))
    file_lines: list[int] = field(default_factory=list)  # lines of each file, in `files` order
    warnings: list[str] = field(default_factory=list)


def _line(data, end: int, cut: int) -> str:
    """The decoded line of data[:cut] that contains offset `end` (at most MAX_HIT_LINE bytes); a
    newline belongs to the line it ends."""
    start = data.rfind(b"\n", 0, end) + 1
    stop = data.find(b"\n", end, cut)
    stop = cut if stop == -1 else stop
    return bytes(data[start : min(stop, start + MAX_HIT_LINE)]).decode("utf-8", "replace")


def _clip(text: str, start: int, end: int) -> str:
    """The redacted line, or a redacted window of it around the match when the line is very long
    (redaction sees the whole neighbourhood, so the window's edge never cuts a secret in two)."""
    return clip(text, start, end, EVIDENCE_CHARS)


class Scanner:
    """Compiled once per knowledge base; `scan` may be called for many files."""

    def __init__(self, kb: KnowledgeBase, chunk_bytes: int = CHUNK_BYTES, engine_name: str | None = None) -> None:
        self.fingerprints = kb.fingerprints
        self.detectors = {kind: kb.detectors(kind) for kind in trends.KINDS}
        patterns = [fp.pattern for fp in self.fingerprints] + [m.scan for m in markers.LINE_MARKERS]
        self.engine = engines.build(patterns, engine_name)
        self.iteration_engine = engines.build([m.scan for m in markers.ITERATION_MARKERS], engine_name)
        self._confirm = [engines.re2_compile(p, text=True) for p in patterns]
        self.chunk_bytes = chunk_bytes

    def scan(self, stream: BinaryIO, name: str, result: ScanResult) -> ScanResult:
        """Scan one stream into `result` (files scanned one after another form one job)."""
        file_no = len(result.files)
        result.files.append(name)
        buf = bytearray(self.chunk_bytes)
        view = memoryview(buf)
        carry = lines = 0
        tail = b""  # the last TAIL_BYTES scanned, for the progress trends
        while True:
            n = stream.readinto(view[carry:])
            if not n:
                break
            result.bytes += n
            filled = carry + n
            cut = buf.rfind(b"\n", 0, filled) + 1
            if cut == 0 and filled < len(buf):
                carry = filled  # a short read (pipe) in the middle of a line: read on
                continue
            cut = cut or filled  # a line longer than the buffer is split
            lines = self._scan_chunk(buf, cut, file_no, lines, result)
            tail = (tail + bytes(view[max(0, cut - TAIL_BYTES):cut]))[-TAIL_BYTES:]
            buf[: filled - cut] = bytes(view[cut:filled])
            carry = filled - cut
        if carry:
            lines = self._scan_chunk(buf, carry, file_no, lines, result) + 1
            tail = (tail + bytes(view[:carry]))[-TAIL_BYTES:]
        view.release()
        result.lines += lines
        result.file_lines.append(lines)
        self._trends(tail, lines, file_no, result)
        return result

    def _trends(self, tail: bytes, lines: int, file_no: int, result: ScanResult) -> None:
        """Loss spikes and stalls judged from the last lines of the file (bot/engine/trends.py)."""
        if not any(self.detectors.values()):
            return
        text = tail.decode("utf-8", "replace").split("\n")
        if text and text[-1] == "":
            text.pop()  # the file ended with a newline
        if len(tail) == TAIL_BYTES:
            text = text[1:]  # the first line was cut
        first = lines - len(text) + 1
        for trend in trends.analyse([t.rstrip("\r") for t in text]):
            line = text[trend.line].rstrip()
            ctx = line_context(line)
            for fp in self.detectors[trend.kind]:
                hit = Hit(fingerprint=fp, file=file_no, line=first + trend.line,
                          text=f"{_clip(line, 0, 0)}  <- {trend.meaning}", rank=ctx.rank, host=ctx.host,
                          time=ctx.time, time_key=ctx.time_key, groups={"trend": trend.meaning},
                          iteration=trend.iteration, checkpoint=result.checkpoint)
                result.hits.setdefault(fp, FingerprintHits()).add(hit)

    def _iterations(self, chunk: memoryview, data, cut: int, whole: bool) -> list[int]:
        """End offsets of iteration lines: only the tail matters unless a failure needs the ones before it."""
        start = 0
        if not whole and cut > 2 * ITERATION_TAIL:
            start = data.find(b"\n", cut - ITERATION_TAIL, cut) + 1
        ends = [start + end for end, _ in self.iteration_engine.scan(chunk[start:])]
        if not ends and start:
            ends = [end for end, _ in self.iteration_engine.scan(chunk)]
        return ends

    def _last_iteration(self, ends: list[int], lo: int, hi: int, data, cut: int, result: ScanResult) -> int:
        """Set result.iteration from the last iteration line ending in data[:hi] after index lo."""
        i = bisect.bisect_right(ends, hi, lo)
        for end in reversed(ends[lo:i]):
            line = _line(data, end, cut)
            value = next((v for m in markers.ITERATION_MARKERS if (v := markers.extract(m, line))), None)
            if value is not None:
                result.iteration = value
                break
        return i

    def _scan_chunk(self, buf: bytearray, cut: int, file_no: int, lines: int, result: ScanResult) -> int:
        """Scan buf[:cut] whose first line is line `lines + 1`; return the lines counted so far."""
        # A carriage return starts a new visual line (progress bars): scan a copy where it is a newline.
        data = bytes(buf[:cut]).translate(_CR_TO_LF) if buf.find(b"\r", 0, cut) != -1 else buf
        with memoryview(data)[:cut] as chunk:
            hits = self.engine.scan(chunk)
            has_failure = any(pid < len(self.fingerprints) for _, pid in hits)
            iterations = self._iterations(chunk, data, cut, has_failure)
        counted = done = 0
        line_no = lines + 1
        seen: dict[int, int] = {}
        for end, pid in hits:
            end -= 1  # the match's last byte: a pattern ending in `\s` may end on its line's newline
            start = data.rfind(b"\n", 0, end) + 1
            if seen.get(pid) == start:
                continue  # the same pattern ending again on the same line
            seen[pid] = start
            line_no += buf.count(b"\n", counted, start)
            counted = start
            if pid < len(self.fingerprints):
                done = self._last_iteration(iterations, done, start, data, cut, result)
            self._on_line(pid, _line(data, end, cut), file_no, line_no, result)
        self._last_iteration(iterations, done, cut, data, cut, result)
        return lines + buf.count(b"\n", 0, cut)

    def _on_line(self, pid: int, text: str, file_no: int, line_no: int, result: ScanResult) -> None:
        match = self._confirm[pid].search(text)
        if match is None:
            return  # the engine found only a required literal, or its match ran across a line end
        if pid >= len(self.fingerprints):
            self._on_marker(markers.LINE_MARKERS[pid - len(self.fingerprints)], text, file_no, line_no, result)
            return
        fp = self.fingerprints[pid]
        ctx = line_context(text)
        groups = {k: redact(v) for k, v in match.groupdict().items() if v is not None}
        hit = Hit(
            fingerprint=fp, file=file_no, line=line_no, text=_clip(text, *match.span()),
            rank=ctx.rank, host=ctx.host, time=ctx.time, time_key=ctx.time_key, groups=groups,
            iteration=result.iteration, checkpoint=result.checkpoint,
        )
        result.hits.setdefault(fp, FingerprintHits()).add(hit)

    @staticmethod
    def _on_marker(marker: markers.Marker, text: str, file_no: int, line_no: int, result: ScanResult) -> None:
        value = markers.extract(marker, text)
        if value is None:
            return
        if marker.kind == markers.CHECKPOINT:
            result.checkpoint = redact(value)
        elif marker.kind == markers.TRACEBACK:
            result.tracebacks += 1
        elif marker.kind == markers.EXCEPTION:
            result.last_exceptions.append(Marked(file_no, line_no, _clip(text, 0, 0)))
        elif len(result.first_errors) < 3:
            result.first_errors.append(Marked(file_no, line_no, _clip(text, 0, 0)))
