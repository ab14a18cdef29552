"""The `trainmedic` command line. Diagnosing a file never imports the Slack stack."""
from __future__ import annotations

import sys

import click

from bot import __version__


def _epilog() -> str:
    from bot.config import settings_help

    return "Settings (environment variables):\n\n\b\n" + settings_help()


class UsageProblem(click.ClickException):
    """Bad input or usage: one line on stderr and exit status 2 (design.md's contract)."""

    exit_code = 2


def _load_kb():
    from bot.kb.load import KnowledgeError, load

    try:
        return load()
    except KnowledgeError as exc:
        raise UsageProblem(str(exc)) from None


@click.group(epilog=_epilog(), context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="trainmedic")
def main() -> None:
    """trainmedic: diagnose failing ML training and serving logs."""


@main.command()
@click.argument("paths", nargs=-1)
@click.option("--format", "fmt", type=click.Choice(["text", "json", "markdown"]), default="text", show_default=True)
@click.option("--job", "jobid", help="Slurm job id: alone, its logs and accounting are read; with paths, it names them.")
@click.option("--no-record", is_flag=True, help="Do not keep this diagnosis as an incident.")
def diagnose(paths: tuple[str, ...], fmt: str, jobid: str | None, no_record: bool) -> None:
    """Diagnose log files (gzip is read as is; '-' reads stdin), or a Slurm job with --job.

    Several files are one job, one file per rank."""
    from bot import render
    from bot.engine.diagnose import Diagnoser
    from bot.sources.files import InputError, diagnose_paths

    if not paths and not jobid:
        raise click.UsageError("give log files, '-' for stdin, or --job JOBID")
    diagnoser = Diagnoser(_load_kb())
    notes: list[str] = []
    try:
        if paths:
            d = diagnose_paths(diagnoser, list(paths), jobid=jobid)
        else:
            d, notes = _diagnose_job(diagnoser, jobid)
    except InputError as exc:
        raise UsageProblem(str(exc)) from None
    incident = None if no_record else _record(d, jobid)
    if fmt == "json":
        click.echo(render.dumps(d, incident, notes))
    else:
        click.echo(render.to_text(d, markdown=fmt == "markdown", incident=incident, notes=notes), nl=False)


def _diagnose_job(diagnoser, jobid: str):
    from bot.config import ConfigError, Settings
    from bot.sources.slurm import JobError, diagnose_job_sync

    try:
        job = diagnose_job_sync(diagnoser, Settings.from_env(), jobid)
    except (JobError, ConfigError) as exc:
        raise UsageProblem(str(exc)) from None
    return job.diagnosis, job.notes


def _record(d, jobid: str | None) -> dict | None:
    """Keep the diagnosis as an incident; a history that cannot be written must not lose the answer."""
    import sqlite3

    from bot.history.store import History

    try:
        history = History()
        try:
            return history.record(d, source="cli", job=jobid)
        finally:
            history.close()
    except (OSError, sqlite3.Error) as exc:
        click.echo(f"warning: incident not recorded ({exc}); set TRAINMEDIC_DB to a writable file", err=True)
        return None


@main.group()
def kb() -> None:
    """Browse and check the knowledge base."""


@kb.command("list")
@click.option("--format", "fmt", type=click.Choice(["text", "json"]), default="text", show_default=True)
def kb_list(fmt: str) -> None:
    """List every entry: id, category and title."""
    import json

    entries = sorted(_load_kb().entries.values(), key=lambda e: (e.data["category"], e.id))
    if fmt == "json":
        click.echo(json.dumps([{"id": e.id, "category": e.data["category"], "title": e.title} for e in entries], indent=2))
        return
    for e in entries:
        click.echo(f"{e.id:30} {e.data['category']:14} {e.title}")


@kb.command("show")
@click.argument("entry_id")
@click.option("--format", "fmt", type=click.Choice(["text", "json"]), default="text", show_default=True)
def kb_show(entry_id: str, fmt: str) -> None:
    """Show one entry the way a person reads it."""
    import json

    from bot.kb.load import KnowledgeError
    from bot.kb.page import entry_text

    try:
        entry = _load_kb().get(entry_id)
    except KnowledgeError as exc:
        raise UsageProblem(str(exc)) from None
    click.echo(json.dumps(entry.data, indent=2) if fmt == "json" else entry_text(entry))


@kb.command("check")
def kb_check() -> None:
    """Run every entry's examples and the benign corpus; exit 1 on any failure."""
    from bot.kbcheck import check, format_report

    report = check(_load_kb())
    click.echo(format_report(report))
    sys.exit(0 if report.ok else 1)


@kb.command("score")
@click.argument("folder", type=click.Path(exists=True, file_okay=False))
@click.option("--misses-only", is_flag=True, help="List only the cases diagnosed wrongly.")
def kb_score(folder: str, misses_only: bool) -> None:
    """Score the diagnosis on labelled logs: FOLDER/labels.yaml lists each case's right root.

    Prints each case, top-1 and top-3 accuracy, false alarms on healthy logs ('root: none') and
    how often each confidence word was right."""
    from pathlib import Path

    from bot.engine.diagnose import Diagnoser
    from bot.kbcheck import format_score, score

    if not (Path(folder) / "labels.yaml").is_file():
        raise UsageProblem(f"{folder}: no labels.yaml (a list of case, root, also_ok)")
    click.echo(format_score(score(Diagnoser(_load_kb()), Path(folder)), only_misses=misses_only))


