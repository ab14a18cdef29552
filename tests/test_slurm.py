"""Slurm jobs as a log source, through fake `scontrol`/`sacct` executables first on PATH."""
import asyncio
import json
import os
import time
from pathlib import Path

import pytest
from conftest import FAKES, run_cli

from bot.config import Settings
from bot.sources.slurm import JobError, collect, expand, parse_jobid

OOM_LOG = """\
[rank0]: iteration    41000/  500000 | lm loss: 1.912E+00 |
[rank0]: saving checkpoint at iteration    40000 to /ckpt/gpt/step_40000
[rank0]: iteration    41200/  500000 | lm loss: 1.905E+00 |
slurmstepd: error: Detected 1 oom-kill event(s) in StepId=8812345.0. Some of your processes may have been killed by the cgroup out-of-memory handler.
srun: error: gpu-a100-17: task 5: Out Of Memory
"""
TIMEOUT_LOG = """\
[rank0]: iteration    23900/  500000 | lm loss: 2.113E+00 |
[rank0]: saving checkpoint at iteration   24000 to /ckpt/gpt/step_24000
[rank0]: iteration    24100/  500000 | lm loss: 2.108E+00 |
slurmstepd: error: *** JOB 8812400 ON gpu-b07 CANCELLED AT 2024-04-01T03:59:51 DUE TO TIME LIMIT ***
"""


def record(jobid, state, **extra):
    return {"JobId": jobid, "JobName": "gpt-train", "UserId": "alice(1001)", "JobState": state,
            "Reason": "None", "ExitCode": "0:0", "RunTime": "1-00:00:00", "TimeLimit": "1-00:00:00",
            "NodeList": "gpu-a100-17", "BatchHost": "gpu-a100-17", **extra}


def steps(jobid, state, maxrss="74659840K", reqmem="64G", exit_code="0:125"):
    return [{"JobID": jobid, "JobName": "gpt-train", "User": "alice", "State": state, "ExitCode": exit_code,
             "NodeList": "gpu-a100-17", "Elapsed": "1-00:00:00", "Timelimit": "1-00:00:00", "ReqMem": reqmem,
             "MaxRSS": "", "MaxRSSNode": "", "WorkDir": "/work"},
            {"JobID": f"{jobid}.0", "JobName": "python", "User": "", "State": state, "ExitCode": exit_code,
             "NodeList": "gpu-a100-17", "Elapsed": "1-00:00:00", "Timelimit": "", "ReqMem": reqmem,
             "MaxRSS": maxrss, "MaxRSSNode": "gpu-a100-17", "WorkDir": "/work"}]


def _json(*args):
    proc = run_cli("diagnose", "--format", "json", "--no-record", *args)
    assert proc.returncode == 0, proc.stderr.decode()
    return json.loads(proc.stdout)


def test_out_of_memory_job_gets_mem_advice_above_maxrss(slurm):
    (slurm.root / "gpt-train-8812345.out").write_text(OOM_LOG)
    slurm.add("8812345", [record("8812345", "OUT_OF_MEMORY", Reason="OutOfMemory", ExitCode="0:125",
                                 WorkDir=str(slurm.root), StdOut=str(slurm.root / "%x-%j.out"),
                                 StdErr=str(slurm.root / "%x-%j.out"))], steps("8812345", "OUT_OF_MEMORY"))
    out = _json("--job", "8812345")
    assert out["root"] == "slurm-cgroup-oom"
    assert out["findings"][0]["verify"].startswith("sacct -j 8812345 ")
    notes = "\n".join(out["notes"])
    assert "MaxRSS 71.2G (step 8812345.0) vs ReqMem 64G -> resubmit with --mem=88G" in notes
    assert "OUT_OF_MEMORY" in notes and "gpu-a100-17" in notes
    assert out["progress"] == {"iteration": 41200, "checkpoint": "/ckpt/gpt/step_40000"}
    assert [e["file"] for e in out["findings"][0]["evidence"]][0] == str(slurm.root / "gpt-train-8812345.out")


def test_timeout_job_gets_time_advice_with_the_last_checkpoint(slurm):
    (slurm.root / "slurm-8812400.out").write_text(TIMEOUT_LOG)
    slurm.add("8812400", [record("8812400", "TIMEOUT", WorkDir=str(slurm.root), StdOut="slurm-%j.out")],
              steps("8812400", "TIMEOUT", maxrss="1000K", exit_code="0:15"))
    out = _json("--job", "8812400")
    assert out["root"] == "slurm-time-limit"
    assert any("ran 1-00:00:00 of a 1-00:00:00 limit -> --time=1-12:00:00" in n and "/ckpt/gpt/step_24000" in n
               for n in out["notes"]), out["notes"]


