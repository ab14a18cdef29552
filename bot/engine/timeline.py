"""Where a job's failure started, when its evidence comes from many ranks and nodes.

Each source (a rank, else a host, else a file) gives its first failure-class line: a root or
cascade fingerprint of a reported finding. Timestamps are put on one clock where they allow it
(ISO dates and syslog/glog month-day stamps share a month-day scale; the year is left out, dmesg
seconds since boot are not comparable). Hosts' clocks may disagree by up to SKEW_SECONDS, so the
start is chosen inside the first window of that width, by role and strength, and only then by
time. The host whose failure its peers do not share is named, with the drain command when that
failure is a machine fault; the rest is collateral. Pure: a Diagnosis in, a Timeline out.
"""
from __future__ import annotations

import re
from collections import deque
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import TYPE_CHECKING

# The "md" (month-day) scale that line_time puts syslog and glog stamps on.
from bot.engine.context import _seconds as month_day_seconds
from bot.engine.scan import FingerprintHits, Hit, ScanResult

if TYPE_CHECKING:
    from bot.engine.diagnose import Diagnosis, Finding

SKEW_SECONDS = 60.0
MAX_EVENTS = 64  # events kept in the timeline (the JSON lists them)
MACHINE_TAGS = frozenset({"hardware", "node-health", "link"})  # a failure of the machine: drain it
_ROLE_ORDER = {"root": 0, "cascade": 1}
_CLOCK = re.compile(r"\d\d:\d\d:\d\d")
_NOTICE_CATEGORIES = frozenset({"scheduler", "launcher"})  # lines that say a task ended on a node


@dataclass(frozen=True)
class Origin:
    """What a file's name says of every line in it: the rank of a per-rank file, the host of a per-node one."""

    rank: int | None = None
    host: str | None = None


@dataclass(frozen=True)
class Event:
    entry: str
    hit: Hit
    at: float | None  # seconds on the month-day clock, None when the line has no comparable time

    @property
    def role(self) -> str:
        return self.hit.fingerprint.role

    def key(self) -> tuple:
        """Time first (timed events before untimed ones), then log order."""
        return (self.at is None, self.at or 0.0, self.hit.order)


@dataclass(frozen=True)
class OddHost:
    host: str
    entry: str
    drain: str | None  # the command to take the node out of service, for a machine fault


@dataclass
class Timeline:
    events: list[Event]  # each source's first failure line, in time order
    start: Event  # the line the failure started with
    rank: int | None  # the initiating rank and host, filled from the other events where the start lacks them
    host: str | None
    odd_hosts: list[OddHost]
    label: str = ""  # what the start is and when: "Xid 79 at 03:12:04"
    then: str = ""  # what followed: "63 ranks: nccl-timeout"

    @property
    def summary(self) -> str:
        """One line, e.g. `started on gpu-node-17 rank 13 (Xid 79 at 03:12:04); then 63 ranks: nccl-timeout`."""
        where = " ".join(x for x in (f"on {self.host}" if self.host else "",
                                      f"rank {self.rank}" if self.rank is not None else "") if x)
        return f"started {where or 'here'} ({self.label})" + (f"; then {self.then}" if self.then else "")

    @property
    def sources(self) -> int:
        """How many ranks, hosts and files failed."""
        return len(self.events)


def attribute(result: ScanResult, origins: dict[str, Origin]) -> ScanResult:
    """The scan with each hit's rank and host taken from its file's origin where the origin says
    (a per-rank file's lines are that rank's, whatever rank number a line quotes)."""
    by_file = {i: origins[name] for i, name in enumerate(result.files) if name in origins}
    if not by_file:
        return result
    return replace(result, hits={fp: _attributed(fph, by_file) for fp, fph in result.hits.items()})


