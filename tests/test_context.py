"""Rank, host and timestamp extraction on each format real logs use."""
import pytest

from bot.engine.context import line_context

RANKS = [
    ("[rank3]:[E1010 06:39:17.596585 ProcessGroupNCCL.cpp:616] boom", 3),
    ("[default5]:RuntimeError: boom", 5),
    ("[2024-09-11 17:52:11,320] [INFO] [Rank 3] step=10", 3),
    ("node12:1234:5678 [3] NCCL INFO Channel 00/0", None),  # [3] is the CUDA device (NCCL's debug.cc: cudaDev)
    ("INFO local_rank: 3 is using device cuda:3", 3),
    ("srun: error: gpu-a100-17: task 5: Out Of Memory", 5),
    ("plain line with no rank", None),
]
HOSTS = [
    ("worker-1: [2024-09-11 17:52:11,320] [INFO] boom", "worker-1"),
    ("node12:1234:5678 [3] NCCL WARN NET/IB : Got completion", "node12"),
    ("slurmstepd: error: *** JOB 4812345 ON gpu-a100-17 CANCELLED AT 2024-09-11T17:52:44 ***", "gpu-a100-17"),
    ("srun: error: jean-zay-iam37: task 0: Killed", "jean-zay-iam37"),
    ("srun: error: Node failure on jean-zay-iam49", "jean-zay-iam49"),
    ("Mar  3 10:00:01 node7 kernel: NVRM: Xid (PCI:0000:3b:00): 79", "node7"),
    ("  host      : gpu-node-07", "gpu-node-07"),
    ("RuntimeError: not a host", None),
]
TIMES = [
    ("[2024-09-11 17:52:11,320] [INFO] x", "2024-09-11 17:52:11,320", "abs"),
    ("2024-09-11T17:52:11.123456Z x", "2024-09-11T17:52:11.123456", "abs"),
    ("Mar  3 10:00:01 node7 kernel: x", "Mar  3 10:00:01", "md"),
    ("[rank0]:[W1009 12:00:00.123456 reducer.cpp:1] x", "W1009 12:00:00.123456", "md"),
    ("[12345.678901] NVRM: Xid", "[12345.678901]", "boot"),
    ("loss 2.1 at 17:52", None, None),
]


@pytest.mark.parametrize("line, rank", RANKS)
def test_rank(line, rank):
    assert line_context(line).rank == rank


@pytest.mark.parametrize("line, host", HOSTS)
def test_host(line, host):
    assert line_context(line).host == host


@pytest.mark.parametrize("line, text, kind", TIMES)
def test_time(line, text, kind):
    ctx = line_context(line)
    assert ctx.time == text
    assert (ctx.time_key[0] if ctx.time_key else None) == kind


def test_times_of_one_kind_order_correctly():
    early = line_context("[2024-09-11 17:52:11,320] a").time_key
    late = line_context("[2024-09-11 17:52:11,900] b").time_key
    assert early < late
