"""Uploaded log files (`file_share`): several files in one message are one job and get one reply.
A message that also mentions the bot is answered once, by whichever request claims it first; a big
upload gets a placeholder at once, which the answer (or the error) then replaces."""
from __future__ import annotations

import tempfile
from pathlib import Path

from slack_bolt.async_app import AsyncApp
from slack_sdk.web.async_client import AsyncWebClient

from bot.slack.blocks import escape
from bot.slack.files import FetchError, Shared, fetch, sort_shared
from bot.slack.replies import (
    Deps,
    Target,
    answers_message,
    placeholder,
    post_diagnosis,
    say,
)
from bot.sources.files import InputError, open_log

SLOW_BYTES = 64 << 20  # uploads this big (together) take long enough to deserve a placeholder


def register(app: AsyncApp, deps: Deps) -> None:
    @app.event({"type": "message", "subtype": "file_share"})
    async def on_file_share(event: dict, client: AsyncWebClient) -> None:
        if not event.get("bot_id"):
            await answer_upload(client, deps, event)


async def answer_upload(client: AsyncWebClient, deps: Deps, event: dict) -> None:
    """A message that shares files: its logs diagnosed as one job, one reply in its thread."""
    shared = await sort_shared(client, event.get("files") or [])
    if not shared.logs and not shared.problems:
        return  # a picture or a PDF in a channel: not ours to comment on
    if not await answers_message(deps, event["channel"], event["ts"]):
        return  # the app_mention of this same message answers it
    await diagnose_shared(deps, shared, Target(event["channel"], event.get("thread_ts") or event["ts"]))


def progress_text(files: list[dict]) -> str | None:
    """The placeholder for downloading and scanning these files, or None when they are quick."""
    size = sum(int(f.get("size") or 0) for f in files)
    if size < SLOW_BYTES:
        return None
    names = ", ".join(f"`{escape(f.get('name') or f['id']).replace('`', '')}`" for f in files)
    return f":hourglass_flowing_sand: Diagnosing {names} ({size / (1 << 20):,.0f} MB)…"


def _not_text(path: str, name: str) -> str | None:
    """Why a downloaded file cannot be diagnosed (binary, an archive...), or None."""
    try:
        with open(path, "rb") as raw, open_log(raw, name, []):
            return None
    except InputError as exc:
        return f"{exc}: skipped. Upload the text log (.log, .out, .err, .txt or .gz)."


async def diagnose_shared(deps: Deps, shared: Shared, target: Target, extra_text: str | None = None) -> None:
    """Download every log file, diagnose them (and `extra_text`) as one job, reply once in the thread."""
    settings = deps.settings
    if shown := progress_text(shared.logs):
        target = await placeholder(deps, target, shown)
    problems = list(shared.problems)
    notes = [f"{name}: skipped, not a log file (.log .out .err .txt .gz)" for name in shared.others]
    with tempfile.TemporaryDirectory(prefix="trainmedic-") as tmp:
        parts = []
        for meta in shared.logs:
            try:
                fetched = await fetch(deps.session(), meta, settings.slack_bot_token or "", Path(tmp),
                                      settings.max_download_bytes)
            except FetchError as exc:
                problems.append(str(exc))
                continue
            for path, name in fetched.parts:
                if problem := _not_text(path, name):
                    problems.append(problem)  # one binary must not cost the other files their answer
                else:
                    parts.append((path, name))
            notes += fetched.notes
        if extra_text and extra_text.strip():
            pasted = Path(tmp) / "thread.txt"
            pasted.write_text(extra_text)
            parts.append((str(pasted), "<thread>"))
        if not parts:
            await say(deps, target, ":warning: " + escape(" ".join(problems or notes or ["Nothing to diagnose."])))
            return
        d = await deps.scans.files(parts, max_bytes=settings.max_log_bytes)
        await post_diagnosis(deps, d, target, source="slack-file", notes=problems + notes + d.warnings)
