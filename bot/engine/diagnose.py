"""The diagnosis core: text in, findings out. Knows nothing of Slack, Slurm or storage.

From the hits of one scan it picks the initiating failure (the root), the failures that are
its consequences (collateral), where it started (rank, host, line) and how far training got.
"""
from __future__ import annotations

import io
import re
from dataclasses import dataclass
from typing import BinaryIO, Iterable

from bot.engine.scan import CHUNK_BYTES, Hit, Marked, Scanner, ScanResult
from bot.kb.load import Entry, KnowledgeBase

WELL_SUPPORTED = 0.5  # an entry scoring below this needs more evidence to be called the cause
WEAK = 0.3
MAX_EVIDENCE = 6
_PLACEHOLDER = re.compile(r"\{(\w+)(?:\|([^{}]*))?\}")


@dataclass
class Finding:
    entry: Entry
    role: str  # root | collateral | related
    score: float
    hits: list[Hit]  # evidence, in log order
    ranks: list[int]
    hosts: list[str]
    groups: dict[str, str]

    @property
    def first(self) -> Hit:
        return self.hits[0]


@dataclass
class Diagnosis:
    root: Finding | None
    findings: list[Finding]
    cascade_only: bool
    scan: ScanResult
    jobid: str | None = None
    initiating: dict | None = None
    progress: dict | None = None

    @property
    def warnings(self) -> list[str]:
        """What went wrong while reading (a truncated gzip, a capped upload)."""
        return self.scan.warnings

    def fill(self, text: str, finding: Finding | None = None) -> str:
        """Substitute {name} / {name|default} from the finding's captures and the job id."""
        values = dict(finding.groups if finding else {})
        if self.jobid:
            values["jobid"] = self.jobid

        def sub(m: re.Match) -> str:
            return values.get(m.group(1)) or (m.group(2) if m.group(2) is not None else f"<{m.group(1)}>")

        return _PLACEHOLDER.sub(sub, text)

    def likely_errors(self) -> list[Marked]:
        """The last exception lines and the first error lines: what to read when nothing matched."""
        seen, out = set(), []
        for m in list(self.scan.last_exceptions)[-3:] + self.scan.first_errors:
            if (m.file, m.line) not in seen:
                seen.add((m.file, m.line))
                out.append(m)
        return sorted(out, key=lambda m: (m.file, m.line))


@dataclass
class _EntryHits:
    entry: Entry
    hits: list[Hit]  # every kept hit, in log order
    roles: set[str]
    score: float

    def first_of(self, *roles: str) -> Hit | None:
        return next((h for h in self.hits if h.fingerprint.role in roles), None)


def _noisy_or(strengths: Iterable[float]) -> float:
    miss = 1.0
    for s in strengths:
        miss *= 1.0 - s
    return round(1.0 - miss, 3)


def _group_by_entry(kb: KnowledgeBase, result: ScanResult) -> dict[str, _EntryHits]:
    grouped: dict[str, list] = {}
    for fp, fph in result.hits.items():
        grouped.setdefault(fp.entry, []).append((fp, fph))
    out = {}
    for entry_id, items in grouped.items():
        roles = {fp.role for fp, _ in items}
        if roles == {"confirm"}:
            continue  # a confirmation proves nothing alone
        hits = sorted((h for _, fph in items for h in fph.hits), key=lambda h: h.order)
        score = _noisy_or(fp.strength for fp, _ in items)
        out[entry_id] = _EntryHits(kb.get(entry_id), hits, roles, score)
    return out


def _earliest(candidates: list[_EntryHits], roles: tuple[str, ...]) -> _EntryHits:
    """The candidate whose first hit came first: by timestamp when all have one of a kind, else line order."""
    firsts = [c.first_of(*roles) for c in candidates]
    kinds = {h.time_key[0] if h.time_key else None for h in firsts}
    by_time = len(kinds) == 1 and None not in kinds
    pairs = sorted(
        zip(firsts, candidates),
        key=lambda p: ((p[0].time_key[1] if by_time else 0.0), p[0].order, -p[1].score),
    )
    return pairs[0][1]


def _pick_root(present: dict[str, _EntryHits]) -> tuple[_EntryHits | None, bool]:
    """(root, cascade_only): the earliest well-supported root candidate not explained by another."""
    roots = [e for e in present.values() if "root" in e.roles]
    strong = [e for e in roots if e.score >= WELL_SUPPORTED]
    if strong:
        # A candidate whose known cause is also in the log is that cause's consequence.
        unexplained = [e for e in strong if not any(c in present for c in e.entry.caused_by)]
        if unexplained:
            return _earliest(unexplained, ("root",)), False
        # Every candidate is explained, by a cause that itself only cascades (a hang reported after
        # a collective timeout): that cause is the answer, with its own "look further" note.
        causes = [present[c] for e in strong for c in e.entry.caused_by if c in present and "root" not in present[c].roles]
        if causes:
            return _earliest(causes, ("cascade", "confirm")), True
        return _earliest(strong, ("root",)), False
    weak = [e for e in roots if e.score >= WEAK]
    if weak:
        # A judgement from logged numbers (a detector) is weaker than any explicit failure line.
        explicit = [e for e in weak if any(h.fingerprint.detector is None for h in e.hits)]
        return _earliest(explicit or weak, ("root",)), False
    cascades = [e for e in present.values() if "cascade" in e.roles]
    if cascades:
        best = max(cascades, key=lambda e: (e.score, -e.hits[0].order[0], -e.hits[0].order[1]))
        return best, True
    return None, False