def _attributed(fph: FingerprintHits, by_file: dict[int, Origin]) -> FingerprintHits:
    def fix(h: Hit) -> Hit:
        o = by_file.get(h.file)
        if o is None:
            return h
        return replace(h, rank=h.rank if o.rank is None else o.rank, host=o.host or h.host)

    first = [fix(h) for h in fph.first]
    last = deque((fix(h) for h in fph.last), maxlen=fph.last.maxlen)
    kept = first + list(last)
    return replace(fph, first=first, last=last, ranks=fph.ranks | {h.rank for h in kept if h.rank is not None},
                   hosts=fph.hosts | {h.host for h in kept if h.host})


def _clock(hit: Hit) -> float | None:
    if hit.time_key is None:
        return None
    kind, seconds = hit.time_key
    if kind == "md":
        return seconds
    if kind == "abs":  # line_time reads an ISO stamp as if it were UTC: its digits are the wall clock
        at = datetime.fromtimestamp(seconds, UTC)
        return month_day_seconds(at.month, at.day, str(at.hour), str(at.minute), str(at.second), None) + at.microsecond / 1e6
    return None


def _source(hit: Hit) -> tuple:
    if hit.rank is not None:
        return ("rank", hit.rank)
    return ("host", hit.host) if hit.host else ("file", hit.file)


def _failure_lines(d: Diagnosis) -> list[Event]:
    """Every kept hit of a root or cascade fingerprint of a reported finding."""
    reported = {f.entry.id for f in d.findings}
    return [Event(fp.entry, h, _clock(h)) for fp, fph in d.scan.hits.items()
            if fp.entry in reported and fp.role in _ROLE_ORDER for h in fph.hits]


def _earlier(a: Event, b: Event) -> bool:
    # Within one file the line order is the truth; across files, the clocks.
    return a.hit.line < b.hit.line if a.hit.file == b.hit.file else a.key() < b.key()


def _firsts(lines: list[Event]) -> list[Event]:
    """Each source's first failure line, in time order."""
    firsts: dict[tuple, Event] = {}
    for event in lines:
        key = _source(event.hit)
        if key not in firsts or _earlier(event, firsts[key]):
            firsts[key] = event
    return sorted(firsts.values(), key=Event.key)


def _window(events: list[Event]) -> list[Event]:
    """The events within SKEW_SECONDS of the first timed one, and those with no time (they cannot
    be placed, so they are not ruled out)."""
    timed = [e.at for e in events if e.at is not None]
    return [e for e in events if e.at is None or e.at <= min(timed) + SKEW_SECONDS] if timed else events


def _best(events: list[Event], rank) -> Event | None:
    return min(events, key=lambda e: (rank(e), e.key())) if events else None


def _by_role(e: Event) -> tuple:
    return (_ROLE_ORDER[e.role], -e.hit.fingerprint.strength)


def _named(events: list[Event], only: bool = False) -> str | None:
    """The node a line names in a `node` capture ("Node failure on gpu-node-17"): that line is about
    that node, whichever host printed it. With `only`, just when the lines name a single node."""
    named = [e for e in events if e.hit.groups.get("node")]
    if only:
        nodes = {e.hit.groups["node"] for e in named}
        return nodes.pop() if len(nodes) == 1 else None
    best = _best(named, _by_role)
    return best.hit.groups["node"] if best else None


def _host_of(events: list[Event]) -> dict[int, str]:
    """Rank -> host, from lines that name both."""
    out: dict[int, str] = {}
    for e in events:
        if e.hit.rank is not None and e.hit.host:
            out.setdefault(e.hit.rank, e.hit.host)
    return out


def _rank_on(host: str, root: Finding, findings: dict[str, Finding], events: list[Event],
             hosts: dict[int, str], window: list[Event]) -> int | None:
    """The rank where the failure of `host` showed first: the root's own lines on that host, then
    the root's lines of the start's window whose host is not known, then failures the root does not
    explain, then a scheduler or launcher saying the task ended; collateral last."""
    def group(e: Event) -> int:
        entry = findings[e.entry].entry
        if e.entry == root.entry.id:
            return 0 if e in located else 1
        if e.role == "root" and root.entry.id not in entry.caused_by:
            return 2
        return 3 if entry.data["category"] in _NOTICE_CATEGORIES else 4

    located = [e for e in events if e.hit.rank is not None and (e.hit.host or hosts.get(e.hit.rank)) == host]
    unplaced = [e for e in window if e.hit.rank is not None and not (e.hit.host or hosts.get(e.hit.rank))]
    start = _best(_window(located + unplaced), lambda e: (group(e), _ROLE_ORDER[e.role]))
    return start.hit.rank if start else None


