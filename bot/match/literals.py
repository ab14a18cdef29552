"""Required literals of a regex: strings of which every match contains at least one.

Hyperscan scans literals at several GB/s but slows down on patterns whose literal comes after a
short, common prefix and a gap (`(sbatch|srun): [^\\n]*Invalid generic resource`). Since every line
the engine reports is confirmed by RE2 anyway, the engine may look for a required literal instead
of the whole pattern; `prefilter` gives that literal alternation when it is long enough to be rare.
"""
from __future__ import annotations

import re
import re._constants as c
import re._parser as sre_parse  # the parser behind `re`; RE2 syntax as used here is a subset of it

MIN_LITERAL = 4  # shorter literals would match too many lines to be worth confirming

_REPEATS = {c.MAX_REPEAT, c.MIN_REPEAT, getattr(c, "POSSESSIVE_REPEAT", c.MAX_REPEAT)}


def _score(literals: set[str]) -> tuple[int, int]:
    return (min(len(s) for s in literals), -len(literals))


def _sequence(items) -> set[str] | None:
    """The best factor of a concatenation: any one item's factor is required."""
    candidates, run = [], []
    for op, arg in items:
        if op is c.LITERAL:
            run.append(chr(arg))
            continue
        if run:
            candidates.append({"".join(run)})
            run = []
        factor = _item(op, arg)
        if factor:
            candidates.append(factor)
    if run:
        candidates.append({"".join(run)})
    return max(candidates, key=_score, default=None)


def _item(op, arg) -> set[str] | None:
    if op is c.SUBPATTERN:
        _group, add_flags, _del_flags, pattern = arg
        # Literals of a local (?i:...) group cannot be matched case-sensitively.
        return None if add_flags & re.IGNORECASE else _sequence(pattern)
    if op is c.BRANCH:
        factors = [_sequence(branch) for branch in arg[1]]
        return None if any(f is None for f in factors) else set().union(*factors)
    if op in _REPEATS and arg[0] >= 1:
        return _sequence(arg[2])
    return None


def required_literals(regex: str) -> list[str] | None:
    """Literals one of which every match of `regex` contains, or None when none is long enough."""
    try:
        tree = sre_parse.parse(regex)
        if tree.state.flags & re.IGNORECASE:
            return None
        factor = _sequence(list(tree))
    except (re.error, RecursionError):
        return None
    if not factor or min(len(s) for s in factor) < MIN_LITERAL:
        return None
    return sorted(factor)


def escape(literal: str) -> str:
    """A literal as a Hyperscan (PCRE) pattern over UTF-8 bytes."""
    return "".join(chr(b) if chr(b).isalnum() and b < 128 else f"\\x{b:02x}" for b in literal.encode())
