"""One streaming pass over a log: every fingerprint and marker matched at once, memory bounded.

Bytes are read with readinto() into one reused buffer and scanned a chunk at a time. The work per
reported line is what its use needs: a fingerprint's first KEEP_HITS lines are confirmed with RE2
when they are seen, later ones cost a counter and the rank/host read from the bytes of the line's
start; a chunk's last KEEP_HITS lines of each fingerprint, its last exceptions and the checkpoint
line before each of them are copied out when the chunk ends. Decoding, confirming, clipping,
redacting and reading the context of a line happen once per file, for the lines that are kept.
"""
from __future__ import annotations

import bisect
import functools
import io
import itertools
import re
from collections import deque
from dataclasses import dataclass, field, replace
from typing import BinaryIO

import stringzilla

from bot.engine import markers, trends
from bot.engine.context import line_context, logged_exception
from bot.engine.redact import clip, redact
from bot.kb.load import Fingerprint, KnowledgeBase
from bot.match import engines

CHUNK_BYTES = 8 << 20  # with its carriage-return copy (_without_cr), 16 MiB of buffers a scanner
WINDOW_BEFORE, WINDOW_AFTER = 3 << 10, 1 << 10  # bytes of a long line kept around a report
HEAD_BYTES = 2000  # the start of a kept line, read for its rank, host and time
EVIDENCE_CHARS = 400
KEEP_HITS = 5  # first and last hits kept per fingerprint
KEEP_SPREAD = 4096  # distinct ranks/hosts remembered per fingerprint
# Each repeat of a fingerprint gives its rank/host until SPREAD_STALE reads in a row added none
# (a per-rank file names one rank; an interleaved 1,024-rank log keeps naming new ones), then every 16th.
SPREAD_STALE, SPREAD_EVERY = 64, 16
KEEP_ERRORS = 3
KEEP_EXCEPTIONS = 8  # last exception lines kept: wrappers print several after the child's own
ITERATION_LOOKBACK = (1 << 10, 8 << 10, 512 << 10)  # windows searched back for the iteration line before a kept line
TAIL_BYTES = 64 << 10  # the end of a file, read for its last timestamp (a hang)
_CR_TO_LF = bytes(range(256)).replace(b"\r", b"\n")  # a StringZilla look-up table
_FINGERPRINT = "fingerprint"

# Rank and host of a repeated line, read from its first bytes (the kept lines get bot/engine/context.py).
# NCCL's `host:pid:tid [N]` prefix names the host; N is the CUDA device, not the rank.
_SPREAD = re.compile(
    rb"(?:(?P<h1>[a-z][a-z0-9-]*\d[a-z0-9.-]*): )?.{0,80}?"
    rb"(?:\[(?:rank|Rank|RANK) ?(?P<r1>\d{1,6})\]|\[default(?P<r2>\d{1,6})\]:|(?P<h2>[A-Za-z][\w.-]*):\d+:\d+ \[\d{1,4}\])"
)


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
        self.spread(hit.rank, hit.host)

    def spread(self, rank: int | None, host: str | None) -> None:
        if rank is not None and len(self.ranks) < KEEP_SPREAD:
            self.ranks.add(rank)
        if host is not None and len(self.hosts) < KEEP_SPREAD:
            self.hosts.add(host)

    def merge(self, later: FingerprintHits) -> None:
        """Add the hits of `later`, which all come after these."""
        ordered = self.hits + later.hits
        for dropped in ordered[KEEP_HITS:-KEEP_HITS]:  # neither first nor last: its rank still counts
            self.spread(*_spread_of(dropped))
        self.count += later.count
        self.first, self.last = ordered[:KEEP_HITS], deque(ordered[KEEP_HITS:], maxlen=KEEP_HITS)
        for rank in later.ranks:
            self.spread(rank, None)
        for host in later.hosts:
            self.spread(None, host)

    @property
    def hits(self) -> list[Hit]:
        return self.first + list(self.last)


@dataclass(frozen=True)
class Marked:
    file: int
    line: int
    text: str
    iteration: str | None = None  # training progress when this line was written (exception lines)
    checkpoint: str | None = None


