"""The incident history: every diagnosis is an incident in SQLite; repeats are linked by signature.

Only redacted evidence lines are stored, never raw logs. The database runs in WAL mode so readers
never block the writer; `synchronous=NORMAL` (safe against a crashed process, may lose the last
transaction on power loss, which is acceptable for a history) and a 10 s busy timeout let several
processes (the bot, on-call's CLI) write to one file. Write transactions start with BEGIN
IMMEDIATE so two writers queue on the busy timeout instead of failing on a lock upgrade.
"""
from __future__ import annotations

import asyncio
import fcntl
import json
import os
import sqlite3
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from datetime import datetime, timedelta, timezone
from functools import partial
from pathlib import Path
from typing import Iterator

import sqlite_utils
from sqlite_utils import Migrations

from bot.engine.diagnose import Diagnosis
from bot.history.signature import signature

# Failures of a machine rather than of a job: a host that shows several is a candidate to drain.
HARDWARE_ENTRIES = frozenset({
    "gpu-xid", "gpu-ecc", "nvlink-error", "gpu-gsp-timeout", "gpu-thermal-throttle", "ib-network-error",
    "ib-link-flap", "efa-network-error", "host-hw-mce", "pcie-aer-error", "local-disk-io-error", "slurm-node-fail",
})
FLAKY_WINDOW_DAYS = 14
FLAKY_MIN_INCIDENTS = 2
MAX_STORED_EVIDENCE = 12

migrations = Migrations("trainmedic")


@migrations()
def m001_incidents(db: sqlite_utils.Database) -> None:
    db["incidents"].create(
        {
            "id": int, "at": str, "entry": str, "title": str, "signature": str, "signature_text": str,
            "source": str, "job": str, "channel": str, "thread_ts": str,
            "status": str, "note": str, "resolved_at": str, "resolved_by": str, "corrected_entry": str,
            "score": float, "rank": int, "host": str, "lines": int, "bytes": int,
        },
        pk="id", not_null={"at", "signature", "status"}, defaults={"status": "open"}, if_not_exists=True,
    )
    db["incidents"].create_index(["signature"], if_not_exists=True)
    db["incidents"].create_index(["at"], if_not_exists=True)
    db["evidence"].create(
        {"incident": int, "seq": int, "role": str, "entry": str, "line": int, "text": str,
         "rank": int, "host": str, "time": str, "file": str},
        pk=("incident", "seq"), foreign_keys=[("incident", "incidents", "id")], if_not_exists=True,
    )
    db["incident_hosts"].create(
        {"incident": int, "host": str, "hardware": int},
        pk=("incident", "host"), foreign_keys=[("incident", "incidents", "id")], if_not_exists=True,
    )
    db["incident_hosts"].create_index(["host"], if_not_exists=True)
    db["feedback"].create(
        {"id": int, "incident": int, "at": str, "kind": str, "user": str, "note": str, "entry": str},
        pk="id", foreign_keys=[("incident", "incidents", "id")], if_not_exists=True,
    )


@migrations()
def m002_slack(db: sqlite_utils.Database) -> None:
    """Slack events already handled (a retry must not get a second reply) and the reply of each incident."""
    db["slack_events"].create({"event_id": str, "at": str}, pk="event_id", if_not_exists=True)
    db["slack_messages"].create(
        {"incident": int, "channel": str, "ts": str, "thread_ts": str, "text": str, "blocks": str},
        pk="incident", foreign_keys=[("incident", "incidents", "id")], if_not_exists=True,
    )


def default_path() -> Path:
    """TRAINMEDIC_DB, else a per-user file under XDG_DATA_HOME (~/.local/share)."""
    if os.environ.get("TRAINMEDIC_DB"):
        return Path(os.environ["TRAINMEDIC_DB"])
    base = Path(os.environ.get("XDG_DATA_HOME") or Path.home() / ".local" / "share")
    return base / "trainmedic" / "incidents.db"


def now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def _connect(path: Path) -> sqlite_utils.Database:
    path.parent.mkdir(parents=True, exist_ok=True)
    conn = sqlite3.connect(path, timeout=10, check_same_thread=False)
    conn.execute("PRAGMA busy_timeout=10000")
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=NORMAL")
    conn.execute("PRAGMA foreign_keys=ON")
    return sqlite_utils.Database(conn)


