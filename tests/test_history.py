"""The incident history on a real SQLite file: migrations, repeats, comebacks, flaky hosts, concurrency."""
import os
import signal
import sqlite3
import subprocess
import sys
import textwrap

import pytest
from conftest import entry_yaml, write_entries

from bot.engine.diagnose import Diagnoser
from bot.history.schema import migrations
from bot.history.store import History
from bot.kb.load import load


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    folder = tmp_path_factory.mktemp("kb")
    write_entries(
        folder,
        entry_yaml("gpu-xid", r"NVRM: Xid \(PCI:[\w:.]+\): (?P<xid>\d+)"),
        entry_yaml("cuda-oom", r"CUDA out of memory\. Tried to allocate"),
    )
    return Diagnoser(load([folder]), engine_name="re2")


def oom(d, rank=3, size="3.82 GiB"):
    return d.diagnose_text(f"[rank{rank}]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate {size}. GPU {rank}\n")


def xid(d, host):
    return d.diagnose_text(f"Oct 10 06:41:02 {host} kernel: NVRM: Xid (PCI:0000:c3:00): 79, pid=51203, name=python\n")


def test_migrations_apply_once_and_rerun_as_noop(tmp_path):
    path = tmp_path / "h.db"
    History(path).close()
    first = [m.name for m in migrations.applied(History(path).db)]
    History(path).close()
    again = History(path)
    assert [m.name for m in migrations.applied(again.db)] == first
    assert {"incidents", "evidence", "incident_hosts", "feedback"} <= set(again.db.table_names())
    assert again.db.execute("pragma journal_mode").fetchone()[0] == "wal"


def test_the_same_failure_twice_is_linked_and_a_different_one_is_not(tmp_path, tiny):
    h = History(tmp_path / "h.db")
    first = h.record(oom(tiny, rank=3, size="3.82 GiB"), source="cli", job="100")
    second = h.record(oom(tiny, rank=5, size="1.20 GiB"), source="cli", job="101")
    other = h.record(xid(tiny, "node7"), source="cli")
    assert first["count"] == 1 and first["previous"] == []
    assert second["count"] == 2 and second["signature"] == first["signature"]
    assert [p["id"] for p in second["previous"]] == [first["id"]]
    assert "job 100" in second["previous"][0]["where"]
    assert other["count"] == 1 and other["signature"] != first["signature"]


def test_a_resolved_failure_that_comes_back_is_flagged(tmp_path, tiny):
    h = History(tmp_path / "h.db")
    first = h.record(oom(tiny), source="cli")
    h.resolve(first["id"], "lowered micro-batch to 2", user="U123")
    again = h.record(oom(tiny), source="cli")
    assert again["came_back"] is True
    assert again["last_resolution"]["note"] == "lowered micro-batch to 2"
    assert h.show(first["id"])["feedback"][0]["kind"] == "resolved"


def test_hardware_incidents_on_one_host_name_it_flaky_with_a_drain_command(tmp_path, tiny):
    h = History(tmp_path / "h.db")
    assert h.record(xid(tiny, "node7"), source="cli")["flaky_hosts"] == []
    h.record(oom(tiny), source="cli")  # not hardware: does not count
    h.record(xid(tiny, "node9"), source="cli")
    second = h.record(xid(tiny, "node7"), source="cli")
    assert [f["host"] for f in second["flaky_hosts"]] == ["node7"]
    assert second["flaky_hosts"][0]["drain"].startswith('scontrol update nodename=node7 state=drain reason="')
    stats = h.stats(7)
    assert {r["host"]: r["incidents"] for r in stats["by_host"]} == {"node7": 2, "node9": 1}
    assert {r["entry"]: r["incidents"] for r in stats["by_entry"]} == {"gpu-xid": 3, "cuda-oom": 1}


def test_wrong_diagnosis_feedback_becomes_an_example(tmp_path, tiny):
    h = History(tmp_path / "h.db")
    inc = h.record(oom(tiny), source="cli")
    h.mark_wrong(inc["id"], "gpu-ecc", user="U9", note="ECC on that GPU")
    [example] = h.feedback_examples()
    assert example["right_entry"] == "gpu-ecc" and example["diagnosed"] == "cuda-oom"
    assert "CUDA out of memory" in example["log"]
    assert h.get_row(inc["id"])["status"] == "wrong"


def test_unknown_failures_are_kept_with_their_likely_lines(tmp_path, tiny):
    h = History(tmp_path / "h.db")
    inc = h.record(tiny.diagnose_text("Traceback (most recent call last):\nWeirdError: flux\n"), source="cli")
    assert inc["signature"].startswith("unknown:")
    shown = h.show(inc["id"])
    assert shown["entry"] is None and shown["evidence"][0]["text"] == "WeirdError: flux"
    assert h.list(entry="unknown")[0]["id"] == inc["id"]


def test_secrets_are_not_stored(tmp_path, tiny):
    h = History(tmp_path / "h.db")
    d = tiny.diagnose_text("CUDA out of memory. Tried to allocate 2 GiB; HF_TOKEN=hf_abcdefghijklmnopqrstuvwxyz0123\n")
    h.record(d, source="cli")
    dump = "\n".join(h.db.iterdump())
    assert "hf_abcdefghij" not in dump


