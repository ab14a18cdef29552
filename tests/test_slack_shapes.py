"""The shapes Slack really sends, each answered once and well: signed requests over HTTP on
127.0.0.1 into Bolt's aiohttp app (and envelopes over a Socket Mode websocket), the Web API played
by FakeSlack. The payloads in tests/fixtures/slack/ follow Slack's documentation and the fixtures of
bolt-python; the README there says which."""
import asyncio
import contextlib
import copy
import gzip
import json
import logging
import time
from pathlib import Path

import pytest
from slack_fake import BOT_TOKEN, FakeSlack
from slackbot import CHANNEL, USER, eventually, message, running_bot, socket_bot
from test_slack_bot import LONG_REPORT, _text_of, run
from test_slurm import record, steps

from bot.history.store import AsyncHistory, History
from bot.slack.client import outbox_client
from bot.slack.outbox import Outbox

FIXTURES = Path(__file__).parent / "fixtures" / "slack"
OOM = ("[rank3]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 3.82 GiB. GPU 3 has a total "
       "capacity of 79.15 GiB of which 1.71 GiB is free.")
OOM_LOG = ("[rank0]: iteration 10/ 100 | loss 2.0 |\n" * 50 + OOM + "\n").encode()
KEY_ERROR = """Traceback (most recent call last):
  File "/home/alice/train.py", line 88, in <module>
    main(cfg)
  File "/home/alice/train.py", line 61, in main
    lr = cfg["optim"]["lr"]
KeyError: 'optim'"""
# Log lines no entry knows (a traceback would now be answered as a weak python-user-code-error).
UNKNOWN = ("2024-05-01 12:00:01 ERROR flux capacitor lost sync (code 88)\n"
           "2024-05-01 12:00:02 ERROR giving up on the flux capacitor")
# Shapes the bot answers nothing to: edits, deletions, other bots, joins, reactions, a canvas
# mention, a subtype and an event type nobody here knows, a button nobody registered.
IGNORED = ["message_changed", "message_deleted", "bot_message", "channel_join", "unknown_subtype", "reaction_added",
           "unknown_event", "document_mention", "block_actions_unknown"]


def shape(name: str) -> dict:
    return copy.deepcopy(json.loads((FIXTURES / f"{name}.json").read_text()))


async def send(bot, body: dict):
    if body["type"] == "event_callback":
        return await bot.post(json.dumps(body), "application/json")
    return await bot.interaction(body)


async def _incidents(bot) -> list[dict]:
    return await bot.deps.history.call("list", days=None, limit=100)


def test_a_thread_broadcast_carrying_a_log_is_diagnosed_in_its_thread(tmp_path, kb, scans):
    async def scenario():
        async with running_bot(tmp_path, kb, scans) as bot:
            assert (await send(bot, shape("thread_broadcast"))).status == 200
            [reply] = await bot.fake.wait_for("chat.postMessage")
            assert reply.params["thread_ts"] == "1700000200.000100"  # the thread, not the channel
            assert "cuda-oom" in _text_of(reply) and "rank 3" in _text_of(reply)
            assert len(await _incidents(bot)) == 1

    run(scenario())


def test_edits_deletions_bots_joins_reactions_and_unknown_shapes_are_ignored_quietly(tmp_path, kb, scans, caplog):
    async def scenario():
        async with running_bot(tmp_path, kb, scans) as bot:
            for name in IGNORED:
                await send(bot, shape(name))
            await bot.quiet("chat.postMessage")
            for method in ("chat.postEphemeral", "chat.update", "views.open", "files.info", "response_url"):
                assert bot.fake.called(method) == [], method
            assert await _incidents(bot) == []

    with caplog.at_level(logging.WARNING, logger="trainmedic"):
        run(scenario())
    assert [r.getMessage() for r in caplog.records if r.name == "trainmedic" and r.levelno >= logging.ERROR] == []


ANSWERED = 4  # of every shape, these get a message: the broadcast, the two uploads (one each), the DM


