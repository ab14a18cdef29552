"""No input makes a scan slow: every pattern in the code and the knowledge base, fed lines of a
quarter of a megabyte and of a megabyte made of long runs of its own repeated atoms with a
non-matching tail, costs about four times as much for four times the bytes (a backtracking pattern
costs sixteen times or far more). The whole scan runs (engines, confirmation, markers, trends,
context of kept lines), so a quadratic step anywhere on the way shows. Growth is compared, never a
wall-clock limit: the factor is generous because the machine is shared."""
import re
import re._constants as c
import re._parser as sre_parse
import time

import pytest

from bot.engine import context, markers, trends
from bot.kb.load import entry_folders, load
from bot.match import literals

SMALL, BIG = 256 << 10, 1 << 20
GROWTH = 8.0  # linear is 4, quadratic 16 and up
GROUP = 12  # patterns a log, one line each: the scan's fixed costs are shared
_CANDIDATES = "a1 -/._x:(|'\"Z"


def _members(items) -> callable:
    def has(ch: str) -> bool:
        for op, arg in items:
            if op is c.LITERAL and chr(arg) == ch or op is c.RANGE and arg[0] <= ord(ch) <= arg[1]:
                return True
            if op is c.CATEGORY and re.fullmatch({c.CATEGORY_DIGIT: r"\d", c.CATEGORY_NOT_DIGIT: r"\D", c.CATEGORY_WORD: r"\w",
                                                  c.CATEGORY_NOT_WORD: r"\W", c.CATEGORY_SPACE: r"\s",
                                                  c.CATEGORY_NOT_SPACE: r"\S"}.get(arg, "(?!)"), ch):
                return True
        return False
    return has


def _sample(items) -> str:
    """A short string that the parsed pattern `items` matches, or nearly."""
    out = []
    for op, arg in items:
        if op is c.LITERAL:
            out.append(chr(arg))
        elif op is c.NOT_LITERAL:
            out.append(next(ch for ch in _CANDIDATES if ord(ch) != arg))
        elif op is c.ANY:
            out.append("a")
        elif op is c.IN:
            negate = arg and arg[0][0] is c.NEGATE
            has = _members(arg[1:] if negate else arg)
            out.append(next((ch for ch in _CANDIDATES if has(ch) != negate), "a"))
        elif op is c.SUBPATTERN:
            out.append(_sample(arg[3]))
        elif op is c.BRANCH:
            out.append(_sample(arg[1][0]))
        elif op in (c.MAX_REPEAT, c.MIN_REPEAT):
            out.append(_sample(arg[2]) * max(1, arg[0]))
    return "".join(out)


def _runs(items, prefix: str = "") -> list[str]:
    """For each repeat in the pattern: the text before it, then its atom repeated (a {unit} mark)."""
    lines = []
    for i, (op, arg) in enumerate(items):
        before = prefix + _sample(items[:i])
        if op in (c.MAX_REPEAT, c.MIN_REPEAT) and (arg[1] is c.MAXREPEAT or arg[1] > 1):
            unit = _sample(arg[2])
            if unit:
                lines.append(before + "{unit}" + unit)
            lines += _runs(list(arg[2]), before)
        elif op is c.SUBPATTERN:
            lines += _runs(list(arg[3]), before)
        elif op is c.BRANCH:
            for branch in arg[1][:3]:
                lines += _runs(list(branch), before)
    return lines


def adversarial(regex: str) -> list[str]:
    """Templates of adversarial lines for one pattern: `{unit}` marks the text to repeat."""
    try:
        items = list(sre_parse.parse(regex))
    except (re.error, RecursionError):
        return []
    found = _runs(items)[:2]
    found += [f"{{unit}}{lit}" for lit in (literals.required_literals(regex) or [])[:1]]
    return found


def _line(template: str, size: int) -> str:
    head, _, unit = template.partition("{unit}")
    unit = unit or "a"
    return head + unit * max(1, (size - len(head)) // len(unit)) + "\x01"


def _all_patterns(kb) -> list[tuple[str, str]]:
    found = [(f"{fp.entry}/{fp.id}", fp.regex) for fp in kb.fingerprints]
    found += [(f"marker {m.kind}", m.scan.regex) for m in markers.LINE_MARKERS + markers.ITERATION_MARKERS]
    found += [(f"marker value {m.kind}", m.extract.pattern) for m in markers.ITERATION_MARKERS if m.extract]
    found += [("marker checkpoint path", markers._PATH.pattern)]
    found += [(f"trend key {i}", p.regex) for i, p in enumerate(trends.KEY_PATTERNS)]
    found += [(f"context {i}", p.pattern) for i, p in enumerate(context._RANK + context._HOST)]
    return found


def _cost(diagnoser, lines: list[str]) -> float:
    text = "\n".join(lines) + "\n"
    best = float("inf")
    for _ in range(3):
        start = time.process_time()  # CPU time: other processes on the machine do not count
        diagnoser.diagnose_text(text)
        best = min(best, time.process_time() - start)
    return best


def _groups(kb):
    templates = [(name, t) for name, regex in _all_patterns(kb) for t in adversarial(regex)]
    return [templates[i:i + GROUP] for i in range(0, len(templates), GROUP)]


def test_the_generator_builds_the_known_bad_cases(kb):
    """The two shapes the issue measured: a checkpoint line ending in 65,000 digits, `Xid (` repeated."""
    checkpoint = [_line(t, 1000) for t in adversarial(markers._PATH.pattern)]
    assert any(re.search(r"\w{900}", line) for line in checkpoint)
    xid = next(fp.regex for fp in kb.fingerprints if fp.id == "any-xid-line")
    assert any(line.startswith("Xid (Xid (") for line in (_line(t, 1000) for t in adversarial(xid)))


GROUPS = _groups(load(entry_folders("")))


@pytest.mark.parametrize("group", range(len(GROUPS)))
def test_every_pattern_scans_in_linear_time(diagnoser, group):
    templates = GROUPS[group]
    small = _cost(diagnoser, [_line(t, SMALL) for _, t in templates])
    big = _cost(diagnoser, [_line(t, BIG) for _, t in templates])
    assert big <= GROWTH * small, (f"{big / small:.1f}x the time for 4x the bytes ({small:.3f}s -> {big:.3f}s) in "
                                   f"{sorted({name for name, _ in templates})}")
