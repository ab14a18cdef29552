"""The diagnosis core: text in, findings out. Knows nothing of Slack, Slurm or storage.

From the hits of one scan it picks the initiating failure (the root), the failures that are
its consequences (collateral), where it started (rank, host, line) and how far training got.
"""
from __future__ import annotations

import io
import re
from dataclasses import dataclass
from typing import BinaryIO, Iterable

from bot.engine import fallback, redact, timeline
from bot.engine.scan import CHUNK_BYTES, Hit, Marked, Scanner, ScanResult
from bot.kb.load import Entry, KnowledgeBase
from bot.kb.xids import NO_XID, Xid, XidTable

WELL_SUPPORTED = 0.5  # an entry scoring below this needs more evidence to be called the cause
WEAK = 0.3
# Confidence words, set from labelled real logs (`trainmedic kb score`): "high" must be right at
# least 19 times in 20. A consequence-only answer is never more than "low".
HIGH, MEDIUM = 0.8, 0.5
MAX_EVIDENCE = 6
_PLACEHOLDER = re.compile(r"\{(\w+)(?:\|([^{}]*))?\}")
_ANGLE = re.compile(r"<([a-z][a-z _-]{0,20})>", re.I)  # <node>, <failed node>, <gpu index>
_ALIASES = {"host": "node", "hostname": "node", "nodename": "node", "failed node": "node", "bad node": "node",
            "job id": "jobid", "job-id": "jobid", "gpu index": "gpu", "gpu-index": "gpu", "gpu id": "gpu"}


@dataclass
class Finding:
    entry: Entry
    role: str  # root | collateral | related
    score: float
    hits: list[Hit]  # evidence, in log order
    ranks: list[int]
    hosts: list[str]
    groups: dict[str, str]
    xids: list[str]  # every Xid number its evidence names, in log order

    @property
    def first(self) -> Hit:
        return self.hits[0]


@dataclass
class Diagnosis:
    root: Finding | None
    findings: list[Finding]
    cascade_only: bool
    scan: ScanResult
    xid_table: XidTable
    jobid: str | None = None
    initiating: dict | None = None
    progress: dict | None = None
    timeline: timeline.Timeline | None = None  # every rank's and host's first failure, in time order

    @property
    def confidence(self) -> str | None:
        """"high", "medium" or "low" for the root; None when nothing was found."""
        if self.root is None:
            return None
        inferred = all(h.fingerprint.role == "confirm" for h in self.root.hits)
        if self.cascade_only or inferred or self.root.score < MEDIUM:
            return "low"
        return "high" if self.root.score >= HIGH else "medium"

    @property
    def warnings(self) -> list[str]:
        """What went wrong while reading (a truncated gzip, a capped upload)."""
        return self.scan.warnings

    def xid(self, finding: Finding) -> Xid | None:
        """The Xid that decides the finding's fix: of those its evidence names, the most disruptive action."""
        return self.xid_table.worst(finding.xids)

    def facts(self, finding: Finding | None = None) -> dict[str, str]:
        """What the log says that a fix can name: the finding's captures, its Xid (knowledge/xids.yaml),
        its node, the job id."""
        values = dict(finding.groups if finding else {})
        if finding is not None and (xid := self.xid(finding)) is not None:
            values.update(self.xid_table.placeholders(xid))
        if finding is not None and "node" not in values:
            node = (self.initiating or {}).get("host") if finding is self.root else None
            node = node or next((h.host for h in finding.hits if h.host), None)
            if node:
                values["node"] = node
        if self.jobid:
            values["jobid"] = self.jobid
        return values

    def fill(self, text: str, finding: Finding | None = None) -> str:
        """Substitute {name} / {name|default}, and `<node>`-style placeholders the log can fill,
        from the finding's captures, its node and the job id; the rest is left for the reader."""
        values = self.facts(finding)

        def sub(m: re.Match) -> str:
            return values.get(m.group(1)) or (m.group(2) if m.group(2) is not None else f"<{m.group(1)}>")

        def angle(m: re.Match) -> str:
            name = _ALIASES.get(m.group(1).lower(), m.group(1).lower())
            return values.get(name) or m.group(0)

        return _ANGLE.sub(angle, _PLACEHOLDER.sub(sub, text))

    def steps(self, finding: Finding) -> list[dict[str, str | None]]:
        """The finding's fix steps for this log, filled: a step with `xid_actions` only when the decisive
        Xid's catalog action (NO_XID when the log names none) is one of them. Every renderer uses this."""
        xid = self.xid(finding)
        action = xid.action if xid else NO_XID
        return [{key: self.fill(step[key], finding) if key in step else None for key in ("text", "command", "code")}
                for step in finding.entry.data["fix"]["steps"]
                if action in step.get("xid_actions", [action])]

    def likely_errors(self) -> list[Marked]:
        """The last exception lines and the first error lines: what to read when nothing matched."""
        seen = {h.order for f in self.findings for h in f.hits}
        out = []
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


