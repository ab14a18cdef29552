"""Multi-pattern, linear-time matching of every pattern at once over a chunk of bytes.

Two engines with one interface. Hyperscan (x86_64 wheel) scans a chunk for all patterns in one
pass and reports each match's end offset. Where it is missing, an RE2 set finds which patterns
occur in the chunk and RE2 finds their positions; both are linear-time. Either way the caller
confirms each hit line with RE2 to extract named groups, so the engines only need end offsets.
Set TRAINMEDIC_ENGINE=re2 to force the fallback (CI does, to keep it tested).
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Protocol

import re2

try:  # the wheel only exists for some platforms: see pyproject.toml
    import hyperscan
except ImportError:  # pragma: no cover - depends on the platform
    hyperscan = None


@dataclass(frozen=True)
class Pattern:
    regex: str
    ignorecase: bool = False


class Engine(Protocol):
    name: str

    def scan(self, chunk: memoryview) -> list[tuple[int, int]]:
        """Return (end_offset, pattern_index) pairs sorted by end offset."""


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
    if hyperscan is not None:
        try:
            _hyperscan_db([pattern])
        except hyperscan.error as exc:
            return f"Hyperscan cannot compile it ({exc}); simplify the pattern"
    return None


def _hyperscan_db(patterns: list[Pattern]) -> "hyperscan.Database":
    db = hyperscan.Database(mode=hyperscan.HS_MODE_BLOCK)
    flags = [
        hyperscan.HS_FLAG_MULTILINE | (hyperscan.HS_FLAG_CASELESS if p.ignorecase else 0)
        for p in patterns
    ]
    db.compile(
        expressions=[p.regex.encode() for p in patterns],
        ids=list(range(len(patterns))),
        elements=len(patterns),
        flags=flags,
    )
    return db


class HyperscanEngine:
    name = "hyperscan"

    def __init__(self, patterns: list[Pattern]) -> None:
        self._db = _hyperscan_db(patterns)

    def scan(self, chunk: memoryview) -> list[tuple[int, int]]:
        hits: list[tuple[int, int]] = []
        append = hits.append

        def on_match(pid: int, _start: int, end: int, _flags: int, _ctx: object) -> None:
            append((end, pid))

        self._db.scan(chunk, match_event_handler=on_match)
        return hits


class RE2Engine:
    name = "re2"

    def __init__(self, patterns: list[Pattern]) -> None:
        self._set = re2.Set.SearchSet(re2.Options())
        for p in patterns:
            self._set.Add(re2_compile(p, multiline=True).pattern)
        self._set.Compile()
        self._regexes = [re2_compile(p, multiline=True) for p in patterns]

    def scan(self, chunk: memoryview) -> list[tuple[int, int]]:
        data = bytes(chunk)
        hits = [
            (m.end(), pid)
            for pid in (self._set.Match(data) or [])
            for m in self._regexes[pid].finditer(data)
        ]
        hits.sort()
        return hits


def build(patterns: list[Pattern], wanted: str | None = None) -> Engine:
    """The engine named by `wanted` or TRAINMEDIC_ENGINE; "auto" is the fastest one available here."""
    wanted = wanted or os.environ.get("TRAINMEDIC_ENGINE") or "auto"
    if wanted not in ("auto", "hyperscan", "re2"):
        raise ValueError(f"TRAINMEDIC_ENGINE={wanted!r}: use auto, hyperscan or re2")
    if wanted == "hyperscan" and hyperscan is None:
        raise ValueError("TRAINMEDIC_ENGINE=hyperscan but the hyperscan package is not installed")
    if hyperscan is not None and wanted != "re2":
        return HyperscanEngine(patterns)
    return RE2Engine(patterns)
