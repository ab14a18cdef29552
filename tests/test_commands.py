"""Commands that cannot hang the bot: the faults a broken cluster shows, through fake executables on
PATH (tests/fakes), against the CLI and the running bot."""
import asyncio
import json
import os
import signal
import time
from pathlib import Path

import pytest
from conftest import run_cli
from test_slurm import OOM_LOG, _json, record

from bot.sources.commands import CommandError, runner


def _alive(pid: int) -> bool:
    status = Path(f"/proc/{pid}/status")
    return status.exists() and "State:\tZ" not in status.read_text()


def test_a_grandchild_that_leaves_the_session_and_keeps_stdout_open_cannot_hold_the_command(slurm, monkeypatch, tmp_path):
    monkeypatch.setenv("FAKE_SLURM_SETSID", "sacct")
    monkeypatch.setenv("TRAINMEDIC_SLURM_TIMEOUT", "2")
    slurm.add("8100", [record("8100", "OUT_OF_MEMORY", StdOut=str(slurm.root / "slurm-%j.out"))])
    (slurm.root / "slurm-8100.out").write_text(OOM_LOG)
    started = time.monotonic()
    out = _json("--job", "8100")
    elapsed = time.monotonic() - started
    grandchild = int((tmp_path / "child.pid").read_text())
    try:
        assert _alive(grandchild)  # it still holds sacct's stdout: we did not wait for it
        assert elapsed < 60  # the grandchild lives 120 s
        assert out["root"] == "slurm-cgroup-oom"
        assert "sacct did not answer within 2 s; the job was read from scontrol" in out["notes"]
    finally:
        os.kill(grandchild, signal.SIGKILL)


def test_a_1_gib_sacct_answer_is_read_up_to_the_cap_and_stopped(slurm, monkeypatch, tmp_path):
    monkeypatch.setenv("FAKE_SACCT_FLOOD", str(1 << 30))
    slurm.add("8200", [record("8200", "OUT_OF_MEMORY", StdOut=str(slurm.root / "slurm-%j.out"))])
    (slurm.root / "slurm-8200.out").write_text(OOM_LOG)
    out = _json("--job", "8200")
    assert out["root"] == "slurm-cgroup-oom"
    assert "sacct's answer passed 4 MB: only its start was read" in out["notes"]
    assert not (tmp_path / "child.pid.done").exists()  # sacct was stopped, not read to its end


def test_a_command_that_cannot_start_is_one_line(slurm, monkeypatch):
    monkeypatch.setenv("TRAINMEDIC_SLURM_COMMAND_PREFIX", "no-such-ssh-binary login01")
    proc = run_cli("diagnose", "--job", "8300")
    assert proc.returncode == 2 and proc.stderr.count(b"\n") == 1
    assert b"cannot run no-such-ssh-binary: No such file or directory" in proc.stderr


def test_commands_in_flight_are_limited_per_user_and_other_users_go_first(tmp_path):
    starts = tmp_path / "starts"

    async def scenario():
        run = runner(total=8, per_user=2).run

        def argv(who: str) -> list[str]:
            return ["sh", "-c", f"echo {who} $(date +%s.%N) >> {starts}; sleep 1"]

        a = [asyncio.ensure_future(run(argv("a"), 10, 100, user="alice")) for _ in range(3)]
        await asyncio.sleep(0.3)
        b = asyncio.ensure_future(run(argv("b"), 10, 100, user="bob"))
        await asyncio.gather(*a, b)

    asyncio.run(scenario())
    order = [line.split()[0] for line in starts.read_text().splitlines()]
    assert order == ["a", "a", "b", "a"]  # alice's third waited for one of her two; bob did not wait


def test_a_command_waiting_for_a_slot_gives_up_at_its_timeout(tmp_path):
    async def scenario():
        run = runner(total=1, per_user=1).run
        busy = asyncio.ensure_future(run(["sleep", "3"], 10, 10, user="u"))
        await asyncio.sleep(0.2)
        with pytest.raises(CommandError, match="was not started: too many commands in flight for 0.5 s"):
            await run(["true"], 0.5, 10, user="v")
        await busy

    asyncio.run(scenario())


def test_ten_hanging_job_diagnoses_do_not_delay_a_pasted_log(slurm, tmp_path, kb, monkeypatch):
    """Ten users /diagnose while Slurm hangs: all ten commands run at once (no small shared thread
    pool), each answer comes at its timeout, and a log pasted meanwhile is answered first. Each
    user is in a channel of their own, so that the ten placeholders ("Diagnosing job ...") are not
    paced in front of the paste's reply (Slack takes about one message a second in a channel)."""
    from slackbot import CHANNEL, message, running_bot

    from bot.sources.workers import ScanPool

    monkeypatch.setenv("FAKE_SLURM_HANG", "sacct")
    paste = "```\n" + OOM_LOG + "```"
    scans = ScanPool(workers=1)

    def hung() -> int:
        return sum(1 for c in slurm.invocations() if c[0] == "sacct")

    async def scenario():
        await scans.text("warm-up")
        async with running_bot(tmp_path, kb, scans, slurm_log_roots=(slurm.root,), slurm_timeout=8.0) as bot:
            for i in range(10):
                await bot.command(f"{8400 + i}", channel=f"C0TEAM{i}", user=f"U0USER{i}")
            while hung() < 10 and not bot.fake.called("chat.update"):
                await asyncio.sleep(0.05)
            assert hung() == 10 and not bot.fake.called("chat.update")  # all ten in flight together
            await bot.event(message(paste, ts="1700000200.000100"))
            deadline = time.monotonic() + 30
            while not bot.fake.posted(CHANNEL) and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            [reply] = [c for c in bot.fake.called("chat.postMessage") if c.params["channel"] == CHANNEL]
            assert "slurm-cgroup-oom" in str(reply.params["blocks"])
            assert not bot.fake.called("chat.update")  # answered while every job was still hanging
            answers = await bot.fake.wait_for("chat.update", count=10)  # each job's answer edits its placeholder
            assert all("sacct did not answer within 8 s" in json.dumps(a.params) for a in answers)

    try:
        asyncio.run(scenario())
    finally:
        scans.close()