@dataclass
class _Grouped:
    present: dict[str, _EntryHits]  # entries with a root or cascade hit
    confirmed: dict[str, _EntryHits]  # entries hit only by confirmations
    conditions: dict[str, _EntryHits]  # entries hit only by conditions (and confirmations)


def _group_by_entry(kb: KnowledgeBase, result: ScanResult) -> _Grouped:
    """The entries the log hit, by what their hits can say; a wrapper whose every report the
    launcher restarted from is none of them."""
    grouped: dict[str, list] = {}
    ignored = fallback.ignored_blocks(result)
    last = fallback.last_exception(result) if any(fp.frame for fp in result.hits) else None
    for fp, fph in result.hits.items():
        # a line inside an exception Python reported as ignored (in __del__, at exit) is no failure,
        # nor the exception line of a traceback a handler logged and went on from,
        # nor a NaN loss logged before finite ones (a warm-up with no batch yet, a skipped step), nor
        # a traceback frame the run's unexplained last exception was not raised through (unless the
        # paste was cut inside that traceback, before its exception line)
        kept = [h for h in fph.hits if not fallback.in_blocks(h.file, h.line, ignored)
                and (h.file, h.line) not in result.logged
                and not (fp.logged_loss and result.loss_back.get(h.file, 0) > h.line)
                and not (fp.frame and not fallback.raised_through(h, last, result))]
        if kept:
            grouped.setdefault(fp.entry, []).append((fp, kept))
    out = _Grouped({}, {}, {})
    for entry_id, items in grouped.items():
        roles = {fp.role for fp, _ in items}
        hits = sorted((h for _, kept in items for h in kept), key=lambda h: h.order)
        score = _noisy_or(fp.strength for fp, _ in items)
        eh = _EntryHits(kb.get(entry_id), hits, roles, score)
        if _recovered(eh, result):
            continue
        # A confirmation proves nothing alone: such an entry only answers a failed run nothing else
        # explains. A condition (the framework fell back to the CPU) is no failure either: it is the
        # answer only as the cause of one (a job its owner killed for crawling).
        if roles == {"confirm"}:
            out.confirmed[entry_id] = eh
        elif all(fp.condition or fp.role == "confirm" for fp, _ in items):
            out.conditions[entry_id] = eh
        else:
            out.present[entry_id] = eh
    return out


def _recovered(eh: _EntryHits, result: ScanResult) -> bool:
    """A wrapper whose every failure report was followed by a restart (a `recovers` line)."""
    return eh.entry.wrapper and all(fallback.recovered(h.file, h.line, result) for h in eh.hits
                                    if h.fingerprint.role != "confirm")


def _confirmed_failure(kb: KnowledgeBase, grouped: _Grouped, result: ScanResult) -> _EntryHits | None:
    """How a failed run died, when nothing else explains it: the best-supported entry whose death
    line (a confirmation marked `ends_run`: a bare `Killed`, exit status 137) the run ended on, or
    that declares the signal a wrapper reports (`exit_signals`: DeepSpeed's `return code = -9`,
    mpirun's `exited on signal 11`). Never a wrapper itself."""
    confirmed = grouped.confirmed
    ended = [e for e in confirmed.values() if not e.entry.wrapper and any(
        h.fingerprint.ends_run and fallback.ended_the_run(h.file, h.line, result) for h in e.hits)]
    reported = fallback.reported_signal([h for e in grouped.present.values() if e.entry.wrapper for h in e.hits], result)
    if reported is not None:
        signal, hit = reported
        for entry in kb.entries.values():
            if signal in entry.exit_signals and not entry.wrapper:
                ended.append(confirmed.get(entry.id) or _EntryHits(entry, [hit], {"confirm"}, WEAK))
    return max(ended, key=lambda e: (e.score, -e.hits[0].order[0], -e.hits[0].order[1]), default=None)


_ROLE_RANK = {"root": 0, "cascade": 1, "confirm": 2}


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


def _explains(cause: str, candidate: _EntryHits, grouped: _Grouped) -> bool:
    """Whether the log holds `cause` (one of the candidate's `caused_by`) as its cause: a root or a
    condition anywhere, even printed later (a GPU's Xid after the CUDA error it caused); a failure
    seen only in its consequences (a peer that closed the connection) when it came first, since a
    rank's own failure line before the others noticed it is that rank's, not theirs. NCCL prints the
    cause of its error as a "Last error:" a few lines under it: that still comes first."""
    if cause in grouped.conditions:
        return True
    found = grouped.present.get(cause)
    if found is None:
        return False
    return "root" in found.roles or not _printed_after(found.hits[0], candidate.first_of("root"))


