"""Failures no single line shows, judged over the whole run from the values its progress lines log.

The scan hands every chunk of a file to `Series.read`, which reads values from windows of it: every
progress line of the first FULL_BYTES of the file, then the first WINDOW_LINES progress lines of
a window every `position / WINDOWS_PER_E` bytes (about WINDOWS_PER_E windows for each e-fold of
the file's size: some 30 in a 5 MB paste, 56 in a 2 GB log), and the end of every chunk. Each
window is scanned by a small engine of its own (the keys below). What is kept is a summary
(running levels, counters, the few lines a judgement quotes), whatever the log's size; a value
read is a report, a float() and a comparison or two.

- divergence: a logged training loss at least SPIKE_FACTOR times the median of the (up to HISTORY)
  values read before it, with at least MIN_HISTORY of them, that never comes back below
  RECOVERY_FACTOR times that median in the rest of the values read. A spike that recovers is an
  ordinary bad batch. The line quoted is where it turned: the lines of the chunk between the
  window that saw it and the one before are read for the first loss past the threshold.
- non-finite: the last values read (NONFINITE_RUN of each series) of the loss or of the grad norm
  are NaN or Inf: a run that ends on a NaN loss, or on grad norms that stay NaN. An infinite grad
  norm now and then is normal with fp16 (the step is skipped); NaN that stays is not.
- loss-scale floor: the fp16 loss scale came down to SCALE_FLOOR (Megatron's and DeepSpeed's
  default minimum) from higher, or below it (fairseq's minimum is 1e-4: only repeated overflows
  get there), and the last FLOOR_READINGS readings stayed there; a scale that is 1.0 throughout is
  bf16 or fp32, not a collapse, and one reading at the floor as a paste ends may still rise again
  (unless it is below COLLAPSED_SCALE).
- skipped steps: after the first CALIBRATION_ITERATIONS (where the scale calibrates and skips are
  normal), at least SKIPPED_SHARE of the iterations read were skipped (Megatron's per-interval
  count, DeepSpeed's cumulative `skipped=`).
- stall: timestamped progress lines stop while the log goes on (timestamped lines) for at least
  STALL_FACTOR times the median interval between progress lines, and MIN_STALL_SECONDS: a hang.
"""
from __future__ import annotations

import bisect
import math
import re
import statistics
from collections import deque
from dataclasses import dataclass, field
from typing import Callable

from bot.engine.context import line_time
from bot.match import engines

FULL_BYTES = 8 << 10
WINDOW_BYTES = 1 << 10
WINDOW_LINES = 3
WINDOWS_PER_E = 4
CHUNK_TAIL_BYTES = 1 << 10
MAX_REFINES = 8  # turns a file may look for in the lines between two windows
TIMED_LINES = 2  # progress lines of a window read for their time (one gap a window is enough)

SPIKE_FACTOR = 3.0
RECOVERY_FACTOR = 2.0
MIN_HISTORY = 3  # a paste from an issue thread may hold a handful of logged losses
HISTORY = 100
SCALE_FLOOR = 1.0
FLOOR_READINGS = 3  # readings of the scale at its floor, without a rise, that make it a collapse
COLLAPSED_SCALE = 1e-3  # a scale this low is a collapse at its first reading (DeepSpeed "reducing to 0")
CALIBRATION_ITERATIONS = 100
SKIPPED_SHARE = 0.2
MIN_SKIPPED = 10
STALL_FACTOR = 10.0
MIN_STALL_SECONDS = 300.0
MIN_STEPS_FOR_STALL = 5

LOSS_SPIKE, NONFINITE, SCALE_FLOOR_KIND, SKIPPED_STEPS, PROGRESS_STALL = (
    "loss-spike", "nonfinite-values", "loss-scale-floor", "skipped-steps", "progress-stall")
KINDS = (LOSS_SPIKE, NONFINITE, SCALE_FLOOR_KIND, SKIPPED_STEPS, PROGRESS_STALL)

