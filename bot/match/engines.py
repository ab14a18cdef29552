"""Multi-pattern, linear-time matching of every pattern at once over a chunk of bytes.

Two engines with one interface. Hyperscan (x86_64 wheel) scans a chunk for all patterns in one
pass and reports each match's end offset; it looks for each pattern's required literals where it
has long ones (bot/match/literals.py), which is many times faster. Where it is missing, an RE2 set finds
which patterns occur in the chunk and RE2 finds their positions; both are linear-time. Either way
the caller confirms each reported line with RE2 (and extracts named groups), so an engine may
report a line that the full pattern does not match, never miss one that it does.
Set TRAINMEDIC_ENGINE=re2 to force the fallback (CI does, to keep it tested).
"""
from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass, replace
from typing import Protocol

import re2

from bot.config import cache_dir, write_cache
from bot.match import literals

try:  # the wheel only exists for some platforms: see pyproject.toml
    import hyperscan
except ImportError:  # pragma: no cover - depends on the platform
    hyperscan = None


@dataclass(frozen=True)
class Pattern:
    regex: str
    ignorecase: bool = False
    first_only: bool = False  # reported for its first line in a scan only (it may be asked again from a later offset)


# Reports kept for one line before the scan skips to the next line: a line of a literal repeated
# 200,000 times costs this many reports, not 200,000 (the caller wants lines, not matches).
LINE_REPORTS = 64


class Engine(Protocol):
    name: str

    def scan(self, data, start: int, cut: int) -> list[tuple[int, int]]:
        """(end_offset, pattern_index) pairs in data[start:cut], sorted by end offset (offsets into
        data); every line that matches a pattern is reported for it, not every match on it, and
        only the first line for a `first_only` pattern (a line left early may add one more)."""


def re2_compile(pattern: Pattern, multiline: bool = False, text: bool = False) -> "re2._Regexp":
    """Compile with RE2 for bytes (or str when `text`); raises re2.error when it is not RE2 syntax."""
    flags = ("i" if pattern.ignorecase else "") + ("m" if multiline else "")
    source = (f"(?{flags})" if flags else "") + pattern.regex
    return re2.compile(source if text else source.encode())


def check(pattern: Pattern) -> str | None:
    """Why `pattern` cannot be used by the engines, or None when it can."""
    try:
        compiled = re2_compile(pattern)
    except re2.error as exc:
        return f"RE2 cannot compile it ({exc}); rewrite without backreferences or lookaround"
    if compiled.search(b"") is not None:
        return "it matches the empty string, so it would match every line; make it require text"
    if wide := _non_ascii_in_class(pattern.regex):
        return (f"the character class holding {wide!r} is read byte by byte by Hyperscan, so it never matches "
                f"that character there; write it as an alternative instead, e.g. (?:\\(|（)")
    if hyperscan is not None:
        try:
            _hyperscan_db([pattern])
        except hyperscan.error as exc:
            return f"Hyperscan cannot compile it ({exc}); simplify the pattern"
    return None


def _non_ascii_in_class(regex: str) -> str | None:
    """The first non-ASCII character inside a [...] class of `regex`, or None. Hyperscan compiles
    patterns as bytes, where such a class holds the character's UTF-8 bytes one by one."""
    in_class = escaped = False
    for i, c in enumerate(regex):
        if escaped:
            escaped = False
        elif c == "\\":
            escaped = True
        elif in_class:
            if c == "]" and regex[i - 1] != "[" and regex[i - 2:i] != "[^":
                in_class = False
            elif ord(c) > 127:
                return c
        elif c == "[":
            in_class = True
    return None


def _hyperscan_db(patterns: list[Pattern]) -> "hyperscan.Database":
    db = hyperscan.Database(mode=hyperscan.HS_MODE_BLOCK)
    flags = [
        hyperscan.HS_FLAG_MULTILINE | (hyperscan.HS_FLAG_CASELESS if p.ignorecase else 0)
        | (hyperscan.HS_FLAG_SINGLEMATCH if p.first_only else 0)
        for p in patterns
    ]
    db.compile(
        expressions=[p.regex.encode() for p in patterns],
        ids=list(range(len(patterns))),
        elements=len(patterns),
        flags=flags,
    )
    return db


def _cached_hyperscan_db(patterns: list[Pattern], prefilter: bool) -> "hyperscan.Database":
    """Compiling ~500 patterns takes about a second; a serialized database loads in milliseconds.

    Keyed by the patterns, their flags and the hyperscan version, under XDG_CACHE_HOME; any problem
    with the cache only means compiling again.
    """
    key = hashlib.sha256(repr((hyperscan.__version__, prefilter, [(p.regex, p.ignorecase, p.first_only) for p in patterns])).encode())
    path = cache_dir() / f"hyperscan-{key.hexdigest()[:24]}.db"
    try:
        db = hyperscan.loadb(path.read_bytes(), hyperscan.HS_MODE_BLOCK)
        db.scratch = hyperscan.Scratch(db)  # a deserialized database comes without one
        return db
    except (OSError, hyperscan.error):
        pass
    if prefilter:
        common = _CommonText()
        patterns = [_prefilter(p, common) for p in patterns]
    db = _hyperscan_db(patterns)
    write_cache(path, hyperscan.dumpb(db))
    return db