LAST_ERROR_LINES = 5  # NCCL's "Last error:" text follows the error it explains by this many lines at most


def _printed_after(a: Hit, b: Hit) -> bool:
    """Whether hit `a` came after hit `b` (beyond a "Last error:" block under it): by timestamp
    when both have one of a kind, else by line within one file; hits in different files without
    timestamps are not ordered (False)."""
    if a.time_key and b.time_key and a.time_key[0] == b.time_key[0]:
        return a.time_key[1] > b.time_key[1]
    return a.file == b.file and a.line > b.line + LAST_ERROR_LINES


def _caught(candidate: _EntryHits, roots: list[_EntryHits], headers: list[Marked]) -> bool:
    """Whether every root line of the candidate is an exception that an `except` block caught, and
    another candidate's root line comes after the handler's header: what the handler raised is the
    failure (an ImportError of a prebuilt kernel caught, and the fallback's JIT build that failed)."""
    below = [fallback.caught_before(h, headers) for h in candidate.hits if h.fingerprint.role == "root"]
    if not below or None in below:
        return False
    return any(o.file == head.file and o.line > head.line for head in below
               for other in roots if other is not candidate for o in other.hits if o.fingerprint.role == "root")


def _pick_root(grouped: _Grouped, result: ScanResult) -> tuple[_EntryHits | None, bool]:
    """(root, cascade_only): the earliest well-supported root candidate not explained by another."""
    present, conditions = grouped.present, grouped.conditions
    roots = [e for e in present.values() if "root" in e.roles]
    if headers := fallback.handled_headers(result):
        roots = [e for e in roots if not _caught(e, roots, headers)]
    strong = [e for e in roots if e.score >= WELL_SUPPORTED]
    if strong:
        # A candidate whose known cause is also in the log is that cause's consequence.
        unexplained = [e for e in strong if not any(_explains(c, e, grouped) for c in e.entry.caused_by)]
        if unexplained:
            return _earliest(unexplained, ("root",)), False
        # Every candidate is explained: by a condition (the job ran on the CPU until it was killed),
        # which is the answer, or by a cause that itself only cascades (a hang reported after a
        # collective timeout), which is the answer with its own "look further" note.
        named = [conditions[c] for e in strong for c in e.entry.caused_by if c in conditions]
        if named:
            return _earliest(named, ("root",)), False
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
    # The first hit of each fingerprint, then the others in log order; a line matched by several
    # fingerprints is one line of evidence.
    firsts = list({h.fingerprint: h for h in reversed(eh.hits)}.values())
    listed = {fp.id: i for i, fp in enumerate(eh.entry.fingerprints)}

    def rank(h: Hit) -> tuple[int, int]:
        # one line, one hit: the strongest role's (a root line is not shown as a mere confirmation),
        # then the fingerprint the entry lists first, as the signature picks it
        return _ROLE_RANK[h.fingerprint.role], listed.get(h.fingerprint.id, len(listed))

    by_line: dict[tuple[int, int], Hit] = {}
    for h in firsts + eh.hits:
        if h.order in by_line:
            if rank(h) < rank(by_line[h.order]):
                by_line[h.order] = h
        elif len(by_line) < MAX_EVIDENCE:
            by_line[h.order] = h
    picked = sorted(by_line.values(), key=lambda h: h.order)
    groups: dict[str, str] = {}
    for h in eh.hits:
        for k, v in h.groups.items():
            groups.setdefault(k, v)
    xids = list(dict.fromkeys(h.groups["xid"] for h in eh.hits if h.groups.get("xid")))
    ranks, hosts = spread.get(eh.entry.id, (set(), set()))
    return Finding(eh.entry, role, eh.score, picked, sorted(ranks), sorted(hosts), groups, xids)


def _spread(result: ScanResult) -> dict[str, tuple[set, set]]:
    out: dict[str, tuple[set, set]] = {}
    for fp, fph in result.hits.items():
        ranks, hosts = out.setdefault(fp.entry, (set(), set()))
        ranks |= fph.ranks
        hosts |= fph.hosts
    return out


def _judge(kb: KnowledgeBase, result: ScanResult) -> tuple[_Grouped, _EntryHits | None, bool]:
    """The scan's hits by entry, and the root they name (again after a fallback added one)."""
    grouped = _group_by_entry(kb, result)
    return (grouped, *_pick_root(grouped, result))