def test_search_list_and_purge(tmp_path, tiny):
    h = History(tmp_path / "h.db")
    old = h.record(oom(tiny), source="cli", job="77", at="2020-01-01T00:00:00+00:00")
    new = h.record(xid(tiny, "node7"), source="cli", job="78")
    assert [r["id"] for r in h.search("Xid node7")] == [new["id"]]
    assert [r["id"] for r in h.list(days=7)] == [new["id"]]
    assert [r["id"] for r in h.list(host="node7")] == [new["id"]]
    assert h.purge(older_than_days=30) == 1
    assert [r["id"] for r in h.list()] == [new["id"]]
    assert h.db.execute("select count(*) from evidence where incident = ?", [old["id"]]).fetchone()[0] == 0


WRITER = textwrap.dedent("""
    import sys
    sys.path.insert(0, {tests!r})
    from conftest import entry_yaml, write_entries
    from pathlib import Path
    from bot.engine.diagnose import Diagnoser
    from bot.history.store import History
    from bot.kb.load import load
    d = Diagnoser(load([Path({kb!r})]), engine_name="re2")
    h = History({db!r})
    for i in range({n}):
        h.record(d.diagnose_text(f"[rank{{i}}]: CUDA out of memory. Tried to allocate {{i}} MiB\\n"), source="w{{0}}".format(sys.argv[1]))
        print(i, flush=True)
""")


def _writer(tmp_path, tiny_folder, n):
    code = WRITER.format(tests=os.path.dirname(__file__), kb=str(tiny_folder), db=str(tmp_path / "h.db"), n=n)
    return lambda tag: subprocess.Popen([sys.executable, "-c", code, tag], stdout=subprocess.PIPE, stderr=subprocess.PIPE)


@pytest.fixture
def tiny_folder(tmp_path):
    return write_entries(tmp_path / "kb", entry_yaml("cuda-oom", r"CUDA out of memory\. Tried to allocate"))


def test_two_processes_writing_at_once_lose_nothing(tmp_path, tiny_folder):
    start = _writer(tmp_path, tiny_folder, 60)
    procs = [start("a"), start("b")]
    for p in procs:
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0, err.decode()
    h = History(tmp_path / "h.db")
    assert h.db.execute("select count(*) from incidents").fetchone()[0] == 120
    assert h.db.execute("select count(*) from evidence").fetchone()[0] == 120
    assert h.db.execute("select source, count(*) from incidents group by source").fetchall() == [("wa", 60), ("wb", 60)]


def test_kill_9_during_writes_leaves_an_intact_database(tmp_path, tiny_folder):
    proc = _writer(tmp_path, tiny_folder, 100_000)("k")
    for _ in range(30):  # let it get well into its writes
        proc.stdout.readline()
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    conn = sqlite3.connect(tmp_path / "h.db")
    assert conn.execute("pragma integrity_check").fetchone()[0] == "ok"
    incidents = conn.execute("select count(*) from incidents").fetchone()[0]
    assert incidents >= 30
    # every committed incident has its evidence: nothing half-written
    assert conn.execute("select count(*) from incidents where id not in (select incident from evidence)").fetchone()[0] == 0
    reopened = History(tmp_path / "h.db")  # and it takes writes again
    with reopened.write() as db:
        db["feedback"].insert({"incident": 1, "at": "now", "kind": "resolved", "note": "after the crash"})
    assert reopened.db.execute("select count(*) from feedback").fetchone()[0] == 1


def test_an_older_schema_is_migrated_after_a_backup_and_keeps_its_data(tmp_path, tiny):
    import sqlite_utils

    path = tmp_path / "old.db"
    db = sqlite_utils.Database(path)
    migrations.apply(db, stop_before="m003_delivery")  # the schema as the second release left it
    db["incidents"].insert({"at": "2026-11-01T00:00:00+00:00", "entry": "cuda-oom", "signature": "cuda-oom:x",
                            "status": "open", "source": "cli"})
    db["slack_events"].insert({"event_id": "Ev1", "at": "2026-11-01T00:00:00+00:00"})
    db.close()
    h = History(path)
    assert {"deliveries", "outbox", "slack_messages"} <= set(h.db.table_names())
    assert "slack_events" not in h.db.table_names()
    assert h.get_row(1)["entry"] == "cuda-oom"
    assert h.intake("event:Ev1", "event", "http", "{}") == "finished"  # answered before the upgrade: a duplicate
    assert h.intake("event:Ev2", "event", "http", "{}") == "new"
    backup = sqlite_utils.Database(tmp_path / "old.db.before-m003_delivery.bak")
    assert backup["slack_events"].count == 1 and backup["incidents"].count == 1  # the file as it was
    assert [r[0] for r in backup.execute("pragma integrity_check")] == ["ok"]


def test_a_new_file_is_not_backed_up(tmp_path):
    History(tmp_path / "new.db").close()
    assert not list(tmp_path.glob("*.bak"))