@dataclass
class ScanResult:
    """Everything a diagnosis needs from the text, independent of its size. Until
    `Scanner.finalize`, kept lines are bytes (`_Raw`), cheap to merge and to pickle."""

    files: list[str] = field(default_factory=list)
    hits: dict[Fingerprint, FingerprintHits] = field(default_factory=dict)
    lines: int = 0
    bytes: int = 0
    tracebacks: int = 0
    first_errors: list[Marked] = field(default_factory=list)
    last_exceptions: deque = field(default_factory=lambda: deque(maxlen=KEEP_EXCEPTIONS))
    warnings: list[str] = field(default_factory=list)
    file_lines: list[int] = field(default_factory=list)  # lines of each file, in `files` order
    file_progress: list[int] = field(default_factory=list)  # each file's last progress line (0: none)
    loss_back: dict[int, int] = field(default_factory=dict)  # by file: the last finite loss logged after NaN/Inf ones
    cut_frames: list[Marked] = field(default_factory=list)  # the last frame of each file that ends inside a traceback
    logged: set[tuple[int, int]] = field(default_factory=set)  # (file, line) of exceptions a handler logged and went on

    def merge(self, later: ScanResult) -> None:
        """Add the result of files scanned on their own (another process), which come after these."""
        shift = len(self.files)
        self.files += later.files
        for fp, fph in later.hits.items():
            moved = FingerprintHits(fph.count, [replace(h, file=h.file + shift) for h in fph.first],
                                    deque((replace(h, file=h.file + shift) for h in fph.last), maxlen=KEEP_HITS),
                                    fph.ranks, fph.hosts)
            if fp in self.hits:
                self.hits[fp].merge(moved)
            else:
                self.hits[fp] = moved
        self.lines += later.lines
        self.file_lines += later.file_lines
        self.file_progress += later.file_progress
        self.loss_back.update((file + shift, line) for file, line in later.loss_back.items())
        self.bytes += later.bytes
        self.tracebacks += later.tracebacks
        room = KEEP_ERRORS - len(self.first_errors)
        self.first_errors += [replace(m, file=m.file + shift) for m in later.first_errors[:max(0, room)]]
        self.last_exceptions.extend(replace(m, file=m.file + shift) for m in later.last_exceptions)
        self.cut_frames += [replace(m, file=m.file + shift) for m in later.cut_frames]
        self.logged |= {(file + shift, line) for file, line in later.logged}
        self.warnings += [w for w in later.warnings if w not in self.warnings]


@dataclass
class Piece:
    """A byte range of one file scanned on its own (bot/sources/parallel.py), kept as bytes and its
    lines numbered from the range's first line until `Scanner.join` puts the pieces together."""

    result: ScanResult
    recording: trends.Recording | None  # its progress values, replayed in file order
    iteration: bytes | None  # its last iteration line, and that line's number in it
    iteration_line: int
    checkpoint: bytes | None  # its last checkpoint line
    tail: bytes


@dataclass(frozen=True)
class _Raw:
    """A kept line as bytes, until the job is done (`Scanner.finalize`): what matched it, where it
    is, what it says, what preceded it. Only the lines still kept then are decoded."""

    pid: int
    file: int
    line: int
    head: bytes  # the line's first HEAD_BYTES
    window: bytes  # the bytes around the report (the whole line unless it is long)
    clipped: bool  # the window starts after the line's start
    iteration: bytes | None  # the last iteration line before it
    checkpoint: bytes | None  # the last checkpoint line before it


def _spread_of(kept: Hit | _Raw) -> tuple[int | None, str | None]:
    """The rank and host of a kept line (a raw one's read from its head)."""
    if isinstance(kept, Hit):
        return kept.rank, kept.host
    rank, host = Scanner._read_spread(kept.head, 0, len(kept.head)) or (None, None)
    return (int(rank) if rank else None), (host.decode() if host else None)


def _clip(text: str, start: int, end: int) -> str:
    """The redacted line, or a redacted window of it around the match when the line is very long
    (redaction sees the whole neighbourhood, so the window's edge never cuts a secret in two)."""
    return clip(text, start, end, EVIDENCE_CHARS)


def _line_bytes(data, start: int, cut: int, limit: int = 4096) -> bytes:
    stop = data.find(b"\n", start, min(cut, start + limit))
    return bytes(data[start : stop if stop != -1 else min(cut, start + limit)])


