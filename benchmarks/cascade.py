"""Initiating host and rank accuracy on multi-node cascades with known answers, next to root accuracy.

    python benchmarks/cascade.py                 # 60 generated cascades and the real multi-rank logs
    python benchmarks/cascade.py --cases 300 --seed 7

Each generated job has 2-16 nodes of 4 or 8 ranks and one planted fault on one node: a GPU falls off
the bus (Xid 79 in that node's kernel log; its rank's watchdog dies with "CUDA error: unknown
error"), the host OOM-kills a rank (oom-kill in the kernel log; srun names the killed task), or a
NIC flaps (mlx5 "Link down"; the rank on that NIC logs NCCL's port error, its peers completion
errors). Every other rank then prints its NCCL watchdog timeout. Each host's clock is off by up to
20 s, lines are interleaved, and healthy nodes log kernel noise. The logs come in three layouts: one
interleaved StdOut with `[rankN]:` prefixes, per-rank files `logs/%j/rank%t.log`, and
`logs/%j/%N-rank%t.log`; half the jobs ran with NCCL_DEBUG=INFO (each rank's log names its host),
half without (only srun's `host: task N` lines tie a rank to its node). Each job goes through the job path's own parts:
joblogs (find, the tail copies, the origins of per-rank files), kernel.rewrite (journalctl's
output as syslog lines of the node), the scan, and reattribute. The same jobs are also diagnosed from
their StdOut alone, which is what `/diagnose` read before. Then the real multi-rank cases of
../shared/real-logs (read from there, never copied) whose initiating host or rank the log text
states (the answers are below, with the line that states each).
"""
from __future__ import annotations

import argparse
import asyncio
import os
import random
import sys
import tempfile
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bot.config import Settings  # noqa: E402
from bot.engine.diagnose import Diagnoser  # noqa: E402
from bot.kb.load import entry_folders, load  # noqa: E402
from bot.sources import kernel  # noqa: E402
from bot.sources.cluster import Cluster  # noqa: E402
from bot.sources.files import diagnose_files  # noqa: E402
from bot.sources.joblogs import JobLogs, LogFile  # noqa: E402
from bot.sources.slurm import reattribute  # noqa: E402

REAL = Path(os.environ.get("TRAINMEDIC_REAL_LOGS", ROOT.parent / "shared" / "real-logs"))
# case -> (accepted roots, initiating host, initiating rank); None where the log does not say
REAL_ANSWERS = {
    # "srun: error: Node failure on jean-zay-iam37" (the STEP line names the batch host iam17)
    "147-slurm-node-failure-m4-training.log": ({"slurm-node-fail"}, "jean-zay-iam37", None),
    # "srun: error: Node failure on jean-zay-iam49" after the ranks' CUDA unknown errors
    "148-cuda-unknown-error-then-node-failure-m4.log": ({"slurm-node-fail", "gpu-xid"}, "jean-zay-iam49", None),
    # "srun: error: jean-zay-iam33: task 3: Exited with exit code 123", the others only Terminated
    "162-srun-task-exit-123-terminated.log": ({"slurm-task-killed"}, "jean-zay-iam33", 3),
    # "[default3]:terminate called ... CUDA error: unknown error", the only rank that printed
    "172-bloom-gpu-crash-cuda-unknown-error.log": ({"gpu-xid"}, None, 3),
}
KINDS = ("gpu", "oom", "nic")
SKEW = 30  # seconds each host's clock may be off
LAYOUTS = ("interleaved", "rank-files", "node-rank-files")
WATCHDOG = ("[Rank {g}] Watchdog caught collective operation timeout: WorkNCCL(SeqNum={seq}, OpType=ALLREDUCE, "
            "NumelIn=262144, NumelOut=262144, Timeout(ms)={ms}) ran for {ran} milliseconds before timing out.")
