"""Diagnoses rendered for people (terminal text, markdown) and programs (the JSON contract)."""
from __future__ import annotations

import json

from bot.engine.diagnose import Diagnosis, Finding
from bot.engine.scan import Hit

MAX_LISTED = 64  # ranks/hosts listed per finding


def _evidence(hit: Hit, d: Diagnosis) -> dict:
    out = {"line": hit.line, "text": hit.text, "rank": hit.rank, "host": hit.host, "time": hit.time}
    if len(d.scan.files) > 1:
        out["file"] = d.scan.files[hit.file]
    return out


def _finding_json(f: Finding, d: Diagnosis) -> dict:
    return {
        "entry": f.entry.id,
        "title": f.entry.title,
        "role": f.role,
        "score": f.score,
        "evidence": [_evidence(h, d) for h in f.hits],
        "fix": d.fill(f.entry.data["fix"]["summary"], f),
        "steps": d.steps(f),
        "verify": d.fill(f.entry.data["verify"], f),
        "related": list(f.entry.related),
        "ranks": f.ranks[:MAX_LISTED],
        "hosts": f.hosts[:MAX_LISTED],
    }


def to_json(d: Diagnosis, incident: dict | None = None, notes: list[str] | None = None) -> dict:
    """The object of design.md's `trainmedic diagnose --format json` contract."""
    initiating = None
    if d.initiating:
        initiating = {k: d.initiating[k] for k in ("rank", "host", "line")}
        if len(d.scan.files) > 1:
            initiating["file"] = d.scan.files[d.initiating["file"]]
    return {
        "root": d.root.entry.id if d.root else None,
        "confidence": d.confidence,
        "findings": [_finding_json(f, d) for f in d.findings],
        "initiating": initiating,
        "progress": d.progress,
        "incident": incident,
        "lines_scanned": d.scan.lines,
        "bytes_scanned": d.scan.bytes,
        "cascade_only": d.cascade_only,
        "likely_errors": [{"line": m.line, "text": m.text} for m in d.likely_errors()],
        "warnings": d.warnings,
        "notes": notes or [],
        "timeline": timeline_json(d),
    }


def dumps(d: Diagnosis, incident: dict | None = None, notes: list[str] | None = None) -> str:
    return json.dumps(to_json(d, incident, notes), indent=2, ensure_ascii=False)


def where(d: Diagnosis) -> str | None:
    """Where it started; for a failure that several ranks or hosts show, how it spread (the
    timeline) and the host that differs from its peers, with its drain command."""
    if not d.initiating or not d.root:
        return None
    parts = []
    if d.initiating["rank"] is not None:
        parts.append(f"rank {d.initiating['rank']}")
    if d.initiating["host"]:
        parts.append(f"host {d.initiating['host']}")
    line = f"line {d.initiating['line']}"
    if len(d.scan.files) > 1:
        line += f" of {d.scan.files[d.initiating['file']]}"
    parts.append(line)
    t = d.timeline
    if t is not None and t.sources > 1:
        text = ", ".join(parts) + f" ({t.label})" + (f"; then {t.then}" if t.then else "")
    else:
        spread = []
        if len(d.root.ranks) > 1:
            spread.append(f"{len(d.root.ranks)} ranks")
        if len(d.root.hosts) > 1:
            spread.append(f"{len(d.root.hosts)} hosts")
        text = ", ".join(parts) + (f" (seen on {' and '.join(spread)})" if spread else "")
    for odd in t.odd_hosts if t is not None else []:
        text += f"; {odd.host} differs from its peers ({odd.entry})" + (f", drain it: {odd.drain}" if odd.drain else "")
    return text


def timeline_json(d: Diagnosis) -> dict | None:
    """The `timeline` key: each rank's and host's first failure line in time order, and the odd hosts."""
    t = d.timeline
    if t is None:
        return None
    events = [{"entry": e.entry, "role": e.role, **_evidence(e.hit, d)} for e in t.events]
    return {"summary": t.summary, "events": events,
            "odd_hosts": [{"host": o.host, "entry": o.entry, "drain": o.drain} for o in t.odd_hosts]}


def progress(d: Diagnosis) -> str | None:
    if not d.progress:
        return None
    bits = []
    if d.progress.get("iteration") is not None:
        bits.append(f"last iteration {d.progress['iteration']}")
    if d.progress.get("checkpoint"):
        bits.append(f"last checkpoint {d.progress['checkpoint']}")
    return ", ".join(bits)


