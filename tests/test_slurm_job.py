"""`/diagnose <jobid>` reads the whole job: every rank's file, torchrun's error files, every node's
kernel log, through fake `scontrol`/`sacct`/`journalctl`/`dmesg`/`srun` and a fake ssh to the nodes."""
import asyncio
import json
import os

import pytest
from conftest import FAKES, run_cli
from test_slurm import _json, record, steps

from bot.config import Settings
from bot.sources.slurm import collect

NODES = "gpu-node-[01-04]"
SPAN = {"StartTime": "2024-04-01T02:00:00", "EndTime": "2024-04-01T03:22:40"}


def timeouts(ranks, at="03:22:10", host=None):
    """Every rank's NCCL watchdog timeout: the symptom, the same on every rank."""
    return "".join(
        f"[rank{r}]:[E401 {at}.{100 + r:06d} ProcessGroupNCCL.cpp:616] [Rank {r}] Watchdog caught collective "
        f"operation timeout: WorkNCCL(SeqNum=4410, OpType=ALLREDUCE, NumelIn=8, NumelOut=8, Timeout(ms)=600000) "
        f"ran for 600047 milliseconds before timing out.\n" for r in ranks)


def iterations(n=3):
    return "".join(f"[rank0]: iteration {1200 + i}/ 500000 | lm loss: 2.10{i}E+00 |\n" for i in range(n))


def kernel(node, *messages, at="2024-04-01T03:12:04"):
    return [f"{at}+0000 {node}.cluster kernel: {m}" for m in messages]


HEALTHY = ("nvidia-peermem: loaded", "IPv6: ADDRCONF(NETDEV_CHANGE): ib0: link becomes ready")
XID = "NVRM: Xid (PCI:0000:3b:00): 79, pid=23456, name=python, GPU has fallen off the bus."


def job(slurm, jobid, state="FAILED", **extra):
    fields = {"NodeList": NODES, "WorkDir": str(slurm.root), "StdOut": str(slurm.root / "slurm-%j.out"), **SPAN, **extra}
    slurm.add(jobid, [record(jobid, state, **fields)], steps(jobid, state, maxrss="1000K"))


def set_db(slurm, **values):
    data = json.loads(slurm.db.read_text())
    data.update(values)
    slurm.db.write_text(json.dumps(data))


@pytest.fixture
def nodes(slurm, monkeypatch):
    """Kernel logs come from each node through the fake ssh; gpu-node-03's GPU fell off the bus."""
    monkeypatch.setenv("TRAINMEDIC_NODE_COMMAND", f"{FAKES / 'fake-node-ssh'} {{node}}")
    monkeypatch.setenv("TRAINMEDIC_NODE_TIMEOUT", "3")
    logs = {f"gpu-node-0{i}": kernel(f"gpu-node-0{i}", *HEALTHY, at="2024-04-01T02:01:00") for i in range(1, 5)}
    logs["gpu-node-03"] += kernel("gpu-node-03", XID)
    logs["gpu-node-02"] += kernel("gpu-node-02", XID, at="2024-03-30T11:00:00")  # days before: outside the window
    set_db(slurm, kernel=logs)
    return logs


def test_a_cause_only_in_one_nodes_kernel_log_is_the_diagnosis_with_that_host(slurm, nodes):
    (slurm.root / "slurm-9100.out").write_text(iterations() + timeouts(range(32)))
    job(slurm, "9100")
    out = _json("--job", "9100")
    assert out["root"] == "gpu-xid"
    assert out["initiating"]["host"] == "gpu-node-03" and out["initiating"]["file"] == "<kernel log of gpu-node-03>"
    root = out["findings"][0]
    assert root["hosts"] == ["gpu-node-03"]  # gpu-node-02's old Xid is outside the job's window
    assert root["evidence"][0]["text"].startswith("Apr  1 03:12:04 gpu-node-03 kernel: NVRM: Xid")
    collateral = {f["entry"]: f for f in out["findings"][1:] if f["role"] == "collateral"}
    assert len(collateral["nccl-timeout"]["ranks"]) == 32
    timeline = out["timeline"]
    assert timeline["summary"] == "started on gpu-node-03 (Xid 79 at 03:12:04); then 32 ranks: nccl-timeout"
    assert timeline["odd_hosts"] == [{"host": "gpu-node-03", "entry": "gpu-xid",
                                      "drain": 'scontrol update nodename=gpu-node-03 state=drain reason="trainmedic: gpu-xid in job 9100"'}]
    assert [e["host"] for e in timeline["events"]][:1] == ["gpu-node-03"]
    assert "kernel logs: 4 of 4 node(s) read" in out["notes"]
    journal = [c for c in slurm.invocations() if c[0] == "journalctl"]
    assert sorted(c[-1] for c in journal) == ["@gpu-node-01", "@gpu-node-02", "@gpu-node-03", "@gpu-node-04"]
    assert "_TRANSPORT=kernel" in journal[0] and "--since=2024-04-01 02:22:40" in journal[0]
    assert "--until=2024-04-01 03:27:40" in journal[0]


