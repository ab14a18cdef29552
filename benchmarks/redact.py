"""Per-line cost of redaction (bot/engine/redact.py), as the scan pays it on every kept line.

    python benchmarks/redact.py

Prints microseconds per line for: every line of the shipped entries' examples and benign logs
(realistic kept lines, nearly all without a secret), lines carrying a generated secret (the test
corpus, tests/secret_corpus.py), and the evidence window of long lines; then the time for 64 KiB
adversarial lines (long runs of what the rules repeat), which must grow linearly. Wall-clock on a
shared machine: read the figures, do not assert them.
"""
from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

import knowledge  # noqa: E402
from bot.engine import redact as redaction  # noqa: E402
from bot.engine.redact import clip, redact  # noqa: E402
from bot.kb.load import entry_folders, load  # noqa: E402
from secret_corpus import placements  # noqa: E402


def per_line(lines: list[str], fn, repeat: int = 5) -> float:
    """Median over `repeat` runs of the mean microseconds per line."""
    fn(lines[0])  # build the rule set once
    runs = []
    for _ in range(repeat):
        for cached in (redaction.looks_random, redaction._continuation):  # each run starts cold
            cached.cache_clear()
        start = time.perf_counter()
        for line in lines:
            fn(line)
        runs.append((time.perf_counter() - start) / len(lines) * 1e6)
    return statistics.median(runs)


def example_lines() -> list[str]:
    kb = load(entry_folders(""))
    lines = [line for e in kb.entries.values() for kind in ("positive", "near_miss")
             for ex in e.data["examples"][kind] for line in ex["log"].splitlines() if line.strip()]
    for path in sorted(Path(knowledge.BENIGN).glob("*.log")):
        lines += [line for line in path.read_text(errors="replace").splitlines() if line.strip()]
    return lines


def main() -> None:
    examples = example_lines()
    secrets = [line for p in placements() for line in p.lines[2:]]
    long_lines = [line * (2000 // max(len(line), 1) + 1) for line in examples[:2000]]
    print(f"{'lines':44} {'count':>7} {'us/line':>9}")
    print(f"{'examples and benign logs (redact)':44} {len(examples):>7} {per_line(examples, redact):>9.1f}")
    print(f"{'lines carrying a secret (redact)':44} {len(secrets):>7} {per_line(secrets, redact):>9.1f}")
    window = lambda line: clip(line, 100, 140, 400)  # noqa: E731
    print(f"{'long lines, 400-char window (clip)':44} {len(long_lines):>7} {per_line(long_lines, window):>9.1f}")
    print()
    print("64 KiB adversarial lines (seconds; linear growth means 4x the size takes ~4x the time):")
    for name, unit in (("eyJ repeated", "eyJ"), ("one long word", "a"), ("flag prefix", "--a"),
                       ("key= repeated", "key="), ("base64 run", "Ab9+"), ("url userinfo", "https://a")):
        times = []
        for size in (16 << 10, 64 << 10):
            line = (unit * (size // len(unit) + 1))[:size]
            start = time.perf_counter()
            redact(line)
            times.append(time.perf_counter() - start)
        print(f"  {name:20} 16 KiB {times[0]:.4f}   64 KiB {times[1]:.4f}")


if __name__ == "__main__":
    main()