def _every_shape() -> list[tuple[str, dict]]:
    """(name, body) of every fixture, and the App Home's Messages tab being opened."""
    home = shape("unknown_event")
    home["event"] = {"type": "app_home_opened", "user": USER, "channel": "D0ONCALL", "tab": "messages",
                     "event_ts": "1700000400.000100"}
    home["event_id"] = "EvHOMEMSGS"
    return [(p.stem, shape(p.stem)) for p in sorted(FIXTURES.glob("*.json"))] + [("app_home_opened", home)]


def test_every_event_shape_is_acknowledged_over_http(tmp_path, kb, scans):
    """Slack counts anything but a 2xx as a failed delivery, retries it, and turns the app's events
    off when failures go on: every request is stored and acked, whether a listener wants it or not."""
    async def scenario():
        async with running_bot(tmp_path, kb, scans) as bot:
            bot.fake.add_file("F0RANK3", "rank3.log", OOM_LOG, filetype="text")
            bot.fake.add_file("F0CONNECT", "rank3.log", OOM_LOG, filetype="text")
            statuses = {name: (await send(bot, body)).status for name, body in _every_shape()}
            await bot.fake.wait_for("chat.postMessage", ANSWERED)  # let the answers finish before the bot stops
            assert {name: status for name, status in statuses.items() if status != 200} == {}

    run(scenario())


def test_every_event_shape_is_acknowledged_in_socket_mode(tmp_path, kb, scans):
    """The same shapes as envelopes over the socket: each acked with its envelope_id, or Slack
    sends it again (and again)."""
    async def scenario():
        async with socket_bot(tmp_path, kb, scans) as bot:
            bot.fake.add_file("F0RANK3", "rank3.log", OOM_LOG, filetype="text")
            bot.fake.add_file("F0CONNECT", "rank3.log", OOM_LOG, filetype="text")
            sent = {await bot.deliver(body): name for name, body in _every_shape()}
            command = {"token": "legacy", "team_id": "T1", "channel_id": CHANNEL, "user_id": USER, "command": "/diagnose",
                       "text": "help", "response_url": f"{bot.fake.url}/response/diagnose", "trigger_id": "trig.9"}
            sent[await bot.deliver(command, kind="slash_commands")] = "/diagnose help"
            missing = await bot.wait_acked(list(sent))
            await bot.fake.wait_for("chat.postMessage", ANSWERED)
            assert [sent[e] for e in missing] == []

    run(scenario())


def test_a_slack_connect_file_is_completed_with_files_info_before_it_is_judged(tmp_path, kb, scans):
    async def scenario():
        async with running_bot(tmp_path, kb, scans) as bot:
            bot.fake.add_file("F0CONNECT", "rank3.log", OOM_LOG, filetype="text", mimetype="text/plain")
            await send(bot, shape("file_share_slack_connect"))
            [reply] = await bot.fake.wait_for("chat.postMessage")
            assert [c.params["file"] for c in bot.fake.called("files.info")] == ["F0CONNECT"]
            assert len(bot.fake.called("download")) == 1
            assert "cuda-oom" in _text_of(reply)

    run(scenario())


@pytest.mark.parametrize("first", ["file_share_mentioning", "app_mention_with_file"])
def test_an_upload_that_mentions_the_bot_is_downloaded_answered_and_recorded_once(tmp_path, kb, scans, first):
    second = {"file_share_mentioning": "app_mention_with_file", "app_mention_with_file": "file_share_mentioning"}[first]

    async def scenario():
        async with running_bot(tmp_path, kb, scans) as bot:
            bot.fake.add_file("F0RANK3", "rank3.log", OOM_LOG, filetype="text")
            bot.fake.thread = [shape("file_share_mentioning")["event"]]  # what conversations.replies shows
            await asyncio.gather(send(bot, shape(first)), send(bot, shape(second)))
            [reply] = await bot.fake.wait_for("chat.postMessage")
            await bot.quiet("chat.update", 1.0)
            assert len(bot.fake.called("chat.postMessage")) == 1
            assert len(bot.fake.called("download")) == 1
            assert "cuda-oom" in _text_of(reply) and reply.params["thread_ts"] == "1700000320.001200"
            assert len(await _incidents(bot)) == 1

    run(scenario())


