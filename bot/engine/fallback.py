"""What a failed run says when no entry explains it: its own last exception, and how it died.

A run that died on an exception the knowledge base has no entry for (`KeyError: 'SLURM_NTASKS'`
of a custom class, `RuntimeError: Found dtype Half but expected Float`) must not get silence.
Entries that declare a `last-exception` detector (python-user-code-error; file-not-found for a
FileNotFoundError, when its detector names that class in `types`) take that line as a weak root,
when the log shows that the run failed of it: a launcher or the scheduler reported a failure
after it (a cascade fingerprint hit: ChildFailedError, `srun: error: ... Exited with exit code 1`),
it is among the last lines of its file, or it comes after the file's last progress line (training
stopped before it, and a runtime's long error dump may follow). With no traceback anywhere (a paste
that cut it off) it counts when a failure is reported after it, or when the log ends on it in the
shape Python prints an uncaught exception (`RuntimeError: ...` at the line's start, not a logger's
`ERROR: ...` about one). An exception handled in the middle of a healthy run is followed by more
training and stays silent; an exception line that a fingerprint matched is that entry's to explain,
and a wrapper's own exception (ChildFailedError, CalledProcessError) is never the answer. When no
exception line explains it, the built-in exception type a wrapper names (Ray's
`RayTaskError(IndexError)`) is the child's error, and the signal a wrapper reports the child died
of (-9, 137, signal 11) names the entry that explains that signal (diagnose.py). A failure the
launcher restarted from (a `recovers` line after it) ended nothing. When nothing at all says how the
run failed and a file ends inside a traceback, before its exception line (a paste cut there), its
last frame stands for the exception.
"""
from __future__ import annotations

import builtins
import re

from bot.engine import markers
from bot.engine.context import line_context, logged_exception
from bot.engine.scan import FingerprintHits, Hit, Marked, ScanResult
from bot.kb.load import Fingerprint, KnowledgeBase

LAST_EXCEPTION = "last-exception"
END_LINES = 40  # an exception this close to the end of its file ended the run
IGNORED_LINES = 40  # an exception this close after Python's "Exception ignored in" header is that ignored one
_IGNORED = re.compile(markers.IGNORED_HEADER)
_HEADERS = re.compile(f"{markers.IGNORED_HEADER}|{markers.HANDLED_HEADER}")
_HANDLED = re.compile(markers.HANDLED_HEADER)
CAUGHT_LINES = 8  # an exception's line this close above "During handling of the above exception" is that exception
# "KeyError: ...", a bare `raise Exception(...)`'s "Exception:", a repr ("TypeError('...')") and
# IPython's header ("KeyError      Traceback (most recent call last)"); a private class's name
# starts with an underscore (torch's "_LinAlgError: linalg.cholesky: ..."); a class named with its
# module needs no suffix (markers.QUALIFIED_CLASS)
_TYPE = re.compile(r"\b((?:[A-Za-z_]\w*\.)*(?:_?[A-Z]\w*(?:Error|Exception)|Exception))(?=:|\(|\s*$| +Traceback \()"
                   rf"|\b({markers.QUALIFIED_CLASS})(?=: )")
# an exception raised by the communication itself (a gloo read error, a reset socket): one more consequence
_COMMS = re.compile(r"gloo|nccl|c10d|ProcessGroup|socket|Connection (?:reset|refused|closed)|Broken pipe|timed? ?out",
                    re.I)
# Python's last line of an uncaught exception: the type at the start (after a rank prefix, or the
# date and time a job runner stamps on every line it relays), or a class named with its module
_UNCAUGHT = re.compile(r"^(?:\d{4}-\d\d-\d\d[ T][\d:.,]+Z? )?(?:\[[^\]\n]{0,40}\]:? ?)*"
                       rf"(?:(?:[A-Za-z_]\w*\.)*_?[A-Z]\w*(?:Error|Exception)(?::|\s*$)|{markers.QUALIFIED_CLASS}: )")


def _matched_lines(result: ScanResult, roles: tuple[str, ...]) -> list[tuple[int, int]]:
    return [h.order for fp, fph in result.hits.items() if fp.role in roles for h in fph.hits]


def recovered(file: int, line: int, result: ScanResult) -> bool:
    """Whether a line marked `recovers` (an elastic restart) follows this one in its file."""
    return any(h.file == file and h.line > line for fp, fph in result.hits.items() if fp.recovers for h in fph.hits)


def failure_reported_after(file: int, line: int, result: ScanResult) -> bool:
    """Whether a launcher or the scheduler reported a failure after this line (a cascade hit)."""
    return any(order > (file, line) for order in _matched_lines(result, ("cascade",)))


