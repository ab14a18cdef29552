"""The incident history on a real SQLite file: migrations, repeats, comebacks, flaky hosts, concurrency."""
import os
import random
import signal
import sqlite3
import string
import subprocess
import sys
import textwrap

import pytest
from conftest import GOES_ON, entry_yaml, write_entries

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
    rng = random.Random(7)
    token = "hf_" + "".join(rng.choice(string.ascii_letters + string.digits) for _ in range(34))
    d = tiny.diagnose_text(f"CUDA out of memory. Tried to allocate 2 GiB; HF_TOKEN={token}\n")
    h.record(d, source="cli")
    dump = "\n".join(h.db.iterdump())
    assert token[3:11] not in dump and "[REDACTED]" in dump


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


# -- signatures: repeats linked as on-call would group them (the shipped knowledge base) ------------

@pytest.fixture(scope="module")
def shipped(kb):
    return Diagnoser(kb, engine_name="re2")


def _oom(rank, host, tried, free):
    return (f"[2024-09-11 17:52:{rank:02d},320] {host}: [rank{rank}]: torch.OutOfMemoryError: CUDA out of memory. "
            f"Tried to allocate {tried}. GPU {rank} has a total capacity of 79.15 GiB of which {free} is free.\n")


def test_two_cuda_ooms_of_different_sizes_and_units_on_one_host_are_one_signature(tmp_path, shipped):
    h = History(tmp_path / "h.db")
    first = h.record(shipped.diagnose_text(_oom(3, "node12", "2.00 GiB", "310.00 MiB")), source="cli")
    second = h.record(shipped.diagnose_text(_oom(5, "node12", "512.00 MiB", "1.10 GiB")), source="cli")
    assert second["signature"] == first["signature"] and second["signature"].startswith("cuda-oom:")
    assert second["count"] == 2 and [p["id"] for p in second["previous"]] == [first["id"]]


@pytest.mark.parametrize("a, b", [
    # another rank, host, size, step, path, job
    (_oom(0, "node1", "20.00 MiB", "1.00 GiB"), _oom(7, "gpu-a100-17", "3.82 GiB", "0 bytes")),
    ("Oct 10 06:41:02 node7 kernel: NVRM: Xid (PCI:0000:c3:00): 79, pid=51203, name=python, GPU has fallen off the bus.\n",
     "Nov 02 11:03:17 node9 kernel: NVRM: Xid (PCI:0000:3b:00): 79, pid=9, name=pt_main_thread, GPU has fallen off the bus.\n"),
    ("OSError: [Errno 28] No space left on device: '/scratch/alice/run-17/ckpt/step_1000/model.pt'\n",
     "OSError: [Errno 28] No space left on device: '/scratch/bob/llama/step_9000/optim.pt'\n"),
    ("Traceback (most recent call last):\nShardError: shard 00017 of /data/ds/train-00017.arrow unreadable after 3 tries (job 8812345)\n",
     "Traceback (most recent call last):\nShardError: shard 00412 of /lustre/ds2/train-00412.arrow unreadable after 5 tries (job 99)\n"),
    ("[rank2]: KeyError: 'input_ids'\n", "[rank6]: KeyError: 'labels'\n"),
])
def test_the_same_failure_elsewhere_links_up(tmp_path, shipped, a, b):
    h = History(tmp_path / "h.db")
    first, second = h.record(shipped.diagnose_text(a), source="cli"), h.record(shipped.diagnose_text(b), source="cli")
    assert second["signature"] == first["signature"] and second["count"] == 2


