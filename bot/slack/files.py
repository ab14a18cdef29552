"""Download log files shared in Slack, streaming to disk with a byte cap.

A file larger than the cap is fetched as its first and last halves (HTTP Range), because failures
are usually at the end; a gzip is fetched whole up to the cap (its tail cannot be cut out) and the
scanner caps the decompressed text. Slack answers a request without a valid bot token with its
HTML login page, which is reported as such instead of being diagnosed.

A shared file object is not always the file: Slack Connect sends only `{"id", "file_access":
"check_file_info"}` (files.info has the rest), a deleted file stays in its message as a
`"mode": "tombstone"` (files.info answers file_deleted), and the free plan hides older files as
`"mode": "hidden_by_limit"`. Each of those gets a sentence of its own; the other files of the
message are still diagnosed.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
from slack_sdk.errors import SlackApiError
from slack_sdk.web.async_client import AsyncWebClient

LOG_SUFFIXES = (".log", ".out", ".err", ".txt", ".gz")
_CHUNK = 1 << 16


class FetchError(Exception):
    """A file that cannot be diagnosed; the message is shown to the user as is."""


@dataclass
class Fetched:
    parts: list[tuple[str, str]] = field(default_factory=list)  # (path on disk, name shown)
    notes: list[str] = field(default_factory=list)


@dataclass
class Shared:
    """The files of a message (or a thread), sorted: what can be diagnosed and what cannot."""

    logs: list[dict] = field(default_factory=list)  # complete file objects of text logs
    problems: list[str] = field(default_factory=list)  # a sentence per file Slack will not hand over
    others: list[str] = field(default_factory=list)  # names of files that are not logs (pictures...)


# What files.info answers for a file that is gone, as the end of a sentence about it.
_FILES_INFO_ERRORS = {
    "file_deleted": "was deleted, so there is nothing to read",
    "file_not_found": "is no longer there, or the bot may not see it",
}


def is_log_file(meta: dict) -> bool:
    name = (meta.get("name") or "").lower()
    return name.endswith(LOG_SUFFIXES) or meta.get("filetype") in ("text", "gzip") or \
        (meta.get("mimetype") or "").startswith("text/plain")


def _label(meta: dict) -> str:
    return meta["name"] if meta.get("name") else f"A file ({meta.get('id', 'no id')})"


def unreadable(meta: dict) -> str | None:
    """Why Slack will not hand this shared file to the bot, as a sentence; None when it will."""
    mode, label = meta.get("mode"), _label(meta)
    if mode == "tombstone":
        return f"{label} was deleted, so there is nothing to read."
    if mode == "hidden_by_limit":
        return (f"{label} is hidden by the free plan's storage limit, and Slack lets nobody download it. "
                "Upload the log again, or paste its last lines.")
    if meta.get("file_access") == "access_denied":
        return f"{label} belongs to another organisation's workspace, which does not let the bot read it."
    if mode == "external" or meta.get("is_external"):
        return f"{label} is stored outside Slack ({meta.get('external_type') or 'a linked service'}): upload the log itself."
    return None


async def complete(client: AsyncWebClient, meta: dict) -> dict:
    """The whole file object (a shared one may be partial, as Slack Connect sends it); FetchError
    with the sentence to show when Slack will not hand the file over."""
    if problem := unreadable(meta):
        raise FetchError(problem)
    if meta.get("url_private_download") and meta.get("name") and meta.get("file_access") != "check_file_info":
        return meta
    try:
        full = (await client.files_info(file=meta["id"]))["file"]
    except SlackApiError as exc:
        error = exc.response.get("error")
        if error not in _FILES_INFO_ERRORS:
            raise
        raise FetchError(f"{_label(meta)} {_FILES_INFO_ERRORS[error]}.") from None
    if problem := unreadable(full):
        raise FetchError(problem)
    return full


async def sort_shared(client: AsyncWebClient, files: list[dict]) -> Shared:
    """Complete every shared file object and sort the files: logs, files Slack withholds, others."""
    out = Shared()
    for meta in files:
        try:
            meta = await complete(client, meta)
        except FetchError as exc:
            out.problems.append(str(exc))
            continue
        if is_log_file(meta):
            out.logs.append(meta)
        else:
            out.others.append(_label(meta))
    return out


def _looks_like_html(content_type: str, first: bytes) -> bool:
    head = first.lstrip()[:64].lower()
    return "text/html" in content_type or head.startswith((b"<!doctype html", b"<html"))


async def _get(session: aiohttp.ClientSession, url: str, token: str, dest: Path, limit: int,
               name: str, byte_range: str | None = None) -> tuple[int, bool]:
    """Stream url into dest, at most `limit` bytes; (bytes written, whether the cap cut it).

    A `bytes=-N` range asks for the tail; a server that ignores it is read through, keeping the
    last `limit` bytes only.
    """
    headers = {"Authorization": f"Bearer {token}"}
    if byte_range:
        headers["Range"] = byte_range
    async with session.get(url, headers=headers) as resp:
        if resp.status not in (200, 206):
            raise FetchError(f"{name}: Slack answered HTTP {resp.status} to the download; is the bot in this channel?")
        want_tail = bool(byte_range and byte_range.startswith("bytes=-") and resp.status == 200)
        kept: deque[bytes] = deque()
        written, first = 0, True
        with dest.open("wb") as out:
            async for chunk in resp.content.iter_chunked(_CHUNK):
                if first and _looks_like_html(resp.headers.get("Content-Type", ""), chunk):
                    raise FetchError(
                        f"{name}: Slack sent its login page instead of the file. The bot token needs the "
                        "files:read scope and the bot must be in the channel.")
                first = False
                if want_tail:
                    kept.append(chunk)
                    written += len(chunk)
                    while written - len(kept[0]) >= limit:
                        written -= len(kept.popleft())
                    continue
                room = limit - written
                out.write(chunk[:room])
                written += min(len(chunk), room)
                if written >= limit:
                    return written, True
            if want_tail:
                data = b"".join(kept)[-limit:]
                out.write(data)
                written = len(data)
    return written, False


async def fetch(session: aiohttp.ClientSession, meta: dict, token: str, folder: Path, max_bytes: int) -> Fetched:
    """Download one shared file into `folder`; a plain file over the cap comes as its head and tail."""
    name = meta.get("name") or meta.get("id") or "file"
    url = meta.get("url_private_download") or meta.get("url_private")
    if not url:
        raise FetchError(f"{name}: Slack gave no download address for it")
    size = int(meta.get("size") or 0)
    out = Fetched()
    safe = "".join(c if c.isalnum() or c in "._-" else "_" for c in name)[:80]
    gz = name.lower().endswith(".gz") or meta.get("filetype") == "gzip"
    if size > max_bytes and not gz:
        half = max_bytes // 2
        head, tail = folder / f"{safe}.head", folder / f"{safe}.tail"
        await _get(session, url, token, head, half, name, f"bytes=0-{half - 1}")
        await _get(session, url, token, tail, half, name, f"bytes=-{half}")
        out.parts = [(str(head), f"{name} (first {half >> 20} MB)"), (str(tail), f"{name} (last {half >> 20} MB)")]
        out.notes.append(f"{name} is {size >> 20} MB: scanned its first and last {half >> 20} MB")
        return out
    dest = folder / safe
    written, cut = await _get(session, url, token, dest, max_bytes, name)
    out.parts = [(str(dest), name)]
    if cut:
        out.notes.append(f"{name}: download stopped at the {max_bytes >> 20} MB cap; scanned what arrived")
    return out