def ended_the_run(file: int, line: int, result: ScanResult) -> bool:
    """Whether the run ended on this line: nothing recovered from it, and a launcher or the
    scheduler reported a failure after it, or it is among the last lines of its file, or training
    progress stopped before it (a long native error dump may follow an exception)."""
    if recovered(file, line, result):
        return False
    near_end = file < len(result.file_lines) and line > result.file_lines[file] - END_LINES
    return near_end or 0 < _last_progress(file, result) < line or failure_reported_after(file, line, result)


def training_went_on(file: int, line: int, result: ScanResult) -> bool:
    """Whether its file logged training progress after this line: what failed there ended nothing."""
    return _last_progress(file, result) > line


def _last_progress(file: int, result: ScanResult) -> int:
    """The line of the file's last progress line (0: none)."""
    return result.file_progress[file] if file < len(result.file_progress) else 0


def last_exception(result: ScanResult, before: Hit | None = None) -> Marked | None:
    """The exception that ended a failed run, when no fingerprint matched it; None otherwise.
    Without a traceback in the log (a paste that cut it off) it takes a launcher's or the
    scheduler's failure report after it: an error line alone is not an uncaught exception.
    With `before` (the first consequence the log shows, a collective time-out), only an exception
    printed above it in its file, with no training logged after it and not raised by the
    communication itself, counts."""
    matched = set(_matched_lines(result, ("root", "cascade", "confirm")))
    blocks = ignored_blocks(result)
    for m in reversed(result.last_exceptions):
        if (m.file, m.line) in matched or (m.file, m.line) in result.logged or _HEADERS.search(m.text) \
                or logged_exception(m.text):
            continue  # a wrapper's exception, a line a known entry already explains, one a handler
            # logged and went on from, Python's header over an ignored or a handled exception, an
            # exception line a WARNING log record quotes
        if before is not None and (m.file != before.file or m.line >= before.line or _COMMS.search(m.text)
                                   or training_went_on(m.file, m.line, result)):
            continue
        if in_blocks(m.file, m.line, blocks):
            return None  # Python reported it as ignored (raised in __del__ or at exit): it ended nothing
        if not result.tracebacks and not failure_reported_after(m.file, m.line, result) \
                and not _ends_the_log(m, result):
            return None
        return m if ended_the_run(m.file, m.line, result) else None
    return None


FRAME_LINES = 40  # a frame this close above the run's last exception is in its traceback


def raised_through(frame: Hit, last: Marked | None, result: ScanResult) -> bool:
    """Whether `last`, the run's last exception that no fingerprint matched, was raised through this
    traceback frame (printed below it, in its traceback), or the traceback its file ends inside, cut
    before its exception line (`ScanResult.cut_frames`), holds it: a frame of a known function says
    what the exception was about (a reset connection inside init_process_group is a failed
    rendezvous; a paste cut inside torch's load_state_dict is a state-dict mismatch)."""
    if last is not None and last.file == frame.file and frame.line < last.line <= frame.line + FRAME_LINES:
        return True
    return any(cut.file == frame.file and frame.line <= cut.line <= frame.line + FRAME_LINES for cut in result.cut_frames)


def wrapped_exception(result: ScanResult) -> tuple[Marked, str] | None:
    """The last report of a wrapper that names the built-in exception type its child raised (Ray's
    `RayTaskError(IndexError): ...`, its capture `inner`), when the run ended on it: the child's own
    exception line was cut from the paste, and the type it names is still the child's error."""
    reports = [h for fp, fph in result.hits.items() if fp.role == "cascade" for h in fph.hits
               if _builtin_exception(h.groups.get("inner", ""))]
    for hit in sorted(reports, key=lambda h: h.order, reverse=True):
        if ended_the_run(hit.file, hit.line, result):
            marked = Marked(hit.file, hit.line, hit.text, iteration=hit.iteration, checkpoint=hit.checkpoint)
            return marked, hit.groups["inner"]
    return None


def _builtin_exception(name: str) -> bool:
    """A Python built-in exception type (IndexError, KeyError, ...), not a framework's own wrapper
    (Ray's ActorDiedError) or a library's error that an entry may explain better."""
    kind = getattr(builtins, name, None)
    return isinstance(kind, type) and issubclass(kind, Exception)


def _ends_the_log(m: Marked, result: ScanResult) -> bool:
    """An exception line in Python's uncaught shape among the last lines of its file."""
    last = result.file_lines[m.file] if m.file < len(result.file_lines) else None
    return last is not None and m.line > last - markers.END_EXCEPTION_LINES and _UNCAUGHT.match(m.text) is not None


def ignored_blocks(result: ScanResult) -> list[tuple[int, int, int]]:
    """(file, first line, last line) of each exception Python reported as ignored, among the last
    exception lines kept: from its "Exception ignored in" header to its own exception line."""
    kept = list(result.last_exceptions)
    blocks = []
    for i, header in enumerate(kept):
        if _IGNORED.search(header.text):
            end = next((m.line for m in kept[i + 1:] if m.file == header.file and not _IGNORED.search(m.text)
                        and m.line - header.line <= IGNORED_LINES), None)
            if end is not None:
                blocks.append((header.file, header.line, end))
    return blocks


