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


def test_an_older_schema_is_migrated_and_keeps_its_data(tmp_path, tiny):
    import sqlite_utils

    path = tmp_path / "old.db"
    db = sqlite_utils.Database(path)
    migrations.apply(db, stop_before="m002_slack")  # the schema as the first release left it
    assert "slack_events" not in db.table_names()
    db["incidents"].insert({"at": "2026-11-01T00:00:00+00:00", "entry": "cuda-oom", "signature": "cuda-oom:x",
                            "status": "open", "source": "cli"})
    db.close()
    h = History(path)
    assert {"slack_events", "slack_messages"} <= set(h.db.table_names())
    assert h.get_row(1)["entry"] == "cuda-oom"
    assert h.claim_event("Ev1") is True and h.claim_event("Ev1") is False


def test_repeats_link_to_the_earlier_slack_thread(tmp_path, tiny):
    h = History(tmp_path / "h.db")
    first = h.record(oom(tiny), source="slack-paste", channel="C1", thread_ts="1700000000.000100")
    again = h.record(oom(tiny), source="cli")
    assert again["previous"][0]["where"] == "https://slack.com/archives/C1/p1700000000000100"
    h.save_message(first["id"], "C2", "1700000000.000200", None, "text", [])
    assert h.get_row(first["id"])["thread_ts"] == "1700000000.000200"