KERNEL_NOISE = ("IPv6: ADDRCONF(NETDEV_CHANGE): ib0: link becomes ready", "nvidia-peermem nv_get_p2p_free_callback:128 ERROR detected invalid context, skipping further processing",
                "audit: type=1400 audit(1711940000.123:88): apparmor=\"STATUS\" operation=\"profile_load\"",
                "EDAC MC0: 1 CE memory read error on CPU_SrcID#0_Ha#0_Chan#1_DIMM#0 (channel:1 slot:0 page:0x1234 offset:0x0)",
                "pcieport 0000:00:01.0: AER: Corrected error received: 0000:01:00.0", "perf: interrupt took too long (2503 > 2500)")


@dataclass
class Case:
    kind: str
    layout: str
    hosts: list[str]
    per_node: int
    host: str  # the answer
    rank: int
    files: dict[str, str] = field(default_factory=dict)  # path under the job's folder -> text
    kernel: dict[str, list[str]] = field(default_factory=dict)  # node -> journalctl -o short-iso lines
    dmesg: set[str] = field(default_factory=set)  # nodes whose kernel log comes from dmesg (no window of its own)
    end: datetime = datetime(2024, 4, 1)

    @property
    def roots(self) -> set[str]:
        return {"gpu": {"gpu-xid"}, "oom": {"host-oom-kill"}, "nic": {"ib-link-flap"}}[self.kind]


def _glog(level: str, at: datetime) -> str:
    return f"{level}{at:%m%d %H:%M:%S}.{at.microsecond:06d}"