def test_a_retry_of_the_event_that_claimed_an_upload_may_still_answer_it(tmp_path):
    """The claim is the message's, held by one request: its own retry (by the delivery worker, after a
    failure or a restart) is not turned away as the other event of the same message is."""
    db = tmp_path / "incidents.db"
    history = History(db)
    for key in ("event:EvA", "event:EvB"):
        history.intake(key, "event", "http", "{}")
    held = f"{CHANNEL}:1.0"
    assert history.claim_message("event:EvA", held)
    assert not history.claim_message("event:EvB", held)
    assert history.claim_message("event:EvA", held)
    history.close()
    restarted = History(db)  # the same database, a new process
    assert restarted.claim_message("event:EvA", held)
    assert not restarted.claim_message("event:EvB", held)
    restarted.close()


def test_deleted_hidden_and_vanished_files_each_get_a_sentence_and_the_good_file_is_still_diagnosed(tmp_path, kb, scans):
    async def scenario():
        async with running_bot(tmp_path, kb, scans) as bot:
            good = bot.fake.add_file("F0GOOD", "rank3.log", OOM_LOG, filetype="text")
            bot.fake.file_errors["F0GONE"] = "file_deleted"
            bot.fake.thread = [
                {"ts": "1700000000.000001", "user": "U1", "text": "job 4812345 died, logs below",
                 "files": [{"id": "F0DELETED", "mode": "tombstone"},
                           {"id": "F0HIDDEN", "mode": "hidden_by_limit"},
                           {"id": "F0GONE", "file_access": "check_file_info"}]},
                {"ts": "1700000000.000002", "user": "U1", "text": "", "files": [good]},
                {"ts": "1700000000.000003", "user": "U2", "text": "<@UBOT> which rank?"},
            ]
            await bot.event({"type": "app_mention", "channel": CHANNEL, "user": "U2", "text": "<@UBOT> which rank?",
                             "ts": "1700000000.000003", "thread_ts": "1700000000.000001"}, event_id="EvTHREAD")
            [reply] = await bot.fake.wait_for("chat.postMessage")
            text = _text_of(reply)
            assert "cuda-oom" in text and "error id" not in text
            assert "F0DELETED) was deleted" in text
            assert "F0HIDDEN) is hidden by the free plan" in text
            assert "F0GONE) was deleted" in text
            assert "None" not in text
            assert [c.params["file"] for c in bot.fake.called("files.info")] == ["F0GONE"]  # no call for a tombstone

    run(scenario())


@pytest.mark.parametrize("where, error", [("C0ELSEWHERE", "not_in_channel"), ("D0TWOPEOPLE", "channel_not_found")])
def test_diagnose_where_the_bot_is_not_a_member_answers_through_response_url(tmp_path, kb, scans, where, error):
    async def scenario():
        async with running_bot(tmp_path, kb, scans) as bot:
            bot.fake.channel_errors[where] = error
            await bot.command(f"```\n{OOM}\n```", channel=where)
            [answer] = await bot.fake.wait_for("response_url")
            assert answer.params["response_type"] == "in_channel"
            assert "cuda-oom" in str(answer.params["blocks"])
            await bot.quiet("files.getUploadURLExternal", 0.5)
            [incident] = await _incidents(bot)
            kept = await bot.kept_message(incident["id"])
            assert kept["channel"] == where and "cuda-oom" in str(kept["blocks"])  # the reply that was delivered

    run(scenario())


def test_where_slack_refuses_an_answer_in_the_channel_it_goes_to_the_user(tmp_path, kb, scans):
    async def scenario():
        async with running_bot(tmp_path, kb, scans) as bot:
            bot.fake.channel_errors["D0TWOPEOPLE"] = "channel_not_found"
            bot.fake.refused_responses.add("in_channel")
            await bot.command(f"```\n{OOM}\n```", channel="D0TWOPEOPLE")
            first, second = await bot.fake.wait_for("response_url", 2)
            assert first.params["response_type"] == "in_channel" and second.params["response_type"] == "ephemeral"
            assert "cuda-oom" in str(second.params["blocks"])

    run(scenario())


