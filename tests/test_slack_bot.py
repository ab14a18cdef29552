"""The Slack bot end to end: signed requests over HTTP on 127.0.0.1 into Bolt's aiohttp app, the
Web API played by FakeSlack. Listeners, the worker pool and the history are the real ones."""
import asyncio
import gzip
import time

import pytest
from conftest import GOES_ON
from slack_fake import BOT_TOKEN
from slackbot import CHANNEL, USER, message, running_bot, signed_headers

OOM_PASTE = """```
[rank0]: {'loss': 1.3021, 'grad_norm': 0.4411, 'learning_rate': 1.9e-05, 'epoch': 0.24}
[rank3]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 3.82 GiB. GPU 3 has a total capacity of 79.15 GiB of which 1.71 GiB is free. Including non-PyTorch memory, this process has 77.43 GiB memory in use.
[rank0]:[E1010 06:49:17.596585 ProcessGroupNCCL.cpp:616] [Rank 0] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=88231, OpType=ALLREDUCE, NumelIn=262144, NumelOut=262144, Timeout(ms)=600000) ran for 600021 milliseconds before timing out.
```"""


def run(coro):
    return asyncio.run(coro)


def _text_of(call) -> str:
    return call.params.get("text", "") + str(call.params.get("blocks", ""))


def test_a_pasted_log_gets_one_reply_in_its_thread(tmp_path, kb, scans):
    async def scenario():
        async with running_bot(tmp_path, kb, scans) as bot:
            resp = await bot.event(message(OOM_PASTE, ts="1700000100.000100"))
            assert resp.status == 200
            [reply] = await bot.fake.wait_for("chat.postMessage")
            assert reply.token == BOT_TOKEN
            assert reply.params["channel"] == CHANNEL and reply.params["thread_ts"] == "1700000100.000100"
            assert "CUDA" in reply.params["text"]  # fallback text always present
            blocks = reply.params["blocks"]
            assert blocks[0]["text"]["text"].startswith("```[rank3]: torch.OutOfMemoryError") and len(blocks) <= 50
            assert all(len(b.get("text", {}).get("text", "")) <= 3000 for b in blocks)
            text = _text_of(reply)
            assert "cuda-oom" in text and "rank 3" in text and "nccl-timeout" in text
            actions = [b for b in blocks if b["type"] == "actions"][0]["elements"]
            assert [a["text"]["text"] for a in actions] == ["Resolved", "Wrong diagnosis", "Show full entry"]
            await bot.quiet("chat.update", 0.3)
            assert len(bot.fake.called("chat.postMessage")) == 1

    run(scenario())


def test_a_retried_or_redelivered_event_gets_no_second_reply(tmp_path, kb, scans):
    async def scenario():
        async with running_bot(tmp_path, kb, scans) as bot:
            await bot.event(message(OOM_PASTE), event_id="EvRETRY")
            await bot.fake.wait_for("chat.postMessage")
            resp = await bot.event(message(OOM_PASTE), event_id="EvRETRY",
                                   **{"X-Slack-Retry-Num": "1", "X-Slack-Retry-Reason": "http_timeout"})
            assert resp.status == 200
            await asyncio.sleep(1.0)
            assert len(bot.fake.called("chat.postMessage")) == 1
        async with running_bot(tmp_path, kb, scans) as restarted:  # same database: a restart remembers
            await restarted.event(message(OOM_PASTE), event_id="EvRETRY")
            await restarted.quiet()

    run(scenario())


@pytest.mark.parametrize("forge", ["bad-signature", "stale-timestamp", "no-signature"])
def test_forged_or_stale_requests_are_refused_and_nothing_is_posted(tmp_path, kb, scans, forge):
    async def scenario():
        async with running_bot(tmp_path, kb, scans) as bot:
            from slackbot import event_body

            body = event_body(message(OOM_PASTE), "EvFORGED")
            headers = {"Content-Type": "application/json"}
            if forge == "bad-signature":
                headers |= signed_headers(body, secret="not-the-secret")
            elif forge == "stale-timestamp":
                headers |= signed_headers(body, timestamp=int(time.time()) - 3600)
            async with bot.http.post(bot.url + "/slack/events", data=body, headers=headers) as resp:
                assert resp.status == 401
            await bot.quiet()

    run(scenario())


def test_chatter_gets_silence_and_bots_are_ignored(tmp_path, kb, scans):
    async def scenario():
        async with running_bot(tmp_path, kb, scans) as bot:
            await bot.event(message("anyone up for lunch? the training run looks fine today"), event_id="Ev1")
            await bot.event(message(OOM_PASTE, user="UBOT", bot_id="BBOT"), event_id="Ev2")  # ourselves
            await bot.event(message(OOM_PASTE, bot_id="BOTHER", user="U0OTHERBOT"), event_id="Ev3")  # another bot
            await bot.event({**message(OOM_PASTE), "subtype": "message_changed"}, event_id="Ev4")  # an edit
            await bot.quiet()

    run(scenario())


