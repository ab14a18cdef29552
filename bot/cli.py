"""The `trainmedic` command line. Diagnosing a file never imports the Slack stack."""
from __future__ import annotations

import sys

import click

from bot import __version__

SETTINGS_HELP = """
Settings (environment variables):

\b
  TRAINMEDIC_KB_PATH       extra knowledge entry folders, colon-separated, layered over the shipped ones
  TRAINMEDIC_ENGINE        auto (default), hyperscan or re2: the multi-pattern engine
"""


class UsageProblem(click.ClickException):
    """Bad input or usage: one line on stderr and exit status 2 (design.md's contract)."""

    exit_code = 2


def _load_kb():
    from bot.knowledge import KnowledgeError, load

    try:
        return load()
    except KnowledgeError as exc:
        raise UsageProblem(str(exc)) from None


@click.group(epilog=SETTINGS_HELP, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="trainmedic")
def main() -> None:
    """trainmedic: diagnose failing ML training and serving logs."""


@main.command()
@click.argument("paths", nargs=-1, required=True)
@click.option("--format", "fmt", type=click.Choice(["text", "json", "markdown"]), default="text", show_default=True)
@click.option("--job", "jobid", help="Slurm job id the logs belong to (filled into the verification command).")
@click.option("--no-record", is_flag=True, help="Do not keep this diagnosis as an incident.")
def diagnose(paths: tuple[str, ...], fmt: str, jobid: str | None, no_record: bool) -> None:
    """Diagnose log files (gzip is read as is; '-' reads stdin). Several files are one job, one per rank."""
    from bot import render
    from bot.diagnose import Diagnoser
    from bot.sources import InputError

    diagnoser = Diagnoser(_load_kb())
    try:
        d = diagnoser.diagnose_paths(list(paths), jobid=jobid)
    except InputError as exc:
        raise UsageProblem(str(exc)) from None
    if fmt == "json":
        click.echo(render.dumps(d))
    else:
        click.echo(render.to_text(d, markdown=fmt == "markdown"), nl=False)


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

    from bot.entrypage import entry_text
    from bot.knowledge import KnowledgeError

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


if __name__ == "__main__":
    main()