def _finding(eh: _EntryHits, role: str, spread: dict[str, tuple[set, set]]) -> Finding:
    picked: list[Hit] = []
    for fp_first in {h.fingerprint: h for h in reversed(eh.hits)}.values():
        picked.append(fp_first)  # the first hit of each fingerprint
    for h in eh.hits:
        if len(picked) >= MAX_EVIDENCE:
            break
        if h not in picked:
            picked.append(h)
    picked = sorted(picked[:MAX_EVIDENCE], key=lambda h: h.order)
    groups: dict[str, str] = {}
    for h in eh.hits:
        for k, v in h.groups.items():
            groups.setdefault(k, v)
    ranks, hosts = spread[eh.entry.id]
    return Finding(eh.entry, role, eh.score, picked, sorted(ranks), sorted(hosts), groups)


def _spread(result: ScanResult) -> dict[str, tuple[set, set]]:
    out: dict[str, tuple[set, set]] = {}
    for fp, fph in result.hits.items():
        ranks, hosts = out.setdefault(fp.entry, (set(), set()))
        ranks |= fph.ranks
        hosts |= fph.hosts
    return out


def analyse(kb: KnowledgeBase, result: ScanResult, jobid: str | None = None) -> Diagnosis:
    """Root, collateral and related findings from one scan."""
    present = _group_by_entry(kb, result)
    root, cascade_only = _pick_root(present)
    spread = _spread(result)
    findings: list[Finding] = []
    if root is not None:
        findings.append(_finding(root, "root", spread))
    others = []
    for eh in present.values():
        if eh is root or eh.score < WELL_SUPPORTED:
            continue
        after_root = root is not None and eh.hits[0].order >= root.hits[0].order
        explained = root is not None and root.entry.id in eh.entry.caused_by
        collateral = "root" not in eh.roles or after_root or explained
        others.append(_finding(eh, "collateral" if collateral else "related", spread))
    others.sort(key=lambda f: (f.role != "collateral", -f.score, f.first.order))
    findings += others
    diagnosis = Diagnosis(findings[0] if root else None, findings, cascade_only, result, jobid)
    if root is not None:
        start = root.first_of("root") or root.hits[0]
        diagnosis.initiating = _initiating(root, start, present)
        if start.iteration or start.checkpoint:
            diagnosis.progress = {"iteration": _as_int(start.iteration), "checkpoint": start.checkpoint}
    return diagnosis


def _as_int(value: str | None) -> int | str | None:
    return int(value) if value and value.isdigit() else value


NEARBY_LINES = 5  # a line this close after the root's first hit may name where it happened


def _initiating(root: _EntryHits, start: Hit, present: dict[str, _EntryHits]) -> dict:
    """Rank and host of the root's first hit `start`; failing that, of its other hits, then of lines
    printed right after it (slurmstepd names no node, the `srun: error: node: task N` line does)."""
    nearby = [h for eh in present.values() for h in eh.hits
              if h.file == start.file and start.line <= h.line <= start.line + NEARBY_LINES]
    candidates = [start] + root.hits + sorted(nearby, key=lambda h: h.order)
    rank = next((h.rank for h in candidates if h.rank is not None), None)
    host = next((h.host for h in candidates if h.host), None)
    return {"rank": rank, "host": host, "line": start.line, "file": start.file}


class Diagnoser:
    """Compiles the knowledge base once; diagnoses any number of logs."""

    def __init__(self, kb: KnowledgeBase, chunk_bytes: int = CHUNK_BYTES, engine_name: str | None = None) -> None:
        self.kb = kb
        self.scanner = Scanner(kb, chunk_bytes, engine_name)

    def diagnose(self, streams: Iterable[tuple[str, BinaryIO]], jobid: str | None = None,
                 warnings: list[str] | None = None) -> Diagnosis:
        """Diagnose log text streams (one per rank, or one for the job) as one job, read in turn.

        `warnings` is the list the sources write to while the streams are read (a truncated gzip,
        a capped upload); the diagnosis reports it."""
        result = ScanResult(warnings=[] if warnings is None else warnings)
        for name, stream in streams:
            self.scanner.scan(stream, name, result)
        return self.analyse(result, jobid)

    def analyse(self, result: ScanResult, jobid: str | None = None) -> Diagnosis:
        """Diagnose a finished scan (of this process or merged from others)."""
        self.scanner.finalize(result)
        return analyse(self.kb, result, jobid)

    def diagnose_text(self, text: str, name: str = "<paste>", jobid: str | None = None) -> Diagnosis:
        return self.diagnose([(name, io.BytesIO(text.encode("utf-8", "replace")))], jobid)
