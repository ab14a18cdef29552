"""Built-in line markers scanned with the fingerprints: training progress and generic error lines.

They are not failures. Progress markers give the context of a failure (last iteration, last saved
checkpoint); error markers give the "most likely error lines" when no entry matches. Each scan
pattern ends on a fixed literal where it can, so the engine reports one match per line. Values
are read with RE2 (linear time whatever the line holds), and only from the lines that are kept.
"""
from __future__ import annotations

from dataclasses import dataclass

import re2

from bot.match.engines import Pattern

ITERATION, CHECKPOINT, EXCEPTION, TRACEBACK, ERROR = "iteration", "checkpoint", "exception", "traceback", "error"
# A traceback frame as Python prints it (faulthandler's dumps, which a hang prints on purpose, have no
# comma before "in") and IPython's arrow at the line a frame was in ("--> 758     raise ...")
FRAME = r'\bFile "[^"\n]{1,400}", line \d+, in |^-{2,}> +\d+ '
IGNORED_HEADER = r"\bException ignored in\b"  # Python's line over an exception it reports and goes on
# Python's line between an exception that an `except` block caught and the one that block raised
HANDLED_HEADER = r"\bDuring handling of the above exception, another exception occurred"
TRACEBACK_HEADER = r"Traceback \(most recent call last\)"  # Python's line over a traceback
# An exception class named with its module whatever its suffix, as Python prints an uncaught one
# (pyarrow.lib.ArrowInvalid, torch._dynamo.exc.BackendCompilerFailed, subprocess.TimeoutExpired):
# lower-case module parts, then a CamelCase name of two words at least, so a logger's name
# ("lightning.Trainer: ...") is not one. No literal in it that the scan could look for, so only a
# file's last lines are read for it (tail_exception).
QUALIFIED_CLASS = r"(?:[a-z_]\w*\.)+_?[A-Z][a-z0-9]+[A-Z]\w*"


@dataclass(frozen=True)
class Marker:
    kind: str
    scan: Pattern
    extract: "re2._Regexp | None" = None  # group 1 is the value; None keeps the line itself


_TQDM = re2.compile(
    r"^\s*(?:\[\w+\]:\s*)?(?:(?:Epoch|Training|Train|Steps?|Iteration)\b[^|%]*)?\d+%\|[^|]*\|\s*(\d+)/\d+ \["
)
_KEYED = re2.compile(r"(?i)\b(?:global[_ ]step|step|steps|iter|iteration)['\"]?\s*[=:]\s*(\d+)")
_PATH = re2.compile(r"""['"]?((?:/|\./|\.\./|[\w.-]+/)[^\s'",]*|checkpoint-\d+)""")

# Iteration lines can be most of a log, so they have an engine of their own that is only run
# backwards from the lines that are kept (see scan._Progress).
ITERATION_MARKERS: tuple[Marker, ...] = (
    Marker(ITERATION, Pattern(r"\biteration\s+\d+/\s*\d+ \|"), re2.compile(r"\biteration\s+(\d+)/")),
    Marker(ITERATION, Pattern(r"\d%\|[^|\n]*\|\s*\d+/\d+ \["), _TQDM),
    Marker(ITERATION, Pattern(r"\b(global[_ ]step|step|steps|iter|iteration)['\"]?\s*[=:]\s*\d", True), _KEYED),
    # "Step 100: loss ...", "step 100/5000 | ...", nanoGPT's "iter 100: loss ..."
    Marker(ITERATION, Pattern(r"\b(step|iter)\s+\d+(/\d+|:)", True), re2.compile(r"(?i)\b(?:step|iter)\s+(\d+)(?:/\d+|:)")),
)
LINE_MARKERS: tuple[Marker, ...] = (
    # "Saving model checkpoint to", "saving checkpoint at iteration", "saving model to '...ckpt'";
    # not "Configuration saved in .../checkpoint-1200/config.json".
    Marker(CHECKPOINT, Pattern(r"\b(sav(ed|ing)|wrote|writing)( the| a)?( model| final)? (checkpoint|ckpt)\b|\bsaving model to\b", True), _PATH),
    # and a frame of a traceback whose header a paste cut off (Python's `  File "x.py", line 3, in f`,
    # rich's boxed "│ ❱ 456 │ ..."), and Hydra's note under a task's uncaught exception, whose
    # traceback it shortens or leaves out, and IPython's arrow at the line a frame was in
    # ("--> 758     raise NonMatchingChecksumError(msg)"), which a notebook paste may keep alone
    Marker(TRACEBACK, Pattern(TRACEBACK_HEADER + r"|│ ❱ +\d+ │|HYDRA_FULL_ERROR=1 for a complete stack trace|"
                              + FRAME)),
    # and the header Python prints over an exception it ignored (in __del__, at interpreter exit),
    # the one under an exception that was caught and whose handler raised another,
    # an exception's repr alone on its line (Hydra's "Error in call to target '...':" puts it there),
    # and IPython's header naming the exception over its traceback (a notebook paste may stop before
    # the exception's own line)
    Marker(EXCEPTION, Pattern(r"\b(_?[A-Z]\w*(Error|Exception)|Exception)(:|$)|^[A-Z]\w*(Error|Exception)\(|"
                              r"^[A-Z]\w*(Error|Exception) +" + TRACEBACK_HEADER + "|" + IGNORED_HEADER + "|" + HANDLED_HEADER)),
    # Only the first KEEP_ERRORS of a file are kept, and a noisy log has thousands: the engine
    # reports a chunk's first one, the scan asks for the next ones (scan.Scanner._next_errors).
    Marker(ERROR, Pattern(r"\b(error|fatal)\b", True, first_only=True)),
)