class _File:
    """What is kept of one file while it is scanned: counters and kept lines as bytes."""

    def __init__(self, n_fingerprints: int, file_no: int, kept: dict[int, int] | None = None) -> None:
        self.file = file_no
        self.count = [0] * n_fingerprints
        self.stale = [0] * n_fingerprints  # spread reads in a row that added no rank or host
        # confirmed first lines still wanted: a job keeps KEEP_HITS in all, so the files before
        # this one (`kept`, by fingerprint) may have found them already
        self.need = [KEEP_HITS] * n_fingerprints
        for pid, n in (kept or {}).items():
            self.need[pid] = max(0, KEEP_HITS - n)
        self.first: dict[int, list[_Raw]] = {}  # by fingerprint, as `last`: a file hits a few of hundreds
        self.last: dict[int, deque] = {}
        self.ranks: dict[int, set] = {}
        self.hosts: dict[int, set] = {}
        self.errors: list[_Raw] = []
        self.exceptions: deque = deque(maxlen=KEEP_EXCEPTIONS)
        self.tracebacks = 0
        self.iteration: bytes | None = None  # the last iteration line of the chunks so far
        self.iteration_line = 0
        self.checkpoint: bytes | None = None
        self.lines = 0  # lines before the chunk being scanned
        self.pos = 0  # bytes before the chunk being scanned
        self.base = 0  # where the stream starts in its file (a piece of it)


class _Lines:
    """Line numbers of offsets in a chunk, counted from the last offset asked (mostly forwards).
    Counted with StringZilla's SIMD count: bytes.count's byte loop took a fifth of a hit-dense scan."""

    def __init__(self, buf: bytearray, first: int) -> None:
        self.buf, self.pos, self.line = buf, 0, first

    def at(self, offset: int) -> int:
        if offset >= self.pos:
            self.line += stringzilla.count(self.buf, b"\n", self.pos, offset)
        else:
            self.line -= stringzilla.count(self.buf, b"\n", offset, self.pos)
        self.pos = offset
        return self.line


class _Progress:
    """The last iteration and checkpoint line before offsets of one chunk, asked in increasing order."""

    def __init__(self, engine: engines.Engine, data, cut: int, before: bytes | None,
                 checkpoints: list[int], checkpoint_before: bytes | None) -> None:
        self.engine, self.data, self.cut = engine, data, cut
        self.known = 0  # the last iteration line ending before `known` is `self.line`
        self.line = before
        self.start: int | None = None  # where `line` starts, when it is in this chunk
        self.checkpoints, self.checkpoint_before = checkpoints, checkpoint_before

    def iteration(self, offset: int) -> bytes | None:
        for size in ITERATION_LOOKBACK + (offset,):
            start = max(self.known, offset - size)
            start = self.data.rfind(b"\n", 0, start) + 1 if start > self.known else start
            ends = self.engine.scan(self.data, start, offset)
            if ends:
                self.start = self.data.rfind(b"\n", 0, ends[-1][0]) + 1
                self.line = _line_bytes(self.data, self.start, self.cut)
                break
            if start <= self.known:
                break
        self.known = offset
        return self.line

    def checkpoint(self, offset: int) -> bytes | None:
        i = bisect.bisect_left(self.checkpoints, offset)
        return _line_bytes(self.data, self.checkpoints[i - 1], self.cut) if i else self.checkpoint_before


class _OnFirstUse:
    """RE2 programs of the patterns, each compiled when first asked for: a scan confirms a few
    dozen of the ~700 patterns, and compiling all of them twice cost a CLI start-up 80 ms."""

    def __init__(self, patterns: list[engines.Pattern], **options: bool) -> None:
        self._patterns, self._options = patterns, options
        self._compiled: dict[int, "re2._Regexp"] = {}

    def __getitem__(self, pid: int) -> "re2._Regexp":
        compiled = self._compiled.get(pid)
        if compiled is None:
            compiled = self._compiled[pid] = engines.re2_compile(self._patterns[pid], **self._options)
        return compiled