def test_a_direct_message_is_always_answered(tmp_path, kb, scans):
    async def scenario():
        async with running_bot(tmp_path, kb, scans) as bot:
            await bot.event(message("warmup done\nWeirdLibError: flux capacitor\n" + GOES_ON, channel_type="im"))
            [reply] = await bot.fake.wait_for("chat.postMessage")
            assert "No known failure" in _text_of(reply) and "WeirdLibError" in _text_of(reply)

    run(scenario())


def test_a_mention_diagnoses_the_thread(tmp_path, kb, scans):
    async def scenario():
        async with running_bot(tmp_path, kb, scans) as bot:
            bot.fake.thread = [
                {"ts": "1700000000.000001", "user": "U1", "text": "job 4812345 died overnight"},
                {"ts": "1700000000.000002", "user": "U1",
                 "text": "slurmstepd: error: Detected 1 oom-kill event(s) in StepId=4812345.batch. Some of your processes may have been killed by the cgroup out-of-memory handler."},
                {"ts": "1700000000.000003", "user": "U2", "text": "<@UBOT> what happened?"},
            ]
            await bot.event({"type": "app_mention", "channel": CHANNEL, "user": "U2", "text": "<@UBOT> what happened?",
                             "ts": "1700000000.000003", "thread_ts": "1700000000.000001"})
            [reply] = await bot.fake.wait_for("chat.postMessage")
            assert bot.fake.called("conversations.replies")[0].params["ts"] == "1700000000.000001"
            assert reply.params["thread_ts"] == "1700000000.000001"
            assert "slurm-cgroup-oom" in _text_of(reply)

    run(scenario())


def test_a_gz_upload_is_downloaded_with_the_token_and_answered(tmp_path, kb, scans):
    log = ("[rank0]: iteration 10/ 100 | loss 2.0 |\n" * 2000 + OOM_PASTE.strip("`") + "\n").encode()
    async def scenario():
        async with running_bot(tmp_path, kb, scans) as bot:
            meta = bot.fake.add_file("F1", "rank3.log.gz", gzip.compress(log), filetype="gzip")
            await bot.event(message("rank 3 died", subtype="file_share", files=[{"id": "F1", "name": meta["name"]}]))
            [reply] = await bot.fake.wait_for("chat.postMessage")
            assert bot.fake.called("files.info")[0].params["file"] == "F1"
            [download] = bot.fake.called("download")
            assert download.token == BOT_TOKEN
            assert reply.params["thread_ts"] == "1700000100.000100"
            assert "cuda-oom" in _text_of(reply) and "rank3.log.gz" not in reply.params["text"]

    run(scenario())


def test_several_files_in_one_message_are_one_job_with_one_reply(tmp_path, kb, scans):
    async def scenario():
        async with running_bot(tmp_path, kb, scans) as bot:
            a = bot.fake.add_file("FA", "rank0.log", b"[rank0]: iteration 10/ 100 | loss 2.0 |\n")
            b = bot.fake.add_file("FB", "rank3.log", OOM_PASTE.strip("`").encode())
            await bot.event(message("", subtype="file_share", files=[a, b]))
            [reply] = await bot.fake.wait_for("chat.postMessage")
            assert len(bot.fake.called("download")) == 2
            assert "rank3.log" in _text_of(reply)
            await bot.quiet("chat.update", 0.5)

    run(scenario())


@pytest.mark.parametrize("kind, expect", [
    ("login-page", "login page"),
    ("binary", "not a text log"),
    ("gzip-bomb", "cap"),
])
def test_bad_files_get_a_clear_reply(tmp_path, kb, scans, kind, expect):
    async def scenario():
        async with running_bot(tmp_path, kb, scans, max_log_bytes=4 << 20) as bot:
            if kind == "login-page":
                meta = bot.fake.add_file("FL", "train.log", b"whatever")
                meta["url_private_download"] = f"{bot.fake.url}/login/FL"
            elif kind == "binary":
                meta = bot.fake.add_file("FB", "model.log", b"\x7fELF\x02\x01\x01" + bytes(range(256)) * 64)
            else:
                bomb = gzip.compress(b"\n" * (64 << 20))  # 64 MB of text in ~64 KB
                meta = bot.fake.add_file("FG", "huge.log.gz", bomb)
            await bot.event(message("", subtype="file_share", files=[meta]))
            [reply] = await bot.fake.wait_for("chat.postMessage")
            assert expect in _text_of(reply), _text_of(reply)

    run(scenario())


