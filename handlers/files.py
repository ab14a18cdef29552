"""Uploaded log files (`file_share`): several files in one message are one job and get one reply."""
from __future__ import annotations

import tempfile
from pathlib import Path

from slack_bolt.async_app import AsyncApp
from slack_sdk.web.async_client import AsyncWebClient

from bot.slack.files import FetchError, fetch, is_log_file
from bot.slack.replies import Deps, post_diagnosis, say
from bot.sources.files import InputError, open_log


def register(app: AsyncApp, deps: Deps) -> None:
    @app.event({"type": "message", "subtype": "file_share"})
    async def on_file_share(event: dict, client: AsyncWebClient) -> None:
        if event.get("bot_id"):
            return
        thread = event.get("thread_ts") or event["ts"]
        files = [f for f in event.get("files") or [] if is_log_file(f)]
        if not files:
            return  # a picture or a PDF in a channel: not ours to comment on
        await diagnose_shared_files(client, deps, files, event["channel"], thread)


async def _complete(client: AsyncWebClient, meta: dict) -> dict:
    """file_share events may carry a partial file object; files.info has the rest."""
    if meta.get("url_private_download") and meta.get("name"):
        return meta
    return (await client.files_info(file=meta["id"]))["file"]


def _not_text(path: str, name: str) -> str | None:
    """Why a downloaded file cannot be diagnosed (binary, an archive...), or None."""
    try:
        with open(path, "rb") as raw, open_log(raw, name, []):
            return None
    except InputError as exc:
        return f"{exc}: skipped. Upload the text log (.log, .out, .err, .txt or .gz)."


async def diagnose_shared_files(client: AsyncWebClient, deps: Deps, files: list[dict], channel: str, thread: str,
                                extra_text: str | None = None) -> None:
    """Download every log file, diagnose them as one job, reply once in the thread."""
    settings = deps.settings
    with tempfile.TemporaryDirectory(prefix="trainmedic-") as tmp:
        parts, notes, problems = [], [], []
        for meta in files:
            meta = await _complete(client, meta)
            if not is_log_file(meta):
                notes.append(f"{meta.get('name')}: skipped, not a log file (.log .out .err .txt .gz)")
                continue
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
            await say(deps, channel, thread, ":warning: " + " ".join(problems or notes or ["Nothing to diagnose."]))
            return
        d = await deps.scans.files(parts, max_bytes=settings.max_log_bytes)
        await post_diagnosis(deps, d, channel, thread, source="slack-file", notes=problems + notes + d.warnings)
