"""`/diagnose`: a Slurm job id, help, an entry, a search, the history, or a pasted log.

A diagnosis goes to the channel (through the command's response_url where the bot is not a
member); help, look-ups, "no known failure" and low-confidence answers go to the user only. Every
answer is an outbox row; errors are not caught here (the delivery worker retries the command and
tells its user if it gives up)."""
from __future__ import annotations

from dataclasses import replace

from slack_bolt.async_app import AsyncApp

from bot.engine.diagnose import WELL_SUPPORTED, Diagnosis
from bot.slack import blocks
from bot.slack.replies import (
    Deps,
    Target,
    command_target,
    placeholder,
    post_diagnosis,
    say,
)
from bot.slack.text import pasted_text
from bot.sources.slurm import JobError, parse_jobid

USAGE = """*Usage*
• `/diagnose <jobid>` - diagnose a Slurm job from its logs and accounting (`123`, `123_4`, `123+1`, `123.batch`)
• `/diagnose <pasted log>` - diagnose the text you paste after the command
• `/diagnose entry <id>` - show a knowledge entry
• `/diagnose search <words>` - find knowledge entries
• `/diagnose history [entry|host|days]` - recent incidents
• `/diagnose help` - this message"""


def search_entries(deps: Deps, words: str) -> list:
    terms = words.lower().split()
    scored = []
    for e in deps.kb.entries.values():
        hay = " ".join([e.id, e.title, " ".join(e.data["tags"]), e.data["summary"]]).lower()
        score = sum(hay.count(t) for t in terms) if all(t in hay for t in terms) else 0
        if score:
            scored.append((score, e))
    return [e for _, e in sorted(scored, key=lambda p: (-p[0], p[1].id))]


async def history_text(deps: Deps, arg: str) -> str:
    """`history`, `history 30` (days), `history cuda-oom` (entry) or `history node12` (host)."""
    days, entry, host = 7, None, None
    if arg.isdigit():
        days = int(arg)
    elif arg in deps.kb.entries or arg == "unknown":
        entry, days = arg, None
    elif arg:
        host, days = arg, None
    rows = await deps.history.call("list", days=days, entry=entry, host=host, limit=20)
    title = f"Incidents {'in the last %d days' % days if days else 'for ' + (entry or host)}"
    if not rows:
        return f"*{title}*: none."
    lines = [f"• #{r['id']} {r['at'][:16].replace('T', ' ')} *{r.get('entry') or 'unknown'}* {r['status']}"
             + (f" · {r['host']}" if r.get("host") else "") + (f" · job {r['job']}" if r.get("job") else "")
             for r in rows]
    return f"*{title}*\n" + "\n".join(lines)


def ack_text(command: dict) -> str | None:
    """What the acknowledgement says at once (the intake sends it when it has stored the command)."""
    text = (command.get("text") or "").strip()
    if parse_jobid(text) is not None:
        return f"Diagnosing job {text}…"
    if "\n" in text or len(text) > 200:
        return "Diagnosing the pasted log…"
    return None


def private_answer(d: Diagnosis) -> bool:
    """Whether a command's diagnosis goes to its user only: nothing known, or a weak guess."""
    return d.root is None or d.root.score < WELL_SUPPORTED


def register(app: AsyncApp, deps: Deps) -> None:
    @app.command("/diagnose")
    async def run_command(ack, command: dict) -> None:
        await ack()  # already acknowledged by the intake; this run is the stored command's replay
        text = (command.get("text") or "").strip()
        word, _, rest = text.partition(" ")
        target = command_target(command)
        to_user = replace(target, private=True)  # look-ups and help
        if parse_jobid(text) is not None:
            await _job(deps, text, target, command["user_id"])
        elif "\n" in text or len(text) > 200:
            d = await deps.scans.text(pasted_text(text), name="<slash command>")
            await post_diagnosis(deps, d, replace(target, private=private_answer(d)), source="slack-command")
        elif word == "entry" and rest.strip() in deps.kb.entries:
            await say(deps, to_user, rest.strip(), blocks.entry_blocks(deps.kb.entries[rest.strip()]))
        elif word == "entry":
            await say(deps, to_user, f"No entry `{blocks.escape(rest.strip())}`. Try `/diagnose search <words>`.")
        elif word == "search" and rest.strip():
            found = search_entries(deps, rest)
            lines = [f"• `{e.id}` {e.title}" for e in found[:15]] or ["No entry matches."]
            await say(deps, to_user, "*Entries*\n" + "\n".join(lines))
        elif word == "history":
            await say(deps, to_user, await history_text(deps, rest.strip()))
        else:
            await say(deps, to_user, USAGE if word in ("", "help") else
                      f"I don't understand `{blocks.escape(text[:100])}`.\n{USAGE}")


async def _job(deps: Deps, jobid: str, target: Target, user: str) -> None:
    """Reading Slurm can take a while: a placeholder in the channel at once, then the answer in its place."""
    from bot.sources.slurm import diagnose_job

    target = await placeholder(deps, target, f":hourglass_flowing_sand: Diagnosing job `{jobid}`: reading Slurm's "
                                             "accounting and the end of its logs…")
    try:
        job = await diagnose_job(deps, jobid, slack_user=user, channel=target.channel)
    except JobError as exc:
        await say(deps, target, f":warning: {blocks.escape(str(exc))}")
        return
    await post_diagnosis(deps, job.diagnosis, replace(target, private=private_answer(job.diagnosis)), source="slack-job",
                         job=job.jobid, notes=job.notes)