LOSS, GRAD_NORM, SCALE, SKIPPED, DS_SKIPPED, ITERATION = "loss", "grad norm", "loss scale", "skipped", "ds-skipped", "iteration"
NONFINITE_RUN = {LOSS: 1, GRAD_NORM: 2}  # fp16 skips a step at a time: one inf grad norm is no failure
# Each key ends where its value starts. Validation losses are not keys (`val_loss`, `val loss:`).
_KEYS: tuple[tuple[str, engines.Pattern], ...] = (
    (LOSS, engines.Pattern(r"\blm loss: ")),  # Megatron
    (LOSS, engines.Pattern(r"['\"](?:train_)?loss['\"]: ")),  # HF Trainer's {'loss': 2.31, ...}
    # tqdm/Lightning postfix, "| loss: 2.3", TF "INFO:tensorflow:loss = 2.3", "Epoch 3 Train Loss: 2.3",
    # kohya's "avr_loss=0.11", "avg_loss: 2.3", "total_loss=4.1"
    (LOSS, engines.Pattern(r"(?:^|[\s,\[|:])(?:(?:[Tt]rain(?:ing)?|avr|avg|mean|total|running)[_/ ])?[Ll]oss ?[=:] ?")),
    (LOSS, engines.Pattern(r"\biter \d+: loss ")),  # nanoGPT
    (LOSS, engines.Pattern(r"\b[Ll]oss is ")),  # BigDL's "Loss is 1.26.", "Loss is Infinity."
    (LOSS, engines.Pattern(r"\| loss ")),  # a column of "step 48480 | loss 14.13 | lr ..."
    (LOSS, engines.Pattern(r"\btrain_loss ")),  # nnU-Net's "2023-08-09 15:17:51.409852: train_loss 0.4123"
    (GRAD_NORM, engines.Pattern(r"\bgrad norm: |['\"]grad_norm['\"]: |\bgrad_norm[=:] ?")),  # mmengine "grad_norm: 3.06"
    # Megatron "loss scale: 1.0 |" (older forks without the colon), fairseq "loss_scale=0.062" and
    # "setting loss scale to: 0.0625", DeepSpeed's overflow lines (new and old wording), Paddle AMP's
    # "Found inf or nan, current scale is: 3.05e-05, decrease to: ..."
    (SCALE, engines.Pattern(r"\bloss[ _]scale(?:[=:] ?| )|\bsetting loss scale to: |\bFound inf or nan, current scale is: |(?:\bOVERFLOW! Rank \d+|\bOverflow detected\.) "
                            r"Skipping step\. Attempted loss scale: \d+(?:\.\d+)?, reducing to |\bReducing dynamic loss scale from \d+(?:\.\d+)? to ")),
    (SKIPPED, engines.Pattern(r"\bnumber of skipped iterations: +|\bnumber_of_skipped_iterations= *")),
    (DS_SKIPPED, engines.Pattern(r"\bstep=\d+, skipped=")),  # DeepSpeed's log_dist: cumulative
    (ITERATION, engines.Pattern(r"\biteration(?: +|= +)")),  # Megatron "iteration  100/ 1000 |", its forks "iteration=   100/"
)
KEY_PATTERNS = [p for _, p in _KEYS]
_KEY_NAMES = [name for name, _ in _KEYS]
_NUMBER = re.compile(rb"[ \t]*['\"]?([-+]?(?:\d+(?:\.\d*)?(?:[eE][-+]?\d+)?|nan|inf(?:inity)?))\b", re.I)
_DS_STEP = re.compile(rb"step=(\d+), skipped=$")
_NOT_TRAINING = re.compile(rb"(?i)\b(?:val|eval|valid|validation|test)[ _/]?loss\W*$")


@dataclass(frozen=True)
class Trend:
    kind: str
    line: int  # line number in the file
    text: str  # the line quoted (decoded, not yet clipped or redacted)
    meaning: str
    iteration: str | None


