"""The history's schema: its migrations, the connection settings, where the file lives, and what
the linked SQLite is.

WAL mode so readers never block the writer; `synchronous=NORMAL` (safe against a crashed process,
may lose the last transaction on power loss, which is acceptable for a history) and a 10 s busy
timeout let several processes (the bot, on-call's CLI) write to one file. `secure_delete` zeroes
what is deleted, so a request body cleared after its answer does not linger in free pages.
"""
from __future__ import annotations

import os
import sqlite3
from pathlib import Path

import sqlite_utils
from sqlite_utils import Migrations

from bot.history import signature
from bot.kb.load import load

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


@migrations()
def m003_delivery(db: sqlite_utils.Database) -> None:
    """Each Slack request stored before it is acked (`deliveries`, finished by the bot's worker) and
    the replies waiting to be posted (`outbox`). The event ids of `slack_events` become finished
    deliveries, so a late retry of an event answered before the upgrade is still a duplicate."""
    db["deliveries"].create(
        {"key": str, "kind": str, "mode": str, "body": str, "state": str, "attempts": int, "next_at": float,
         "received_at": str, "finished_at": str, "error": str},
        pk="key", not_null={"kind", "state"}, defaults={"attempts": 0, "next_at": 0.0}, if_not_exists=True,
    )
    db["deliveries"].create_index(["state", "next_at"], if_not_exists=True)
    db["outbox"].create(
        {"id": int, "key": str, "kind": str, "channel": str, "thread_ts": str, "incident": int, "payload": str,
         "state": str, "uncertain": int, "attempts": int, "next_at": float, "created": float, "ts": str,
         "sent_at": str, "error": str},
        pk="id", not_null={"key", "kind", "channel", "state"},
        defaults={"state": "pending", "uncertain": 0, "attempts": 0, "next_at": 0.0}, if_not_exists=True,
    )
    db["outbox"].create_index(["key"], unique=True, if_not_exists=True)
    db["outbox"].create_index(["state", "id"], if_not_exists=True)
    db["outbox"].create_index(["incident"], if_not_exists=True)
    if "reply_key" not in db["incidents"].columns_dict:
        db["incidents"].add_column("reply_key", str)
    db["incidents"].create_index(["reply_key"], unique=True, if_not_exists=True)
    if "slack_events" in db.table_names():
        db.execute("insert or ignore into deliveries (key, kind, state, received_at, finished_at)"
                   " select 'event:' || event_id, 'event', 'done', at, at from slack_events")
        db["slack_events"].drop()


@migrations()
def m004_signatures(db: sqlite_utils.Database) -> None:
    """Stored signatures recomputed as bot/history/signature.py builds them now (the entry, the
    fingerprint that matched and its stable captures; an unknown by its exception and normalised
    message), so that earlier incidents link to new ones. The root lines are matched again against
    the entries the bot diagnoses with; an incident whose lines no longer match keeps its signature."""
    incidents = list(db.query("select id, entry from incidents"))
    if not incidents:
        return
    kb = load()
    for row in incidents:
        evidence = list(db.query("select role, entry, text from evidence where incident = ? order by seq", [row["id"]]))
        rebuilt = signature.from_evidence(kb, row["entry"], evidence)
        if rebuilt:
            db.execute("update incidents set signature = ?, signature_text = ? where id = ?", [*rebuilt, row["id"]])


@migrations()
def m005_delivery_answers(db: sqlite_utils.Database) -> None:
    """What a request's answers hold on to: the Slack message it answers (`message`, unique: a
    message that shares a log and mentions the bot arrives as two events and gets one answer) and
    how many of its slash command's response_url uses are spent (`responses`: Slack allows five)."""
    columns = db["deliveries"].columns_dict
    if "message" not in columns:
        db["deliveries"].add_column("message", str)
    if "responses" not in columns:
        db["deliveries"].add_column("responses", int, not_null_default=0)
    db["deliveries"].create_index(["message"], unique=True, if_not_exists=True)


def default_path() -> Path:
    """TRAINMEDIC_DB, else a per-user file under XDG_DATA_HOME (~/.local/share)."""
    if os.environ.get("TRAINMEDIC_DB"):
        return Path(os.environ["TRAINMEDIC_DB"])
    base = Path(os.environ.get("XDG_DATA_HOME") or Path.home() / ".local" / "share")
    return base / "trainmedic" / "incidents.db"


BUSY_TIMEOUT_MS = 10_000


def connect(path: Path) -> sqlite_utils.Database:
    conn = sqlite3.connect(path, timeout=BUSY_TIMEOUT_MS / 1000, check_same_thread=False)
    conn.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=NORMAL")
    conn.execute("PRAGMA foreign_keys=ON")
    conn.execute("PRAGMA secure_delete=ON")
    return sqlite_utils.Database(conn)


def has_wal_reset_bug(version: tuple[int, int, int] = sqlite3.sqlite_version_info) -> bool:
    """SQLite's WAL-reset bug (3.7.0 to 3.51.2; fixed in 3.51.3, backported to 3.50.7 and 3.44.6) can
    corrupt a WAL database when two connections write or checkpoint it at once."""
    return not (version >= (3, 51, 3) or (3, 50, 7) <= version < (3, 51, 0) or (3, 44, 6) <= version < (3, 45, 0))


def storage(db: sqlite_utils.Database) -> dict:
    """The settings the connection really runs with (a file system may refuse WAL), for the start-up log."""
    def pragma(name: str):
        return db.execute(f"PRAGMA {name}").fetchone()[0]

    return {"sqlite": sqlite3.sqlite_version, "journal_mode": pragma("journal_mode"),
            "synchronous": {0: "OFF", 1: "NORMAL", 2: "FULL", 3: "EXTRA"}.get(pragma("synchronous"), "?"),
            "busy_timeout_ms": pragma("busy_timeout"), "wal_reset_bug": has_wal_reset_bug()}
