"""The history's schema: its migrations, the connection settings, where the file lives.

WAL mode so readers never block the writer; `synchronous=NORMAL` (safe against a crashed process,
may lose the last transaction on power loss, which is acceptable for a history) and a 10 s busy
timeout let several processes (the bot, on-call's CLI) write to one file.
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


# m003_* (delivery tables) belong before this one; keep the migrations in the order of their names.
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


def default_path() -> Path:
    """TRAINMEDIC_DB, else a per-user file under XDG_DATA_HOME (~/.local/share)."""
    if os.environ.get("TRAINMEDIC_DB"):
        return Path(os.environ["TRAINMEDIC_DB"])
    base = Path(os.environ.get("XDG_DATA_HOME") or Path.home() / ".local" / "share")
    return base / "trainmedic" / "incidents.db"


def connect(path: Path) -> sqlite_utils.Database:
    conn = sqlite3.connect(path, timeout=10, check_same_thread=False)
    conn.execute("PRAGMA busy_timeout=10000")
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=NORMAL")
    conn.execute("PRAGMA foreign_keys=ON")
    return sqlite_utils.Database(conn)