@dataclass(frozen=True)
class Quote:
    line: int
    text: str


def _quote(data, start: int, line_of) -> Quote:
    stop = data.find(b"\n", start)
    text = bytes(data[start: stop if stop != -1 else len(data)][:4096]).decode("utf-8", "replace")
    return Quote(line_of(start), text.rstrip("\r"))


@dataclass
class _Divergence:
    window: list[float] = field(default_factory=list)  # the last HISTORY losses, sorted
    recent: deque = field(default_factory=lambda: deque(maxlen=HISTORY))
    turn: tuple[Quote, float, float] | None = None  # (line, level before, value)

    def add(self, value: float, quote) -> bool:
        """Take the next loss read; True when it starts a turn."""
        started = False
        if self.turn is not None and value < RECOVERY_FACTOR * self.turn[1]:
            self.turn = None  # it came back: a spike, not a divergence
        if self.turn is None and len(self.window) >= MIN_HISTORY:
            base = _sorted_median(self.window)
            if base > 0 and value >= SPIKE_FACTOR * base:
                self.turn = (quote(), base, value)
                started = True
        if len(self.recent) == HISTORY:
            self.window.pop(bisect.bisect_left(self.window, self.recent[0]))
        self.recent.append(value)
        bisect.insort(self.window, value)
        return started


def _sorted_median(values: list[float]) -> float:
    """statistics.median of a list already sorted, without sorting it again for every loss read."""
    mid = len(values) // 2
    return values[mid] if len(values) % 2 else (values[mid - 1] + values[mid]) / 2


@dataclass
class _Steps:
    """Timestamps of progress lines read one after another, for the usual step time."""

    kind: str | None = None
    mixed: bool = False
    gaps: deque = field(default_factory=lambda: deque(maxlen=HISTORY))
    count: int = 0

    def add(self, key: tuple[str, float], previous: tuple[str, float] | None) -> None:
        self.count += 1
        if self.kind is None:
            self.kind = key[0]
        self.mixed |= key[0] != self.kind
        if previous is not None and previous[0] == key[0] and key[1] > previous[1]:
            self.gaps.append(key[1] - previous[1])