@pytest.mark.parametrize("honour_range", [True, False])
def test_a_huge_plain_log_is_read_as_head_and_tail(tmp_path, kb, scans, honour_range):
    body = b"".join(b"[rank0]: iteration %d/ 100000 | loss 2.0 |\n" % i for i in range(60_000))
    log = body + OOM_PASTE.strip("`").encode() + b"\n"
    async def scenario():
        async with running_bot(tmp_path, kb, scans, max_download_bytes=1 << 20) as bot:
            bot.fake.honour_range = honour_range
            meta = bot.fake.add_file("FH", "big.out", log)
            await bot.event(message("", subtype="file_share", files=[meta]))
            [reply] = await bot.fake.wait_for("chat.postMessage")
            ranges = [c.params["range"] for c in bot.fake.called("download")]
            assert ranges == ["bytes=0-524287", "bytes=-524288"]
            assert "cuda-oom" in _text_of(reply)  # the failure at the very end was read
            assert "first and last" in _text_of(reply)

    run(scenario())


def test_rate_limited_then_success_gives_one_reply(tmp_path, kb, scans):
    async def scenario():
        async with running_bot(tmp_path, kb, scans) as bot:
            bot.fake.fail["chat.postMessage"] = [429, 500]
            started = time.monotonic()
            await bot.event(message(OOM_PASTE))
            await bot.fake.wait_for("chat.postMessage", count=3)
            assert time.monotonic() - started >= 1.0  # Retry-After: 1 was honoured
            await asyncio.sleep(0.5)
            assert len(bot.fake.called("chat.postMessage")) == 3  # 429, 500, then the one reply

    run(scenario())


def test_no_broadcast_mention_comes_out_of_a_log(tmp_path, kb, scans):
    paste = OOM_PASTE.replace("Including", "<!channel> @here <@U0BOSS> Including")
    async def scenario():
        async with running_bot(tmp_path, kb, scans) as bot:
            await bot.event(message(paste))
            [reply] = await bot.fake.wait_for("chat.postMessage")
            text = _text_of(reply)
            assert "<!channel>" not in text and "@here" not in text and "<@U0BOSS>" not in text

    run(scenario())


# Each evidence line is up to 400 characters, and every <, & and > in it becomes an entity of 4-5 in
# Slack: too long for blocks.
LONG_REPORT = "\n".join(f"[rank{r}]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate {r}.00 GiB. "
                        + "<&>" * 130 for r in range(8))


def test_a_long_report_goes_as_a_file_in_the_thread(tmp_path, kb, scans):
    async def scenario():
        async with running_bot(tmp_path, kb, scans) as bot:
            await bot.event(message(LONG_REPORT))
            await bot.fake.wait_for("files.completeUploadExternal")
            [upload] = bot.fake.uploads.values()
            assert b"cuda-oom" in upload
            complete = bot.fake.called("files.completeUploadExternal")[0].params
            assert complete["thread_ts"] == "1700000100.000100"

    run(scenario())


def test_buttons_resolve_and_wrong_diagnosis_edit_the_reply(tmp_path, kb, scans):
    async def scenario():
        async with running_bot(tmp_path, kb, scans) as bot:
            await bot.event(message(OOM_PASTE))
            [reply] = await bot.fake.wait_for("chat.postMessage")
            buttons = {a["action_id"]: a for b in reply.params["blocks"] if b["type"] == "actions" for a in b["elements"]}
            incident = buttons["incident_resolve"]["value"]
            base = {"user": {"id": USER}, "channel": {"id": CHANNEL}, "trigger_id": "trig.2", "team": {"id": "T1"},
                    "container": {"type": "message", "message_ts": "x"}, "api_app_id": "A1", "token": "legacy"}

            resp = await bot.interaction({**base, "type": "block_actions", "actions": [buttons["incident_resolve"]]})
            assert resp.status == 200
            [opened] = await bot.fake.wait_for("views.open")
            assert opened.params["view"]["private_metadata"] == incident
            view = {**opened.params["view"], "id": "V1",
                    "state": {"values": {"note": {"value": {"type": "plain_text_input", "value": "micro-batch 4 -> 2"}}}}}
            await bot.interaction({**base, "type": "view_submission", "view": view})
            [update] = await bot.fake.wait_for("chat.update")
            assert update.params["ts"] == "1700000000.000001"
            assert "Resolved" in str(update.params["blocks"]) and "micro-batch 4 -&gt; 2" in str(update.params["blocks"])

            await bot.interaction({**base, "type": "block_actions", "actions": [buttons["incident_wrong"]]})
            opened = (await bot.fake.wait_for("views.open", 2))[1]
            options = opened.params["view"]["blocks"][0]["element"]["options"]
            assert len(options) <= 100 and {"gpu-ecc", "unknown"} <= {o["value"] for o in options}
            view = {**opened.params["view"], "id": "V2", "state": {"values": {
                "entry": {"value": {"type": "static_select", "selected_option": {"value": "gpu-ecc"}}},
                "note": {"value": {"type": "plain_text_input", "value": None}}}}}
            await bot.interaction({**base, "type": "view_submission", "view": view})
            update = (await bot.fake.wait_for("chat.update", 2))[1]
            assert "gpu-ecc" in str(update.params["blocks"])
            row = await bot.deps.history.call("get_row", int(incident))
            assert row["status"] == "wrong" and row["corrected_entry"] == "gpu-ecc"

            await bot.interaction({**base, "type": "block_actions", "actions": [buttons["entry_show"]]})
            shown = (await bot.fake.wait_for("views.open", 3))[2]
            assert "CUDA" in str(shown.params["view"]["blocks"]) and len(shown.params["view"]["blocks"]) <= 100

    run(scenario())


