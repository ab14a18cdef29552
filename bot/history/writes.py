"""Writing the history: incidents, feedback, retention, and the life of Slack requests and replies
(deliveries, outbox). Every write is one BEGIN IMMEDIATE transaction (`Writes.write`), so two
writers queue on the busy timeout instead of failing on a lock upgrade."""
from __future__ import annotations

import json
import time
from contextlib import contextmanager
from datetime import datetime, timedelta, timezone
from typing import Callable, Iterator

import sqlite_utils

from bot.engine.diagnose import Diagnosis
from bot.history.queries import Queries
from bot.history.schema import BUSY_TIMEOUT_MS
from bot.history.signature import signature

# Failures of a machine rather than of a job: a host that shows several is a candidate to drain.
HARDWARE_ENTRIES = frozenset({
    "gpu-xid", "gpu-ecc", "nvlink-error", "gpu-gsp-timeout", "gpu-thermal-throttle", "ib-network-error",
    "ib-link-flap", "efa-network-error", "host-hw-mce", "pcie-aer-error", "local-disk-io-error", "slurm-node-fail",
})
MAX_STORED_EVIDENCE = 12
RESPONSE_URL_USES = 5  # Slack's limit for one slash command's response_url


def now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


class Writes(Queries):
    """The write side of `History`; a write returns what the queries say of it (an incident's links)."""

    @contextmanager
    def write(self, busy_ms: int | None = None) -> Iterator[sqlite_utils.Database]:
        """One write transaction, taken with BEGIN IMMEDIATE (waits up to the busy timeout, or `busy_ms`)."""
        if busy_ms is not None:
            self.db.conn.execute(f"PRAGMA busy_timeout={busy_ms}")
        try:
            self.db.conn.execute("BEGIN IMMEDIATE")
        finally:
            if busy_ms is not None:
                self.db.conn.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")
        try:
            yield self.db
        except BaseException:
            self.db.conn.rollback()
            raise
        self.db.conn.commit()

    def record(self, d: Diagnosis, source: str, job: str | None = None, channel: str | None = None,
               thread_ts: str | None = None, at: str | None = None, reply_key: str | None = None,
               replies: Callable[[dict], list[dict]] | None = None) -> dict:
        """Store `d` as a new incident and return the `incident` object of the JSON contract.

        `replies(incident)` gives the outbox rows of its reply, stored in the same transaction, so
        an incident never lacks its reply; `reply_key` makes the call idempotent (a retried event
        gets back the incident it recorded the first time)."""
        if reply_key is not None:
            known = self.db.execute("select id from incidents where reply_key = ?", [reply_key]).fetchone()
            if known:
                return self.links(known[0])
        sig, sig_text = signature(d)
        root = d.root
        row = {
            "at": at or now(), "entry": root.entry.id if root else None, "title": root.entry.title if root else None,
            "signature": sig, "signature_text": sig_text, "source": source, "job": job, "channel": channel,
            "thread_ts": thread_ts, "status": "open",
            "score": root.score if root else None, "rank": (d.initiating or {}).get("rank"),
            "host": (d.initiating or {}).get("host"), "lines": d.scan.lines, "bytes": d.scan.bytes,
            "reply_key": reply_key,
        }
        with self.write() as db:
            incident_id = db["incidents"].insert(row).last_pk
            db["evidence"].insert_all(self._evidence_rows(incident_id, d))
            hardware = int(bool(root) and root.entry.id in HARDWARE_ENTRIES)
            hosts = sorted(set(root.hosts) | ({row["host"]} if row["host"] else set())) if root else []
            db["incident_hosts"].insert_all({"incident": incident_id, "host": h, "hardware": hardware} for h in hosts)
            links = self.links(incident_id)
            if replies is not None:
                self._enqueue(db, replies(links))
        return links

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
        """Delete incidents (and their evidence, hosts, feedback, replies) older than the retention; return how many."""
        cutoff = (datetime.now(timezone.utc) - timedelta(days=older_than_days)).isoformat(timespec="seconds")
        with self.write() as db:
            ids = [r["id"] for r in db.query("select id from incidents where at < ?", [cutoff])]
            for table in ("evidence", "incident_hosts", "feedback", "slack_messages", "outbox"):
                db.execute(f"delete from {table} where incident in (select id from incidents where at < ?)", [cutoff])
            db.execute("delete from incidents where at < ?", [cutoff])
        return len(ids)

    def forget_finished(self, older_than: float) -> None:
        """Drop finished deliveries and sent replies older than `older_than` seconds: Slack retries
        within minutes and a signed request is refused after five, so a day of them dedups enough."""
        since = time.time() - older_than
        cutoff = datetime.fromtimestamp(since, timezone.utc).isoformat(timespec="seconds")
        with self.write() as db:
            db.execute("delete from deliveries where state in ('done', 'failed') and finished_at < ?", [cutoff])
            db.execute("delete from outbox where state in ('sent', 'skipped') and created < ?", [since])

    # -- deliveries: every Slack request, stored before its ack and finished by the bot's worker ----

    def intake(self, key: str, kind: str, mode: str, body: str, busy_ms: int | None = None) -> str:
        """Store a request before it is acked. 'new'; 'pending' for a known unfinished one (Slack's
        retry: made due now, so it may finish it); 'finished' for a duplicate of a finished one."""
        with self.write(busy_ms) as db:
            cur = db.execute(
                "insert or ignore into deliveries (key, kind, mode, body, state, attempts, next_at, received_at)"
                " values (?, ?, ?, ?, 'received', 0, 0, ?)", [key, kind, mode, body, now()])
            if cur.rowcount == 1:
                return "new"
            db.execute("update deliveries set next_at = 0 where key = ? and state = 'received'", [key])
            state = db.execute("select state from deliveries where key = ?", [key]).fetchone()[0]
        return "pending" if state in ("received", "working") else "finished"

    def claim_deliveries(self, limit: int) -> list[dict]:
        """Up to `limit` due requests, marked working (one more attempt each)."""
        with self.write() as db:
            rows = list(db.query("select * from deliveries where state = 'received' and next_at <= ?"
                                 " order by next_at, received_at limit ?", [time.time(), limit]))
            for r in rows:
                db.execute("update deliveries set state = 'working', attempts = attempts + 1 where key = ?", [r["key"]])
                r["attempts"] += 1
        return rows

    def release_working(self) -> int:
        """Requests a stopped or dead bot was working on become due again."""
        with self.write() as db:
            return db.execute("update deliveries set state = 'received', next_at = 0 where state = 'working'").rowcount

    def retry_delivery(self, key: str, delay: float, error: str) -> None:
        with self.write() as db:
            db.execute("update deliveries set state = 'received', next_at = ?, error = ? where key = ?",
                       [time.time() + delay, error, key])

    def finish_delivery(self, key: str, state: str, error: str | None = None) -> None:
        """'done' or 'failed'. The body goes: it may hold a pasted log, and only evidence is kept."""
        with self.write() as db:
            db.execute("update deliveries set state = ?, error = ?, finished_at = ?, body = null where key = ?",
                       [state, error, now(), key])

    def claim_message(self, key: str, message: str) -> bool:
        """Whether the request `key` is the one to answer `message` (channel:ts): the first to ask
        takes it, and its own retries keep it."""
        with self.write() as db:
            owner = db.execute("select key from deliveries where message = ?", [message]).fetchone()
            if owner is None:
                db.execute("update deliveries set message = ? where key = ?", [message, key])
                return True
        return owner[0] == key

    def use_response_url(self, key: str) -> bool:
        """Spend one of the five uses Slack allows a slash command's response_url; False when none is left."""
        with self.write() as db:
            return db.execute("update deliveries set responses = responses + 1 where key = ? and responses < ?",
                              [key, RESPONSE_URL_USES]).rowcount == 1

    def next_delivery_at(self) -> float | None:
        return self.db.execute("select min(next_at) from deliveries where state = 'received'").fetchone()[0]

    # -- the outbox: replies to post or edit, each a row until Slack has it ---------------------------

    @staticmethod
    def _enqueue(db: sqlite_utils.Database, rows: list[dict]) -> None:
        for r in rows:  # a retried listener enqueues the same keys again: ignored
            db.execute(
                "insert or ignore into outbox (key, kind, channel, thread_ts, incident, payload, state, created)"
                " values (?, ?, ?, ?, ?, ?, 'pending', ?)",
                [r["key"], r["kind"], r["channel"], r.get("thread_ts"), r.get("incident"),
                 json.dumps(r.get("payload") or {}), time.time()])

    def enqueue(self, rows: list[dict]) -> None:
        with self.write() as db:
            self._enqueue(db, rows)

    def outbox_pending(self, limit: int = 500) -> list[dict]:
        rows = self.db.query("select * from outbox where state = 'pending' order by id limit ?", [limit])
        return [{**r, "payload": json.loads(r["payload"] or "{}")} for r in rows]

    def outbox_attempt(self, row_id: int) -> None:
        """Before a call that may reach Slack: until its answer is in, the row is uncertain."""
        with self.write() as db:
            db.execute("update outbox set uncertain = 1, attempts = attempts + 1 where id = ?", [row_id])

    def outbox_retry(self, row_id: int, delay: float, error: str, uncertain: bool) -> None:
        with self.write() as db:
            db.execute("update outbox set next_at = ?, error = ?, uncertain = ? where id = ?",
                       [time.time() + delay, error, int(uncertain), row_id])

    def outbox_failed(self, row_id: int, error: str, notices: list[dict] | None = None) -> None:
        """The row ends failed with Slack's reason; `notices` (telling a user so) are enqueued with it."""
        with self.write() as db:
            db.execute("update outbox set state = 'failed', error = ?, uncertain = 0 where id = ?", [error, row_id])
            self._enqueue(db, notices or [])

    def outbox_skipped(self, row_id: int, reason: str) -> None:
        """Nothing to send after all (a placeholder where the bot cannot post, a report with no message to attach to)."""
        with self.write() as db:
            db.execute("update outbox set state = 'skipped', error = ?, uncertain = 0 where id = ?", [reason, row_id])

    def outbox_sent(self, row_id: int, ts: str | None) -> None:
        """Slack has the message: remember it, and for a diagnosis the reply that status changes edit
        (its ts is None when it went to the user only or through a slash command's response_url)."""
        with self.write() as db:
            db.execute("update outbox set state = 'sent', ts = ?, sent_at = ?, uncertain = 0, error = null where id = ?",
                       [ts, now(), row_id])
            row = db["outbox"].get(row_id)
            if row["kind"] == "post" and row["incident"] is not None:
                payload = json.loads(row["payload"])
                self._save_message(db, row["incident"], row["channel"], ts, row["thread_ts"], payload["text"],
                                   payload["blocks"])

    def sent_ts(self, key: str) -> str | None:
        found = self.db.execute("select ts from outbox where key = ? and state = 'sent'", [key]).fetchone()
        return found[0] if found else None

    def outbox_state(self, key: str) -> str | None:
        found = self.db.execute("select state from outbox where key = ?", [key]).fetchone()
        return found[0] if found else None

    @staticmethod
    def _save_message(db: sqlite_utils.Database, incident_id: int, channel: str, ts: str, thread_ts: str | None,
                      text: str, blocks: list[dict]) -> None:
        """Remember the reply (and what it showed) so a status change can edit it; a reply posted in
        the channel (not in a thread) is the thread later links point to."""
        db["incidents"].update(incident_id, {"channel": channel, "thread_ts": thread_ts or ts})
        db["slack_messages"].upsert({"incident": incident_id, "channel": channel, "ts": ts, "thread_ts": thread_ts,
                                     "text": text, "blocks": json.dumps(blocks)}, pk="incident")