class Summary:
    """What is kept of a file's progress values, whatever its size: running levels, counters and
    the few lines a judgement quotes. Fed value by value (`take`), in file order."""

    def __init__(self) -> None:
        self.loss = _Divergence()
        self.finite = {name: deque(maxlen=n) for name, n in NONFINITE_RUN.items()}
        self.nonfinite_from: dict[str, Quote | None] = {}  # the first value of each series' last NaN/Inf run
        self.loss_back = 0  # the line of the last finite loss read right after NaN/Inf ones (0: none)
        self.scale_max = 0.0
        self.scale_last: float | None = None
        self.floor: Quote | None = None
        self.floor_readings = 0  # readings since the scale reached its floor
        self.recovered_from = math.inf  # the lowest scale at the floor that it rose again from
        self.skipped = [0.0, 0.0]  # Megatron: skipped and iterations, after calibration
        self.ds_first: tuple[float, float] | None = None  # DeepSpeed (step, skipped) after calibration
        self.ds_last: tuple[float, float] | None = None
        self.skip_quote: Quote | None = None
        self.steps = _Steps()
        self.intervals: deque = deque(maxlen=HISTORY)  # Megatron's iterations between two log lines
        self._iteration: float | None = None  # Megatron's last iteration number read
        self._window_iteration: float | None = None  # ... in the window being read

    def window(self) -> None:
        """A new window starts (Megatron's interval is read between two lines of one window)."""
        self._window_iteration = None

    def step(self, key: tuple[str, float], previous: tuple[str, float] | None) -> None:
        """A progress line's time, and that of the line read before it in the same window."""
        self.steps.add(key, previous)

    def take(self, name: str, value: float, quote: Callable[[], Quote], ds_step: float | None) -> bool:
        """Take the next value read; True when it is a loss that starts a turn."""
        if name in self.finite:
            finite = math.isfinite(value)
            self.finite[name].append(finite)
            if not finite:
                if self.nonfinite_from.get(name) is None:
                    self.nonfinite_from[name] = quote()
            else:
                if name == LOSS and self.nonfinite_from.get(name) is not None:
                    self.loss_back = quote().line
                self.nonfinite_from[name] = None
            if finite and name == LOSS:
                return self.loss.add(value, quote)
        elif name == ITERATION:
            if self._window_iteration is not None and value > self._window_iteration:
                self.intervals.append(value - self._window_iteration)
            self._iteration = self._window_iteration = value
        elif name == SCALE and math.isfinite(value):
            self._scale(value, quote)
        elif name == SKIPPED and self._iteration is not None and self._iteration > CALIBRATION_ITERATIONS:
            self.skipped[0] += value
            self.skipped[1] += 1
            if value and self.skip_quote is None:
                self.skip_quote = quote()
        elif name == DS_SKIPPED and ds_step is not None and ds_step > CALIBRATION_ITERATIONS:
            if self.ds_first is None:
                # The count is cumulative: at most one skip an iteration went to calibrating the
                # scale in the first iterations, so a first reading of 1995 skipped at step 2000
                # already says most steps after calibration were skipped.
                self.ds_first = (CALIBRATION_ITERATIONS, min(value, CALIBRATION_ITERATIONS))
            self.ds_last = (ds_step, value)
            if value > self.ds_first[1] and self.skip_quote is None:
                self.skip_quote = quote()
        return False

    def _scale(self, value: float, quote: Callable[[], Quote]) -> None:
        if self.floor is not None and self.scale_last is not None and value > self.scale_last:
            # It rose again from the floor: steps went through at that scale (fairseq bouncing
            # between 0.5 and 1 for epochs). Only a fall below the lowest level it came back
            # from is a collapse after that.
            self.floor = None
            self.recovered_from = min(self.scale_last, self.recovered_from)
        at_floor = value < SCALE_FLOOR or value <= SCALE_FLOOR < self.scale_max  # below 1 only by repeated overflows
        if at_floor and self.floor is None and value < self.recovered_from:
            self.floor, self.floor_readings = quote(), 0
        if self.floor is not None:
            self.floor_readings += 1
        self.scale_max = max(self.scale_max, value)
        self.scale_last = value

    def refined(self, quote: Quote, value: float) -> None:
        """The first loss past the threshold, found in the lines before the window that saw the turn."""
        self.loss.turn = (quote, self.loss.turn[1], value)

    def skipped_share(self) -> tuple[float, float]:
        """(skipped, iterations) judged after calibration, from whichever format the log uses."""
        if self.ds_first and self.ds_last and self.ds_last[0] > self.ds_first[0]:
            return self.ds_last[1] - self.ds_first[1], self.ds_last[0] - self.ds_first[0]
        interval = statistics.median(self.intervals) if self.intervals else 1.0
        return self.skipped[0], self.skipped[1] * interval

    def judge(self, last_progress: Quote | None, last_time: tuple[str, float] | None,
              iteration: str | None) -> list[Trend]:
        """The trends of the whole file, once it has been read."""
        out = []
        if self.loss.turn is not None:
            quote, base, value = self.loss.turn
            out.append(Trend(LOSS_SPIKE, quote.line, quote.text,
                             f"loss rose from a running level of {base:.4g} to {value:.4g} here and never came back "
                             f"below {RECOVERY_FACTOR:g}x that level (threshold {SPIKE_FACTOR:g}x)", iteration))
        for name, flags in self.finite.items():
            if len(flags) == flags.maxlen and not any(flags):
                quote = self.nonfinite_from[name]
                out.append(Trend(NONFINITE, quote.line, quote.text,
                                 f"the logged {name} is NaN or Inf from here on (the last values read)", iteration))
                break
        if self.floor is not None and self.scale_last is not None and self.scale_last <= SCALE_FLOOR \
                and (self.floor_readings >= FLOOR_READINGS or self.scale_last < COLLAPSED_SCALE):
            out.append(Trend(SCALE_FLOOR_KIND, self.floor.line, self.floor.text,
                             f"the fp16 loss scale fell from {self.scale_max:g} to its floor {self.scale_last:g} and stayed there",
                             iteration))
        skipped, total = self.skipped_share()
        if self.skip_quote is not None and total and skipped >= MIN_SKIPPED and skipped / total >= SKIPPED_SHARE:
            out.append(Trend(SKIPPED_STEPS, self.skip_quote.line, self.skip_quote.text,
                             f"{skipped / total:.0%} of the iterations read after the first {CALIBRATION_ITERATIONS} were "
                             f"skipped for overflow (threshold {SKIPPED_SHARE:.0%})", iteration))
        stall = self._stall(last_progress, last_time, iteration)
        return out + ([stall] if stall else [])

    def _stall(self, last: Quote | None, last_time: tuple[str, float] | None, iteration: str | None) -> Trend | None:
        steps = self.steps
        if last is None or last_time is None or steps.mixed or steps.count < MIN_STEPS_FOR_STALL or not steps.gaps:
            return None
        progress_time = line_time(last.text)[1]
        if progress_time is None or progress_time[0] != steps.kind or last_time[0] != steps.kind:
            return None
        step = statistics.median(steps.gaps)
        silent = last_time[1] - progress_time[1]
        if silent < max(STALL_FACTOR * step, MIN_STALL_SECONDS):
            return None
        return Trend(PROGRESS_STALL, last.line, last.text,
                     f"no new progress line for {silent / 60:.0f} min after this one, while steps took {step:.3g} s "
                     f"(threshold {STALL_FACTOR:g}x the step time and {MIN_STALL_SECONDS / 60:g} min)", iteration)