@pytest.mark.parametrize("a, b", [
    # Xid 79 (gpu-xid) and Xid 48 (gpu-ecc) on one host; Xid 79 and Xid 62, both gpu-xid
    ("Oct 10 06:41:02 node7 kernel: NVRM: Xid (PCI:0000:c3:00): 79, pid=51203, name=python, GPU has fallen off the bus.\n",
     "Oct 10 06:41:02 node7 kernel: NVRM: Xid (PCI:0000:c3:00): 48, pid=51203, name=python, An uncorrectable double bit error\n"),
    ("Oct 10 06:41:02 node7 kernel: NVRM: Xid (PCI:0000:c3:00): 79, pid=51203, name=python, GPU has fallen off the bus.\n",
     "Oct 10 06:41:02 node7 kernel: NVRM: Xid (PCI:0000:c3:00): 62, pid=51203, name=python, Internal micro-controller halt\n"),
    # a full /scratch and a full /dev/shm are different fixes (disk-full links by mount point)
    ("OSError: [Errno 28] No space left on device: '/scratch/alice/ckpt/model.pt'\n",
     "OSError: [Errno 28] No space left on device: '/home/alice/.cache/huggingface/hub/tmp3x'\n"),
    ("OSError: [Errno 28] No space left on device: '/scratch/alice/ckpt/model.pt'\n",
     "OSError: [Errno 28] No space left on device: '/dev/shm/torch_17_3942'\n"),
    ("[rank2]: KeyError: 'input_ids'\n", "[rank2]: ValueError: 'input_ids' is not a valid column\n"),
    ("Traceback (most recent call last):\nShardError: shard 17 unreadable\n",
     "Traceback (most recent call last):\nManifestError: shard 17 unreadable\n"),
])
def test_a_different_failure_stays_apart(tmp_path, shipped, a, b):
    h = History(tmp_path / "h.db")
    first, second = h.record(shipped.diagnose_text(a), source="cli"), h.record(shipped.diagnose_text(b), source="cli")
    assert second["signature"] != first["signature"] and second["count"] == 1


def test_every_group_by_names_a_capture_of_its_fingerprint(kb):
    for fp in kb.fingerprints:
        for name in fp.group_by:
            assert f"(?P<{name}>" in fp.regex, (fp.entry, fp.id, name)


def test_unknown_failures_are_listed_once_per_distinct_failure_with_their_count(tmp_path, shipped):
    h = History(tmp_path / "h.db")
    for shard, host in ((17, "node1"), (412, "node2"), (9, "node3")):
        # error lines with no traceback in a log that goes on: nothing names them, not even the uncaught-exception fallback
        h.record(shipped.diagnose_text(f"loading shards\nShardError: shard {shard} on {host} bad\n{GOES_ON}"), source="cli")
    other = h.record(shipped.diagnose_text(f"loading shards\nManifestError: missing index\n{GOES_ON}"), source="cli")
    groups = h.unknown_groups()
    assert [(g["count"], g["failure"]) for g in groups] == [(1, "ManifestError: missing index"),
                                                            (3, "ShardError: shard <n> on node<n> bad")]
    assert groups[0]["id"] == other["id"] and groups[1]["first_seen"] <= groups[1]["at"]


def test_a_migration_recomputes_the_signatures_of_a_database_made_by_todays_schema(tmp_path, shipped):
    import sqlite_utils

    path = tmp_path / "old.db"
    db = sqlite_utils.Database(path)
    fresh = [m.name for m in migrations.pending(db)]
    migrations.apply(db, stop_before=[n for n in fresh if n not in ("m001_incidents", "m002_slack")])
    assert [m.name for m in migrations.applied(db)] == ["m001_incidents", "m002_slack"]
    old = [  # as the first releases stored them: a hash of the whole first root line, units unmasked
        ("cuda-oom", "cuda-oom:5f0c1e2a9b11", "root", _oom(3, "node12", "2.00 GiB", "310.00 MiB").strip()),
        ("cuda-oom", "cuda-oom:8e41d07c3a52", "root", _oom(5, "node12", "512.00 MiB", "1.10 GiB").strip()),
        (None, "unknown:0b9d3a7e4c61", "likely", "ShardError: shard 17 on node1 bad"),
        ("retired-entry", "retired-entry:77aa00bb11cc", "root", "something only a removed entry knew"),
    ]
    for i, (entry, sig, role, text) in enumerate(old, start=1):
        db["incidents"].insert({"id": i, "at": f"2026-11-0{i}T00:00:00+00:00", "entry": entry, "signature": sig,
                                "status": "open", "source": "cli"})
        db["evidence"].insert({"incident": i, "seq": 0, "role": role, "entry": entry, "line": 4, "text": text})
    db.close()
    h = History(path)  # applies the pending migrations, m004 among them
    sigs = [h.get_row(i)["signature"] for i in range(1, 5)]
    assert sigs[0] == sigs[1] != "cuda-oom:5f0c1e2a9b11"
    assert sigs[3] == "retired-entry:77aa00bb11cc"  # nothing to match it against: kept as it was
    again = h.record(shipped.diagnose_text(_oom(1, "node3", "64.00 MiB", "12.5 MiB")), source="cli")
    assert again["signature"] == sigs[0] and again["count"] == 3 and [p["id"] for p in again["previous"]] == [2, 1]
    unknown = h.record(shipped.diagnose_text(f"loading shards\nShardError: shard 99 on node7 bad\n{GOES_ON}"), source="cli")
    assert unknown["signature"] == sigs[2] and unknown["count"] == 2
