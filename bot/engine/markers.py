"""Built-in line markers scanned with the fingerprints: training progress and generic error lines.

They are not failures. Progress markers give the context of a failure (last iteration, last saved
checkpoint); error markers give the "most likely error lines" when no entry matches. Each scan
pattern ends on a fixed literal where it can, so the engine reports one match per line.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from bot.match.engines import Pattern

ITERATION, CHECKPOINT, EXCEPTION, TRACEBACK, ERROR = "iteration", "checkpoint", "exception", "traceback", "error"


@dataclass(frozen=True)
class Marker:
    kind: str
    scan: Pattern
    extract: re.Pattern | None = None  # group 1 is the value; None keeps the line itself


_TQDM = re.compile(
    r"^\s*(?:\[\w+\]:\s*)?(?:(?:Epoch|Training|Train|Steps?|Iteration)\b[^|%]*)?\d+%\|[^|]*\|\s*(\d+)/\d+ \["
)
_KEYED = re.compile(r"\b(?:global[_ ]step|step|steps|iter|iteration)['\"]?\s*[=:]\s*(\d+)", re.I)
_PATH = re.compile(r"""['"]?((?:/|\./|\.\./|[\w.-]+/)[^\s'",]*|checkpoint-\d+)""")

# Iteration lines can be most of a log, so they have an engine of their own that is only run over
# the tail of a chunk unless the chunk holds a failure (see scan.Scanner._iterations).
ITERATION_MARKERS: tuple[Marker, ...] = (
    Marker(ITERATION, Pattern(r"\biteration\s+\d+/\s*\d+ \|"), re.compile(r"\biteration\s+(\d+)/")),
    Marker(ITERATION, Pattern(r"\d%\|[^|\n]*\|\s*\d+/\d+ \["), _TQDM),
    Marker(ITERATION, Pattern(r"\b(global[_ ]step|step|steps|iter|iteration)['\"]?\s*[=:]\s*\d", True), _KEYED),
)
LINE_MARKERS: tuple[Marker, ...] = (
    # "Saving model checkpoint to", "saving checkpoint at iteration", "saving model to '...ckpt'";
    # not "Configuration saved in .../checkpoint-1200/config.json".
    Marker(CHECKPOINT, Pattern(r"\b(sav(ed|ing)|wrote|writing)( the| a)?( model| final)? (checkpoint|ckpt)\b|\bsaving model to\b", True), _PATH),
    Marker(TRACEBACK, Pattern(r"Traceback \(most recent call last\)")),
    Marker(EXCEPTION, Pattern(r"\b[A-Z]\w*(Error|Exception)(:|$)")),
    Marker(ERROR, Pattern(r"\b(error|fatal)\b", True)),
)


def extract(marker: Marker, line: str) -> str | None:
    """The marker's value in `line` (iteration number, checkpoint path), or None if it is not there."""
    if marker.extract is None:
        return line
    if marker.kind == CHECKPOINT:
        paths = _PATH.findall(line)
        return paths[-1] if paths else None
    m = marker.extract.search(line)
    return m.group(1) if m else None