class Scanner:
    """Compiled once per knowledge base; `scan` may be called for many files."""

    def __init__(self, kb: KnowledgeBase, chunk_bytes: int = CHUNK_BYTES, engine_name: str | None = None) -> None:
        self.fingerprints = kb.fingerprints
        self._pid = {fp: pid for pid, fp in enumerate(self.fingerprints)}
        self.detectors = {kind: kb.detectors(kind) for kind in trends.KINDS}
        patterns = [fp.pattern for fp in self.fingerprints] + [m.scan for m in markers.LINE_MARKERS]
        self.kinds = [_FINGERPRINT] * len(self.fingerprints) + [m.kind for m in markers.LINE_MARKERS]
        self.engine = engines.build(patterns, engine_name)
        self.iteration_engine = engines.build([m.scan for m in markers.ITERATION_MARKERS], engine_name)
        self.series_engine = engines.build(trends.KEY_PATTERNS, engine_name, prefilter=False)
        self.error_pid = self.kinds.index(markers.ERROR)
        self.error_engine = engines.build([patterns[self.error_pid]], engine_name)
        self._confirm = _OnFirstUse(patterns, text=True)
        self._confirm_lines = _OnFirstUse(patterns, multiline=True)
        self.chunk_bytes = chunk_bytes
        self._buffer = bytearray(chunk_bytes)
        self._lf = bytearray()  # a chunk with carriage returns as newlines, grown to the largest chunk

    def scan(self, stream: BinaryIO, name: str, result: ScanResult) -> ScanResult:
        """Scan one stream into `result` (files scanned one after another form one job)."""
        file_no = len(result.files)
        result.files.append(name)
        kept = {self._pid[fp]: len(fph.first) for fp, fph in result.hits.items() if fp in self._pid}
        st, series, tail = self._read(stream, file_no, 0, None, kept)
        self._finish(st, result)
        _read_tail(tail, st.lines, file_no, result)
        if series is not None:
            self._trends(series.summary, st.iteration, st.iteration_line, st.checkpoint, tail, file_no, result)
        return result

    def scan_piece(self, stream: BinaryIO, offset: int) -> Piece:
        """Scan the part of a file that starts at `offset` (on a line start) for `join`."""
        result = ScanResult(files=["<piece>"])
        st, series, tail = self._read(stream, 0, offset, trends.Recording())
        self._finish(st, result)
        recording = series.summary if series is not None else None
        return Piece(result, recording, st.iteration, st.iteration_line, st.checkpoint, tail)

    def join(self, name: str, pieces: list[Piece], result: ScanResult) -> ScanResult:
        """Add the pieces of one file, in file order, to `result` as that file: line numbers moved
        by the lines before each piece, a kept line with no iteration or checkpoint line before it
        in its piece given the last one of the pieces before, the trend series replayed."""
        file_no = len(result.files)
        result.files.append(name)
        summary = trends.Summary()
        lines = size = iteration_line = 0
        iteration = checkpoint = None
        tail = b""
        for piece in pieces:
            part = piece.result

            def moved(raw: _Raw, progress: bool = True) -> _Raw:
                return replace(raw, file=file_no, line=raw.line + lines, checkpoint=raw.checkpoint or checkpoint,
                               iteration=(raw.iteration or iteration) if progress else raw.iteration)

            for fp, fph in part.hits.items():
                later = FingerprintHits(fph.count, [moved(r) for r in fph.first],
                                        deque(map(moved, fph.last), maxlen=KEEP_HITS), fph.ranks, fph.hosts)
                result.hits.setdefault(fp, FingerprintHits()).merge(later)
            result.tracebacks += part.tracebacks
            room = max(0, KEEP_ERRORS - len(result.first_errors))
            result.first_errors += [moved(r, progress=False) for r in part.first_errors[:room]]
            result.last_exceptions.extend(map(moved, part.last_exceptions))
            if piece.recording is not None:
                piece.recording.replay(summary, lines)
            if piece.iteration is not None:
                iteration, iteration_line = piece.iteration, piece.iteration_line + lines
            checkpoint = piece.checkpoint or checkpoint
            tail = (tail + piece.tail)[-TAIL_BYTES:]
            lines += part.lines
            size += part.bytes
        result.lines += lines
        result.bytes += size
        result.file_lines.append(lines)
        result.file_progress.append(iteration_line)
        _read_tail(tail, lines, file_no, result)
        if any(self.detectors.values()):
            self._trends(summary, iteration, iteration_line, checkpoint, tail, file_no, result)
        return result

    def _read(self, stream: BinaryIO, file_no: int, offset: int, recording: trends.Recording | None,
              kept: dict[int, int] | None = None) -> tuple[_File, trends.Series | None, bytes]:
        """Go through a stream chunk by chunk: what is kept of it, its series and its last bytes."""
        st = _File(len(self.fingerprints), file_no, kept)
        st.base = offset
        series = trends.Series(self.series_engine, recording) if any(self.detectors.values()) else None
        pasted = _in_memory(stream, len(self._buffer))
        if pasted is not None:  # scanned where it lies, as one chunk
            tail = self._chunk(pasted, len(pasted), st, series, b"") if pasted else b""
            if pasted and not pasted.endswith(b"\n"):
                st.lines += 1  # the last line had no newline
            return st, series, tail
        buf = self._buffer  # one per scanner: a job of 1,000 files allocates it once
        view = memoryview(buf)
        carry = 0
        tail = b""
        while True:
            n = stream.readinto(view[carry:])
            if not n:
                break
            filled = carry + n
            cut = buf.rfind(b"\n", 0, filled) + 1
            if cut == 0 and filled < len(buf):
                carry = filled  # a short read (pipe) in the middle of a line: read on
                continue
            cut = cut or filled  # a line longer than the buffer is split
            tail = self._chunk(buf, cut, st, series, tail)
            buf[: filled - cut] = bytes(view[cut:filled])
            carry = filled - cut
        if carry:
            tail = self._chunk(buf, carry, st, series, tail)
            st.lines += 1  # the last line had no newline
        view.release()
        return st, series, tail

    def _chunk(self, buf: bytearray, cut: int, st: _File, series: trends.Series | None, tail: bytes) -> bytes:
        data = self._without_cr(buf, cut)
        kept, checkpoints = self._reports(data, cut, st)
        lines = _Lines(buf, st.lines + 1)
        progress = _Progress(self.iteration_engine, data, cut, st.iteration, checkpoints, st.checkpoint)
        self._keep(kept, data, cut, st, progress, lines)
        st.iteration = progress.iteration(cut)
        st.checkpoint = progress.checkpoint(cut)
        if progress.start is not None:
            st.iteration_line = lines.at(progress.start)
        if series is not None:
            series.read(data, st.base + st.pos, cut, lines.at)
        st.lines = lines.at(cut) - 1
        st.pos += cut
        return (tail + bytes(data[max(0, cut - TAIL_BYTES):cut]))[-TAIL_BYTES:]

    def _without_cr(self, buf, cut: int):
        """`buf`, or, when its first `cut` bytes hold a carriage return (it starts a new visual line:
        progress bars), a copy where it is a newline. The copy goes to a buffer kept for the next
        chunks, by StringZilla's SIMD translate: bytes.translate's byte loop into a new 4 MB object
        took 3-9 ms, a quarter of a per-rank file's scan; this takes under 1 ms."""
        if buf.find(b"\r", 0, cut) == -1:
            return buf
        if len(self._lf) < cut:
            self._lf = bytearray(cut)
        stringzilla.translate(buf, _CR_TO_LF, start=0, end=cut, out=self._lf)
        return self._lf

    def _reports(self, data, cut: int, st: _File) -> tuple[list[tuple[int, int, int, str]], list[int]]:
        """Go through the engine's reports once; return the lines to keep as (start, end, pid, kind)
        and the start of every checkpoint line."""
        kinds, count, need = self.kinds, st.count, st.need
        kept: list[tuple[int, int, int, str]] = []
        checkpoints: list[int] = []
        last: dict[int, list] = {}
        pending: dict[int, list] = {}  # lines of fingerprints still short of KEEP_HITS confirmed ones
        exceptions: list[tuple[int, int]] = []
        seen: dict[int, int] = {}
        start = stop = -1
        spread = None
        errors = len(st.errors)
        for end, pid in self.engine.scan(data, 0, cut):
            last_byte = end - 1  # a pattern ending in \s may end on its line's newline: that line is its line
            if last_byte > stop:
                start = data.rfind(b"\n", 0, last_byte) + 1
                stop = data.find(b"\n", last_byte, cut)
                stop = cut if stop == -1 else stop
                spread = None
            if seen.get(pid) == start:
                continue  # the same pattern again on the same line
            seen[pid] = start
            kind = kinds[pid]
            if kind is _FINGERPRINT:
                if need[pid]:
                    pending.setdefault(pid, []).append((start, end, stop))
                    continue
                count[pid] += 1
                last.setdefault(pid, []).append((start, end))
                if st.stale[pid] < SPREAD_STALE or count[pid] % SPREAD_EVERY == 0:
                    if spread is None:
                        spread = self._read_spread(data, start, stop)
                    self._spread(st, pid, spread)
            elif kind == markers.CHECKPOINT:
                checkpoints.append(start)
            elif kind == markers.EXCEPTION:
                exceptions.append((start, end))
            elif kind == markers.TRACEBACK:
                st.tracebacks += 1
            elif errors < KEEP_ERRORS:
                # the engine reports a chunk's first error line only: the next ones are looked for here
                kept.append((start, end, pid, kind))
                kept += self._next_errors(data, stop + 1, cut, KEEP_ERRORS - errors - 1)
                errors = KEEP_ERRORS  # the chunk holds no more than were found
        for pid, lines in pending.items():
            kept += self._confirm_pending(pid, lines, data, st, last)
        for pid, lines in last.items():
            kept += [(s, e, pid, "last") for s, e in lines[-KEEP_HITS:]]
        kept += [(s, e, pid, markers.EXCEPTION) for s, e in exceptions[-KEEP_EXCEPTIONS:]]
        kept.sort()
        return kept, checkpoints

    def _next_errors(self, data, pos: int, cut: int, wanted: int) -> list[tuple[int, int, int, str]]:
        """The next `wanted` error lines from `pos`, each scan stopping at the first one it finds."""
        found = []
        while len(found) < wanted and pos < cut and (reports := self.error_engine.scan(data, pos, cut)):
            end = reports[0][0]
            start = data.rfind(b"\n", 0, end - 1) + 1
            found.append((start, end, self.error_pid, markers.ERROR))
            pos = (data.find(b"\n", end - 1, cut) + 1) or cut
        return found

    def _confirm_pending(self, pid: int, lines: list[tuple[int, int, int]], data, st: _File,
                         last: dict[int, list]) -> list[tuple[int, int, int, str]]:
        """Confirm a chunk's lines of one fingerprint with RE2 passes over them joined, a few lines
        first, then batches growing eightfold (a pattern a chunk repeats thousands of times is
        confirmed from its first lines); the first confirmed ones are kept, the lines after the
        last one needed are repeats."""
        confirmed: list[int] = []
        lo = 0
        size = 2 * st.need[pid]
        while lo < len(lines) and len(confirmed) < st.need[pid]:
            batch = lines[lo:lo + size]
            spans = [(max(start, end - WINDOW_BEFORE), min(stop, end + WINDOW_AFTER)) for start, end, stop in batch]
            joined = b"\n".join(bytes(data[a:b]) for a, b in spans)
            offsets = list(itertools.accumulate((b - a + 1 for a, b in spans), initial=0))
            for m in self._confirm_lines[pid].finditer(joined):
                i = lo + bisect.bisect_right(offsets, m.start()) - 1
                if not confirmed or confirmed[-1] != i:
                    confirmed.append(i)
                    if len(confirmed) == st.need[pid]:
                        break
            lo += size
            size *= 8
        if not confirmed:
            return []
        st.need[pid] -= len(confirmed)
        repeats = lines[confirmed[-1] + 1:] if not st.need[pid] else []
        st.count[pid] += len(confirmed) + len(repeats)
        if repeats:
            last[pid] = [(start, end) for start, end, _ in repeats]
            for start, _end, stop in repeats:
                if st.stale[pid] >= SPREAD_STALE:
                    break
                self._spread(st, pid, self._read_spread(data, start, stop))
        return [(lines[i][0], lines[i][1], pid, _FINGERPRINT) for i in confirmed]

    @staticmethod
    def _read_spread(data, start: int, stop: int) -> tuple:
        m = _SPREAD.match(data, start, min(stop, start + 160))
        return (m.group("r1") or m.group("r2"), m.group("h1") or m.group("h2")) if m else ()

    @staticmethod
    def _spread(st: _File, pid: int, spread: tuple) -> None:
        """Add a line's (rank, host) to its fingerprint's spread (`()`: the line names neither)."""
        rank, host = spread or (None, None)
        before = len(st.ranks.get(pid, ())) + len(st.hosts.get(pid, ()))
        if rank is not None:
            ranks = st.ranks.setdefault(pid, set())
            if len(ranks) < KEEP_SPREAD:
                ranks.add(int(rank))
        if host is not None:
            hosts = st.hosts.setdefault(pid, set())
            if len(hosts) < KEEP_SPREAD:
                hosts.add(host.decode())
        grew = len(st.ranks.get(pid, ())) + len(st.hosts.get(pid, ())) > before
        st.stale[pid] = 0 if grew else st.stale[pid] + 1

    @staticmethod
    def _keep(kept, data, cut: int, st: _File, progress: _Progress, lines: _Lines) -> None:
        """Copy the kept lines out of the chunk, with their line numbers and what preceded them."""
        for start, end, pid, kind in kept:
            line = lines.at(start)
            stop = data.find(b"\n", start, cut)
            stop = cut if stop == -1 else stop
            lo = max(start, min(end, stop) - WINDOW_BEFORE)
            hi = min(stop, max(end, lo) + WINDOW_AFTER)
            raw = _Raw(pid, st.file, line, bytes(data[start : min(stop, start + HEAD_BYTES)]), bytes(data[lo:hi]), lo > start,
                       progress.iteration(start) if kind in (_FINGERPRINT, "last", markers.EXCEPTION) else None,
                       progress.checkpoint(start))
            if kind is _FINGERPRINT:
                st.first.setdefault(pid, []).append(raw)
            elif kind == "last":
                st.last.setdefault(pid, deque(maxlen=KEEP_HITS)).append(raw)
            elif kind == markers.EXCEPTION:
                st.exceptions.append(raw)
            else:
                st.errors.append(raw)

    def _finish(self, st: _File, result: ScanResult) -> None:
        """Add the counts and kept lines of a file to the result (still as bytes)."""
        result.bytes += st.pos
        result.lines += st.lines
        result.file_lines.append(st.lines)
        result.file_progress.append(st.iteration_line)
        for pid in sorted(st.first.keys() | st.last.keys()):
            raws = st.first.get(pid, []) + list(st.last.get(pid, ()))
            later = FingerprintHits(st.count[pid], raws[:KEEP_HITS], deque(raws[KEEP_HITS:], maxlen=KEEP_HITS),
                                    st.ranks.get(pid, set()), st.hosts.get(pid, set()))
            result.hits.setdefault(self.fingerprints[pid], FingerprintHits()).merge(later)
        result.tracebacks += st.tracebacks
        result.first_errors += st.errors[: max(0, KEEP_ERRORS - len(result.first_errors))]
        result.last_exceptions.extend(st.exceptions)

    def finalize(self, result: ScanResult) -> None:
        """Decode, confirm, clip, redact and read the context of the lines a job keeps, once."""
        # Many kept lines share the iteration and checkpoint line before them: each is read once.
        preceding = (functools.cache(_iteration), functools.cache(_checkpoint))
        for fp in list(result.hits):
            fph = result.hits[fp]
            hits = [h for x in fph.hits if (h := self._hit(x, *preceding) if isinstance(x, _Raw) else x) is not None]
            if not hits:
                del result.hits[fp]
                continue
            fph.first, fph.last = hits[:KEEP_HITS], deque(hits[KEEP_HITS:], maxlen=KEEP_HITS)
            for h in hits:
                fph.spread(h.rank, h.host)
        result.first_errors = [m for x in result.first_errors if (m := self._marked(markers.ERROR, x, *preceding))]
        result.last_exceptions = deque((m for x in result.last_exceptions
                                        if (m := self._marked(markers.EXCEPTION, x, *preceding))),
                                       maxlen=KEEP_EXCEPTIONS)

    def _marked(self, kind: str, raw: _Raw | Marked, iteration, checkpoint) -> Marked | None:
        if isinstance(raw, Marked):
            return raw
        text = raw.window.decode("utf-8", "replace")
        if self._confirm[self.kinds.index(kind)].search(text) is None:
            return None
        return Marked(raw.file, raw.line, _clip(("…" if raw.clipped else "") + text, 0, 0),
                      iteration(raw.iteration), checkpoint(raw.checkpoint))

    def _hit(self, raw: _Raw, iteration, checkpoint) -> Hit | None:
        text = raw.window.decode("utf-8", "replace")
        match = self._confirm[raw.pid].search(text)
        if match is None or logged_exception(text, match.end()):
            return None  # not this line after all, or an exception line a WARNING log record quotes
        ctx = line_context(raw.head.decode("utf-8", "replace"))
        evidence = _clip(text, *match.span())
        if raw.clipped and not evidence.startswith("…"):
            evidence = "…" + evidence
        return Hit(
            fingerprint=self.fingerprints[raw.pid], file=raw.file, line=raw.line, text=evidence,
            rank=ctx.rank, host=ctx.host, time=ctx.time, time_key=ctx.time_key,
            groups={k: redact(v) for k, v in match.groupdict().items() if v is not None},
            iteration=iteration(raw.iteration), checkpoint=checkpoint(raw.checkpoint),
        )

    def _trends(self, summary: trends.Summary, last_iteration: bytes | None, iteration_line: int,
                last_checkpoint: bytes | None, tail: bytes, file_no: int, result: ScanResult) -> None:
        """Divergence, NaN, fp16 scale and skipped steps, stalls, judged over the whole file."""
        text = last_iteration.decode("utf-8", "replace") if last_iteration else None
        last_progress = trends.Quote(iteration_line, text) if text else None
        iteration = markers.iteration(text) if text else None
        checkpoint = _checkpoint(last_checkpoint)
        if summary.loss_back:
            result.loss_back[file_no] = summary.loss_back
        for trend in summary.judge(last_progress, trends.last_timestamp(tail), iteration):
            ctx = line_context(trend.text)
            for fp in self.detectors[trend.kind]:
                hit = Hit(fingerprint=fp, file=file_no, line=trend.line,
                          text=f"{_clip(trend.text, 0, 0)}  <- {trend.meaning}", rank=ctx.rank, host=ctx.host,
                          time=ctx.time, time_key=ctx.time_key, groups={"trend": trend.meaning},
                          iteration=trend.iteration, checkpoint=checkpoint)
                result.hits.setdefault(fp, FingerprintHits()).add(hit)