def _odd_hosts(d: Diagnosis) -> list[OddHost]:
    """The root's hosts, when most hosts with a failure do not show the root (a single host will
    do for a machine fault: its peers printed only consequences)."""
    root = d.root
    if root is None or d.cascade_only or not root.hosts:
        return []
    everywhere = set().union(*(f.hosts for f in d.findings))
    machine = bool(MACHINE_TAGS & set(root.entry.data["tags"]))
    limit = max(1, len(everywhere) // 2) if machine else len(everywhere) // 2
    if len(root.hosts) > limit:
        return []
    reason = f"trainmedic: {root.entry.id}" + (f" in job {d.jobid}" if d.jobid else "")
    return [OddHost(h, root.entry.id, f'scontrol update nodename={h} state=drain reason="{reason}"' if machine else None)
            for h in root.hosts]


def _label(event: Event, lines: list[Event]) -> str:
    """What the start is ("Xid 79", from any fingerprint matching its line, else the entry) and when."""
    xid = next((e.hit.groups["xid"] for e in lines if e.hit.order == event.hit.order and "xid" in e.hit.groups), None)
    what = f"Xid {xid}" if xid else event.entry
    clock = _CLOCK.search(event.hit.time or "")
    return what + (f" at {clock.group(0)}" if clock else "")


def _then(d: Diagnosis) -> str:
    then = [f for f in d.findings if f.role == "collateral" and len(f.ranks or f.hosts) > 1]
    return ", ".join((f"{len(f.ranks)} ranks" if f.ranks else f"{len(f.hosts)} hosts") + f": {f.entry.id}"
                     for f in then[:3])


def build(d: Diagnosis) -> Timeline | None:
    """The job's timeline, or None when nothing failed."""
    if d.root is None:
        return None
    lines = _failure_lines(d)
    events = _firsts(lines)
    own = [e for e in lines if e.entry == d.root.entry.id] or events
    window = _window(own)
    start = _best(window, _by_role)
    if start is None:
        return None
    hosts = _host_of(lines)
    host = _named(window) or start.hit.host or hosts.get(start.hit.rank)
    if host is None:  # a rank's line: the node's own line in the window, or the one node the job's lines name
        placed = _best([e for e in window if e.hit.host], _by_role)
        host = placed.hit.host if placed else _named(lines, only=True)
    rank = start.hit.rank
    if rank is None and host:
        rank = _rank_on(host, d.root, {f.entry.id: f for f in d.findings}, lines, hosts, window)
    return Timeline(events[:MAX_EVENTS], start, rank, host, _odd_hosts(d), _label(start, lines), _then(d))


def attach(d: Diagnosis) -> None:
    """Set d.timeline and reconcile it with d.initiating (the root's first line in log order and the
    lines near it): the timeline's start wins when it is another line and knows where it was."""
    d.timeline = t = build(d)
    if t is None or d.initiating is None:
        return
    init = d.initiating
    if (t.start.hit.file, t.start.hit.line) == (init["file"], init["line"]):
        # the timeline knows the window; the lines next to the root's first line fill what it does not
        t.rank = t.rank if t.rank is not None else init["rank"]
        t.host = t.host or init["host"]
    elif t.rank is None and t.host is None:  # the start says nowhere: keep the placed line
        t.rank, t.host = init["rank"], init["host"]
        return
    init.update(rank=t.rank, host=t.host, line=t.start.hit.line, file=t.start.hit.file)
