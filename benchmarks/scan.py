"""Throughput and peak memory of `trainmedic diagnose` next to grep and ripgrep on the same log.

    python benchmarks/scan.py --size-mb 1024          # writes bench-data/synthetic-1024mb.log once

Generates a synthetic multi-rank training log (interleaved ranks, progress bars, NCCL INFO lines,
warnings, a benign traceback, the failure planted near the end), then times, on that same file:
`trainmedic diagnose` (each engine), `grep -E -c -f` and `rg -c -f` with the knowledge base's
fingerprints, and prints MB/s and peak RSS. It also times a 5 MB paste diagnosed in-process.
Timings are wall-clock on a shared machine: run it twice and read the figures, do not assert them.
"""
from __future__ import annotations

import argparse
import os
import random
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bot.engine.diagnose import Diagnoser  # noqa: E402
from bot.kb.load import entry_folders, load  # noqa: E402

FAILURE = """\
[rank3]: Traceback (most recent call last):
[rank3]:   File "/workspace/train.py", line 211, in <module>
[rank3]:     loss.backward()
[rank3]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 3.82 GiB. GPU 3 has a total capacity of 79.15 GiB of which 1.71 GiB is free. Including non-PyTorch memory, this process has 77.43 GiB memory in use.
[rank1]:[E1010 06:49:17.596585 ProcessGroupNCCL.cpp:616] [Rank 1] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=88231, OpType=ALLREDUCE, NumelIn=262144, NumelOut=262144, Timeout(ms)=600000) ran for 600021 milliseconds before timing out.
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
"""


def _noise_block(rng: random.Random, start_iter: int, lines: int) -> tuple[str, int]:
    out = []
    it = start_iter
    for _ in range(lines):
        r = rng.randrange(8)
        kind = rng.random()
        if kind < 0.35:
            it += 1
            out.append(f"[rank{r}]: iteration {it:8d}/  500000 | consumed samples: {it * 128:12d} | elapsed time per iteration (ms): {rng.uniform(900, 1100):.1f} | learning rate: 2.999E-04 | lm loss: {rng.uniform(1.8, 2.2):.6E} | loss scale: 65536.0 | grad norm: {rng.uniform(0.2, 0.6):.3f} |")
        elif kind < 0.55:
            out.append(f"node{r // 4:02d}:{40000 + r}:{41000 + r} [{r}] NCCL INFO Channel {rng.randrange(32):02d}/32 : {r}[{r}] -> {(r + 1) % 8}[{(r + 1) % 8}] via P2P/IPC/read")
        elif kind < 0.75:
            pct = rng.randrange(100)
            out.append(f"[default{r}]:Training: {pct:3d}%|{'#' * (pct // 10):10s}| {pct * 50}/5000 [12:{pct % 60:02d}<08:{(99 - pct) % 60:02d},  1.21it/s, loss={rng.uniform(1, 3):.3f}]")
        elif kind < 0.9:
            out.append(f"[rank{r}]:[W1010 06:{rng.randrange(60):02d}:{rng.randrange(60):02d}.{rng.randrange(10**6):06d} reducer.cpp:1400] Warning: Grad strides do not match bucket view strides. This may indicate grad was not created according to the gradient layout contract")
        else:
            out.append(f"[2024-10-10 06:{rng.randrange(60):02d}:{rng.randrange(60):02d},{rng.randrange(1000):03d}] [INFO] [logging.py:96:log_dist] [Rank {r}] step={it}, skipped=0, lr=[0.0003], mom=[(0.9, 0.95)]")
    return "\n".join(out) + "\n", it