def analyse(kb: KnowledgeBase, result: ScanResult, jobid: str | None = None) -> Diagnosis:
    """Root, collateral and related findings from one scan."""
    grouped, root, cascade_only = _judge(kb, result)
    if root is None or cascade_only and root.entry.wrapper:
        # Only a wrapper (or nothing) reported the failure: the child's own exception says more,
        # and failing that, what confirms how it died (a SIGKILL from outside, a segfault).
        if fallback.add_last_exception(kb, result):
            grouped, root, cascade_only = _judge(kb, result)
        elif (named := _confirmed_failure(kb, grouped, result)) is not None:
            root, cascade_only = named, False
        elif grouped.conditions:  # nothing failed that says more than how the run ran (on the CPU)
            root, cascade_only = _earliest(list(grouped.conditions.values()), ("root",)), False
        elif root is not None and all(fallback.training_went_on(h.file, h.line, result) for h in root.hits):
            # a wrapper's report with training logged after it: a side command failed and was handled
            grouped.present.pop(root.entry.id)
            root = None
        if root is None and fallback.add_cut_frame(kb, result):
            grouped, root, cascade_only = _judge(kb, result)
    elif cascade_only and fallback.add_last_exception(kb, result, before=root.hits[0]):
        # Only consequences were found (a collective time-out on the other ranks): an uncaught
        # exception printed above the first of them, after which training stopped, started it.
        grouped, root, cascade_only = _judge(kb, result)
    spread = _spread(result)
    findings: list[Finding] = []
    if root is not None:
        findings.append(_finding(root, "root", spread))
    others = []
    for eh in grouped.present.values():
        if eh is root or eh.score < WELL_SUPPORTED:
            continue
        after_root = root is not None and eh.hits[0].order >= root.hits[0].order
        explained = root is not None and root.entry.id in eh.entry.caused_by
        collateral = "root" not in eh.roles or after_root or explained
        others.append(_finding(eh, "collateral" if collateral else "related", spread))
    if root is not None:  # what the run ran under (on the CPU, say) is worth a line of a failed run's reply
        others += [_finding(eh, "related", spread) for eh in grouped.conditions.values() if eh is not root]
    others.sort(key=lambda f: (f.role != "collateral", -f.score, f.first.order))
    findings += others
    diagnosis = Diagnosis(findings[0] if root else None, findings, cascade_only, result, kb.xids, jobid)
    if root is not None:
        start = root.first_of("root") or root.hits[0]
        diagnosis.initiating = _initiating(root, start, grouped.present)
        if start.iteration or start.checkpoint:
            diagnosis.progress = {"iteration": _as_int(start.iteration), "checkpoint": start.checkpoint}
        timeline.attach(diagnosis)
    return diagnosis


def _as_int(value: str | None) -> int | str | None:
    return int(value) if value and value.isdigit() else value


NEARBY_LINES = 5  # a line this close after the root's first hit may name where it happened


def _initiating(root: _EntryHits, start: Hit, present: dict[str, _EntryHits]) -> dict:
    """Rank and host of the root's first hit `start`; failing that, what a launcher's failure summary
    names (torchrun's "Root Cause" table: `rank : 3`, `host : node12`; a `local_rank` elsewhere is not
    the rank), then the root's other hits and the lines printed right after it (slurmstepd names no
    node, `srun: error: node: task N` does). When `start` is a launcher's own line (the signal it
    reports is the only evidence), its table comes first: that line names a local rank."""
    nearby = sorted((h for eh in present.values() for h in eh.hits
                     if h.file == start.file and start.line <= h.line <= start.line + NEARBY_LINES), key=lambda h: h.order)
    summary = [h for eh in present.values() if eh.entry.wrapper for h in eh.hits]
    table = [int(h.groups["rank"]) for h in summary if h.groups.get("rank", "").isdigit()]
    ranks = (table + [start.rank] if start in summary else [start.rank] + table) + [h.rank for h in root.hits + nearby]
    hosts = [start.host] + [h.groups.get("node") for h in summary] + [h.host for h in root.hits + nearby]
    rank = next((r for r in ranks if r is not None), None)
    host = next((h for h in hosts if h), None)
    return {"rank": rank, "host": host, "line": start.line, "file": start.file}


class Diagnoser:
    """Compiles the knowledge base once; diagnoses any number of logs."""

    def __init__(self, kb: KnowledgeBase, chunk_bytes: int = CHUNK_BYTES, engine_name: str | None = None) -> None:
        self.kb = kb
        self.scanner = Scanner(kb, chunk_bytes, engine_name)
        redact.prepare()  # with the engines, not in the first diagnosis that shows a line

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