class History:
    """Synchronous store. One instance per thread; the Slack side wraps it in one writer thread."""

    def __init__(self, path: Path | str | None = None) -> None:
        self.path = Path(path) if path else default_path()
        self.db = _connect(self.path)
        with self._lock():
            migrations.apply(self.db)

    @contextmanager
    def _lock(self) -> Iterator[None]:
        # Migrations from two processes at once: the second waits, then finds nothing pending.
        with open(self.path.with_name(self.path.name + ".lock"), "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            yield

    @contextmanager
    def write(self) -> Iterator[sqlite_utils.Database]:
        """One write transaction, taken with BEGIN IMMEDIATE (waits up to the busy timeout)."""
        self.db.conn.execute("BEGIN IMMEDIATE")
        try:
            yield self.db
        except BaseException:
            self.db.conn.rollback()
            raise
        self.db.conn.commit()

    def close(self) -> None:
        self.db.close()

    # -- recording ---------------------------------------------------------------------------

    def record(self, d: Diagnosis, source: str, job: str | None = None, channel: str | None = None,
               thread_ts: str | None = None, at: str | None = None) -> dict:
        """Store `d` as a new incident and return the `incident` object of the JSON contract."""
        sig, sig_text = signature(d)
        root = d.root
        row = {
            "at": at or now(), "entry": root.entry.id if root else None, "title": root.entry.title if root else None,
            "signature": sig, "signature_text": sig_text, "source": source, "job": job, "channel": channel,
            "thread_ts": thread_ts, "status": "open",
            "score": root.score if root else None, "rank": (d.initiating or {}).get("rank"),
            "host": (d.initiating or {}).get("host"), "lines": d.scan.lines, "bytes": d.scan.bytes,
        }
        with self.write() as db:
            incident_id = db["incidents"].insert(row).last_pk
            db["evidence"].insert_all(self._evidence_rows(incident_id, d))
            hardware = int(bool(root) and root.entry.id in HARDWARE_ENTRIES)
            hosts = sorted(set(root.hosts) | ({row["host"]} if row["host"] else set())) if root else []
            db["incident_hosts"].insert_all({"incident": incident_id, "host": h, "hardware": hardware} for h in hosts)
        return self.links(incident_id)

    @staticmethod
    def _evidence_rows(incident_id: int, d: Diagnosis) -> list[dict]:
        rows = []
        for f in d.findings:
            for h in f.hits:
                rows.append({"role": f.role, "entry": f.entry.id, "line": h.line, "text": h.text, "rank": h.rank,
                             "host": h.host, "time": h.time, "file": d.scan.files[h.file]})
        if not rows:
            rows = [{"role": "likely", "entry": None, "line": m.line, "text": m.text, "rank": None, "host": None,
                     "time": None, "file": d.scan.files[m.file]} for m in d.likely_errors()]
        return [{"incident": incident_id, "seq": i, **r} for i, r in enumerate(rows[:MAX_STORED_EVIDENCE])]

    # -- links and tallies ---------------------------------------------------------------------

    def links(self, incident_id: int) -> dict:
        """How this incident relates to the earlier ones: repeats, a comeback after a fix, flaky hosts."""
        inc = self.get_row(incident_id)
        earlier = list(self.db.query(
            "select * from incidents where signature = ? and id < ? order by id desc", [inc["signature"], incident_id]))
        resolved = [e for e in earlier if e["status"] == "resolved"]
        return {
            "id": incident_id,
            "signature": inc["signature"],
            "previous": [{"id": e["id"], "at": e["at"], "where": _where(e)} for e in earlier[:5]],
            "count": len(earlier) + 1,
            "first_seen": earlier[-1]["at"] if earlier else inc["at"],
            "came_back": bool(resolved),
            "last_resolution": ({"id": resolved[0]["id"], "at": resolved[0]["resolved_at"], "note": resolved[0]["note"]}
                                if resolved else None),
            "flaky_hosts": self.flaky_hosts(incident_id),
        }

    def flaky_hosts(self, incident_id: int | None = None, days: int = FLAKY_WINDOW_DAYS) -> list[dict]:
        """Hosts with several hardware-class incidents in the window (of this incident, or all)."""
        since = (datetime.now(timezone.utc) - timedelta(days=days)).isoformat(timespec="seconds")
        where = "ih.hardware = 1 and i.at >= ?"
        params: list = [since]
        if incident_id is not None:
            where += " and ih.host in (select host from incident_hosts where incident = ? and hardware = 1)"
            params.append(incident_id)
        rows = self.db.query(
            f"""select ih.host, count(*) as incidents, group_concat(distinct i.entry) as entries, max(i.at) as last
                from incident_hosts ih join incidents i on i.id = ih.incident
                where {where} group by ih.host having count(*) >= ? order by incidents desc, ih.host""",
            params + [FLAKY_MIN_INCIDENTS],
        )
        return [{**r, "entries": sorted(r["entries"].split(",")), "drain": drain_command(r["host"], r["incidents"], days)}
                for r in rows]

    # -- feedback ------------------------------------------------------------------------------

    def resolve(self, incident_id: int, note: str, user: str | None = None) -> None:
        self.get_row(incident_id)
        with self.write() as db:
            db["incidents"].update(incident_id, {"status": "resolved", "note": note, "resolved_at": now(), "resolved_by": user})
            db["feedback"].insert({"incident": incident_id, "at": now(), "kind": "resolved", "user": user, "note": note})

    def mark_wrong(self, incident_id: int, right_entry: str | None, user: str | None = None, note: str | None = None) -> None:
        """Record that the diagnosis was wrong; `right_entry` None means "unknown failure"."""
        self.get_row(incident_id)
        with self.write() as db:
            db["incidents"].update(incident_id, {"status": "wrong", "corrected_entry": right_entry or "unknown"})
            db["feedback"].insert({"incident": incident_id, "at": now(), "kind": "wrong", "user": user, "note": note,
                                   "entry": right_entry or "unknown"})

    def purge(self, older_than_days: int) -> int:
        """Delete incidents (and their evidence, hosts, feedback) older than the retention; return how many."""
        cutoff = (datetime.now(timezone.utc) - timedelta(days=older_than_days)).isoformat(timespec="seconds")
        with self.write() as db:
            ids = [r["id"] for r in db.query("select id from incidents where at < ?", [cutoff])]
            db.execute("delete from slack_events where at < ?", [cutoff])
            for table in ("evidence", "incident_hosts", "feedback", "slack_messages"):
                db.execute(f"delete from {table} where incident in (select id from incidents where at < ?)", [cutoff])
            db.execute("delete from incidents where at < ?", [cutoff])
        return len(ids)

    # -- Slack bookkeeping -----------------------------------------------------------------------

    def claim_event(self, event_id: str) -> bool:
        """True the first time an event id is seen, False for a retry or a second delivery."""
        with self.write() as db:
            cur = db.execute("insert or ignore into slack_events (event_id, at) values (?, ?)", [event_id, now()])
            return cur.rowcount == 1

    def save_message(self, incident_id: int, channel: str, ts: str, thread_ts: str | None, text: str,
                     blocks: list[dict]) -> None:
        """Remember the reply (and what it showed) so a status change can edit it; a reply posted in
        the channel (not in a thread) is the thread later links point to."""
        with self.write() as db:
            db["incidents"].update(incident_id, {"channel": channel, "thread_ts": thread_ts or ts})
            db["slack_messages"].upsert({"incident": incident_id, "channel": channel, "ts": ts, "thread_ts": thread_ts,
                                         "text": text, "blocks": json.dumps(blocks)}, pk="incident")

    def message_for(self, incident_id: int) -> dict | None:
        rows = list(self.db.query("select * from slack_messages where incident = ?", [incident_id]))
        if not rows:
            return None
        return {**rows[0], "blocks": json.loads(rows[0]["blocks"] or "[]")}

    # -- reading -------------------------------------------------------------------------------

    def get_row(self, incident_id: int) -> dict:
        try:
            return self.db["incidents"].get(incident_id)
        except sqlite_utils.db.NotFoundError:
            raise LookupError(f"no incident {incident_id}; `trainmedic incidents list` shows recent ones") from None

    def show(self, incident_id: int) -> dict:
        inc = self.get_row(incident_id)
        inc["evidence"] = list(self.db.query("select * from evidence where incident = ? order by seq", [incident_id]))
        inc["feedback"] = list(self.db.query("select * from feedback where incident = ? order by id", [incident_id]))
        inc["links"] = self.links(incident_id)
        return inc

    def list(self, days: int | None = None, entry: str | None = None, host: str | None = None,
             status: str | None = None, limit: int = 50) -> list[dict]:
        where, params = ["1=1"], []
        if days is not None:
            where.append("at >= ?")
            params.append((datetime.now(timezone.utc) - timedelta(days=days)).isoformat(timespec="seconds"))
        if entry:
            where.append("coalesce(entry, 'unknown') = ?")
            params.append(entry)
        if host:
            where.append("id in (select incident from incident_hosts where host = ?)")
            params.append(host)
        if status:
            where.append("status = ?")
            params.append(status)
        sql = f"select * from incidents where {' and '.join(where)} order by id desc limit ?"
        return list(self.db.query(sql, params + [limit]))

    def search(self, words: str, limit: int = 50) -> list[dict]:
        """Incidents whose entry, title, job, host, note or evidence mention every word."""
        clauses, params = [], []
        for word in words.split():
            like = f"%{word}%"
            clauses.append(
                "(coalesce(entry,'') like ? or coalesce(title,'') like ? or coalesce(job,'') like ? or coalesce(host,'') like ?"
                " or coalesce(note,'') like ? or id in (select incident from evidence where text like ?))")
            params += [like] * 6
        sql = f"select * from incidents where {' and '.join(clauses) or '1=1'} order by id desc limit ?"
        return list(self.db.query(sql, params + [limit]))

    def stats(self, days: int | None = None) -> dict:
        since = ((datetime.now(timezone.utc) - timedelta(days=days)).isoformat(timespec="seconds")
                 if days is not None else "")
        by_entry = list(self.db.query(
            "select coalesce(entry, 'unknown') as entry, count(*) as incidents, sum(status = 'open') as open,"
            " max(at) as last from incidents where at >= ? group by 1 order by incidents desc, entry", [since]))
        by_host = list(self.db.query(
            "select ih.host, count(*) as incidents, sum(ih.hardware) as hardware, max(i.at) as last"
            " from incident_hosts ih join incidents i on i.id = ih.incident where i.at >= ?"
            " group by ih.host order by incidents desc, ih.host", [since]))
        total = sum(r["incidents"] for r in by_entry)
        return {"days": days, "incidents": total, "by_entry": by_entry, "by_host": by_host,
                "flaky_hosts": self.flaky_hosts(days=days or FLAKY_WINDOW_DAYS)}

    def feedback_examples(self) -> list[dict]:
        """Each wrong-diagnosis report as a knowledge-base example to review: the lines and the right entry."""
        rows = self.db.query(
            "select f.incident, f.entry as right_entry, f.note, f.at, i.entry as diagnosed from feedback f"
            " join incidents i on i.id = f.incident where f.kind = 'wrong' order by f.id")
        out = []
        for r in rows:
            lines = [e["text"] for e in self.db.query("select text from evidence where incident = ? order by seq", [r["incident"]])]
            out.append({**r, "log": "\n".join(lines) + "\n"})
        return out



def _where(row: dict) -> str:
    """Where an incident was reported: its Slack thread, else its job and host."""
    if row.get("channel") and row.get("thread_ts"):
        return thread_link(row["channel"], row["thread_ts"])
    parts = []
    if row.get("job"):
        parts.append(f"job {row['job']}")
    if row.get("host"):
        parts.append(f"on {row['host']}")
    if row.get("channel"):
        parts.append(f"in <#{row['channel']}>")
    return " ".join(parts) or row.get("source") or "cli"


def thread_link(channel: str, ts: str) -> str:
    """A link Slack clients open at the thread (the workspace is taken from the signed-in client)."""
    return f"https://slack.com/archives/{channel}/p{ts.replace('.', '')}"


def drain_command(host: str, incidents: int, days: int) -> str:
    reason = f"trainmedic: {incidents} hardware incidents in {days}d"
    return f'scontrol update nodename={host} state=drain reason="{reason}"'


class AsyncHistory:
    """The history for asyncio code: every call runs on one thread (the one writer), off the loop."""

    def __init__(self, path: Path | str | None = None) -> None:
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="history")
        self._history = self._executor.submit(History, path).result()

    async def call(self, method: str, *args, **kwargs):
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, partial(getattr(self._history, method), *args, **kwargs))

    def close(self) -> None:
        self._executor.submit(self._history.close).result()
        self._executor.shutdown()