def test_a_job_slurm_forgot_is_read_through_sacct(slurm):
    (slurm.root / "slurm-7001.out").write_text(OOM_LOG)
    rows = steps("7001", "OUT_OF_MEMORY")
    rows[0]["WorkDir"] = rows[1]["WorkDir"] = str(slurm.root)
    slurm.add("7001", sacct=rows)
    out = _json("--job", "7001")
    assert out["root"] == "slurm-cgroup-oom"
    assert any(e.get("file", "").endswith("slurm-7001.out") for e in out["findings"][0]["evidence"])
    assert ["scontrol", "show", "job", "-o", "7001"] in slurm.invocations()


@pytest.mark.parametrize("state, entry", [("OUT_OF_MEMORY", "slurm-cgroup-oom"), ("TIMEOUT", "slurm-time-limit"),
                                          ("NODE_FAIL", "slurm-node-fail"), ("PREEMPTED", "slurm-preempted"),
                                          ("CANCELLED by 1001", "job-cancelled")])
def test_a_job_whose_log_is_gone_is_diagnosed_from_accounting(slurm, state, entry):
    slurm.add("7100", sacct=steps("7100", state))
    out = _json("--job", "7100")
    assert out["root"] == entry
    assert any("no job log could be read" in n for n in out["notes"])


HOSTILE = ["1;id", "$(id)", "`id`", "1 2", "1\n2", "../1", "1/../../etc/passwd", "１２３", "٣", "-1", "+1", "1_",
           "1__2", "1.", "1.batch.0", "1.foo", "0x10", "1e5", "", " ", "1 ", " 1", "1\x00", "1|id", "1&&id",
           "1>x", "--help", "-j", "1,2", "1*", "9" * 13, "1" * 10_000, "1;rm -rf /", "'1'", '"1"', "1\t"]


@pytest.mark.parametrize("jobid", HOSTILE, ids=[repr(h)[:20] for h in HOSTILE])
def test_hostile_job_ids_are_refused_before_any_process_starts(slurm, jobid):
    assert parse_jobid(jobid) is None
    with pytest.raises(JobError, match="not a Slurm job id"):
        asyncio.run(collect(Settings.from_env(), jobid))
    assert slurm.invocations() == []


def test_the_cli_refuses_a_hostile_id_with_one_line(slurm):
    proc = run_cli("diagnose", "--job", "1;id")
    assert proc.returncode == 2 and proc.stderr.count(b"\n") == 1 and b"not a Slurm job id" in proc.stderr
    assert slurm.invocations() == []


@pytest.mark.parametrize("valid", ["123", "123_4", "123+1", "123.0", "123.batch", "123.extern", "123_4.batch"])
def test_slurm_id_forms_are_accepted(valid):
    assert parse_jobid(valid) == valid


def test_logs_outside_the_roots_or_behind_symlinks_are_not_read(slurm, tmp_path):
    secret = tmp_path / "outside" / "secret.out"
    secret.parent.mkdir()
    secret.write_text("slurmstepd: error: *** JOB 1 ON x CANCELLED AT 2024-01-01T00:00:00 DUE TO TIME LIMIT ***\n")
    (slurm.root / "link.out").symlink_to(secret)
    slurm.add("7200", [record("7200", "FAILED", StdOut=str(secret), StdErr=str(slurm.root / "link.out"))])
    collected = asyncio.run(collect(Settings.from_env(), "7200"))
    try:
        assert [name for _, name in collected.parts] == ["<slurm accounting of 7200>"]
        assert sum("outside TRAINMEDIC_SLURM_LOG_ROOTS" in n for n in collected.notes) == 2
    finally:
        collected.folder.cleanup()
    assert _json("--job", "7200")["root"] != "slurm-time-limit"


def test_a_fifo_in_the_root_is_refused(slurm):
    os.mkfifo(slurm.root / "pipe.out")
    slurm.add("7300", [record("7300", "FAILED", StdOut=str(slurm.root / "pipe.out"))])
    collected = asyncio.run(collect(Settings.from_env(), "7300"))
    collected.folder.cleanup()
    assert any("not a regular file" in n for n in collected.notes)


def test_only_the_tail_of_a_big_log_is_read(slurm, monkeypatch):
    monkeypatch.setenv("TRAINMEDIC_SLURM_TAIL_MB", "1")
    big = slurm.root / "big.out"
    with big.open("w") as f:
        f.write("[rank0]: iteration 1/ 9 | loss 2 |\n" * 200_000)
        f.write(OOM_LOG)
    slurm.add("7400", [record("7400", "OUT_OF_MEMORY", StdOut=str(big))])
    collected = asyncio.run(collect(Settings.from_env(), "7400"))
    try:
        assert Path(collected.parts[0][0]).stat().st_size == 1 << 20
    finally:
        collected.folder.cleanup()


def _gone(pid: int) -> bool:
    status = Path(f"/proc/{pid}/status")
    # killed: gone, or a zombie nobody has reaped yet
    return not status.exists() or "State:\tZ" in status.read_text()