def test_an_error_where_the_bot_is_not_a_member_is_told_through_response_url(tmp_path, kb, scans):
    async def scenario():
        async with running_bot(tmp_path, kb, scans) as bot:
            bot.fake.channel_errors["C0ELSEWHERE"] = "not_in_channel"
            bot.fake.refused_responses.update({"in_channel", "ephemeral"})  # the answer cannot be delivered at all
            await bot.command(f"```\n{OOM}\n```", channel="C0ELSEWHERE")
            in_channel, to_user, error = await bot.fake.wait_for("response_url", 3)
            assert [in_channel.params["response_type"], to_user.params["response_type"]] == ["in_channel", "ephemeral"]
            assert "error id" in error.params["text"] and error.params["response_type"] == "ephemeral"
            assert bot.fake.called("chat.postEphemeral") == []  # Slack would refuse it there too

    run(scenario())


def test_dm_chatter_gets_a_short_help_and_no_incident(tmp_path, kb, scans):
    async def scenario():
        async with running_bot(tmp_path, kb, scans) as bot:
            await send(bot, shape("dm_chatter"))
            [reply] = await bot.fake.wait_for("chat.postMessage")
            assert reply.params["channel"] == "D0ONCALL"
            assert "Paste a log" in reply.params["text"] and "/diagnose <jobid>" in reply.params["text"]
            assert "No known failure" not in _text_of(reply)
            assert await _incidents(bot) == []
            await bot.event(message(UNKNOWN, channel="D0ONCALL", channel_type="im", ts="1700000340.000100"), event_id="EvDM2")
            replies = await bot.fake.wait_for("chat.postMessage", 2)
            assert "No known failure" in _text_of(replies[1])  # a log is still diagnosed, even an unknown one
            assert len(await _incidents(bot)) == 1

    run(scenario())


def test_a_mention_in_a_thread_of_chatter_gets_help_not_an_unknown_incident(tmp_path, kb, scans):
    async def scenario():
        async with running_bot(tmp_path, kb, scans) as bot:
            bot.fake.thread = [{"ts": "1700000000.000001", "user": "U2", "text": "<@UBOT> what can you do?"}]
            await bot.event({"type": "app_mention", "channel": CHANNEL, "user": "U2", "text": "<@UBOT> what can you do?",
                             "ts": "1700000000.000001"}, event_id="EvHELLO")
            [reply] = await bot.fake.wait_for("chat.postMessage")
            assert "Paste a log" in reply.params["text"] and reply.params["thread_ts"] == "1700000000.000001"
            assert await _incidents(bot) == []

    run(scenario())


def test_command_help_unknown_and_weak_answers_go_to_the_user_only(tmp_path, kb, scans):
    async def scenario():
        async with running_bot(tmp_path, kb, scans) as bot:
            await bot.command("help")
            [help_answer] = await bot.fake.wait_for("response_url")
            assert help_answer.params["response_type"] == "ephemeral" and "Usage" in help_answer.params["text"]
            await bot.command(UNKNOWN)
            await bot.command(KEY_ERROR)
            unknown, weak = (await bot.fake.wait_for("response_url", 3))[1:]
            assert unknown.params["response_type"] == weak.params["response_type"] == "ephemeral"
            answers = sorted([str(unknown.params), str(weak.params)])
            assert any("No known failure" in a for a in answers)
            assert any("python-user-code-error" in a and "low confidence" in a for a in answers)
            await bot.command(f"```\n{OOM}\n```")  # a confident diagnosis is the channel's
            [public] = await bot.fake.wait_for("chat.postMessage")
            assert public.params["channel"] == CHANNEL and "cuda-oom" in _text_of(public)
            assert len(bot.fake.called("response_url")) == 3 and bot.fake.called("files.getUploadURLExternal") == []

    run(scenario())


