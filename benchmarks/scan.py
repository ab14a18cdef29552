"""Throughput and peak memory of `trainmedic diagnose` next to ripgrep and grep on the same logs.

    sudo apt-get install ripgrep grep          # the tools it compares with (Debian/Ubuntu packages)
    python benchmarks/scan.py                  # every log, 1 GB each; writes bench-data/ once
    python benchmarks/scan.py --logs dense --runs 5

The logs (synthetic, multi-rank, the planted CUDA OOM near the end of each):
- clean: progress bars (tqdm's carriage-return updates), Megatron iteration lines, NCCL INFO,
  warnings; almost no line matches.
- dense: the same with about 1 line in 20 matching a fingerprint or a marker, spread over the
  whole file, in the shapes real jobs print thousands of times: every rank's "saving checkpoint"
  and "successfully saved checkpoint", DeepSpeed's allocator cache flushes, wandb's network
  retries, NCCL's async IB port events, handled exceptions and error lines.
- ranks: 256 per-rank files of 4 MB (hit-dense) diagnosed as one job (`--rank-files`, `--rank-mb`).
- paste: the last 5 MB of the dense log, minus a one-line log: the cost of the text itself, as the
  whole command (start-up cancels out) and in-process (the bot's path, engine already compiled).
- progress (`--logs progress`, 2 GB by default): Megatron progress lines only (lm loss, loss scale,
  grad norm, skipped iterations), millions of them: the trend series must keep memory bounded.

For every log it prints trainmedic (each engine), `rg -c -f` and `grep -E -c -f` with the same
patterns (the knowledge base's fingerprints and the scan's line markers, written for each tool),
as best and median wall time of `--runs` runs, the best CPU time (user + system, children
included: a parallel scan's workers count, and other users of a shared machine do not), MB/s of
the best wall time and peak RSS (of the largest process). Timings are wall-clock on whatever machine runs it:
read them, run them twice, never assert them.
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

from bot.engine import markers  # noqa: E402
from bot.engine.diagnose import Diagnoser  # noqa: E402
from bot.kb.load import entry_folders, load  # noqa: E402
from bot.sources import parallel  # noqa: E402

FAILURE = """\
[rank3]: Traceback (most recent call last):
[rank3]:   File "/workspace/train.py", line 211, in <module>
[rank3]:     loss.backward()
[rank3]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 3.82 GiB. GPU 3 has a total capacity of 79.15 GiB of which 1.71 GiB is free. Including non-PyTorch memory, this process has 77.43 GiB memory in use.
[rank1]:[E1010 06:49:17.596585 ProcessGroupNCCL.cpp:616] [Rank 1] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=88231, OpType=ALLREDUCE, NumelIn=262144, NumelOut=262144, Timeout(ms)=600000) ran for 600021 milliseconds before timing out.
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
"""


def _noise_line(rng: random.Random, r: int, it: int) -> str:
    kind = rng.random()
    if kind < 0.35:
        return (f"[rank{r}]: iteration {it:8d}/  500000 | consumed samples: {it * 128:12d} | elapsed time per iteration (ms): "
                f"{rng.uniform(900, 1100):.1f} | learning rate: 2.999E-04 | lm loss: {rng.uniform(1.8, 2.2):.6E} | loss scale: "
                f"65536.0 | grad norm: {rng.uniform(0.2, 0.6):.3f} | number of skipped iterations:   0 |")
    if kind < 0.55:
        return f"node{r // 4:02d}:{40000 + r}:{41000 + r} [{r}] NCCL INFO Channel {rng.randrange(32):02d}/32 : {r}[{r}] -> {(r + 1) % 8}[{(r + 1) % 8}] via P2P/IPC/read"
    if kind < 0.75:  # two updates of a bar, as tqdm writes them to a file: a carriage return between
        pct = rng.randrange(99)
        return "\r".join(f"[default{r}]:Training: {p:3d}%|{'#' * (p // 10):10s}| {p * 50}/5000 [12:{p % 60:02d}<08:{(99 - p) % 60:02d},"
                          f"  1.21it/s, loss={rng.uniform(1, 3):.3f}]" for p in (pct, pct + 1))
    if kind < 0.9:
        return (f"[rank{r}]:[W1010 06:{rng.randrange(60):02d}:{rng.randrange(60):02d}.{rng.randrange(10**6):06d} reducer.cpp:1400] "
                "Warning: Grad strides do not match bucket view strides. This may indicate grad was not created according to the gradient layout contract")
    return (f"[2024-10-10 06:{rng.randrange(60):02d}:{rng.randrange(60):02d},{rng.randrange(1000):03d}] [INFO] [logging.py:96:log_dist] "
            f"[Rank {r}] step={it}, skipped=0, lr=[0.0003], mom=[(0.9, 0.95)]")


def _hit_line(rng: random.Random, r: int, it: int) -> str:
    """A line that matches a fingerprint or a marker without being a failure, as real jobs print them."""
    t = f"[2024-10-10 06:{rng.randrange(60):02d}:{rng.randrange(60):02d},{rng.randrange(1000):03d}]"
    return rng.choice((
        f"[rank{r}]: {t} [INFO] saving checkpoint at iteration {it:8d} to /ckpt/run7/iter_{it:07d}",
        f"[rank{r}]: {t} [INFO]   successfully saved checkpoint at iteration {it:8d} to /ckpt/run7/iter_{it:07d}",
        f"[rank{r}]: {t} [WARNING] [stage3.py:2069:step] {rng.randrange(1, 9)} pytorch allocator cache flushes since last step. "
        "this happens when there is high memory pressure and is detrimental to performance.",
        f"[rank{r}]: wandb: Network error (ReadTimeout), entering retry loop.",
        f"node{r // 4:02d}:{40000 + r}:{41000 + r} [{r}] NCCL INFO NET/IB : Got async event : port active",
        f"[rank{r}]: {t} [ERROR] [metrics.py:88:push] error pushing metrics to the collector, will retry",
        f"[rank{r}]: {t} [WARNING] retrying after urllib3.exceptions.ReadTimeoutError: read timed out",
    ))


def _block(rng: random.Random, start_iter: int, lines: int, hit_share: float) -> tuple[str, int]:
    out, it = [], start_iter
    for _ in range(lines):
        r = rng.randrange(8)
        it += rng.random() < 0.35
        out.append(_hit_line(rng, r, it) if rng.random() < hit_share else _noise_line(rng, r, it))
    return "\n".join(out) + "\n", it


def _progress_block(rng: random.Random, start_iter: int, lines: int) -> tuple[str, int]:
    out = []
    for it in range(start_iter + 1, start_iter + lines + 1):
        out.append(f"[rank7]: [2024-10-10 06:{it // 60 % 60:02d}:{it % 60:02d}] iteration {it:8d}/ 5000000 | consumed samples: {it * 512:12d} | "
                   f"elapsed time per iteration (ms): {rng.uniform(900, 1100):.1f} | learning rate: 2.999E-04 | global batch size:   512 | "
                   f"lm loss: {rng.uniform(1.8, 2.2):.6E} | loss scale: 65536.0 | grad norm: {rng.uniform(0.2, 0.6):.3f} | "
                   "number of skipped iterations:   0 | number of nan iterations:   0 |")
    return "\n".join(out) + "\n", start_iter + lines


def generate(path: Path, size_mb: float, kind: str, seed: int = 7, failure: str = FAILURE) -> None:
    """Write a log of about `size_mb` MB ending in `failure`; blocks repeat (the scan cost does not
    depend on novelty)."""
    rng = random.Random(seed)
    blocks = []
    it = 0
    for _ in range(8):
        if kind == "progress":
            block, it = _progress_block(rng, it, 20_000)
        else:
            block, it = _block(rng, it, 20_000, 0.05 if kind == "dense" else 0.0)
        blocks.append(block.encode())
    target = int(size_mb * (1 << 20))
    written = 0
    with open(path, "wb") as f:
        i = 0
        while written < target - len(failure):
            block = blocks[i % len(blocks)][: target - len(failure) - written]
            block = block[: block.rfind(b"\n") + 1]
            if not block:
                break
            f.write(block)
            written += len(block)
            i += 1
        f.write(failure.encode())


def _patterns(kb) -> tuple[list[str], list[str]]:
    """(ERE for grep, Rust regex for rg): the fingerprints and line markers, written for each tool."""
    ere, rust = [], []
    for p in [fp.pattern for fp in kb.fingerprints] + [m.scan for m in markers.LINE_MARKERS]:
        rx = re.sub(r"\(\?P<\w+>", "(", p.regex)  # both tools join the patterns: names would clash
        rust.append(("(?i)" if p.ignorecase else "") + rx)
        ere.append(rx.replace("(?:", "(").replace(r"\d", "[0-9]"))  # grep cannot fold case per pattern
    return ere, rust


def _env(engine: str) -> dict[str, str]:
    """The environment trainmedic runs in: the engine forced, and bytecode written and reused as an
    installed package has it (a machine that sets PYTHONDONTWRITEBYTECODE would otherwise time
    compiling our modules on every start, ~0.1 s, which no pip install pays)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    return {**env, "TRAINMEDIC_ENGINE": engine, "PYTHONPATH": str(ROOT)}