class Recording:
    """A Summary's input, kept in order to be replayed later: what a piece of a file scanned in
    another process (bot/sources/parallel.py) hands back, since a summary depends on every value
    before it. Bounded like the windows themselves (a few thousand values for a GB). It never
    starts a turn, so the piece's lines between windows are not searched for where a turn began:
    after a replay, a divergence is quoted at the first value read past the threshold."""

    def __init__(self) -> None:
        self.events: list[tuple] = []

    def window(self) -> None:
        self.events.append(("window",))

    def step(self, key: tuple[str, float], previous: tuple[str, float] | None) -> None:
        self.events.append(("step", key, previous))

    def take(self, name: str, value: float, quote: Callable[[], Quote], ds_step: float | None) -> bool:
        self.events.append(("take", name, value, quote(), ds_step))
        return False

    def replay(self, summary: Summary, line_shift: int) -> None:
        """Feed the values to `summary`, with line numbers moved by `line_shift` (the lines of the
        file before this piece)."""
        for event in self.events:
            if event[0] == "take":
                _, name, value, quote, ds_step = event
                moved = Quote(quote.line + line_shift, quote.text)
                summary.take(name, value, lambda: moved, ds_step)
            elif event[0] == "step":
                summary.step(*event[1:])
            else:
                summary.window()