def test_code_fences_glued_to_the_log_lines_are_unwrapped(tmp_path, kb, scans):
    # As Slack's composer sends a code block: the fences glued to the first and last log lines.
    paste = (f"job died again:\n```{OOM}\n[rank0]: iteration 10/ 100 | loss 2.0 |\n"
             "[rank3]: Compile with `TORCH_USE_CUDA_DSA` to enable device-side assertions.```")

    async def scenario():
        async with running_bot(tmp_path, kb, scans) as bot:
            await bot.event(message(paste))
            [reply] = await bot.fake.wait_for("chat.postMessage")
            sections = [b["text"]["text"] for b in reply.params["blocks"] if b["type"] == "section"]
            assert all(text.count("```") % 2 == 0 for text in sections), sections
            evidence = next(t for t in sections if t.startswith("*Evidence*")).split("```")[1]
            assert evidence.startswith("2 [rank 3] [rank3]: torch.OutOfMemoryError"), evidence  # no fence glued on
            assert sections[0].startswith("```[rank3]: torch.OutOfMemoryError")

    run(scenario())


def test_backticks_in_a_log_line_cannot_close_the_evidence_block(tmp_path, kb, scans):
    line = OOM + " Hint: set ```PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True``` and retry`"
    log = ("[rank0]: iteration 10/ 100 | loss 2.0 |\n" + line + "\n").encode()

    async def scenario():
        async with running_bot(tmp_path, kb, scans) as bot:
            meta = bot.fake.add_file("F0TICKS", "rank3.log", log, filetype="text")
            await bot.event(message("", subtype="file_share", files=[meta]))
            [reply] = await bot.fake.wait_for("chat.postMessage")
            sections = [b["text"]["text"] for b in reply.params["blocks"] if b["type"] == "section"]
            for text in (sections[0], next(t for t in sections if t.startswith("*Evidence*"))):
                quoted = text.split("```")
                assert len(quoted) == 3, text  # one block, opened and closed by the fences only
                assert "PYTORCH_CUDA_ALLOC_CONF" in quoted[1] and quoted[1].replace("\u2060", "").endswith("retry`")

    run(scenario())


def test_the_reply_starts_with_the_matched_line_then_the_entry(tmp_path, kb, scans):
    secret_line = OOM + " hf_token=hf_AbCdEfGhIjKlMnOpQrStUvWxYz0123"

    async def scenario():
        async with running_bot(tmp_path, kb, scans) as bot:
            await bot.event(message("[rank0]: iteration 10/ 100 | loss 2.0 |\n" + secret_line))
            [reply] = await bot.fake.wait_for("chat.postMessage")
            first = reply.params["blocks"][0]["text"]["text"]
            line, verdict = first.split("```")[1], first.split("```")[2]
            assert line.startswith("[rank3]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 3.82 GiB.")
            assert "[REDACTED]" in line and "hf_AbCd" not in str(reply.params)
            assert verdict.strip().startswith("*cuda-oom*")
            assert reply.params["text"].startswith("[rank3]: torch.OutOfMemoryError")  # the notification, too

    run(scenario())


def test_a_big_upload_gets_a_placeholder_that_becomes_the_diagnosis(tmp_path, kb, scans):
    async def scenario():
        async with running_bot(tmp_path, kb, scans) as bot:
            meta = bot.fake.add_file("F0BIG", "rank3.log.gz", gzip.compress(OOM_LOG), filetype="gzip")
            meta["size"] = 212 << 20  # what Slack says of it; the stand-in serves a small body
            await bot.event(message("", subtype="file_share", files=[meta]))
            [placeholder] = await bot.fake.wait_for("chat.postMessage")
            assert "Diagnosing `rank3.log.gz` (212 MB)" in placeholder.params["text"]
            assert placeholder.params["thread_ts"] == "1700000100.000100"
            [update] = await bot.fake.wait_for("chat.update")
            assert update.params["ts"] == "1700000000.000001" and "cuda-oom" in _text_of(update)
            assert len(bot.fake.called("chat.postMessage")) == 1
            [incident] = await _incidents(bot)
            assert (await bot.kept_message(incident["id"]))["ts"] == "1700000000.000001"

    run(scenario())


