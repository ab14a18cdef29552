"""What a single log line says about where and when it was written: rank, host, timestamp."""
from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime, timezone

import re2

_RANK = [
    re.compile(p)
    for p in (
        r"\[(?:rank|Rank|RANK)\s?(\d{1,6})\]",  # [rank3]: (PyTorch), [Rank 3] (DeepSpeed)
        r"\[default(\d{1,6})\]:",  # torchrun --tee prefixes
        r"\b(?:global_rank|local_rank|rank)\s*[:=]\s*(\d{1,6})\b",
        r"\bsrun: error: [\w.-]+: task (\d{1,6}):",
        r"\bProcess (?:rank )?(\d{1,6}) (?:terminated|exited)",
    )
]
_HOST = [
    re.compile(p)
    for p in (
        r"^(?:\S+\s+)?([A-Za-z][\w.-]*):\d+:\d+ \[\d{1,4}\]",  # NCCL host:pid:tid [cudaDev]: the bracket is the GPU, not the rank
        r"\bsrun: error: ([\w.-]+): tasks? ",
        r"\b(?:STEP|JOB) \S+ ON ([\w.-]+) ",  # slurmstepd *** JOB 1 ON node12 CANCELLED
        r"\bNode failure on ([\w.-]+)",
        r"^[A-Z][a-z]{2} [ \d]\d \d\d:\d\d:\d\d ([\w.-]+) ",  # syslog: Mar  3 10:00:01 node12 kernel:
        r"^([a-z][a-z0-9-]*\d[a-z0-9.-]*): ",  # pdsh / DeepSpeed launcher prefixes: worker-1:
        r"\bhost(?:name)?[=:]\s*([A-Za-z][\w.-]+)",
        r"^\s*host\s+:\s*([A-Za-z][\w.-]*)\s*$",  # torchrun's failure table: "  host      : node12"
    )
]
_MONTHS = {m: i for i, m in enumerate("Jan Feb Mar Apr May Jun Jul Aug Sep Oct Nov Dec".split(), 1)}
_ISO = re.compile(r"(\d{4})-(\d\d)-(\d\d)[T ](\d\d):(\d\d):(\d\d)(?:[.,](\d{1,9}))?")
_GLOG = re.compile(r"\b[IWEF](\d{1,2})(\d\d) (\d\d):(\d\d):(\d\d)(?:\.(\d{1,9}))?")  # [W1009 17:52:10.112]
_SYSLOG = re.compile(r"^([A-Z][a-z]{2}) ([ \d]\d) (\d\d):(\d\d):(\d\d)")
_DMESG = re.compile(r"^\[\s*(\d{1,9}\.\d{3,9})\]")
_CLOCK = re.compile(r"\d:\d\d")  # in every timestamp above but dmesg's

# An exception line quoted by a log record of level WARNING ("[WARNING] FileNotFoundError: ...",
# "WARNING:root:KeyError: ..."): the exception was caught and reported, and the program went on
# (torch._dynamo's "WON'T CONVERT" blocks prefix every line of the compiler's traceback so). Only
# the exception line right after the level counts: a warning that names an error type in a sentence
# may be about a failure. RE2: it runs on kept lines of any content.
_LOGGED_EXCEPTION = re2.compile(
    r"(?:\[WARN(?:ING)?\]|\bWARN(?:ING)?:(?:[\w.]+:)?|[-|] WARN(?:ING)? +[-|])[ \t]*(?:[A-Za-z_]\w*\.)*[A-Z]\w*(?:Error|Exception):")

# Only timestamps near the start of a line date the line; later ones are quoted values.
_HEAD = 120


@dataclass(frozen=True)
class LineContext:
    rank: int | None
    host: str | None
    time: str | None
    time_key: tuple[str, float] | None  # (kind, seconds): comparable only within one kind


def _seconds(month: int, day: int, h: str, m: str, s: str, frac: str | None) -> float:
    return (((month * 31 + day) * 24 + int(h)) * 60 + int(m)) * 60 + int(s) + float(f"0.{frac or 0}")


def line_time(line: str) -> tuple[str | None, tuple[str, float] | None]:
    """(the timestamp as written, (kind, seconds)) of a line, or (None, None)."""
    head = line[:_HEAD]
    if not _CLOCK.search(head):
        m = _DMESG.search(head)  # the one timestamp without a clock; most lines are untimed
        return (m.group(0), ("boot", float(m.group(1)))) if m else (None, None)
    if m := _ISO.search(head):
        y, mo, d, h, mi, s, frac = m.groups()
        try:
            at = datetime(int(y), int(mo), int(d), int(h), int(mi), int(s), tzinfo=timezone.utc)
        except ValueError:
            return None, None
        return m.group(0), ("abs", at.timestamp() + float(f"0.{frac or 0}"))
    if m := _SYSLOG.search(head):
        month = _MONTHS.get(m.group(1))
        if month:
            return m.group(0), ("md", _seconds(month, int(m.group(2)), *m.groups()[2:5], None))
    if m := _GLOG.search(head):
        return m.group(0), ("md", _seconds(int(m.group(1)), int(m.group(2)), *m.groups()[2:]))
    if m := _DMESG.search(head):
        return m.group(0), ("boot", float(m.group(1)))
    return None, None


def _first(patterns: list[re.Pattern], line: str) -> str | None:
    for pattern in patterns:
        if m := pattern.search(line):
            return m.group(1)
    return None


def line_context(line: str) -> LineContext:
    """Rank, host and timestamp of one line, each None when the line does not say."""
    line = line[:2000]
    rank = _first(_RANK, line)
    time, key = line_time(line)
    return LineContext(rank=int(rank) if rank is not None else None, host=_first(_HOST, line), time=time, time_key=key)


def logged_exception(line: str, end: int | None = None) -> bool:
    """Whether the line (up to `end`) is an exception line quoted by a WARNING log record, not raised."""
    return _LOGGED_EXCEPTION.search(line, 0, len(line) if end is None else end) is not None