class _CommonText:
    """Healthy log text (the benign corpus): a literal frequent there would make a poor prefilter."""

    MAX_SHARE = 0.001  # of the corpus' lines

    def __init__(self) -> None:
        import knowledge

        files = sorted(knowledge.BENIGN.glob("*.log"))
        self.text = "\n".join(f.read_text(encoding="utf-8", errors="replace") for f in files)
        self.lower = self.text.lower()
        self.limit = max(1, int(self.text.count("\n") * self.MAX_SHARE))

    def too_common(self, literal: str, caseless: bool) -> bool:
        haystack, needle = (self.lower, literal.lower()) if caseless else (self.text, literal)
        return haystack.count(needle) > self.limit


def _prefilter(pattern: Pattern, common: _CommonText) -> Pattern:
    """What Hyperscan looks for: a required literal alternation when the pattern has one that is
    rare in healthy logs (else every progress line would be reported and confirmed)."""
    found = literals.required_literals(pattern.regex)
    if not found or any(common.too_common(lit, pattern.ignorecase) for lit in found):
        return pattern
    return replace(pattern, regex="|".join(map(literals.escape, found)))


class HyperscanEngine:
    """Reports every line that holds a required literal of a pattern (or the pattern itself); a
    line with more than LINE_REPORTS reports is left after them (in linear time whatever it holds)."""

    name = "hyperscan"

    def __init__(self, patterns: list[Pattern], prefilter: bool = True) -> None:
        self._db = _cached_hyperscan_db(patterns, prefilter)
        self._patterns = patterns
        self._rest: RE2Engine | None = None  # for the rest of a line left early

    def _rest_of_line(self, data, start: int, cut: int) -> tuple[int, list[tuple[int, int]]]:
        """Where the scan resumes after a line left early at `start`, and one report at that
        line's end for each pattern found in the rest of it."""
        stop = data.find(b"\n", start, cut)
        stop = cut if stop == -1 else stop
        if self._rest is None:
            self._rest = RE2Engine(self._patterns)
        with memoryview(data)[start:stop] as view:
            present = self._rest.present(view)
        return stop + 1, [(stop, pid) for pid in sorted(present)]

    def scan(self, data, start: int, cut: int) -> list[tuple[int, int]]:
        hits: list[tuple[int, int]] = []
        append = hits.append
        base = start

        def on_match(pid: int, _start: int, end: int, _flags: int, _ctx: object) -> int:
            append((base + end, pid))
            # Every LINE_REPORTS reports, stop when they all fell on one line; the scan resumes after it.
            if len(hits) % LINE_REPORTS == 0 and data.find(b"\n", hits[-LINE_REPORTS][0], base + end) == -1:
                return 1
            return 0

        with memoryview(data) as view:
            while base < cut:
                try:
                    self._db.scan(view[base:cut], match_event_handler=on_match)
                    break
                except hyperscan.ScanTerminated:
                    base, rest = self._rest_of_line(data, hits[-1][0], cut)
                    hits += rest
        return hits


# RE2 builds one program of every pattern for its Set; at RE2's default 8 MiB that program held
# about 720 of them, fewer than the shipped knowledge base now has before a site layers its own
# entries on top. It is a ceiling, not an allocation: three times the 1,016 shipped fingerprints
# needed about 40 MiB, so 64 MiB leaves room to grow (tests/test_scan.py keeps three times fitting).
SET_MAX_MEM = 64 << 20


class RE2Engine:
    name = "re2"

    def __init__(self, patterns: list[Pattern]) -> None:
        self._regexes = [re2_compile(p, multiline=True) for p in patterns]
        self._first_only = [p.first_only for p in patterns]
        options = re2.Options()
        options.max_mem = SET_MAX_MEM
        self._set = re2.Set.SearchSet(options)
        for regex in self._regexes:
            self._set.Add(regex.pattern)
        self._set.Compile()

    def present(self, data) -> list[int]:
        """The patterns that occur somewhere in `data`."""
        return self._set.Match(data) or []

    def scan(self, data, start: int, cut: int) -> list[tuple[int, int]]:
        with memoryview(data)[start:cut] as view:
            present = self.present(view)
        hits = []
        for pid in present:
            regex, pos = self._regexes[pid], start
            while (m := regex.search(data, pos, cut)) is not None:
                hits.append((m.end(), pid))
                if self._first_only[pid]:
                    break
                pos = data.find(b"\n", m.end(), cut) + 1 or cut  # one report a line is enough
        hits.sort()
        return hits


def build(patterns: list[Pattern], wanted: str | None = None, prefilter: bool = True) -> Engine:
    """The engine named by `wanted` or TRAINMEDIC_ENGINE; "auto" is the fastest one available here.
    Without `prefilter` every report ends where the whole pattern's match ends (Hyperscan otherwise
    may look for a required literal only)."""
    wanted = wanted or os.environ.get("TRAINMEDIC_ENGINE") or "auto"
    if wanted not in ("auto", "hyperscan", "re2"):
        raise ValueError(f"TRAINMEDIC_ENGINE={wanted!r}: use auto, hyperscan or re2")
    if wanted == "hyperscan" and hyperscan is None:
        raise ValueError("TRAINMEDIC_ENGINE=hyperscan but the hyperscan package is not installed")
    if hyperscan is not None and wanted != "re2":
        return HyperscanEngine(patterns, prefilter)
    return RE2Engine(patterns)