@pytest.mark.parametrize("failure, expect", [("login-page", "login page"), ("unreachable", "error id")])
def test_a_failed_big_upload_turns_its_placeholder_into_the_error(tmp_path, kb, scans, failure, expect):
    async def scenario():  # files.slack.com unreachable is retried as an outage: here for 1 s, not a day
        async with running_bot(tmp_path, kb, scans, give_up_after=1.0) as bot:
            meta = bot.fake.add_file("F0BIG", "rank3.log", OOM_LOG, filetype="text")
            meta["size"] = 300 << 20
            meta["url_private_download"] = f"{bot.fake.url}/login/F0BIG" if failure == "login-page" else \
                "http://127.0.0.1:9/files/F0BIG"  # nothing listens there
            await bot.event(message("", subtype="file_share", files=[meta]))
            [update] = await bot.fake.wait_for("chat.update")
            assert expect in update.params["text"]
            assert len(bot.fake.called("chat.postMessage")) == 1  # only the placeholder was posted

    run(scenario())


@pytest.mark.parametrize("token, said", [("xapp-1-A000-0000-revoked", "invalid_auth"),
                                         (BOT_TOKEN, "not_allowed_token_type")])
def test_a_bad_app_token_stops_socket_mode_at_once_with_one_line(tmp_path, token, said):
    from slack_fake import FakeSlack
    from test_slack_serve import _serve

    async def scenario():
        fake = await FakeSlack().start()
        try:
            proc, _ = await _serve(tmp_path, fake, "--socket-mode", SLACK_APP_TOKEN=token, SLACK_SIGNING_SECRET="")
            out, _ = await asyncio.wait_for(proc.communicate(), 60)
        finally:
            await fake.stop()
        return proc.returncode, out.decode()

    code, out = run(scenario())
    lines = [line for line in out.splitlines() if "SLACK_APP_TOKEN" in line]
    assert code == 2 and len(lines) == 1 and said in lines[0], out
    assert "Traceback" not in out and "serving on" not in out


def test_a_job_slurm_does_not_know_turns_its_placeholder_into_the_error(slurm, tmp_path, kb, scans):
    async def scenario():
        async with running_bot(tmp_path, kb, scans, slurm_log_roots=(slurm.root,)) as bot:
            await bot.command("4242")
            [placeholder] = await bot.fake.wait_for("chat.postMessage")
            assert "Diagnosing job `4242`" in placeholder.params["text"]
            [update] = await bot.fake.wait_for("chat.update")
            assert update.params["ts"] == "1700000000.000001" and "Slurm knows no job 4242" in update.params["text"]

    run(scenario())


def test_a_job_with_no_known_failure_answers_its_user_only_and_leaves_no_placeholder(slurm, tmp_path, kb, scans):
    (slurm.root / "slurm-7001.out").write_text("[rank0]: iteration 100/ 100 | loss 1.2 |\ntraining done\n")
    slurm.add("7001", [record("7001", "COMPLETED", StdOut=str(slurm.root / "slurm-%j.out"))], steps("7001", "COMPLETED"))

    async def scenario():
        async with running_bot(tmp_path, kb, scans, slurm_log_roots=(slurm.root,)) as bot:
            await bot.command("7001")
            [private] = await bot.fake.wait_for("response_url")
            assert private.params["response_type"] == "ephemeral" and "No known failure" in str(private.params)
            [deleted] = bot.fake.called("chat.delete")
            assert deleted.params["ts"] == "1700000000.000001"  # the placeholder is gone from the channel
            assert bot.fake.called("chat.update") == []

    run(scenario())


# -- a slash command's response_url: 30 minutes and 5 answers -------------------------------------