def verdict(d: Diagnosis) -> str:
    """One sentence: what broke."""
    if d.root is None:
        return "No known failure found."
    if d.cascade_only:
        return (f"Only a consequence was found: {d.root.entry.title} ({d.root.entry.id}). "
                "The initiating failure is not in this text: look at the earliest error of the first rank or host that failed.")
    return f"{d.root.entry.title} ({d.root.entry.id}, {d.confidence} confidence)"


def _steps(d: Diagnosis, f: Finding, md: bool) -> list[str]:
    out = []
    for i, step in enumerate(d.steps(f), 1):
        out.append(f"{i}. {step['text']}")
        if step["command"]:
            out.append(f"   `{step['command']}`" if md else f"     $ {step['command']}")
        if step["code"]:  # a change to code or config: shown as code, never as a command
            code = step["code"].rstrip("\n")
            out += ["   ```", *(f"   {line}" for line in code.split("\n")), "   ```"] if md else \
                [f"     | {line}" for line in code.split("\n")]
    return out


def history_lines(incident: dict | None) -> list[str]:
    """What the incident history says: repeats, a comeback after a fix, hosts to drain."""
    if not incident:
        return []
    out = []
    if incident["count"] > 1:
        ids = ", ".join(f"#{p['id']} ({p['where']})" for p in incident["previous"])
        out.append(f"Seen {incident['count']} times since {incident['first_seen'][:10]}: {ids}")
    if incident["came_back"]:
        res = incident["last_resolution"]
        out.append(f"Came back after a fix: #{res['id']} was resolved {str(res['at'])[:10]} with: {res['note']}")
    for host in incident["flaky_hosts"]:
        out.append(f"Host {host['host']} has {host['incidents']} hardware incidents ({', '.join(host['entries'])}): "
                   f"{host['drain']}")
    return out


def to_text(d: Diagnosis, markdown: bool = False, incident: dict | None = None, notes: list[str] | None = None) -> str:
    """Terminal (or markdown) report: verdict first, then evidence, origin, collateral, fix, verify."""
    h = (lambda s: f"### {s}") if markdown else (lambda s: f"{s}:")
    code = (lambda s: f"`{s}`") if markdown else (lambda s: s)
    out = [("## " if markdown else "") + verdict(d)]
    if notes:
        out += ["", h("Job")] + [f"  {n}" for n in notes]
    if hist := history_lines(incident):
        out += ["", h("History")] + [f"  {line}" for line in hist]
    if d.root is None:
        errors = d.likely_errors()
        if errors:
            out += ["", h("Most likely error lines")] + [f"  {m.line}: {m.text}" for m in errors]
        return "\n".join(out + _footer(d, incident)) + "\n"
    f = d.root
    out += ["", f.entry.data["summary"].strip(), "", h("Evidence")]
    out += [f"  {code(_loc(hit, d))} {hit.text}" for hit in f.hits]
    if started := where(d):
        out += ["", h("Started at") + " " + started]
    if prog := progress(d):
        out += [h("Progress") + " " + prog]
    collateral = [x for x in d.findings[1:] if x.role == "collateral"]
    if collateral:
        out += ["", h("Collateral (consequences, not the cause)")]
        out += [f"  - {x.entry.id}: {x.entry.title} (first at line {x.first.line})" for x in collateral]
    related_hits = [x for x in d.findings[1:] if x.role == "related"]
    if related_hits:
        out += ["", h("Also seen")] + [f"  - {x.entry.id}: {x.entry.title} (line {x.first.line})" for x in related_hits]
    out += ["", h("Fix") + " " + d.fill(f.entry.data["fix"]["summary"], f)] + _steps(d, f, markdown)
    out += ["", h("Verify") + " " + code(d.fill(f.entry.data["verify"], f))]
    if f.entry.related:
        out += ["", h("Related entries") + " " + ", ".join(f.entry.related)]
    return "\n".join(out + _footer(d, incident)) + "\n"


def _loc(hit: Hit, d: Diagnosis) -> str:
    loc = f"{d.scan.files[hit.file]}:{hit.line}" if len(d.scan.files) > 1 else f"line {hit.line}"
    return loc + ":"


def _footer(d: Diagnosis, incident: dict | None) -> list[str]:
    out = ["", f"Scanned {d.scan.lines} lines ({d.scan.bytes} bytes)."]
    if incident:
        out.append(f"Recorded as incident #{incident['id']} (signature {incident['signature']}).")
    return out + [f"warning: {w}" for w in d.warnings]