def test_the_text_reply_names_the_odd_host_and_its_drain_command(slurm, nodes):
    (slurm.root / "slurm-9101.out").write_text(timeouts(range(8)))
    job(slurm, "9101")
    proc = run_cli("diagnose", "--no-record", "--job", "9101")
    text = proc.stdout.decode()
    assert "Started at: host gpu-node-03, line 1 of <kernel log of gpu-node-03> (Xid 79 at 03:12:04); then 8 ranks: nccl-timeout" in text
    assert "gpu-node-03 differs from its peers (gpu-xid), drain it: scontrol update nodename=gpu-node-03 state=drain" in text


def test_a_node_that_does_not_answer_is_named_never_taken_as_healthy(slurm, nodes):
    set_db(slurm, hang_nodes=["gpu-node-04"], fail_nodes=["gpu-node-01"])
    (slurm.root / "slurm-9102.out").write_text(timeouts(range(8)))
    job(slurm, "9102")
    out = _json("--job", "9102")
    assert out["root"] == "gpu-xid" and out["initiating"]["host"] == "gpu-node-03"
    notes = out["notes"]
    assert "kernel logs: 2 of 4 node(s) read; 2 did not answer and are not known to be healthy" in notes
    assert "gpu-node-04: kernel log not read: journalctl on gpu-node-04 did not answer within 3 s" in notes
    assert any(n.startswith("gpu-node-01: kernel log not read: journalctl and dmesg failed") for n in notes), notes


def test_a_node_without_a_journal_is_read_with_dmesg(slurm, nodes):
    set_db(slurm, no_journal=["gpu-node-03"])
    (slurm.root / "slurm-9103.out").write_text(timeouts(range(8)))
    job(slurm, "9103")
    out = _json("--job", "9103")
    assert out["root"] == "gpu-xid" and out["initiating"]["host"] == "gpu-node-03"
    assert ["dmesg", "--time-format=iso", "@gpu-node-03"] in slurm.invocations()


def test_kernel_logs_through_srun_inside_the_allocation_behind_the_ssh_prefix(slurm, nodes, monkeypatch):
    monkeypatch.setenv("TRAINMEDIC_SLURM_COMMAND_PREFIX", f"{FAKES / 'fake-ssh'} login01")
    monkeypatch.setenv("TRAINMEDIC_NODE_COMMAND", "srun --jobid={jobid} --overlap --nodelist={node} -N1 -n1")
    monkeypatch.setenv("FAKE_NOW", "2024-04-01T03:30:00")  # journalctl's "-60min" is an hour before this
    (slurm.root / "slurm-9104.out").write_text(timeouts(range(8)))
    job(slurm, "9104", state="RUNNING", EndTime="Unknown")
    out = _json("--job", "9104")
    assert out["root"] == "gpu-xid" and out["initiating"]["host"] == "gpu-node-03"
    srun = [c for c in slurm.invocations() if c[0] == "srun"]
    assert len(srun) == 4 and srun[0][1:3] == ["--jobid=9104", "--overlap"]
    assert any("--since=-60min" in c for c in slurm.invocations() if c[0] == "journalctl")  # still running


def test_no_node_command_no_kernel_logs_and_the_note_says_so(slurm):
    (slurm.root / "slurm-9105.out").write_text(timeouts(range(4)))
    job(slurm, "9105")
    out = _json("--job", "9105")
    assert out["cascade_only"] and "node kernel logs not read: TRAINMEDIC_NODE_COMMAND is not set" in out["notes"]
    assert not [c for c in slurm.invocations() if c[0] in ("journalctl", "scontrol") and "hostnames" in c]


RANK_OOM = """\
  File "/workspace/train.py", line 184, in <module>
    trainer.train()
[E401 03:12:06.300112 ProcessGroupNCCL.cpp:1] CUDA failure
torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 3.82 GiB. GPU 5 has a total capacity of 79.15 GiB of which 1.71 GiB is free.
"""
PLAIN_TIMEOUT = ("[E401 03:22:10.100 ProcessGroupNCCL.cpp:616] Watchdog caught collective operation timeout: "
                 "WorkNCCL(SeqNum=4410, OpType=ALLREDUCE, NumelIn=8, NumelOut=8, Timeout(ms)=600000) ran for 600047 "
                 "milliseconds before timing out.\n")


