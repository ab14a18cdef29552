"""No secret leaves through the Slack path: the posted replies, the uploaded report, the history
file and its WAL, and the bot's own log. Bolt on 127.0.0.1 receiving signed events, FakeSlack for
the Web API, the real scan pool and history (tests/slackbot.py)."""
import asyncio
import gzip
import logging

from secret_corpus import SEED, LeakFinder, placements
from slackbot import message, running_bot

from bot.engine.redact import MASK


def _posted(bot) -> str:
    """Everything the bot sent to Slack: message texts and blocks, edits, views, file contents."""
    calls = "\n".join(str(c.params) for c in bot.fake.calls)
    return calls + "\n".join(u.decode("utf-8", "replace") for u in bot.fake.uploads.values())


def _stored(path) -> bytes:
    wal = path.with_name(path.name + "-wal")
    return path.read_bytes() + (wal.read_bytes() if wal.exists() else b"")


def test_pasted_uploaded_and_attached_secrets_never_reach_slack_the_history_or_the_log(tmp_path, kb, scans, caplog):
    caplog.set_level(logging.DEBUG, logger="trainmedic")
    caplog.set_level(logging.INFO)
    by_format: dict[str, list] = {}
    for p in placements():
        by_format.setdefault(p.format, []).append(p)
    chosen = [ps[i % len(ps)] for i, ps in enumerate(by_format.values())]  # each format, the contexts in turn
    pasted, uploaded = chosen[::2], chosen[1::2]
    # a report too long for blocks, attached as a file: long CUDA OOM lines that carry a secret each
    # (the secret sits where the evidence window's right edge may cut it)
    # (a split secret's second line alone holds only a fragment that nothing can tell from a word:
    # the split context is tested whole, in the pasted and uploaded logs)
    whole = [p for p in uploaded if p.context != "split"][:8]
    attached = [f"[rank{r}]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate {r}.00 GiB. "
                + "<tensor>" * 30 + " " + p.lines[-1] + " <tensor>" * 100 for r, p in enumerate(whole)]
    finder = LeakFinder(set().union(*(p.pieces for p in chosen)))

    async def scenario():
        async with running_bot(tmp_path, kb, scans) as bot:
            for i, p in enumerate(pasted):  # direct messages: answered whether or not a known failure is found
                await bot.event(message("```\n" + p.text + "```", ts=f"1700000100.{i:06d}", channel_type="im",
                                        channel=f"D0{i:06d}"),  # each DM its own channel, as Slack has them
                                event_id=f"EvP{i}")
            log = "".join(p.text for p in uploaded).encode()
            meta = bot.fake.add_file("FZ", "ranks.log.gz", gzip.compress(log), filetype="gzip")
            await bot.event(message("all ranks", ts="1700000200.000001", subtype="file_share",
                                    files=[{"id": "FZ", "name": meta["name"]}]), event_id="EvU")
            await bot.event(message("\n".join(attached), ts="1700000300.000001"), event_id="EvL")
            await bot.fake.wait_for("chat.postMessage", len(pasted) + 2, timeout=120)
            await bot.fake.wait_for("files.completeUploadExternal")
            await bot.event({"type": "app_home_opened", "user": "U0ONCALL", "tab": "home"}, event_id="EvH")
            await bot.fake.wait_for("views.publish")
            await asyncio.sleep(0.2)
            return _posted(bot)

    posted = asyncio.run(scenario())
    assert posted.count(MASK) >= len(pasted)  # every pasted secret was shown, masked
    assert not finder.find(posted), f"seed {SEED}"
    assert "cuda-oom" in posted
    assert not finder.find(_stored(tmp_path / "incidents.db"))
    logged = "\n".join(r.getMessage() + (r.exc_text or "") for r in caplog.records)
    assert not finder.find(logged)
