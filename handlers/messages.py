"""Pasted logs: a message that carries a failure gets the diagnosis in its thread; chatter gets silence.
A thread reply also sent to the channel (`thread_broadcast`) counts as a message; edits, deletions,
joins, other bots' posts and subtypes this module does not name are ignored. A mention (or a DM)
always gets an answer: a diagnosis when there is a log (in a mention, the thread's parent, earlier
replies and their files), a short help otherwise. Errors are not caught here: the delivery worker
retries the request, and tells the user if it gives up."""
from __future__ import annotations

from slack_bolt.async_app import AsyncApp
from slack_sdk.web.async_client import AsyncWebClient

from bot.engine.diagnose import Diagnosis
from bot.engine.logshape import looks_like_log
from bot.slack.files import sort_shared
from bot.slack.replies import Deps, Target, answers_message, post_diagnosis, say
from bot.slack.text import message_text
from handlers.commands import USAGE
from handlers.files import answer_upload, diagnose_shared

HELP = ("I diagnose failing ML training and serving logs. Paste a log here (a code block is best), upload "
        "`.log`, `.out`, `.err`, `.txt` or `.gz` files, or mention me in a thread that holds one.\n" + USAGE)


def is_log(d: Diagnosis, text: str) -> bool:
    """Whether to diagnose `text` (scanned as `d`) or answer with help: a known failure, or log-shaped lines."""
    return d.root is not None or looks_like_log(text)


def register(app: AsyncApp, deps: Deps) -> None:
    @app.event({"type": "message", "subtype": (None, "thread_broadcast")})
    async def on_message(event: dict, client: AsyncWebClient, context) -> None:
        if event.get("bot_id") or event.get("hidden"):
            return  # other bots, and ourselves (Bolt drops our own events too)
        bot_user = context.get("bot_user_id")
        if bot_user and f"<@{bot_user}>" in (event.get("text") or ""):
            return  # the app_mention listener answers this one
        if event.get("files"):  # a broadcast reply that shares files
            return await answer_upload(client, deps, event)
        direct = event.get("channel_type") == "im"
        target = Target(event["channel"], event.get("thread_ts") or event["ts"])
        text = message_text(event)
        d = await deps.scans.text(text)
        if d.root is not None or (direct and is_log(d, text)):
            await post_diagnosis(deps, d, target, source="slack-paste")
        elif direct:
            await say(deps, Target(event["channel"]), HELP)

    @app.event("app_mention")
    async def on_mention(event: dict, client: AsyncWebClient, context) -> None:
        if event.get("bot_id") or event.get("subtype"):
            return  # a bot, or a mention in a canvas (document_mention): no thread to read
        if not await answers_message(deps, event["channel"], event["ts"]):
            return  # the file_share of this same message answers it
        target = Target(event["channel"], event.get("thread_ts") or event["ts"])
        await answer_thread(client, deps, target, event, context.get("bot_user_id"))


async def answer_thread(client: AsyncWebClient, deps: Deps, target: Target, event: dict, bot_user: str | None) -> None:
    """Diagnose the thread's parent, the replies before the mention, and files shared in them."""
    resp = await client.conversations_replies(channel=target.channel, ts=target.thread_ts, limit=200)
    messages = [m for m in resp.get("messages", []) if float(m["ts"]) <= float(event["ts"])] or [event]
    texts, files = [], []
    for m in messages:
        if m.get("bot_id") or (bot_user and m.get("user") == bot_user):
            continue  # our own earlier answers are not part of the log
        texts.append(message_text(m))
        files += m.get("files") or []
    text = "\n".join(texts)
    shared = await sort_shared(client, files)
    if shared.logs or shared.problems:
        await diagnose_shared(deps, shared, target, extra_text=text)
        return
    d = await deps.scans.text(text, name="<thread>")
    if is_log(d, text):
        await post_diagnosis(deps, d, target, source="slack-mention")
    else:
        await say(deps, target, HELP)