_FRAME = re2.compile(FRAME)  # RE2: it reads a file's last lines, whatever they hold
CUT_TAIL_BYTES = 4096  # a file's last bytes read for a traceback it ends inside


_QUALIFIED = re2.compile(r"^(?:\[[^\]\n]{0,40}\]:? ?)*" + QUALIFIED_CLASS + ": ")
FRAME_TO_EXCEPTION = 3  # a frame line, its source line and the carets under it, then the exception
END_EXCEPTION_LINES = 3  # without its traceback (cut from a paste), an exception line this close to its file's end ended it


def _tail_lines(tail: bytes) -> list[str]:
    """A file's last lines (of its last CUT_TAIL_BYTES), the first of them perhaps partial."""
    lines = tail[-CUT_TAIL_BYTES:].decode("utf-8", "replace").split("\n")
    if tail.endswith(b"\n"):
        lines.pop()  # the file's last line is the one before its final newline
    return [line.rstrip("\r") for line in lines]


def tail_exception(tail: bytes) -> tuple[int, str] | None:
    """The last exception line in a file's last lines whose class the scan's exception marker does not
    know (pyarrow.lib.ArrowInvalid: no Error suffix), printed right under a traceback frame or among
    the file's last lines: (how many lines before the file's last line, the line), or None."""
    lines = _tail_lines(tail)
    for at in range(len(lines) - 1, 0, -1):
        if _QUALIFIED.search(lines[at]) and (at >= len(lines) - END_EXCEPTION_LINES or any(
                _FRAME.search(lines[k]) for k in range(max(0, at - FRAME_TO_EXCEPTION), at))):
            return len(lines) - 1 - at, lines[at]
    return None


_HEADER = re2.compile("^" + TRACEBACK_HEADER + r":\s*$")
_EXCEPTION_LINE = re2.compile(r"^(?:[A-Za-z_]\w*\.)*_?[A-Z]\w*: (.+)$")  # unindented "Type: message"
MIN_QUOTED = 12  # characters of an exception's message the line above its traceback must repeat
# an ERROR (or glog E/F) record before the quoted message: code that logs the error and raises it
_ERROR_RECORD = re2.compile(r"^[EF]\d{4} |\b(?:ERROR|CRITICAL|FATAL)\b")


def logged_tracebacks(tail: bytes) -> list[int]:
    """Exception lines in a file's last lines whose traceback a handler printed right after logging
    the error, the run going on after it: the line above "Traceback (most recent call last):" repeats
    the exception's message ("Could not load bitsandbytes native library: 'NoneType' object has no
    attribute 'split'") in no ERROR record, and more than END_EXCEPTION_LINES lines follow the
    exception. Code that logs an error and raises it (an ERROR record, then Python's report of the
    uncaught exception) is not one. Each as how many lines before the file's last line it is."""
    lines = _tail_lines(tail)
    found = []
    for h in range(1, len(lines)):
        if not _HEADER.match(lines[h]):
            continue
        at = next((k for k in range(h + 1, len(lines)) if lines[k] and not lines[k][0].isspace()), None)
        raised = _EXCEPTION_LINE.match(lines[at]) if at is not None else None
        message = raised.group(1).strip() if raised else ""
        quoted = lines[h - 1].find(message) if len(message) >= MIN_QUOTED else -1
        if quoted >= 0 and not _ERROR_RECORD.search(lines[h - 1][:quoted]) and at < len(lines) - END_EXCEPTION_LINES:
            found.append(len(lines) - 1 - at)
    return found


def cut_traceback(tail: bytes) -> tuple[int, str] | None:
    """Where a file ends inside a traceback, before its exception line (a paste cut there, a process
    killed while printing it): (how many lines before the file's last line, the last frame line), or
    None. The frame may be followed by its source line, and that by the carets under it."""
    lines = _tail_lines(tail)
    end = len(lines)
    while end and not lines[end - 1].strip():
        end -= 1
    carets = end >= 3 and not lines[end - 1].strip().strip("^~")
    for at in (end - 1, end - 2) + ((end - 3,) if carets else ()):
        if at >= 0 and _FRAME.search(lines[at]):
            return len(lines) - 1 - at, lines[at]
    return None


def checkpoint(line: str) -> str | None:
    """The path a checkpoint line names, or None."""
    paths = _PATH.findall(line)
    return paths[-1] if paths else None


def iteration(line: str) -> str | None:
    """The training iteration an iteration line names, or None."""
    return next((v for m in ITERATION_MARKERS if (v := extract(m, line))), None)


def extract(marker: Marker, line: str) -> str | None:
    """The marker's value in `line` (iteration number, checkpoint path), or None if it is not there."""
    if marker.extract is None:
        return line
    if marker.kind == CHECKPOINT:
        return checkpoint(line)
    m = marker.extract.search(line)
    return m.group(1) if m else None
