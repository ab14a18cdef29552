"""Which fingerprints cost the scan the most, on 5 MB of the hit-dense benchmark log: each pattern
as Hyperscan is given it (its rare required literals where it has them, else the whole regex) is
timed alone, and the dearest of those are then left out of the whole database one at a time: what
the whole scan saves without each is its real cost.

    python benchmarks/patterns.py              # the 15 dearest
    python benchmarks/patterns.py --top 40

A pattern that Hyperscan must run in full (no literal rare enough in the benign corpus, see
bot/match/engines.py) and that starts with an anchor and optional prefix groups can cost the whole
scan far more than its share: one such pattern once added 1.5 ms to the 5 MB paste's 4.7 ms.
Timings are wall-clock on whatever machine runs it: read them, run them twice, never assert them.
"""
from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.scan import generate  # noqa: E402
from bot.engine import markers  # noqa: E402
from bot.kb.load import entry_folders, load  # noqa: E402
from bot.match import engines  # noqa: E402


def _best(db, data: bytes, runs: int = 3) -> float:
    best = float("inf")
    for _ in range(runs):
        start = time.perf_counter()
        db.scan(data, match_event_handler=lambda *_: 0)
        best = min(best, time.perf_counter() - start)
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--top", type=int, default=15)
    args = ap.parse_args()
    if engines.hyperscan is None:
        sys.exit("Hyperscan is not installed here: nothing to measure")
    with tempfile.TemporaryDirectory() as tmp:
        log = Path(tmp) / "dense.log"
        generate(log, 8, "dense")
        data = log.read_bytes()[-(5 << 20):]
    kb = load(entry_folders(""))
    common = engines._CommonText()
    named = [(f"{fp.entry}/{fp.id}", fp.pattern) for fp in kb.fingerprints]
    named += [(f"marker {m.kind}", m.scan) for m in markers.LINE_MARKERS]
    given = [(name, engines._prefilter(p, common), p) for name, p in named]
    dbs = [engines._hyperscan_db([g]) for _, g, _ in given]
    alone = sorted(range(len(given)), key=lambda i: -_best(dbs[i], data))[:args.top]
    together = [g for _, g, _ in given]
    whole = _best(engines._hyperscan_db(together), data, runs=7)
    print(f"{len(given)} patterns together: {1000 * whole:.2f} ms over {len(data) / 1e6:.1f} MB; "
          f"without each of the {args.top} dearest alone:")
    saved = {i: whole - _best(engines._hyperscan_db(together[:i] + together[i + 1:]), data, runs=7) for i in alone}
    for i in sorted(alone, key=lambda i: -saved[i]):
        name, g, p = given[i]
        print(f"  {1000 * saved[i]:+6.2f} ms  {'whole regex' if g.regex == p.regex else 'literals   '}  {name}")


if __name__ == "__main__":
    main()
