"""`/diagnose`: a Slurm job id, help, an entry, a search, the history, or a pasted log.

A diagnosis goes to the channel (through the command's response_url where the bot is not a
member); help, look-ups, "no known failure" and low-confidence answers go to the user only."""
from __future__ import annotations

from slack_bolt.async_app import AsyncApp
from slack_sdk.web.async_client import AsyncWebClient

from bot.slack import blocks
from bot.slack.answers import Answer, private_answer
from bot.slack.replies import Deps, post_diagnosis, report_error
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


def register(app: AsyncApp, deps: Deps) -> None:
    async def ack_command(ack, command: dict) -> None:
        text = (command.get("text") or "").strip()
        if "\n" in text or len(text) > 200:
            await ack("Diagnosing the pasted log…")
        else:
            await ack()  # a job says so in the channel at once (its placeholder)

    async def run_command(respond, command: dict, client: AsyncWebClient) -> None:
        text = (command.get("text") or "").strip()
        word, _, rest = text.partition(" ")
        channel, user = command["channel_id"], command["user_id"]
        answer = Answer(client, respond=respond, user=user)

        async def tell(reply: str, **extra) -> None:  # look-ups and help: for the user only
            await respond(text=reply, response_type="ephemeral", **extra)

        try:
            if parse_jobid(text) is not None:
                await _job(answer, deps, text, channel, user)
            elif "\n" in text or len(text) > 200:
                d = await deps.scans.text(pasted_text(text), name="<slash command>")
                answer.private = private_answer(d)
                await post_diagnosis(answer, deps, d, channel, None, source="slack-command")
            elif word == "entry" and rest.strip() in deps.kb.entries:
                await tell(rest.strip(), blocks=blocks.entry_blocks(deps.kb.entries[rest.strip()]))
            elif word == "entry":
                await tell(f"No entry `{blocks.escape(rest.strip())}`. Try `/diagnose search <words>`.")
            elif word == "search" and rest.strip():
                found = search_entries(deps, rest)
                lines = [f"• `{e.id}` {e.title}" for e in found[:15]] or ["No entry matches."]
                await tell("*Entries*\n" + "\n".join(lines))
            elif word == "history":
                await tell(await history_text(deps, rest.strip()))
            else:
                await tell(USAGE if word in ("", "help") else f"I don't understand `{blocks.escape(text[:100])}`.\n{USAGE}")
        except Exception:  # noqa: BLE001
            await report_error(answer, channel, None, f"running /diagnose {text[:40]}", user=user)

    app.command("/diagnose")(ack=ack_command, lazy=[run_command])


async def _job(answer: Answer, deps: Deps, jobid: str, channel: str, user: str) -> None:
    """Reading Slurm can take a while: a placeholder in the channel at once, then the answer in its place."""
    from bot.sources.slurm import diagnose_job

    await answer.placeholder(channel, None, f":hourglass_flowing_sand: Diagnosing job `{jobid}`: reading Slurm's "
                                            "accounting and the end of its logs…")
    try:
        job = await diagnose_job(deps, jobid, slack_user=user, channel=channel)
    except JobError as exc:
        await answer.chat_postMessage(channel=channel, text=f":warning: {blocks.escape(str(exc))}")
        return
    answer.private = private_answer(job.diagnosis)
    await post_diagnosis(answer, deps, job.diagnosis, channel, None, source="slack-job", job=job.jobid,
                         notes=job.notes)