@contextlib.asynccontextmanager
async def outbox_alone(tmp_path, rows, give_up_after: float = 86400.0, age: float = 0.0):
    """The outbox posting `rows` (made by `rows(fake)`, `age` seconds old) from a real history file
    to FakeSlack; they answer one finished /diagnose delivery, `command:trig.url`."""
    fake = await FakeSlack().start()
    db = tmp_path / "incidents.db"
    history = History(db)
    history.intake("command:trig.url", "command", "http", "")
    history.finish_delivery("command:trig.url", "done")
    history.enqueue(rows(fake))
    with history.write() as conn:
        conn.execute("update outbox set created = created - ?", [age])
    history.close()
    store = AsyncHistory(db, serves=True)
    box = Outbox(store, outbox_client(BOT_TOKEN, fake.api_url, 5.0), give_up_after)
    task = asyncio.create_task(box.run())
    try:
        yield fake, store
    finally:
        await box.stop(time.monotonic())
        task.cancel()
        store.close()
        await fake.stop()


def reply_to_command(fake, n: int, expires_in: float, channel: str = CHANNEL, private: bool = False) -> dict:
    command = {"delivery": "command:trig.url", "url": f"{fake.url}/response/diagnose", "user": USER,
               "expires": time.time() + expires_in}
    payload = {"text": f"answer {n}", "command": command, **({"private": True} if private else {})}
    return {"key": f"command:trig.url#{n}", "kind": "post", "channel": channel, "payload": payload}


def test_a_private_answer_whose_response_url_has_expired_goes_by_chat_post_ephemeral(tmp_path):
    async def scenario():
        async with outbox_alone(tmp_path, lambda fake: [reply_to_command(fake, 1, -1, private=True)]) as (fake, _):
            [sent] = await fake.wait_for("chat.postEphemeral")
            assert sent.params["user"] == USER and sent.params["text"] == "answer 1"
            assert fake.called("response_url") == []

    run(scenario())


def test_a_response_url_takes_five_answers_and_the_sixth_goes_by_chat_post_ephemeral(tmp_path):
    def six(fake):  # in six channels, so that no pacing holds them up
        return [reply_to_command(fake, n, 600, channel=f"C0TEAM{n}", private=True) for n in range(1, 7)]

    async def scenario():
        async with outbox_alone(tmp_path, six) as (fake, _):
            [late] = await fake.wait_for("chat.postEphemeral")
            responded = [c.params["text"] for c in fake.called("response_url")]
            assert len(responded) == 5
            assert sorted(responded + [late.params["text"]]) == [f"answer {n}" for n in range(1, 7)]

    run(scenario())


def test_an_answer_through_response_url_is_retried_before_it_expires_and_not_given_up_while_usable(tmp_path):
    expires = time.monotonic() + 5

    def rows(fake):
        return [reply_to_command(fake, 1, 5, channel="C0ELSEWHERE")]

    async def scenario():
        # An old row: its backoff alone would wait a minute, and its age is past give_up_after.
        async with outbox_alone(tmp_path, rows, give_up_after=0.5, age=1000) as (fake, store):
            fake.channel_errors["C0ELSEWHERE"] = "not_in_channel"
            fake.fail["response_url"] = [503, 503]
            tries = await fake.wait_for("response_url", 3)
            assert [c.params["response_type"] for c in tries] == ["in_channel"] * 3
            assert all(c.at < expires for c in tries)
            await eventually(lambda: store.call("outbox_state", "command:trig.url#1"), lambda state: state == "sent",
                             "the reply's outbox row to be sent")

    run(scenario())


def test_a_long_report_where_the_bot_is_not_a_member_is_not_uploaded(tmp_path, kb, scans):
    async def scenario():
        async with running_bot(tmp_path, kb, scans) as bot:
            bot.fake.channel_errors["C0ELSEWHERE"] = "not_in_channel"
            await bot.command(LONG_REPORT, channel="C0ELSEWHERE", trigger_id="trig.long")
            [answer] = await bot.fake.wait_for("response_url")
            assert answer.params["response_type"] == "in_channel" and "cuda-oom" in str(answer.params["blocks"])
            await bot.quiet("files.getUploadURLExternal", 1.5)
            assert await bot.deps.history.call("outbox_state", "command:trig.long#1.file") == "skipped"

    run(scenario())