def handled_headers(result: ScanResult) -> list[Marked]:
    """Python's "During handling of the above exception, another exception occurred" lines, among
    the last exception lines kept: the exception above each was caught, and its handler raised."""
    return [m for m in result.last_exceptions if _HANDLED.search(m.text)]


def caught_before(hit: Hit, headers: list[Marked]) -> Marked | None:
    """The handled header right under this hit's exception (it was caught), or None."""
    return next((h for h in headers if h.file == hit.file and hit.line < h.line <= hit.line + CAUGHT_LINES), None)


def in_blocks(file: int, line: int, blocks: list[tuple[int, int, int]]) -> bool:
    return any(f == file and first < line <= last for f, first, last in blocks)


def add_last_exception(kb: KnowledgeBase, result: ScanResult, before: Hit | None = None) -> bool:
    """Record the run's last exception (printed above `before`, when given) as a hit of the
    `last-exception` detectors that name its type (a FileNotFoundError whose wording no fingerprint
    knows is still file-not-found's), else of those that name none; True if one was added."""
    m = last_exception(result, before)
    if m is not None:
        kind = _TYPE.search(m.text)
        groups = {"exception": kind.group(1) or kind.group(2)} if kind else {}
    elif before is None and (wrapped := wrapped_exception(result)) is not None:
        m, groups = wrapped[0], {"exception": wrapped[1]}
    else:
        return False
    return _record(_detectors_for(kb, groups.get("exception", "")), m, groups, result)


def add_cut_frame(kb: KnowledgeBase, result: ScanResult) -> bool:
    """When nothing else says how the run failed and a file ends inside a traceback, before its
    exception line (a paste cut there), record that traceback's last frame as the uncaught
    exception of the detectors that name no type; True if one was added."""
    if not result.cut_frames:
        return False
    return _record(_detectors_for(kb, ""), result.cut_frames[-1], {}, result)


def _record(detectors: list[Fingerprint], m: Marked, groups: dict[str, str], result: ScanResult) -> bool:
    ctx = line_context(m.text)
    for fp in detectors:
        hit = Hit(fingerprint=fp, file=m.file, line=m.line, text=m.text, rank=ctx.rank, host=ctx.host,
                  time=ctx.time, time_key=ctx.time_key, groups=groups,
                  iteration=m.iteration, checkpoint=m.checkpoint)
        result.hits.setdefault(fp, FingerprintHits()).add(hit)
    return bool(detectors)


def _detectors_for(kb: KnowledgeBase, exception: str) -> list[Fingerprint]:
    """The last-exception detectors naming this exception class (`torch.serialization.FileNotFoundError`
    is a FileNotFoundError), else those naming none."""
    short = exception.rsplit(".", 1)[-1]
    detectors = kb.detectors(LAST_EXCEPTION)
    return [d for d in detectors if short in d.types] or [d for d in detectors if not d.types]


_EXIT_GROUPS = ("exitcode", "returncode", "exit_code")


def reported_signal(reports: list[Hit], result: ScanResult) -> tuple[int, Hit] | None:
    """The signal the first failure that wrappers report (`reports`, their hits) died of: a negative exit code (-9), a shell
    exit status 128+N (137), or a captured signal number. None when that first report is a plain
    exit code (a later 137 is then the launcher's teardown, not the cause)."""
    for hit in sorted(reports, key=lambda h: h.order):
        if recovered(hit.file, hit.line, result):
            continue  # the launcher restarted the workers and carried on
        code = _exit_of(hit.groups)
        if code is not None:
            return (code, hit) if code > 0 else None
    return None


# Windows reports a crash as an NTSTATUS exit code (unsigned, or negative when read as int32):
# access violation and stack overflow behave as SIGSEGV, a fail-fast (stack buffer overrun) as abort.
_NTSTATUS = {0xC0000005: 11, 0xC00000FD: 11, 0xC0000409: 6}


def _exit_of(groups: dict[str, str]) -> int | None:
    """The signal number a wrapper's captures say the child died of (> 0), 0 for a plain non-zero
    exit code, None when they say nothing of how it ended."""
    value = groups.get("signal", "")
    if value.isdigit():
        return int(value)
    for name in _EXIT_GROUPS:
        value = groups.get(name, "")
        if value.lstrip("-").isdigit() and int(value) != 0:
            code = int(value)
            if code & 0xFFFFFFFF in _NTSTATUS:
                return _NTSTATUS[code & 0xFFFFFFFF]
            return -code if code < 0 else code - 128 if 128 < code < 160 else 0
    return None