def test_a_hanging_scontrol_ends_at_the_timeout_with_its_children_and_sacct_answers(slurm, monkeypatch, tmp_path):
    monkeypatch.setenv("FAKE_SLURM_HANG", "scontrol")
    monkeypatch.setenv("TRAINMEDIC_SLURM_TIMEOUT", "2")
    slurm.add("7500", sacct=steps("7500", "TIMEOUT"))
    out = _json("--job", "7500")
    assert out["root"] == "slurm-time-limit"  # from sacct's accounting
    assert "scontrol did not answer within 2 s; the job was read from sacct" in out["notes"]
    child = int((tmp_path / "child.pid").read_text())
    time.sleep(0.2)
    assert _gone(child)


def test_when_neither_scontrol_nor_sacct_answers_the_cli_says_so_in_one_line(slurm, monkeypatch):
    monkeypatch.setenv("FAKE_SLURM_HANG", "sacct")
    monkeypatch.setenv("TRAINMEDIC_SLURM_COMMAND_PREFIX", f"{FAKES / 'fake-ssh'} login01")
    monkeypatch.setenv("TRAINMEDIC_SLURM_TIMEOUT", "2")
    proc = run_cli("diagnose", "--job", "7501")  # scontrol answers that it knows no such job
    assert proc.returncode == 2 and proc.stderr.count(b"\n") == 1
    assert proc.stderr == b"Error: sacct did not answer within 2 s\n"


def test_the_command_prefix_runs_slurm_and_reads_logs_through_it(slurm, monkeypatch):
    (slurm.root / "odd name $(id).out").write_text(OOM_LOG)
    monkeypatch.setenv("TRAINMEDIC_SLURM_COMMAND_PREFIX", f"{FAKES / 'fake-ssh'} login01")
    slurm.add("7600", [record("7600", "OUT_OF_MEMORY", StdOut=str(slurm.root / "odd name $(id).out"))])
    out = _json("--job", "7600")
    assert out["root"] == "slurm-cgroup-oom"
    assert any("odd name $(id).out" in e.get("file", "") for e in out["findings"][0]["evidence"])


def test_array_task_patterns_expand():
    rec = {"JobId": "55_3", "ArrayJobId": "55", "ArrayTaskId": "3", "JobName": "sweep", "UserId": "bob(7)"}
    assert expand("/s/%u/%x-%A_%a-%4a-%%.out", rec) == "/s/bob/sweep-55_3-0003-%.out"


def test_owner_policy(slurm, monkeypatch, tmp_path):
    users = tmp_path / "users.yaml"
    users.write_text("U0ALICE: alice\nU0MALLORY: mallory\n")
    monkeypatch.setenv("TRAINMEDIC_JOB_POLICY", "owner")
    monkeypatch.setenv("TRAINMEDIC_USER_MAP", str(users))
    slurm.add("7700", [record("7700", "FAILED")])
    settings = Settings.from_env()
    with pytest.raises(JobError, match="only the owner"):
        asyncio.run(collect(settings, "7700", slack_user="U0MALLORY"))
    asyncio.run(collect(settings, "7700", slack_user="U0ALICE")).folder.cleanup()


def test_slash_command_acks_at_once_and_posts_the_job_diagnosis(slurm, tmp_path, kb, monkeypatch):
    from slackbot import CHANNEL, running_bot

    from bot.sources.workers import ScanPool

    (slurm.root / "slurm-8812345.out").write_text(OOM_LOG)
    slurm.add("8812345", [record("8812345", "OUT_OF_MEMORY", StdOut=str(slurm.root / "slurm-%j.out"))],
              steps("8812345", "OUT_OF_MEMORY"))
    scans = ScanPool(workers=1)

    async def scenario():
        async with running_bot(tmp_path, kb, scans, slurm_log_roots=(slurm.root,)) as bot:
            started = time.monotonic()
            resp = await bot.command("8812345")
            assert resp.status == 200 and time.monotonic() - started < 3
            [placeholder] = await bot.fake.wait_for("chat.postMessage")  # said at once, in the channel
            assert placeholder.params["channel"] == CHANNEL and "thread_ts" not in placeholder.params
            assert "Diagnosing job `8812345`" in placeholder.params["text"]
            [reply] = await bot.fake.wait_for("chat.update")  # the diagnosis takes its place
            assert reply.params["channel"] == CHANNEL and reply.params["ts"] == "1700000000.000001"
            text = str(reply.params["blocks"])
            assert "slurm-cgroup-oom" in text and "--mem=88G" in text and "sacct -j 8812345" in text
            await bot.command("1;id")
            [refusal] = await bot.fake.wait_for("response_url")
            assert "Usage" in str(refusal.params)

    try:
        asyncio.run(scenario())
    finally:
        scans.close()