def test_a_cause_only_in_one_ranks_own_file_names_that_rank_and_host(slurm, monkeypatch):
    """Per-rank files (srun --output=logs/%j/%N-rank%t.log): the lines print no rank, their file does."""
    monkeypatch.setenv("TRAINMEDIC_SLURM_RANK_LOGS", "logs/%j/%N-rank%t.log:logs/%j/missing-%t.log")
    folder = slurm.root / "logs" / "9200"
    folder.mkdir(parents=True)
    for r in range(16):
        node = f"gpu-node-0{r // 4 + 1}"
        (folder / f"{node}-rank{r}.log").write_text(RANK_OOM if r == 6 else PLAIN_TIMEOUT)
    (folder / "notes.txt").write_text("not a rank file")
    (slurm.root / "slurm-9200.out").write_text("srun: error: gpu-node-02: task 6: Exited with exit code 1\n")
    job(slurm, "9200")
    out = _json("--job", "9200")
    assert out["root"] == "cuda-oom"
    assert out["initiating"]["rank"] == 6 and out["initiating"]["host"] == "gpu-node-02"
    assert out["initiating"]["file"] == str(folder / "gpu-node-02-rank6.log")
    evidence = out["findings"][0]["evidence"][0]
    assert evidence["file"] == str(folder / "gpu-node-02-rank6.log") and evidence["rank"] == 6
    timeouts_ = next(f for f in out["findings"] if f["entry"] == "nccl-timeout")
    assert len(timeouts_["ranks"]) >= 10 and timeouts_["role"] == "collateral"
    assert any("missing-%t.log: no file matches" in n for n in out["notes"]), out["notes"]
    assert not any("notes.txt" in e.get("file", "") for f in out["findings"] for e in f["evidence"])


FAILURE_TABLE = """\
E0401 03:12:09.433000 140231 torch/distributed/elastic/multiprocessing/api.py:869] failed (exitcode: 1) local_rank: 3 (pid: 51203) of binary: /opt/conda/bin/python
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
============================================================
train.py FAILED
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2024-04-01_03:12:09
  host      : gpu-node-02.cluster.example
  rank      : 11 (local_rank: 3)
  exitcode  : 1 (pid: 51203)
  error_file: {error_file}
  traceback : To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html
============================================================
"""


def test_torchruns_error_file_and_log_dir_are_read_with_the_rank_its_failure_table_gives(slurm):
    run_dir = slurm.root / "tl" / "none_x1y2"
    rank_dir = run_dir / "attempt_1" / "3"
    rank_dir.mkdir(parents=True)
    (run_dir / "attempt_0" / "3").mkdir(parents=True)
    error_file = rank_dir / "error.json"
    error_file.write_text(json.dumps({"message": {
        "message": "RuntimeError: CUDA error: an illegal memory access was encountered",
        "extraInfo": {"py_callstack": "Traceback (most recent call last):\n  File \"train.py\", line 9\n"
                                      "RuntimeError: CUDA error: an illegal memory access was encountered\n",
                      "timestamp": "1711940000"}}}))
    (rank_dir / "stderr.log").write_text("[W401 03:12:08.1 init.cpp:9] Warning: something benign\n")
    (run_dir / "attempt_0" / "3" / "stderr.log").write_text("an earlier attempt\n")
    out_log = f"I0401 02:00:01.1 api.py:1] log directory set to: {run_dir}\n" + timeouts(range(8)) \
        + FAILURE_TABLE.format(error_file=error_file)
    (slurm.root / "slurm-9300.out").write_text(out_log)
    job(slurm, "9300")
    out = _json("--job", "9300")
    assert out["root"] == "cuda-illegal-address"
    assert out["initiating"] == {"rank": 11, "host": "gpu-node-02", "line": 1, "file": str(error_file)}
    files = {e.get("file") for f in out["findings"] for e in f["evidence"]}
    assert str(error_file) in files
    collected = asyncio.run(collect(Settings.from_env(), "9300"))
    try:
        names = [name for _, name in collected.parts]
        assert str(rank_dir / "stderr.log") in names and str(run_dir / "attempt_0" / "3" / "stderr.log") not in names
        assert collected.origins[str(rank_dir / "stderr.log")].rank == 11
    finally:
        collected.folder.cleanup()


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