def generate(path: Path, size_mb: int) -> None:
    """Write a log of about `size_mb` MB; blocks repeat (scan cost does not depend on novelty)."""
    rng = random.Random(7)
    blocks, it = [], 0
    for _ in range(8):
        block, it = _noise_block(rng, it, 20_000)
        blocks.append(block.encode())
    target = size_mb << 20
    written = 0
    with open(path, "wb") as f:
        while written < target - (1 << 20):
            block = blocks[(written // len(blocks[0])) % len(blocks)]
            f.write(block)
            written += len(block)
        f.write(FAILURE.encode())


def _grep_patterns(kb) -> tuple[list[str], list[str]]:
    """(ERE for grep, Rust regex for rg): the same fingerprints, written for each tool."""
    ere, rust = [], []
    for fp in kb.fingerprints:
        rx = re.sub(r"\(\?P<\w+>", "(", fp.regex)  # both tools join the patterns: names would clash
        rust.append(("(?i)" if fp.ignorecase else "") + rx)
        ere.append(rx.replace("(?:", "(").replace(r"\d", "[0-9]"))  # grep cannot fold case per pattern
    return ere, rust


def _run(cmd: list[str], env: dict | None = None) -> tuple[float, int]:
    """(seconds, peak RSS in MiB) of one child process."""
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    _, status, usage = os.wait4(proc.pid, 0)
    elapsed = time.perf_counter() - start
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode not in (0, 1):  # grep and rg exit 1 when nothing matched
        raise RuntimeError(f"{cmd[0]} exited {proc.returncode}")
    return elapsed, usage.ru_maxrss // 1024


def _best(cmd: list[str], runs: int, env: dict | None = None) -> tuple[float, int]:
    results = [_run(cmd, env) for _ in range(runs)]
    return min(r[0] for r in results), max(r[1] for r in results)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size-mb", type=int, default=1024)
    ap.add_argument("--data", type=Path, default=ROOT / "bench-data")
    ap.add_argument("--runs", type=int, default=3, help="best of N runs for each tool")
    args = ap.parse_args()

    kb = load(entry_folders(""))
    args.data.mkdir(exist_ok=True)
    log = args.data / f"synthetic-{args.size_mb}mb.log"
    if not log.exists():
        print(f"generating {log} ...", flush=True)
        generate(log, args.size_mb)
    mb = log.stat().st_size / 1e6
    ere, rust = _grep_patterns(kb)
    tmp = Path(tempfile.mkdtemp())
    (tmp / "ere").write_text("\n".join(ere) + "\n")
    (tmp / "rust").write_text("\n".join(rust) + "\n")

    print(f"file: {mb:.0f} MB, {len(kb.fingerprints)} fingerprints, {os.cpu_count()} cores")
    print(f"{'tool':34} {'seconds':>8} {'MB/s':>8} {'peak RSS MiB':>13}")
    trainmedic = [sys.executable, "-m", "bot.cli", "diagnose", "--format", "json", "--no-record", str(log)]
    rows = []
    for engine in ("hyperscan", "re2"):
        env = {**os.environ, "TRAINMEDIC_ENGINE": engine, "PYTHONPATH": str(ROOT)}
        try:
            rows.append((f"trainmedic diagnose ({engine})", *_best(trainmedic, args.runs, env)))
        except RuntimeError as exc:
            print(f"trainmedic ({engine}): {exc}")
    rows.append(("grep -E -c -f (same patterns)", *_best(["grep", "-E", "-c", "-f", str(tmp / "ere"), str(log)], args.runs)))
    if shutil.which("rg"):
        rows.append(("rg -c -f (same patterns)", *_best(["rg", "-c", "-f", str(tmp / "rust"), str(log)], args.runs)))
    for name, secs, rss in rows:
        print(f"{name:34} {secs:8.2f} {mb / secs:8.0f} {rss:13d}")

    paste = log.read_bytes()[-(5 << 20):].decode("utf-8", "replace")
    diagnoser = Diagnoser(kb)
    times = []
    for _ in range(10):
        start = time.perf_counter()
        d = diagnoser.diagnose_text(paste)
        times.append(time.perf_counter() - start)
    print(f"5 MB paste, in-process ({diagnoser.scanner.engine.name}): median {statistics.median(times) * 1000:.0f} ms "
          f"-> root {d.root.entry.id if d.root else None}")
    start = time.perf_counter()
    load(entry_folders(""))
    Diagnoser(kb)
    print(f"knowledge base load + compile: {(time.perf_counter() - start) * 1000:.0f} ms")


if __name__ == "__main__":
    main()