@main.command()
@click.option("--port", type=int, default=3000, show_default=True, help="HTTP port (/slack/events, /healthz).")
@click.option("--socket-mode", is_flag=True, help="Connect to Slack over Socket Mode (SLACK_APP_TOKEN); /healthz stays on --port.")
@click.option("--host", default="0.0.0.0", show_default=True)
def serve(port: int, socket_mode: bool, host: str) -> None:
    """Run the Slack bot (HTTP mode by default)."""
    import asyncio
    import logging

    from bot.config import ConfigError, Settings
    from bot.slack.server import run

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        asyncio.run(run(Settings.from_env(), port, socket_mode, host))
    except ConfigError as exc:
        raise UsageProblem(str(exc)) from None


def _history():
    import sqlite3

    from bot.history.store import History

    try:
        return History()
    except (OSError, sqlite3.Error) as exc:
        raise UsageProblem(f"cannot open the incident history: {exc} (TRAINMEDIC_DB)") from None


FORMAT = click.option("--format", "fmt", type=click.Choice(["text", "json", "markdown", "csv"]), default="text",
                      show_default=True)
LIST_COLUMNS = ["id", "at", "entry", "status", "host", "job", "signature"]


@main.group()
def incidents() -> None:
    """Review the incident history (TRAINMEDIC_DB)."""


@incidents.command("list")
@click.option("--days", type=int, help="Only the last N days.")
@click.option("--entry", help="Only this knowledge entry id ('unknown' for unmatched logs).")
@click.option("--host", help="Only incidents that involve this host.")
@click.option("--status", type=click.Choice(["open", "resolved", "wrong"]))
@click.option("--limit", type=int, default=50, show_default=True)
@FORMAT
def incidents_list(days, entry, host, status, limit, fmt) -> None:
    """List recent incidents, newest first."""
    from bot.tables import render as table

    rows = _history().list(days=days, entry=entry, host=host, status=status, limit=limit)
    click.echo(table(rows, fmt, None if fmt == "json" else LIST_COLUMNS))


@incidents.command("show")
@click.argument("incident_id", type=int)
@FORMAT
def incidents_show(incident_id: int, fmt: str) -> None:
    """Show one incident: its evidence, feedback and links to earlier ones."""
    import json

    from bot.tables import render as table

    try:
        inc = _history().show(incident_id)
    except LookupError as exc:
        raise UsageProblem(str(exc)) from None
    if fmt == "json":
        click.echo(json.dumps(inc, indent=2, ensure_ascii=False))
        return
    head = {k: v for k, v in inc.items() if k not in ("evidence", "feedback", "links", "signature_text")}
    click.echo(table([head], fmt) if fmt == "csv" else "\n".join(f"{k}: {v}" for k, v in head.items() if v is not None))
    click.echo("\nevidence:")
    click.echo(table(inc["evidence"], fmt, ["role", "entry", "line", "rank", "host", "text"]))
    links = inc["links"]
    click.echo(f"\nseen {links['count']} time(s) since {links['first_seen']}" + (" - came back after a fix" if links["came_back"] else ""))
    if inc["feedback"]:
        click.echo("\nfeedback:")
        click.echo(table(inc["feedback"], fmt, ["at", "kind", "user", "entry", "note"]))


@incidents.command("stats")
@click.option("--days", type=int, default=7, show_default=True)
@FORMAT
def incidents_stats(days: int, fmt: str) -> None:
    """Counts by failure and by host, and the flaky hosts to drain."""
    import json

    from bot.tables import render as table

    stats = _history().stats(days)
    if fmt == "json":
        click.echo(json.dumps(stats, indent=2))
        return
    click.echo(f"{stats['incidents']} incidents in the last {days} days\n\nby failure:")
    click.echo(table(stats["by_entry"], fmt, ["entry", "incidents", "open", "last"]))
    click.echo("\nby host:")
    click.echo(table(stats["by_host"], fmt, ["host", "incidents", "hardware", "last"]))
    if stats["flaky_hosts"]:
        click.echo("\nflaky hosts (several hardware incidents):")
        click.echo(table(stats["flaky_hosts"], fmt, ["host", "incidents", "entries", "drain"]))


@incidents.command("search")
@click.argument("words", nargs=-1, required=True)
@click.option("--limit", type=int, default=50, show_default=True)
@FORMAT
def incidents_search(words, limit, fmt) -> None:
    """Incidents whose entry, title, job, host, note or evidence contain every word."""
    from bot.tables import render as table

    rows = _history().search(" ".join(words), limit=limit)
    click.echo(table(rows, fmt, None if fmt == "json" else LIST_COLUMNS))


@incidents.command("export")
@click.option("--feedback", is_flag=True, help="Export wrong-diagnosis reports as knowledge-base examples (YAML).")
@click.option("--days", type=int, help="Only the last N days.")
@FORMAT
def incidents_export(feedback: bool, days, fmt: str) -> None:
    """Export every incident (for a spreadsheet or another tool), or the feedback as KB examples."""
    from bot.tables import render as table

    history = _history()
    if feedback:
        import yaml

        examples = [{"name": f"incident {r['incident']}: diagnosed {r['diagnosed'] or 'nothing'}, was {r['right_entry']}",
                     "entry": r["right_entry"], "note": r["note"], "log": r["log"]} for r in history.feedback_examples()]
        click.echo(yaml.safe_dump(examples, sort_keys=False, allow_unicode=True) if examples else "# no feedback yet")
        return
    click.echo(table(history.list(days=days, limit=1_000_000), fmt))


if __name__ == "__main__":
    main()
