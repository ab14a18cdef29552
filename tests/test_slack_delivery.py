"""Delivery under Slack's bad days, on the real HTTP endpoint with FakeSlack: outages, 503 and 429,
a post whose answer times out, permanent errors, pacing, replayed and malformed requests, and a
database locked by another process while Slack waits for its ack."""
import asyncio
import json
import logging
import subprocess
import sys
import time

import pytest
from slack_fake import FakeSlack
from slackbot import CHANNEL, command_body, event_body, message, running_bot

from bot.sources.workers import ScanPool

OOM = ("[rank3]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 3.82 GiB. GPU 3 has a total "
       "capacity of 79.15 GiB of which 1.71 GiB is free.")


def run(coro):
    return asyncio.run(coro)


def pastes(n: int, channel: str = CHANNEL, first: int = 0) -> list[tuple[dict, str]]:
    return [(message(OOM, ts=f"1700000200.{i:06d}", channel=channel), f"Ev{channel}{i}") for i in range(first, first + n)]


async def until(predicate, timeout: float = 60.0, what: str = "") -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.05)


def one_reply_each(fake: FakeSlack, events: list[tuple[dict, str]]) -> None:
    keys = fake.reply_keys()
    for _, event_id in events:
        assert keys.count(f"event:{event_id}#1") == 1, (event_id, keys)
    assert len(keys) == len(set(keys)), keys


def test_replies_wait_out_an_outage_and_arrive_once(tmp_path, kb, scans):
    events = pastes(5)

    async def scenario():
        async with running_bot(tmp_path, kb, scans) as bot:
            await bot.fake.go_down()  # nothing listens on Slack's port
            for event, event_id in events:
                assert (await bot.event(event, event_id)).status == 200  # stored and acked all the same
            await asyncio.sleep(4)
            assert bot.fake.posted() == []
            await bot.fake.come_up()
            await until(lambda: len(bot.fake.posted()) >= 5, what="5 replies after the outage")
            await asyncio.sleep(1.5)
            one_reply_each(bot.fake, events)
            assert not any("failed" in m["text"] for m in bot.fake.posted())

    run(scenario())


@pytest.mark.parametrize("status", [503, 429])
def test_a_long_run_of_503_or_429_delays_replies_but_loses_none(tmp_path, kb, scans, status):
    events = pastes(3)

    async def scenario():
        async with running_bot(tmp_path, kb, scans) as bot:
            bot.fake.outage, bot.fake.retry_after = status, 2
            for event, event_id in events:
                await bot.event(event, event_id)
            await until(lambda: len(bot.fake.called("chat.postMessage")) >= 1, what="a try during the outage")
            await asyncio.sleep(5)  # more than three tries' worth: the old client gave up there
            assert bot.fake.posted() == []
            bot.fake.outage, cleared = None, time.monotonic()
            await until(lambda: len(bot.fake.posted()) >= 3, what="replies after it")
            await asyncio.sleep(1.5)
            one_reply_each(bot.fake, events)
            if status == 429:  # Retry-After honoured: no try came sooner than 2 s after a 429 in the channel
                tries = [c.at for c in bot.fake.called("chat.postMessage") if c.at < cleared]
                assert len(tries) >= 3 and all(b - a >= 1.9 for a, b in zip(tries, tries[1:])), tries

    run(scenario())


def test_a_post_whose_answer_times_out_is_found_and_not_doubled(tmp_path, kb, scans, caplog):
    caplog.set_level(logging.INFO, "trainmedic")

    async def scenario():
        async with running_bot(tmp_path, kb, scans, slack_timeout=1.0) as bot:
            bot.fake.slow["chat.postMessage"] = [3.0]  # Slack keeps the message but answers too late
            await bot.event(message(OOM), "EvSLOW")
            await until(lambda: len(bot.fake.called("conversations.replies")) >= 1, what="the lookup")
            await asyncio.sleep(3)
            assert len(bot.fake.posted()) == 1 and len(bot.fake.called("chat.postMessage")) == 1
            assert bot.fake.called("conversations.replies")[0].params["include_all_metadata"] in ("1", "true", True)
            [reply] = bot.fake.posted()
            row = await bot.deps.history.call("show", 1)
            assert row["reply"] == "delivered" and row["thread_ts"] == reply["thread_ts"]
            assert (await bot.kept_message(1))["ts"] == reply["ts"]  # its buttons work

    run(scenario())
    assert any("already in Slack" in r.getMessage() for r in caplog.records)


