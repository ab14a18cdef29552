"""Reading the history: incidents for the review CLI and App Home, links between repeats, host tallies."""
from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone

import sqlite_utils

FLAKY_WINDOW_DAYS = 14
FLAKY_MIN_INCIDENTS = 2


class Queries:
    """The read side of `History`; expects `self.db`."""

    db: sqlite_utils.Database

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

    def message_for(self, incident_id: int) -> dict | None:
        rows = list(self.db.query("select * from slack_messages where incident = ?", [incident_id]))
        if not rows:
            return None
        return {**rows[0], "blocks": json.loads(rows[0]["blocks"] or "[]")}

    def reply_of(self, incident_id: int) -> dict | None:
        """The outbox row of an incident's reply (state pending, sent or failed, and why), or None."""
        rows = list(self.db.query("select state, error, attempts, ts, channel from outbox"
                                  " where incident = ? and kind = 'post' order by id limit 1", [incident_id]))
        return rows[0] if rows else None

    def get_delivery(self, key: str) -> dict | None:
        rows = list(self.db.query("select * from deliveries where key = ?", [key]))
        return rows[0] if rows else None

    def undelivered(self, limit: int = 20) -> list[dict]:
        """Replies that ended failed (newest first): the incident, where, and Slack's reason."""
        return list(self.db.query(
            "select o.incident, o.channel, o.thread_ts, o.error, o.kind, i.entry, i.at from outbox o"
            " left join incidents i on i.id = o.incident where o.state = 'failed' order by o.id desc limit ?", [limit]))

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
        reply = self.reply_of(incident_id)
        if reply is not None:  # only incidents from Slack have a reply
            inc["reply"] = {"pending": "waiting to be posted", "sent": "delivered",
                            "failed": "could not be delivered"}[reply["state"]]
            inc["reply_error"] = reply["error"]
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

    def unknown_groups(self, status: str | None = "open", limit: int = 50) -> list[dict]:
        """One row per distinct unknown failure (one signature), latest first: its latest incident's
        row with `count` (incidents in the group), `first_seen` and `failure` (what it was grouped by)."""
        where, params = "entry is null", []
        if status:
            where += " and status = ?"
            params.append(status)
        rows = self.db.query(
            f"""select i.*, g.count, g.first_seen from incidents i join (
                  select signature, max(id) as latest, count(*) as count, min(at) as first_seen
                  from incidents where {where} group by signature) g on i.id = g.latest
                order by i.id desc limit ?""", params + [limit])
        return [{**r, "failure": (r["signature_text"] or "").partition("\n")[2]} for r in rows]

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