def _run(cmd: list[str], env: dict | None = None) -> tuple[float, float, int]:
    """(wall seconds, CPU seconds of it and its children, peak RSS in MiB of the largest process)."""
    start = time.perf_counter()
    # Not /dev/null: GNU grep stops at the first match when its output goes there.
    with tempfile.TemporaryFile() as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.DEVNULL, env=env)
        _, status, usage = os.wait4(proc.pid, 0)  # ru_maxrss covers the reaped children too
    elapsed = time.perf_counter() - start
    code = os.waitstatus_to_exitcode(status)
    if code not in (0, 1):  # grep and rg exit 1 when nothing matched
        raise RuntimeError(f"{cmd[0]} exited {code}")
    return elapsed, usage.ru_utime + usage.ru_stime, usage.ru_maxrss // 1024


def _measure(cmd: list[str], runs: int, env: dict | None = None) -> tuple[float, float, float, int]:
    """(best wall, median wall, best CPU seconds, peak RSS) of `runs` runs."""
    results = [_run(cmd, env) for _ in range(runs)]
    times = [r[0] for r in results]
    return min(times), statistics.median(times), min(r[1] for r in results), max(r[2] for r in results)


def _row(name: str, mb: float, best: float, median: float, cpu: float, rss: int) -> None:
    print(f"  {name:44} {best:8.2f} {median:8.2f} {cpu:8.2f} {mb / best:8.0f} {rss:10d}", flush=True)