def test_app_home_is_published(tmp_path, kb, scans):
    async def scenario():
        async with running_bot(tmp_path, kb, scans) as bot:
            await bot.event(message(OOM_PASTE), event_id="EvA")
            await bot.fake.wait_for("chat.postMessage")
            await bot.event({"type": "app_home_opened", "user": USER, "channel": "D1", "tab": "home"}, event_id="EvB")
            [published] = await bot.fake.wait_for("views.publish")
            assert published.params["user_id"] == USER
            home = str(published.params["view"]["blocks"])
            assert "cuda-oom" in home and "█" in home and "Flaky hosts" in home

    run(scenario())


def test_slash_command_help_entry_and_search(tmp_path, kb, scans):
    async def scenario():
        async with running_bot(tmp_path, kb, scans) as bot:
            started = time.monotonic()
            resp = await bot.command("help")
            assert resp.status == 200 and time.monotonic() - started < 3
            await bot.command("entry gpu-xid")
            await bot.command("search fallen bus")
            await bot.command("frobnicate the cluster")
            responses = await bot.fake.wait_for("response_url", 4)
            texts = sorted(str(r.params) for r in responses)
            assert any("Usage" in t and "I don't understand" not in t for t in texts)
            assert any("GPU" in t and "Xid" in t for t in texts)
            assert any("`gpu-xid`" in t for t in texts)
            assert any("I don't understand" in t for t in texts)

    run(scenario())


def test_text_pasted_after_the_command_is_diagnosed(tmp_path, kb, scans):
    async def scenario():
        async with running_bot(tmp_path, kb, scans) as bot:
            await bot.command(OOM_PASTE)
            [reply] = await bot.fake.wait_for("chat.postMessage")
            assert reply.params["channel"] == CHANNEL and "thread_ts" not in reply.params
            assert "cuda-oom" in _text_of(reply)

    run(scenario())


def test_a_permanent_listener_error_becomes_a_message_with_an_error_id(tmp_path, kb, scans, caplog):
    async def scenario():
        async with running_bot(tmp_path, kb, scans) as bot:
            bot.fake.method_errors["conversations.replies"] = "thread_not_found"  # no retry can mend that
            await bot.event({"type": "app_mention", "channel": CHANNEL, "user": "U2", "text": "<@UBOT> help",
                             "ts": "1700000000.000003"})
            [reply] = await bot.fake.wait_for("chat.postMessage")
            text = reply.params["text"]
            error_id = text.split("error id `")[1].split("`")[0]
            assert len(error_id) == 8 and "thread_not_found" in text and "Nothing was lost" not in text
            assert len(bot.fake.called("conversations.replies")) == 1
            return error_id

    error_id = run(scenario())
    assert any(error_id in r.getMessage() for r in caplog.records)


def test_slash_command_history(tmp_path, kb, scans):
    async def scenario():
        async with running_bot(tmp_path, kb, scans) as bot:
            await bot.event(message(OOM_PASTE))
            await bot.fake.wait_for("chat.postMessage")
            await bot.command("history")
            await bot.command("history cuda-oom")
            await bot.command("history gpu-node-99")
            responses = [str(r.params) for r in await bot.fake.wait_for("response_url", 3)]
            assert sum("cuda-oom" in r for r in responses) == 2
            assert any("gpu-node-99" in r and "none" in r for r in responses)

    run(scenario())


def test_a_binary_among_several_files_is_skipped_and_the_rest_diagnosed(tmp_path, kb, scans):
    async def scenario():
        async with running_bot(tmp_path, kb, scans) as bot:
            good = bot.fake.add_file("FG", "rank3.log", OOM_PASTE.strip("`").encode())
            binary = bot.fake.add_file("FX", "core.log", b"\x7fELF\x02\x01\x01" + bytes(range(256)) * 16)
            await bot.event(message("", subtype="file_share", files=[binary, good]))
            [reply] = await bot.fake.wait_for("chat.postMessage")
            text = _text_of(reply)
            assert "cuda-oom" in text and "core.log" in text and "not a text log" in text

    run(scenario())