def test_an_incident_and_its_reply_are_one_write_and_a_retry_records_nothing_twice(tmp_path, tiny):
    h = History(tmp_path / "h.db")

    def reply(incident):
        return [{"key": "event:Ev1#1", "kind": "post", "channel": "C1", "thread_ts": "1.1", "incident": incident["id"],
                 "payload": {"text": f"incident {incident['id']}", "blocks": []}}]

    first = h.record(oom(tiny), source="slack-paste", channel="C1", reply_key="event:Ev1#1", replies=reply)
    again = h.record(oom(tiny), source="slack-paste", channel="C1", reply_key="event:Ev1#1", replies=reply)
    assert again["id"] == first["id"] and h.db["incidents"].count == 1
    [row] = h.outbox_pending()
    assert row["incident"] == first["id"] and row["payload"]["text"] == f"incident {first['id']}"

    def broken(incident):
        raise RuntimeError("rendering failed")

    with pytest.raises(RuntimeError):
        h.record(oom(tiny), source="slack-paste", reply_key="event:Ev2#1", replies=broken)
    assert h.db["incidents"].count == 1  # no incident without its reply


def test_a_delivery_is_claimed_retried_released_and_finished(tmp_path):
    h = History(tmp_path / "h.db")
    assert h.intake("event:Ev1", "event", "http", '{"x": 1}') == "new"
    [row] = h.claim_deliveries(4)
    assert row["attempts"] == 1 and h.claim_deliveries(4) == []  # working: nobody else takes it
    assert h.intake("event:Ev1", "event", "http", '{"x": 1}') == "pending"  # Slack's retry is acked, not redone
    h.retry_delivery("event:Ev1", 3600, "Slack answered 503")
    assert h.claim_deliveries(4) == []  # backing off
    assert h.intake("event:Ev1", "event", "http", '{"x": 1}') == "pending"  # a retry from Slack makes it due now
    [row] = h.claim_deliveries(4)
    assert row["attempts"] == 2
    assert h.release_working() == 1  # what a dead bot was doing is due again
    [row] = h.claim_deliveries(4)
    h.finish_delivery("event:Ev1", "done")
    done = h.db["deliveries"].get("event:Ev1")
    assert done["state"] == "done" and done["body"] is None  # a pasted log is not kept once answered
    assert h.intake("event:Ev1", "event", "http", '{"x": 1}') == "finished"


@pytest.mark.parametrize("version, affected", [
    ((3, 40, 1), True), ((3, 44, 5), True), ((3, 44, 6), False), ((3, 45, 0), True), ((3, 50, 6), True),
    ((3, 50, 7), False), ((3, 51, 2), True), ((3, 51, 3), False), ((3, 52, 0), False),
])
def test_the_wal_reset_bug_versions(version, affected):
    from bot.history.schema import has_wal_reset_bug

    assert has_wal_reset_bug(version) is affected


def test_while_a_bot_serves_a_file_another_writer_follows_the_wal_reset_rule(tmp_path, tiny):
    from bot.history.schema import has_wal_reset_bug
    from bot.history.store import lock_for_serving

    path = tmp_path / "h.db"
    lock = lock_for_serving(path)
    with pytest.raises(sqlite3.OperationalError, match="another `trainmedic serve`"):
        lock_for_serving(path, wait=0.2)  # one bot per file
    cli = History(path)
    if has_wal_reset_bug():
        with pytest.raises(sqlite3.OperationalError, match="WAL-reset bug"):
            cli.record(oom(tiny), source="cli")
    else:
        cli.record(oom(tiny), source="cli")
    assert cli.list() is not None  # reading is always allowed
    lock.close()
    cli.record(oom(tiny), source="cli")  # the bot is gone: the CLI writes again
    assert cli.db["incidents"].count == (1 if has_wal_reset_bug() else 2)


def test_repeats_link_to_the_earlier_slack_thread(tmp_path, tiny):
    h = History(tmp_path / "h.db")
    first = h.record(oom(tiny), source="slack-paste", channel="C1", thread_ts="1700000000.000100")
    again = h.record(oom(tiny), source="cli")
    assert again["previous"][0]["where"] == "https://slack.com/archives/C1/p1700000000000100"
    h.enqueue([{"key": "command:t1#1", "kind": "post", "channel": "C2", "incident": first["id"],
                "payload": {"text": "text", "blocks": []}}])
    [row] = h.outbox_pending()
    h.outbox_sent(row["id"], "1700000000.000200")  # posted in the channel: it starts the thread
    assert h.get_row(first["id"])["thread_ts"] == "1700000000.000200"
    assert h.message_for(first["id"])["ts"] == "1700000000.000200"


def test_the_bot_commits_durably_and_reports_its_storage_settings(tmp_path):
    bot = History(tmp_path / "h.db", serves=True)
    cli = History(tmp_path / "h.db")
    s = bot.storage()
    assert s["journal_mode"] == "wal" and s["synchronous"] == "FULL" and s["busy_timeout_ms"] == 10000
    assert s["sqlite"] == sqlite3.sqlite_version
    assert cli.storage()["synchronous"] == "NORMAL"