def generate(rng: random.Random, kind: str, layout: str) -> Case:
    prefix = rng.choice(["gpu-node-", "dgx", "a100-", "hgx-b-"])
    nodes, per_node = rng.randint(2, 16), rng.choice([4, 8])
    hosts = [f"{prefix}{i:02d}" for i in range(1, nodes + 1)]
    bad = rng.randrange(nodes)
    rank = bad * per_node + rng.randrange(per_node)
    case = Case(kind, layout, hosts, per_node, hosts[bad], rank)
    skew = {h: timedelta(seconds=rng.uniform(-SKEW, SKEW)) for h in hosts}
    t0 = datetime(2024, 4, 1, 2, 0) + timedelta(seconds=rng.randrange(3600))
    timeout_s = rng.choice([60, 300, 600, 1800])
    lines: dict[int, list[tuple[datetime, str]]] = {g: [] for g in range(nodes * per_node)}
    pids = {g: rng.randrange(10_000, 90_000) for g in lines}

    def host_of(g: int) -> str:
        return hosts[g // per_node]

    def say(g: int, at: datetime, text: str) -> None:
        lines[g].append((at + skew[host_of(g)], text))

    def nccl(g: int, what: str) -> str:
        return f"{host_of(g)}:{pids[g]}:{pids[g] + 87} [{g % per_node}] NCCL {what}"

    nccl_info = rng.random() < 0.5  # NCCL_DEBUG=INFO: every rank's log names its host at start-up
    for g in lines:  # start-up and training noise
        if nccl_info:
            say(g, t0 - timedelta(minutes=50), nccl(g, f"INFO NCCL version 2.21.5+cuda12.4 comm 0x{g:x} rank {g} nranks {len(lines)}"))
        for i in range(rng.randint(3, 8)):
            at = t0 - timedelta(seconds=rng.uniform(10, 2400))
            say(g, at, rng.choice([f"iteration {40000 + i * 10}/ 500000 | lm loss: {rng.uniform(1.8, 2.2):.4E} | grad norm: {rng.uniform(0.2, 0.6):.3f} |",
                                   f"{_glog('W', at)} {rng.randrange(100, 999)} reducer.cpp:1400] Warning: Grad strides do not match bucket view strides."]
                                  + ([nccl(g, f"INFO Channel {rng.randrange(32):02d}/32 : {g} -> {(g + 1) % len(lines)} via NET/IB/{rng.randrange(8)}")] if nccl_info else [])))
    stamp = lambda at, host: f"{at + skew[host]:%Y-%m-%dT%H:%M:%S}+0000 {host}.cluster kernel:"  # noqa: E731
    for h in hosts:
        case.kernel[h] = [f"{stamp(t0 - timedelta(seconds=rng.uniform(0, 1800)), h)} {rng.choice(KERNEL_NOISE)}"
                          for _ in range(rng.randint(0, 6))]
    bus = f"{rng.randrange(16, 250):02x}"
    died = [rank]
    if kind == "gpu":
        case.kernel[case.host].append(f"{stamp(t0, case.host)} NVRM: Xid (PCI:0000:{bus}:00): 79, pid={pids[rank]}, name=python, GPU has fallen off the bus.")
        at = t0 + timedelta(seconds=rng.uniform(0.5, 4))
        say(rank, at, f"{_glog('E', at + skew[case.host])} {pids[rank]} ProcessGroupNCCL.cpp:1515] [PG 0 Rank {rank}] Process group "
                      "watchdog thread terminated with exception: CUDA error: unknown error")
    elif kind == "oom":
        case.kernel[case.host] += [f"{stamp(t0, case.host)} python invoked oom-killer: gfp_mask=0x140cca(GFP_HIGHUSER_MOVABLE|__GFP_COMP), order=0, oom_score_adj=0",
                                   f"{stamp(t0, case.host)} oom-kill:constraint=CONSTRAINT_NONE,nodemask=(null),cpuset=/,mems_allowed=0-1,global_oom,task_memcg=/slurm/uid_1001/job_77/step_0/task_{rank % per_node},task=python,pid={pids[rank]},uid=1001",
                                   f"{stamp(t0, case.host)} Out of memory: Killed process {pids[rank]} (python) total-vm:912345678kB, anon-rss:801234567kB, file-rss:0kB, shmem-rss:0kB, UID:1001 pgtables:1765432kB oom_score_adj:0"]
        for g in rng.sample(sorted(set(lines) - {rank}), k=max(1, len(lines) // 3)):
            at = t0 + timedelta(seconds=rng.uniform(0.5, 5))
            say(g, at, f"{_glog('E', at + skew[host_of(g)])} {pids[g]} ProcessGroupNCCL.cpp:1895] [PG 0 Rank {g}] NCCL error: remote process exited or there was a network error, NCCL version 2.21.5")
            died.append(g)
    else:
        iface = f"ib{rng.randrange(8)}"
        case.kernel[case.host] += [f"{stamp(t0, case.host)} mlx5_core 0000:{bus}:00.0 {iface}: Link down",
                                   f"{stamp(t0 + timedelta(seconds=rng.uniform(5, 40)), case.host)} mlx5_core 0000:{bus}:00.0 {iface}: Link up"]
        say(rank, t0 + timedelta(seconds=rng.uniform(0, 1)), nccl(rank, "WARN NET/IB : Got async event : port error"))
        for g in rng.sample(sorted(set(lines) - {rank}), k=max(1, len(lines) // 4)):
            say(g, t0 + timedelta(seconds=rng.uniform(3, 15)),
                nccl(g, f"WARN NET/IB : Got completion from peer 10.0.{bad}.{rank % per_node + 10}<{rng.randrange(30000, 60000)}> with status=12 opcode=0 len=0 vendor err 129 (Send)"))
    for g in set(lines) - set(died):
        at = t0 + timedelta(seconds=timeout_s + rng.uniform(0, 3))
        say(g, at, f"{_glog('E', at + skew[host_of(g)])} {pids[g]} ProcessGroupNCCL.cpp:616] "
                   + WATCHDOG.format(g=g, seq=88231, ms=timeout_s * 1000, ran=timeout_s * 1000 + rng.randrange(5, 90)))
    case.end = t0 + timedelta(seconds=timeout_s + 90)
    other = rng.choice([h for h in hosts if h != case.host])
    if rng.random() < 0.3:  # the same kind of fault on another node, after the cascade
        late = t0 + timedelta(seconds=timeout_s + 60)
        case.kernel[other].append(f"{stamp(late, other)} " + {
            "gpu": f"NVRM: Xid (PCI:0000:{bus}:00): 79, pid=4242, name=python, GPU has fallen off the bus.",
            "oom": "Out of memory: Killed process 4242 (python) total-vm:912345678kB, anon-rss:801234567kB, file-rss:0kB, shmem-rss:0kB, UID:1001 pgtables:1765432kB oom_score_adj:0",
            "nic": f"mlx5_core 0000:{bus}:00.0 ib3: Link down"}[kind])
    if rng.random() < 0.3:  # a node read with dmesg, whose ring buffer still holds a fault of two days ago
        case.dmesg.add(other)
        case.kernel[other].insert(0, f"{stamp(t0 - timedelta(days=2), other)} NVRM: Xid (PCI:0000:{bus}:00): 79, pid=4141, name=python, GPU has fallen off the bus.")
    _lay_out(rng, case, lines)
    return case


def _lay_out(rng: random.Random, case: Case, lines: dict[int, list[tuple[datetime, str]]]) -> None:
    """The StdOut (interleaved, or only srun's lines) and the per-rank files of the layout."""
    exits = [case.rank] + rng.sample(sorted(set(lines) - {case.rank}), k=len(lines) - 1)
    if case.kind == "nic" or (case.kind == "gpu" and rng.random() < 0.5):
        rng.shuffle(exits)  # the faulty rank may hang until its watchdog ends it with the others
    srun = [f"srun: error: {case.hosts[g // case.per_node]}: task {g}: "
            + ("Killed" if case.kind == "oom" and g == case.rank else "Exited with exit code 1") for g in exits]
    if case.layout == "interleaved":
        merged = sorted(((at + timedelta(seconds=rng.uniform(0, 2)), f"[rank{g}]:{text}") for g, ls in lines.items() for at, text in ls))
        case.files["slurm-77.out"] = "\n".join(t for _, t in merged + [(None, s) for s in srun]) + "\n"
        return
    case.files["slurm-77.out"] = "\n".join(srun) + "\n"
    for g, ls in lines.items():
        name = f"rank{g}.log" if case.layout == "rank-files" else f"{case.hosts[g // case.per_node]}-rank{g}.log"
        case.files[f"logs/77/{name}"] = "\n".join(text for _, text in sorted(ls)) + "\n"


@dataclass
class Score:
    cases: int = 0
    root: int = 0
    host: int = 0
    rank: int = 0

    def add(self, root_ok: bool, host_ok: bool, rank_ok: bool) -> None:
        self.cases += 1
        self.root += root_ok
        self.host += host_ok
        self.rank += rank_ok

    def row(self, name: str) -> str:
        pct = lambda n: f"{n}/{self.cases} {100 * n / max(1, self.cases):5.1f}%"  # noqa: E731
        return f"  {name:30} {self.cases:5} {pct(self.root):>16} {pct(self.host):>16} {pct(self.rank):>16}"


async def _read_job(case: Case, folder: Path, whole: bool):
    """What the job path reads: parts to diagnose and the per-rank files' origins."""
    root = folder / "scratch"
    for rel, text in case.files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    pattern = {"rank-files": "logs/77/rank%t.log", "node-rank-files": "logs/77/%N-rank%t.log"}.get(case.layout)
    settings = Settings(slurm_log_roots=(root,), slurm_rank_logs=(pattern,) if pattern else ())
    copies = folder / "copies"
    copies.mkdir()
    logs = JobLogs(Cluster(settings), copies)
    read = await logs.read([LogFile(str(root / "slurm-77.out"))])
    if not whole:
        return read.parts, {}
    ranked = await logs.discover([str(root / pattern)] if pattern else [])
    parts, origins = read.parts + ranked.parts, ranked.origins
    span = kernel.window(None, f"{case.end:%Y-%m-%dT%H:%M:%S}", 60)
    for i, (node, journal) in enumerate(case.kernel.items()):
        raw, dest = folder / f"k{i}.raw", folder / f"k{i}"
        if node in case.dmesg:  # dmesg --time-format=iso: no host field
            journal = [f"{ln[:19]},000000+00:00 {ln.split(' kernel: ', 1)[1]}" for ln in journal]
        raw.write_text("\n".join(journal) + "\n")
        kernel.rewrite(raw, dest, node, node not in case.dmesg, span)
        parts.append((str(dest), f"<kernel log of {node}>"))
    return parts, origins


def diagnose_case(diagnoser: Diagnoser, case: Case, whole: bool) -> tuple[bool, bool, bool, str]:
    with tempfile.TemporaryDirectory(prefix="trainmedic-cascade-") as tmp:
        parts, origins = asyncio.run(_read_job(case, Path(tmp), whole))
        d = reattribute(diagnoser.kb, diagnose_files(diagnoser, parts, "77"), origins)
    init = d.initiating or {}
    got = f"got {d.root.entry.id if d.root else None} {init.get('host')}/{init.get('rank')}"
    return (d.root is not None and d.root.entry.id in case.roots, init.get("host") == case.host,
            init.get("rank") == case.rank, got)


def real_cases(diagnoser: Diagnoser) -> list[str]:
    rows = []
    for name, (roots, host, rank) in REAL_ANSWERS.items():
        path = REAL / name
        if not path.is_file():
            continue
        d = diagnose_files(diagnoser, [(str(path), name)])
        init = d.initiating or {}
        got = d.root.entry.id if d.root else None
        marks = [f"root {'ok' if got in roots else 'MISS'} ({got})"]
        if host:
            marks.append(f"host {'ok' if init.get('host') == host else 'MISS'} ({init.get('host')})")
        if rank is not None:
            marks.append(f"rank {'ok' if init.get('rank') == rank else 'MISS'} ({init.get('rank')})")
        rows.append(f"  {name:50} " + ", ".join(marks))
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cases", type=int, default=60, help="generated cascades (spread over kinds and layouts)")
    ap.add_argument("--seed", type=int, default=17)
    ap.add_argument("--misses", action="store_true", help="print each generated case that missed")
    args = ap.parse_args()
    rng = random.Random(args.seed)
    diagnoser = Diagnoser(load(entry_folders("")))
    head = f"  {'':30} {'cases':>5} {'root':>16} {'initiating host':>16} {'initiating rank':>16}"
    scores: dict[str, Score] = {}
    for i in range(args.cases):
        case = generate(rng, KINDS[i % 3], LAYOUTS[(i // 3) % 3])
        for whole in (True, False):
            *ok, got = diagnose_case(diagnoser, case, whole)
            label = "whole job" if whole else "StdOut only"
            for key in (f"{label}: all", f"{label}: {case.kind}", f"{label}: {case.layout}"):
                scores.setdefault(key, Score()).add(*ok)
            if args.misses and whole and not all(ok):
                print(f"miss: {case.kind} {case.layout} {len(case.hosts)}x{case.per_node} want {case.host}/{case.rank} "
                      f"{got}")
    print(f"generated cascades (seed {args.seed}): one fault on one node, every other rank times out")
    print(head)
    for key in sorted(scores, key=lambda k: (not k.startswith("whole"), not k.endswith(": all"), k)):
        print(scores[key].row(key))
    rows = real_cases(diagnoser)
    print(f"\nreal multi-rank logs ({len(rows)} of {len(REAL_ANSWERS)} found, one log each):")
    print("\n".join(rows) if rows else f"  none at {REAL}")


if __name__ == "__main__":
    main()
