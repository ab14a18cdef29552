"""Writing the history: incidents, feedback, retention, Slack bookkeeping. Every write is one
BEGIN IMMEDIATE transaction (`Writes.write`), so two writers queue on the busy timeout instead of
failing on a lock upgrade."""
from __future__ import annotations

import json
from contextlib import contextmanager
from datetime import datetime, timedelta, timezone
from typing import Iterator

import sqlite_utils

from bot.engine.diagnose import Diagnosis
from bot.history.queries import Queries
from bot.history.signature import signature

# Failures of a machine rather than of a job: a host that shows several is a candidate to drain.
HARDWARE_ENTRIES = frozenset({
    "gpu-xid", "gpu-ecc", "nvlink-error", "gpu-gsp-timeout", "gpu-thermal-throttle", "ib-network-error",
    "ib-link-flap", "efa-network-error", "host-hw-mce", "pcie-aer-error", "local-disk-io-error", "slurm-node-fail",
})
MAX_STORED_EVIDENCE = 12


def now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


class Writes(Queries):
    """The write side of `History`; a write returns what the queries say of it (an incident's links)."""

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
