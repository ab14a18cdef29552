"""App Home lists each distinct unknown failure once, with how often it happened (real Bolt app
over HTTP on 127.0.0.1, FakeSlack, the real history)."""
import asyncio

from conftest import GOES_ON
from slackbot import USER, running_bot

from bot.engine.diagnose import Diagnoser


def test_app_home_shows_one_row_per_distinct_unknown_with_its_count(tmp_path, kb, scans):
    diagnoser = Diagnoser(kb, engine_name="re2")
    # no traceback, and the log goes on after the exception: no entry is named
    logs = [f"loading shards\nShardError: shard {n} on node{n} bad\n{GOES_ON}" for n in (3, 17, 412)]
    logs.append(f"loading shards\nManifestError: missing index\n{GOES_ON}")

    async def scenario():
        async with running_bot(tmp_path, kb, scans) as bot:
            for log in logs:
                await bot.deps.history.call("record", diagnoser.diagnose_text(log), source="cli")
            await bot.event({"type": "app_home_opened", "user": USER, "tab": "home"}, event_id="EvHome")
            [publish] = await bot.fake.wait_for("views.publish")
            return publish.params["view"]

    view = asyncio.run(scenario())
    [section] = [b["text"]["text"] for b in view["blocks"] if "Unknown failures" in b.get("text", {}).get("text", "")]
    rows = section.split("\n")[1:]
    assert len(rows) == 2
    assert "×1" in rows[0] and "ManifestError: missing index" in rows[0]
    assert "×3" in rows[1] and "ShardError: shard &lt;n&gt; on node&lt;n&gt; bad" in rows[1]