@pytest.mark.parametrize("prefix", [False, True], ids=["local", "through the ssh prefix"])
def test_a_log_path_that_is_a_folder_is_refused_with_its_reason_and_the_rest_is_read(slurm, monkeypatch, prefix):
    if prefix:
        monkeypatch.setenv("TRAINMEDIC_SLURM_COMMAND_PREFIX", f"{FAKES / 'fake-ssh'} login01")
    (slurm.root / "err-9400").mkdir()
    os.mkfifo(slurm.root / "pipe-9400")
    (slurm.root / "slurm-9400.out").write_text(
        "slurmstepd: error: *** JOB 9400 ON gpu-node-01 CANCELLED AT 2024-04-01T03:59:51 DUE TO TIME LIMIT ***\n")
    slurm.add("9400", [record("9400", "TIMEOUT", StdOut=str(slurm.root / "slurm-%j.out"), StdErr=str(slurm.root / "err-%j")),
                       record("9400_1", "TIMEOUT", StdOut=str(slurm.root / "pipe-9400"))], steps("9400", "TIMEOUT"))
    before = _open_fds()
    for _ in range(20):
        asyncio.run(collect(Settings.from_env(), "9400")).folder.cleanup()
    assert _open_fds() <= before + 1  # nothing left open by twenty refusals (asyncio may keep one)
    proc = run_cli("diagnose", "--format", "json", "--no-record", "--job", "9400")
    assert proc.returncode == 0 and proc.stderr == b""
    out = json.loads(proc.stdout)
    assert out["root"] == "slurm-time-limit"  # the readable log and the accounting still count
    assert f"{slurm.root / 'err-9400'}: is a folder, not a regular file, not read" in out["notes"]
    assert f"{slurm.root / 'pipe-9400'}: is a named pipe, not a regular file, not read" in out["notes"]
    assert any(e.get("file") == str(slurm.root / "slurm-9400.out") for e in out["findings"][0]["evidence"])


def test_the_job_budget_caps_the_files_read_and_says_so(slurm, monkeypatch):
    monkeypatch.setenv("TRAINMEDIC_SLURM_RANK_LOGS", "logs/%j/rank%t.log")
    monkeypatch.setenv("TRAINMEDIC_SLURM_MAX_FILES", "5")
    folder = slurm.root / "logs" / "9500"
    folder.mkdir(parents=True)
    for r in range(12):
        (folder / f"rank{r}.log").write_text(PLAIN_TIMEOUT)
    job(slurm, "9500")
    collected = asyncio.run(collect(Settings.from_env(), "9500"))
    try:
        assert len([n for _, n in collected.parts if n.startswith(str(folder))]) == 4  # StdOut took one of five
        assert any(n.startswith("8 more log file(s) not read (TRAINMEDIC_SLURM_MAX_FILES=5)") for n in collected.notes)
    finally:
        collected.folder.cleanup()


def test_kernel_logs_through_the_login_node_and_an_ssh_to_each_node(slurm, nodes, monkeypatch):
    """Two remote shells in a row (login node, then the node): the arguments survive both."""
    monkeypatch.setenv("TRAINMEDIC_SLURM_COMMAND_PREFIX", f"{FAKES / 'fake-ssh'} login01")
    (slurm.root / "slurm-9600.out").write_text(timeouts(range(8)))
    job(slurm, "9600")
    out = _json("--job", "9600")
    assert out["root"] == "gpu-xid" and out["initiating"]["host"] == "gpu-node-03"
    assert ["journalctl", "-q", "--no-pager", "-o", "short-iso", "_TRANSPORT=kernel", "--since=2024-04-01 02:22:40",
            "--until=2024-04-01 03:27:40", "@gpu-node-03"] in slurm.invocations()


def test_the_slack_reply_names_where_it_started_and_the_host_to_drain(slurm, nodes, tmp_path, kb):
    from slackbot import running_bot

    from bot.sources.workers import ScanPool

    (slurm.root / "slurm-9700.out").write_text(timeouts(range(16)))
    job(slurm, "9700")
    scans = ScanPool(workers=1)

    async def scenario():
        async with running_bot(tmp_path, kb, scans, slurm_log_roots=(slurm.root,), node_timeout=3.0,
                               node_command=(str(FAKES / "fake-node-ssh"), "{node}")) as bot:
            await bot.command("9700")
            [reply] = await bot.fake.wait_for("chat.update")  # the diagnosis takes the place of "Diagnosing job..."
            text = str(reply.params["blocks"])
            assert "Started at host gpu-node-03, line 1 of &lt;kernel log of gpu-node-03&gt; (Xid 79 at 03:12:04)" in text
            assert "then 16 ranks: nccl-timeout" in text and "scontrol update nodename=gpu-node-03 state=drain" in text
            assert "kernel logs: 4 of 4 node(s) read" in text

    try:
        asyncio.run(scenario())
    finally:
        scans.close()