def _processes(paths: list[Path]) -> str:
    """How many processes trainmedic would scan these files with now (a big file is cut into pieces)."""
    workers = parallel.workers_for([(str(p), p.name) for p in paths])
    return f" (trainmedic would use {workers} process{'es' if workers > 1 else ''} now)"


def _header(title: str) -> None:
    print(f"\n{title}\n  {'tool':44} {'best s':>8} {'median s':>8} {'CPU s':>8} {'MB/s':>8} {'RSS MiB':>10}", flush=True)


def _tools(paths: list[Path], mb: float, runs: int, grep_runs: int, pattern_files: tuple[Path, Path]) -> None:
    ere, rust = pattern_files
    trainmedic = [sys.executable, "-m", "bot.cli", "diagnose", "--format", "json", "--no-record", *map(str, paths)]
    for engine in ("hyperscan", "re2"):
        env = _env(engine)
        try:
            _row(f"trainmedic diagnose ({engine})", mb, *_measure(trainmedic, runs, env))
        except RuntimeError as exc:
            print(f"  trainmedic ({engine}): {exc}")
    if shutil.which("rg"):
        _row("rg -c -f (same patterns)", mb, *_measure(["rg", "-c", "-f", str(rust), *map(str, paths)], runs))
    else:
        print("  rg: not installed (Debian/Ubuntu: apt-get install ripgrep)")
    if grep_runs:
        _row("grep -E -c -f (same patterns)", mb, *_measure(["grep", "-E", "-c", "-f", str(ere), *map(str, paths)], grep_runs))