def _in_memory(stream: BinaryIO, limit: int) -> bytes | None:
    """The rest of a paste held in memory (a BytesIO, read without a copy) when it fits one chunk."""
    if not isinstance(stream, io.BytesIO):
        return None
    with stream.getbuffer() as view:
        if len(view) - stream.tell() > limit:
            return None
    data = stream.getvalue()[stream.tell():]
    stream.seek(0, io.SEEK_END)
    return data


def _read_tail(tail: bytes, lines: int, file_no: int, result: ScanResult) -> None:
    """What a file's last lines say that the scan's patterns cannot look for (kept redacted, like
    every kept line): the last frame of a file that ends inside a traceback, the exceptions a
    handler logged with their traceback and went on from, and an exception line whose class has no
    Error suffix, put among the exception lines in their order."""
    if (cut := markers.cut_traceback(tail)) is not None:
        back, frame = cut
        result.cut_frames.append(Marked(file_no, lines - back, _clip(frame, 0, 0)))
    result.logged |= {(file_no, lines - back) for back in markers.logged_tracebacks(tail)}
    if (raised := markers.tail_exception(tail)) is not None:
        back, text = raised
        found = Marked(file_no, lines - back, _clip(text, 0, 0))
        if any((m.file, m.line) == (found.file, found.line) for m in result.last_exceptions):
            return  # the scan kept it already (its class ends in Error)
        result.last_exceptions = deque(sorted([*result.last_exceptions, found], key=lambda m: (m.file, m.line)),
                                       maxlen=KEEP_EXCEPTIONS)


def _iteration(line: bytes | None) -> str | None:
    return markers.iteration(line.decode("utf-8", "replace")) if line else None


def _checkpoint(line: bytes | None) -> str | None:
    value = markers.checkpoint(line.decode("utf-8", "replace")) if line else None
    return redact(value) if value else None