class Series:
    """Reads the progress values of one file (or a piece of one) from windows of each chunk into
    a Summary (or a Recording of a piece)."""

    def __init__(self, engine: engines.Engine, summary: Summary | Recording | None = None) -> None:
        self._engine = engine
        self.summary = Summary() if summary is None else summary
        self._next = 0  # file offset where the next window starts
        self._gap = 0  # where the part of the chunk not read before the current window starts
        self.refined = 0

    def windows(self, file_pos: int, cut: int) -> list[tuple[int, int]]:
        """Offsets in a chunk of `cut` bytes starting at `file_pos` to read values from."""
        out = []
        while self._next < file_pos + cut:
            start = max(self._next, file_pos)
            size = FULL_BYTES - start if start < FULL_BYTES else WINDOW_BYTES
            end = min(start + size, file_pos + cut)
            out.append((start - file_pos, end - file_pos))
            self._next = end + (0 if end < FULL_BYTES else max(0, end // WINDOWS_PER_E - WINDOW_BYTES))
        tail = max(0, cut - CHUNK_TAIL_BYTES)
        if not out or out[-1][1] <= tail:
            out.append((tail, cut))
        return out

    def read(self, data, file_pos: int, cut: int, line_of) -> None:
        """Read the values in the windows of data[:cut], a chunk starting at `file_pos` in the file;
        `line_of(offset)` is the line number of an offset in it."""
        self._gap = 0
        for start, end in self.windows(file_pos, cut):
            lines = None if file_pos + start < FULL_BYTES else WINDOW_LINES
            if start:
                start = data.find(b"\n", start - 1, end) + 1 or end  # whole lines only
            stop = data.rfind(b"\n", start, end) + 1 if end < cut else cut
            if stop > start:
                self._gap = self._window(data, start, stop, line_of, lines)

    def _window(self, data, start: int, stop: int, line_of, lines: int | None) -> int:
        """Read the values of data[start:stop], of its first `lines` progress lines if given;
        return where the lines read end."""
        previous_time = None
        line_start = -1
        timed = 0
        names: set[str] = set()
        self.summary.window()
        for end, key in self._engine.scan(data, start, stop):
            ls = data.rfind(b"\n", 0, end) + 1
            name = _KEY_NAMES[key]
            if ls == line_start and name in names:
                continue  # one value of a kind per line ("lm loss: " is also "loss: ")
            if ls != line_start:  # the first value of a progress line: its time, once
                names = set()
                if lines is not None:
                    if not lines:
                        return ls
                    lines -= 1
                line_start = ls
                timed += 1
                timed_ok = lines is None or timed <= TIMED_LINES
                time_key = line_time(bytes(data[ls: ls + 120]).decode("utf-8", "replace"))[1] if timed_ok else None
                if time_key is not None:
                    self.summary.step(time_key, previous_time)
                    previous_time = time_key
            m = _NUMBER.match(data, end, min(end + 40, stop))
            if m is not None:
                names.add(name)
                self._value(name, float(m.group(1)), data, end, ls, line_of)
        return stop

    def _value(self, name: str, value: float, data, end: int, line: int, line_of) -> None:
        if name == LOSS and _NOT_TRAINING.search(bytes(data[max(0, end - 24): end])):
            return  # "val loss: 2.4", "Validation loss: 2.3"
        ds_step = None
        if name == DS_SKIPPED:
            m = _DS_STEP.search(data, max(0, end - 40), end)
            ds_step = float(m.group(1)) if m else None
        turned = self.summary.take(name, value, lambda: _quote(data, line, line_of), ds_step)
        if turned and self._gap < line and self.refined < MAX_REFINES:
            self._refine(data, line, line_of)

    def _refine(self, data, start: int, line_of) -> None:
        """A turn seen in a window: the first loss past the threshold may be in the lines not read
        before it (in this chunk); read them for it."""
        self.refined += 1
        base = self.summary.loss.turn[1]
        line = -1
        for end, key in self._engine.scan(data, self._gap, start):
            ls = data.rfind(b"\n", 0, end) + 1
            if _KEY_NAMES[key] != LOSS or ls == line or _NOT_TRAINING.search(bytes(data[max(0, end - 24): end])):
                continue
            m = _NUMBER.match(data, end, min(end + 40, start))
            if m is None:
                continue
            line = ls
            if float(m.group(1)) >= SPIKE_FACTOR * base:
                self.summary.refined(_quote(data, ls, line_of), float(m.group(1)))
                return


def last_timestamp(tail: bytes) -> tuple[str, float] | None:
    """The time of the last timestamped line among the last lines of a file."""
    for line in reversed(tail.split(b"\n")[-200:]):
        key = line_time(line[:120].decode("utf-8", "replace"))[1]
        if key is not None:
            return key
    return None