def test_a_permanent_error_is_visible_in_app_home_and_incidents_show(tmp_path, kb, scans):
    async def scenario():
        async with running_bot(tmp_path, kb, scans) as bot:
            bot.fake.channel_errors["C0GONE"] = "channel_not_found"
            await bot.event(message(OOM, channel="C0GONE"), "EvGONE")
            await until(lambda: bot.fake.called("chat.postMessage"), what="the try")
            await asyncio.sleep(1.0)
            assert len(bot.fake.called("chat.postMessage")) == 1  # not retried, and no "failed" message after it
            await bot.event({"type": "app_home_opened", "user": "U1", "channel": "D1", "tab": "home"}, "EvHOME")
            [home] = await bot.fake.wait_for("views.publish")
            text = json.dumps(home.params["view"])
            assert "could not be delivered" in text and "channel_not_found" in text and "C0GONE" in text

    run(scenario())
    shown = subprocess.run([sys.executable, "-m", "bot.cli", "incidents", "show", "1"], capture_output=True,
                           env={**__import__("os").environ, "TRAINMEDIC_DB": str(tmp_path / "incidents.db")})
    out = shown.stdout.decode()
    assert shown.returncode == 0 and "reply: could not be delivered" in out and "channel_not_found" in out


def test_posts_are_paced_per_channel_and_other_channels_keep_flowing(tmp_path, kb, scans):
    busy, quiet = pastes(4, "C0BUSY"), pastes(1, "C0QUIET")

    async def scenario():
        async with running_bot(tmp_path, kb, scans) as bot:
            for event, event_id in busy + quiet:
                await bot.event(event, event_id)
            await until(lambda: len(bot.fake.posted()) >= 5, what="5 replies")
            at = {c.params["channel"]: [] for c in bot.fake.called("chat.postMessage")}
            for c in bot.fake.called("chat.postMessage"):
                at[c.params["channel"]].append(c.at)
            gaps = [b - a for a, b in zip(at["C0BUSY"], at["C0BUSY"][1:])]
            assert min(gaps) >= 0.9, gaps  # about one a second in a channel
            assert at["C0QUIET"][0] < at["C0BUSY"][-1]  # not queued behind the busy channel
            one_reply_each(bot.fake, busy + quiet)

    run(scenario())


def test_a_replayed_slash_command_gives_one_diagnosis(tmp_path, kb, scans):
    async def scenario():
        async with running_bot(tmp_path, kb, scans) as bot:
            body = command_body(bot.fake, OOM + "\n" + OOM, trigger_id="trig.replayed")
            answers = [await bot.post(body, "application/x-www-form-urlencoded") for _ in range(10)]
            assert [r.status for r in answers] == [200] * 10
            await bot.fake.wait_for("chat.postMessage")
            await asyncio.sleep(1.5)
            assert len(bot.fake.posted()) == 1
            assert len(await bot.deps.history.call("list")) == 1

    run(scenario())


@pytest.mark.parametrize("timestamp, status", [("abc", 400), ("1700000000.5", 400), ("", 401), (None, 401)])
def test_malformed_signature_headers_get_a_4xx_and_one_line_without_the_body(tmp_path, kb, scans, caplog,
                                                                             timestamp, status):
    caplog.set_level(logging.DEBUG)
    secret_line = "password=hunter2-in-the-pasted-log"

    async def scenario():
        async with running_bot(tmp_path, kb, scans) as bot:
            body = event_body(message(f"{OOM}\n{secret_line}"), "EvMALFORMED")
            headers = {"Content-Type": "application/json", "X-Slack-Signature": "v0=" + "0" * 64}
            if timestamp is not None:
                headers["X-Slack-Request-Timestamp"] = timestamp
            async with bot.http.post(bot.url + "/slack/events", data=body, headers=headers) as resp:
                assert resp.status == status
            await bot.quiet(seconds=0.5)

    run(scenario())
    refused = [r.getMessage() for r in caplog.records if "refused" in r.getMessage()]
    assert len(refused) == 1 and len(refused[0]) < 120
    assert not any("hunter2" in r.getMessage() for r in caplog.records)


