"""The job timeline (bot/engine/timeline.py): each rank's and host's first failure on one clock,
the start chosen within a clock-skew window by role, the rank filled in from the host's ranks, and
the host that differs from its peers."""
import io

from bot.engine.diagnose import analyse
from bot.engine.timeline import Origin, attribute

XID = "Apr  1 03:12:04 gpu-node-03 kernel: NVRM: Xid (PCI:0000:3b:00): 79, pid=23456, name=python, GPU has fallen off the bus.\n"


def watchdog_unknown(rank, at):
    return (f"[rank{rank}]:[E401 {at}.000100 ProcessGroupNCCL.cpp:1515] [PG 0 Rank {rank}] Process group watchdog "
            "thread terminated with exception: CUDA error: unknown error\n")


def timeout(rank, at="03:22:10"):
    return (f"[rank{rank}]:[E401 {at}.000200 ProcessGroupNCCL.cpp:616] [Rank {rank}] Watchdog caught collective "
            "operation timeout: WorkNCCL(SeqNum=9, OpType=ALLREDUCE, NumelIn=8, NumelOut=8, Timeout(ms)=600000) "
            "ran for 600047 milliseconds before timing out.\n")


def job(diagnoser, **files):
    return diagnoser.diagnose([(name, io.BytesIO(text.encode())) for name, text in files.items()], jobid="77")


def test_within_the_skew_window_the_stronger_line_starts_and_the_host_gives_the_rank(diagnoser):
    # rank 13's clock is 14 s behind its node's kernel: its line looks earlier, the Xid is the start
    ranks = watchdog_unknown(13, "03:11:50") + "".join(timeout(r) for r in range(12))
    stderr = "srun: error: gpu-node-03: task 13: Exited with exit code 1\n"
    d = job(diagnoser, **{"rank-all.out": ranks, "stderr": stderr, "<kernel log of gpu-node-03>": XID})
    assert d.root.entry.id == "gpu-xid"
    assert d.initiating == {"rank": 13, "host": "gpu-node-03", "line": 1, "file": 2}
    assert d.timeline.summary == "started on gpu-node-03 rank 13 (Xid 79 at 03:12:04); then 12 ranks: nccl-timeout"


def test_a_line_earlier_than_the_window_starts_even_when_weaker(diagnoser):
    early = watchdog_unknown(40, "03:02:00")  # ten minutes before the Xid of another host
    d = job(diagnoser, **{"ranks": early + timeout(1), "<kernel log of gpu-node-03>": XID})
    assert d.timeline.start.hit.rank == 40 and d.initiating["rank"] == 40 and d.initiating["file"] == 0


def test_a_machine_fault_on_one_host_is_drained_a_fault_everywhere_is_not(diagnoser):
    ranks = "".join(timeout(r) for r in range(8)).replace("[rank0]:", "gpu-node-01: [rank0]:")
    d = job(diagnoser, ranks=ranks + "gpu-node-02: " + timeout(9), kernel=XID)
    [odd] = d.timeline.odd_hosts
    assert odd.host == "gpu-node-03" and odd.entry == "gpu-xid"
    assert odd.drain == 'scontrol update nodename=gpu-node-03 state=drain reason="trainmedic: gpu-xid in job 77"'
    everywhere = job(diagnoser, a=XID, b=XID.replace("gpu-node-03", "gpu-node-04"),
                     c=XID.replace("gpu-node-03", "gpu-node-05"))
    assert everywhere.timeline.odd_hosts == []


def test_a_host_oom_kill_on_one_host_is_named_without_a_drain_and_its_killed_task_is_the_rank(diagnoser):
    kernel = ("Apr  1 03:12:04 gpu-node-02 kernel: Out of memory: Killed process 4242 (python) total-vm:81234567kB, "
              "anon-rss:71234567kB, file-rss:0kB, shmem-rss:0kB, UID:1001 pgtables:1234kB oom_score_adj:0\n")
    peers = "".join(f"[rank{r}]:[E401 03:12:05.1 ProcessGroupNCCL.cpp:1] [Rank {r}] NCCL error: remote process "
                    "exited or there was a network error, NCCL version 2.19.3\n" for r in range(8, 16))
    srun = ("srun: error: gpu-node-02: task 11: Killed\nsrun: error: gpu-node-01: task 1: Exited with exit code 1\n"
            "srun: error: gpu-node-03: task 17: Exited with exit code 1\n")
    d = job(diagnoser, ranks=peers, srun=srun, kernel=kernel)
    assert d.root.entry.id == "host-oom-kill"
    assert (d.initiating["host"], d.initiating["rank"]) == ("gpu-node-02", 11)
    [odd] = d.timeline.odd_hosts
    assert odd.host == "gpu-node-02" and odd.drain is None


def test_a_per_rank_files_origin_gives_its_lines_their_rank_and_host(diagnoser):
    oom = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 3.82 GiB.\n"
    nccl = "gpu-node-09:51203:51290 [3] NCCL INFO comm 0x1 rank 43 nranks 64\n" + timeout(0).replace("[rank0]:", "")
    d = job(diagnoser, **{"rank43.log": oom, "rank7.log": nccl})
    assert d.initiating["rank"] is None
    origins = {"rank43.log": Origin(43, "gpu-node-09"), "rank7.log": Origin(7, None)}
    again = analyse(diagnoser.kb, attribute(d.scan, origins), "77")
    assert (again.initiating["rank"], again.initiating["host"]) == (43, "gpu-node-09")
    assert again.root.hits[0].rank == 43
    assert next(f for f in again.findings if f.entry.id == "nccl-timeout").ranks == [0, 7]


def test_a_single_log_keeps_its_rank_and_host_from_the_lines_near_the_root(diagnoser):
    log = ("slurmstepd: error: Detected 1 oom-kill event(s) in StepId=8812345.0. Some of your processes may have "
           "been killed by the cgroup out-of-memory handler.\nsrun: error: gpu-a100-17: task 5: Out Of Memory\n")
    d = diagnoser.diagnose_text(log)
    assert (d.initiating["rank"], d.initiating["host"], d.initiating["line"]) == (5, "gpu-a100-17", 1)


def test_a_line_that_names_the_failed_node_wins_over_the_host_that_printed_it(diagnoser):
    log = ("srun: error: Node failure on gpu-node-37\n"
           "srun: Job step aborted: Waiting up to 32 seconds for job step to finish.\n"
           "slurmstepd: error: *** STEP 66120.0 ON gpu-node-02 CANCELLED AT 2024-04-01T03:17:51 DUE TO NODE FAILURE ***\n")
    d = diagnoser.diagnose_text(log)
    assert d.root.entry.id == "slurm-node-fail" and d.initiating["host"] == "gpu-node-37"


def test_when_the_root_says_nowhere_the_one_node_the_job_names_is_where(diagnoser):
    crash = ("terminate called after throwing an instance of 'c10::CUDAError'\n  what():  CUDA error: unknown error\n"
             "Exception raised from query at ../aten/src/ATen/cuda/CUDAEvent.h:91 (most recent call first):\n")
    d = diagnoser.diagnose_text(crash * 3 + "srun: error: Node failure on gpu-node-49\n")
    assert d.root.entry.id == "gpu-xid" and d.initiating["host"] == "gpu-node-49"
