"""Failures no single line shows, judged from the log's own progress lines at its end.

- loss-spike: a logged training loss at least SPIKE_FACTOR times the median of the values before
  it (at least MIN_HISTORY of them), that never comes back below RECOVERY_FACTOR times that median
  in the rest of the log. A spike that recovers is an ordinary bad batch, not a failure.
- progress-stall: progress lines carry timestamps, and the log goes on (timestamped lines) for at
  least STALL_FACTOR times the median interval between progress lines, and at least
  MIN_STALL_SECONDS, after the last one: the job hung.

Only the end of each log is read (scan.TAIL_BYTES): what stopped a job is at its end, and reading
every progress line of a 1 GB log would cost more than the scan itself.
"""
from __future__ import annotations

import bisect
import math
import re
import statistics
from dataclasses import dataclass

from bot.engine import markers
from bot.engine.context import line_time

SPIKE_FACTOR = 3.0
RECOVERY_FACTOR = 2.0
MIN_HISTORY = 10
HISTORY = 100
STALL_FACTOR = 10.0
MIN_STALL_SECONDS = 300.0
MIN_STEPS_FOR_STALL = 5

LOSS_SPIKE, PROGRESS_STALL = "loss-spike", "progress-stall"
KINDS = (LOSS_SPIKE, PROGRESS_STALL)

_LOSS = re.compile(r"(?<![\w.])(?:lm |train(?:ing)?[_ ])?loss['\"]?\s*[:=]?\s*([-+]?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?)\b")


@dataclass(frozen=True)
class Trend:
    kind: str
    line: int  # index into the lines given
    meaning: str
    iteration: str | None


@dataclass(frozen=True)
class _Point:
    line: int
    loss: float | None
    iteration: str | None
    time: tuple[str, float] | None


def _points(lines: list[str]) -> list[_Point]:
    points = []
    for i, line in enumerate(lines):
        loss_match = _LOSS.search(line)
        iteration = next((v for m in markers.ITERATION_MARKERS if (v := markers.extract(m, line))), None)
        if loss_match is None and iteration is None:
            continue
        loss = float(loss_match.group(1)) if loss_match else None
        points.append(_Point(i, loss if loss is not None and math.isfinite(loss) else None, iteration,
                             line_time(line)[1]))
    return points


def _spike(points: list[_Point]) -> Trend | None:
    losses = [(p, p.loss) for p in points if p.loss is not None]
    window: list[float] = []  # the last HISTORY losses, kept sorted for the median
    for k, (point, value) in enumerate(losses):
        if k >= MIN_HISTORY:
            base = statistics.median(window)
            if base > 0 and value >= SPIKE_FACTOR * base and all(v >= RECOVERY_FACTOR * base for _, v in losses[k:]):
                return Trend(LOSS_SPIKE, point.line,
                             f"loss jumped from a recent median of {base:.4g} to {value:.4g} and did not come back "
                             f"(threshold {SPIKE_FACTOR:g}x)", point.iteration)
        bisect.insort(window, value)
        if k >= HISTORY:
            window.remove(losses[k - HISTORY][1])
    return None


def _stall(points: list[_Point], lines: list[str]) -> Trend | None:
    timed = [p for p in points if p.time is not None]
    if len(timed) < MIN_STEPS_FOR_STALL or len({p.time[0] for p in timed}) != 1:
        return None
    kind = timed[0].time[0]
    gaps = [b.time[1] - a.time[1] for a, b in zip(timed, timed[1:]) if b.time[1] > a.time[1]]
    if not gaps:
        return None
    step = statistics.median(gaps)
    last = timed[-1]
    later = [t for line in lines[last.line + 1:] if (t := line_time(line)[1]) and t[0] == kind]
    if not later:
        return None
    silent = max(t[1] for t in later) - last.time[1]
    if silent >= max(STALL_FACTOR * step, MIN_STALL_SECONDS):
        return Trend(PROGRESS_STALL, last.line,
                     f"no new progress line for {silent / 60:.0f} min after this one, while steps took "
                     f"{step:.3g} s (threshold {STALL_FACTOR:g}x the step time and {MIN_STALL_SECONDS / 60:g} min)",
                     last.iteration)
    return None


def analyse(lines: list[str]) -> list[Trend]:
    """The trends found in the last lines of one log."""
    points = _points(lines)
    return [t for t in (_spike(points), _stall(points, lines)) if t is not None]