def _paste(kb, dense: Path, tmp: Path, runs: int) -> None:
    """The cost of 5 MB of hit-dense text over a one-line log, whole process and in-process."""
    with open(dense, "rb") as f:
        f.seek(max(0, dense.stat().st_size - (5 << 20)))
        data = f.read()
    data = data[data.find(b"\n") + 1:]
    paste, one = tmp / "paste-5mb.log", tmp / "one-line.log"
    paste.write_bytes(data)
    one.write_bytes(b"[rank0]: iteration 1/ 10 | lm loss: 2.0 |\n")
    _header(f"paste: {len(data) / 1e6:.1f} MB of the dense log over a one-line log")
    cmd = [sys.executable, "-m", "bot.cli", "diagnose", "--format", "json", "--no-record"]
    for engine in ("hyperscan", "re2"):
        env = _env(engine)
        # A start-up (0.3-0.5 s) is far noisier than the difference: many runs, taken in turn.
        pairs = [(_run(cmd + [str(paste)], env), _run(cmd + [str(one)], env)) for _ in range(max(runs, 15))]
        big_wall, small_wall = [b[0] for b, _ in pairs], [s[0] for _, s in pairs]
        big_cpu, small_cpu = min(b[1] for b, _ in pairs), min(s[1] for _, s in pairs)
        print(f"  whole process ({engine}): {1000 * (min(big_wall) - min(small_wall)):.0f} ms best, "
              f"{1000 * (statistics.median(big_wall) - statistics.median(small_wall)):.0f} ms median, "
              f"{1000 * (big_cpu - small_cpu):.0f} ms CPU (5 MB {1000 * statistics.median(big_wall):.0f} ms, "
              f"one line {1000 * statistics.median(small_wall):.0f} ms, {len(pairs)} runs each, in turn)")
        diagnoser = Diagnoser(kb, engine_name=engine)
        text, line = data.decode("utf-8", "replace"), one.read_text()
        costs = []
        for _ in range(15):
            start = time.perf_counter()
            d = diagnoser.diagnose_text(text)
            mid = time.perf_counter()
            diagnoser.diagnose_text(line)
            costs.append((mid - start) - (time.perf_counter() - mid))
        print(f"  in-process ({engine}): {1000 * min(costs):.1f} ms best, {1000 * statistics.median(costs):.1f} ms median "
              f"-> root {d.root.entry.id if d.root else None}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--logs", default="clean,dense,ranks,paste", help="comma-separated: clean, dense, ranks, paste, progress")
    ap.add_argument("--size-mb", type=int, default=1024, help="size of the clean and dense logs")
    ap.add_argument("--progress-mb", type=int, default=2048, help="size of the progress-only log")
    ap.add_argument("--rank-files", type=int, default=256)
    ap.add_argument("--rank-mb", type=float, default=4)
    ap.add_argument("--data", type=Path, default=ROOT / "bench-data")
    ap.add_argument("--runs", type=int, default=3, help="runs of each tool (best and median)")
    ap.add_argument("--grep-runs", type=int, default=1, help="runs of grep, which takes a minute on a hit-dense GB (0: none)")
    args = ap.parse_args()
    wanted = set(args.logs.split(","))

    kb = load(entry_folders(""))
    args.data.mkdir(exist_ok=True)
    tmp = Path(tempfile.mkdtemp())
    ere, rust = _patterns(kb)
    (tmp / "ere").write_text("\n".join(ere) + "\n")
    (tmp / "rust").write_text("\n".join(rust) + "\n")
    files = (tmp / "ere", tmp / "rust")
    warm = tmp / "warm.log"
    warm.write_text("warm the caches\n")
    for engine in ("hyperscan", "re2"):  # the first start after an entry changed compiles and validates
        _run([sys.executable, "-m", "bot.cli", "diagnose", "--no-record", str(warm)],
             _env(engine))
    print(f"{len(kb.fingerprints)} fingerprints + {len(markers.LINE_MARKERS)} markers, {os.cpu_count()} cores, "
          f"load average {os.getloadavg()[0]:.2f}")

    def log(kind: str, size_mb: float) -> Path:
        path = args.data / f"{kind}-{size_mb:g}mb.log"
        if not path.exists():
            print(f"generating {path} ...", flush=True)
            generate(path, size_mb, kind)
        return path

    for kind, size in (("clean", args.size_mb), ("dense", args.size_mb), ("progress", args.progress_mb)):
        if kind in wanted:
            path = log(kind, size)
            mb = path.stat().st_size / 1e6
            _header(f"{kind}: {path.name}, {mb:.0f} MB{_processes([path])}")
            _tools([path], mb, args.runs, args.grep_runs, files)
    if "ranks" in wanted:
        folder = args.data / f"ranks-{args.rank_files}x{args.rank_mb:g}mb"
        folder.mkdir(exist_ok=True)
        paths = [folder / f"rank{r:04d}.log" for r in range(args.rank_files)]
        for r, path in enumerate(paths):
            if not path.exists():
                generate(path, args.rank_mb, "dense", seed=r, failure=FAILURE if r == 3 else "")
        mb = sum(p.stat().st_size for p in paths) / 1e6
        _header(f"ranks: {len(paths)} files of {args.rank_mb:g} MB as one job, {mb:.0f} MB{_processes(paths)}")
        _tools(paths, mb, args.runs, args.grep_runs, files)
    if "paste" in wanted:
        _paste(kb, log("dense", args.size_mb), tmp, args.runs)
    shutil.rmtree(tmp)


if __name__ == "__main__":
    main()