def test_an_oversized_body_gets_413_without_a_traceback(tmp_path, kb, scans, caplog):
    async def scenario():
        async with running_bot(tmp_path, kb, scans, max_request_bytes=64 << 10) as bot:
            body = event_body(message("x" * (100 << 10)), "EvHUGE")
            resp = await bot.post(body, "application/json")
            assert resp.status == 413
            assert (await bot.event(message(OOM), "EvSMALL")).status == 200  # and it still serves

    run(scenario())
    assert not any(r.exc_info for r in caplog.records)


def test_an_event_no_listener_handles_is_acked_and_finished(tmp_path, kb, scans, caplog):
    async def scenario():
        async with running_bot(tmp_path, kb, scans) as bot:
            resp = await bot.event({"type": "reaction_added", "user": "U1", "reaction": "eyes",
                                    "item": {"type": "message", "channel": CHANNEL, "ts": "1.1"}}, "EvREACT")
            assert resp.status == 200
            for _ in range(40):
                row = await bot.deps.history.call("get_delivery", "event:EvREACT")
                if row["state"] == "done":
                    break
                await asyncio.sleep(0.05)
            assert row["state"] == "done"

    run(scenario())
    assert not any("Unhandled request" in r.getMessage() for r in caplog.records)


def test_a_transient_listener_failure_is_retried_and_the_user_gets_the_diagnosis(tmp_path, kb, scans):
    async def scenario():
        async with running_bot(tmp_path, kb, scans) as bot:
            bot.fake.thread = [{"ts": "1700000000.000001", "user": "U1", "text": OOM}]
            bot.fake.fail["conversations.replies"] = [500, 500, 500]  # more than the client's own retries
            await bot.event({"type": "app_mention", "channel": CHANNEL, "user": "U2", "text": "<@UBOT> what broke?",
                             "ts": "1700000000.000003", "thread_ts": "1700000000.000001"}, "EvMENTION")
            [reply] = await bot.fake.wait_for("chat.postMessage")
            assert "cuda-oom" in str(reply.params["blocks"]) and "failed" not in reply.params["text"]

    run(scenario())


HOLD_LOCK = """
import sqlite3, sys, time
conn = sqlite3.connect(sys.argv[1], isolation_level=None)
conn.execute("BEGIN IMMEDIATE")
print("locked", flush=True)
time.sleep(float(sys.argv[2]))
conn.execute("COMMIT")
"""


@pytest.mark.parametrize("hold, expect", [(0.5, 200), (6.0, 503)])
def test_the_ack_comes_within_slacks_3_s_while_another_process_holds_the_write_lock(tmp_path, kb, scans, hold, expect):
    async def scenario():
        async with running_bot(tmp_path, kb, scans) as bot:
            locker = subprocess.Popen([sys.executable, "-c", HOLD_LOCK, str(tmp_path / "incidents.db"), str(hold)],
                                      stdout=subprocess.PIPE)
            assert locker.stdout.readline() == b"locked\n"
            started = time.monotonic()
            resp = await bot.event(message(OOM), "EvLOCKED")
            took = time.monotonic() - started
            assert took < 3.0 and resp.status == expect, (took, resp.status)
            await asyncio.to_thread(locker.wait)
            if expect == 503:  # Slack retries what got a 503; now it is stored
                resp = await bot.event(message(OOM), "EvLOCKED", **{"X-Slack-Retry-Num": "1"})
                assert resp.status == 200
            await bot.fake.wait_for("chat.postMessage")
            await asyncio.sleep(1.0)
            assert bot.fake.reply_keys() == ["event:EvLOCKED#1"]

    run(scenario())


def test_a_killed_scan_worker_is_replaced_and_the_event_still_answered(tmp_path, kb):
    import os
    import signal

    pool = ScanPool(workers=1)

    async def scenario():
        await pool.text("warm-up")
        for pid in list(pool._pool._processes):  # the OOM killer takes the worker
            os.kill(pid, signal.SIGKILL)
        async with running_bot(tmp_path, kb, pool) as bot:
            await bot.event(message(OOM), "EvOOMKILLED")
            [reply] = await bot.fake.wait_for("chat.postMessage", timeout=60)
            assert "cuda-oom" in str(reply.params["blocks"])

    try:
        run(scenario())
    finally:
        pool.close()
