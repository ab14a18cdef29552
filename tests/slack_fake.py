"""A stand-in for Slack on 127.0.0.1: the Web API methods the bot calls, private file downloads
(only with a Bearer xoxb- token; the HTML login page otherwise), the external upload flow and a
Socket Mode websocket. Every call is recorded for the tests to assert on.

It keeps the messages the bot posted (with their metadata and files), so conversations.replies
and conversations.history can find them again, and it plays Slack's bad days: `go_down()` and
`come_up()` (nothing listens on the port), `outage` (every call answers that status: 503, or 429
with `retry_after`), `fail` (statuses for the next calls of one method), `slow` (a call that does
its work, then answers only after a delay: the bot's timeout fires) and `method_errors`.

Slack's answers where the bot is not welcome: `channel_errors` (channel -> not_in_channel or
channel_not_found for every post, ephemeral, edit, deletion, upload and read there), `file_errors`
(file id -> what files.info answers, e.g. file_deleted), `refused_responses` (response types that
the response_url refuses), and apps.connections.open refuses any token that is not an app token."""
from __future__ import annotations

import asyncio
import itertools
import json
import time
from dataclasses import dataclass, field

from aiohttp import WSMsgType, web

BOT_TOKEN = "xoxb-test-0000000000-abcdefghijklmnop"
APP_TOKEN = "xapp-1-A000-0000-abcdef"
SIGNING_SECRET = "8f742231b10e8888abcd99yyyzzz85a5"
LOGIN_PAGE = b"<!DOCTYPE html><html><head><title>Slack</title></head><body>Sign in to your workspace</body></html>"


@dataclass
class Call:
    method: str
    params: dict
    token: str | None
    at: float = field(default_factory=time.monotonic)


@dataclass
class FakeSlack:
    calls: list[Call] = field(default_factory=list)
    files: dict[str, tuple[dict, bytes]] = field(default_factory=dict)  # id -> (meta, content)
    thread: list[dict] = field(default_factory=list)  # what conversations.replies answers
    fail: dict[str, list[int]] = field(default_factory=dict)  # method (or response_url) -> statuses to answer first
    honour_range: bool = True
    socket_accepts: bool = True
    uploads: dict[str, bytes] = field(default_factory=dict)
    sockets: list = field(default_factory=list)
    messages: list[dict] = field(default_factory=list)  # what the bot posted and Slack kept
    outage: int | None = None  # every API call answers this status while set
    retry_after: float = 1
    slow: dict[str, list[float]] = field(default_factory=dict)  # method -> seconds to wait before answering
    channel_errors: dict[str, str] = field(default_factory=dict)  # channel -> error for every call there
    method_errors: dict[str, str] = field(default_factory=dict)  # method -> error (ok: false) for every call
    file_errors: dict[str, str] = field(default_factory=dict)  # file id -> what files.info answers
    refused_responses: set[str] = field(default_factory=set)  # response types the response_url refuses
    _ts: itertools.count = field(default_factory=lambda: itertools.count(1))
    _names: dict[str, str] = field(default_factory=dict)
    url: str = ""
    port: int = 0

    # -- the server --------------------------------------------------------------------------

    async def start(self) -> "FakeSlack":
        app = web.Application()
        app.router.add_post("/api/{method}", self._api)
        app.router.add_get("/api/{method}", self._api)
        app.router.add_get("/files/{file_id}", self._download)
        app.router.add_post("/upload/{file_id}", self._upload)
        app.router.add_get("/socket", self._socket)
        app.router.add_get("/login/{file_id}", self._login)
        app.router.add_post("/response/{cmd}", self._response)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        await self.come_up()
        self.url = f"http://127.0.0.1:{self.port}"
        return self

    async def come_up(self) -> None:
        self._site = web.TCPSite(self._runner, "127.0.0.1", self.port, reuse_address=True)
        await self._site.start()
        self.port = self._site._server.sockets[0].getsockname()[1]

    async def go_down(self) -> None:
        """Slack unreachable: the port refuses connections (open websockets are dropped)."""
        for ws in self.sockets:
            await ws.close()
        await self._site.stop()

    async def stop(self) -> None:
        for ws in self.sockets:
            await ws.close()
        await self._runner.cleanup()

    @property
    def api_url(self) -> str:
        return self.url + "/api/"

    def add_file(self, file_id: str, name: str, content: bytes, **meta) -> dict:
        info = {"id": file_id, "name": name, "size": len(content),
                "url_private_download": f"{self.url}/files/{file_id}", **meta}
        self.files[file_id] = (info, content)
        return info

    # -- assertions helpers ------------------------------------------------------------------

    def called(self, method: str) -> list[Call]:
        return [c for c in self.calls if c.method == method]

    def posted(self, channel: str | None = None) -> list[dict]:
        """The messages Slack kept (posts that succeeded, even when their answer came too late)."""
        return [m for m in self.messages if channel is None or m["channel"] == channel]

    def reply_keys(self) -> list[str]:
        return [m["metadata"]["event_payload"]["key"] for m in self.messages if m.get("metadata")]

    async def send_envelope(self, payload: dict, envelope_id: str, kind: str = "events_api") -> None:
        """Deliver over the newest Socket Mode connection, as Slack does."""
        envelope = {"envelope_id": envelope_id, "type": kind, "accepts_response_payload": kind != "events_api",
                    "payload": payload}
        await self.sockets[-1].send_str(json.dumps(envelope))

    def acked(self, envelope_id: str) -> list[Call]:
        return [c for c in self.called("socket-ack") if c.params.get("envelope_id") == envelope_id]

    async def wait_for(self, method: str, count: int = 1, timeout: float = 30.0) -> list[Call]:
        deadline = asyncio.get_running_loop().time() + timeout
        while len(self.called(method)) < count:
            if asyncio.get_running_loop().time() > deadline:
                raise AssertionError(f"{method} called {len(self.called(method))} times, wanted {count}: "
                                     f"{[c.method for c in self.calls]}")
            await asyncio.sleep(0.05)
        return self.called(method)

    # -- handlers ----------------------------------------------------------------------------

    async def _params(self, request: web.Request) -> dict:
        params = dict(request.query)  # the SDK sends some methods' arguments in the query string
        if request.method == "GET":
            return params
        if request.content_type == "application/json":
            return {**params, **await request.json()}
        params.update(await request.post())
        for key in ("blocks", "view"):
            if isinstance(params.get(key), str):
                params[key] = json.loads(params[key])
        return params

    async def _api(self, request: web.Request) -> web.Response:
        method = request.match_info["method"]
        params = await self._params(request)
        auth = request.headers.get("Authorization", "")
        token = auth.removeprefix("Bearer ") or params.get("token")
        self.calls.append(Call(method, params, token))
        statuses = self.fail.get(method)
        status = statuses.pop(0) if statuses else self.outage
        if status:
            headers = {"Retry-After": str(self.retry_after)} if status == 429 else {}
            return web.json_response({"ok": False, "error": "ratelimited" if status == 429 else "service_unavailable"},
                                     status=status, headers=headers)
        if token not in (BOT_TOKEN, APP_TOKEN):
            return web.json_response({"ok": False, "error": "invalid_auth"})
        if refusal := self._refusal(method, params, token):
            return web.json_response({"ok": False, "error": refusal})
        answer = self._answer(method, params)
        if self.slow.get(method):
            await asyncio.sleep(self.slow[method].pop(0))  # the work is done; the answer is late
        return web.json_response(answer)

    _IN_CHANNEL = ("chat.postMessage", "chat.postEphemeral", "chat.update", "chat.delete", "files.completeUploadExternal",
                   "conversations.replies", "conversations.history")

    def _refusal(self, method: str, params: dict, token: str) -> str | None:
        """The error Slack gives a well-formed call it will not do, or None."""
        if method == "apps.connections.open" and not token.startswith("xapp-"):
            return "not_allowed_token_type"
        if method in self._IN_CHANNEL and (params.get("channel") or params.get("channel_id")) in self.channel_errors:
            return self.channel_errors[params.get("channel") or params.get("channel_id")]
        if method == "files.info" and params.get("file") in self.file_errors:
            return self.file_errors[params["file"]]
        return self.method_errors.get(method)

    def _answer(self, method: str, params: dict) -> dict:
        ok = {"ok": True}
        if method == "auth.test":
            return {**ok, "user_id": "UBOT", "bot_id": "BBOT", "team_id": "T1", "user": "trainmedic"}
        if method in ("chat.postMessage", "chat.update"):
            ts = params.get("ts") or f"1700000000.{next(self._ts):06d}"
            if method == "chat.postMessage":
                self._keep(params["channel"], ts, params.get("thread_ts"), params.get("text"), params.get("metadata"))
            return {**ok, "channel": params.get("channel"), "ts": ts}
        if method == "conversations.replies":
            kept = [m for m in self.messages if m["channel"] == params["channel"] and m.get("thread_ts") == params["ts"]]
            return {**ok, "messages": self.thread + self._shown(kept, params), "has_more": False}
        if method == "conversations.history":
            kept = [m for m in self.messages if m["channel"] == params["channel"] and not m.get("thread_ts")]
            return {**ok, "messages": self._shown(kept, params)[::-1], "has_more": False}
        if method == "files.info":
            meta, _ = self.files[params["file"]]
            return {**ok, "file": meta}
        if method == "files.getUploadURLExternal":
            file_id = f"FUP{next(self._ts)}"
            self._names[file_id] = params.get("filename")
            return {**ok, "upload_url": f"{self.url}/upload/{file_id}", "file_id": file_id}
        if method == "files.completeUploadExternal":
            files = json.loads(params["files"]) if isinstance(params.get("files"), str) else params.get("files")
            self._keep(params.get("channel_id") or params.get("channel"), f"1700000000.{next(self._ts):06d}",
                       params.get("thread_ts"), "", None, files=[{"id": f["id"], "name": self._names.get(f["id"])}
                                                                  for f in files])
            return {**ok, "files": [{"id": f["id"]} for f in files]}
        if method == "apps.connections.open":
            return {**ok, "url": self.url.replace("http", "ws") + "/socket"}
        return ok

    def _keep(self, channel: str, ts: str, thread_ts: str | None, text: str | None, metadata, files=None) -> None:
        if isinstance(metadata, str):
            metadata = json.loads(metadata)
        self.messages.append({"channel": channel, "ts": ts, "thread_ts": thread_ts, "text": text or "", "user": "UBOT",
                              "bot_id": "BBOT", "metadata": metadata, "files": files or []})

    @staticmethod
    def _shown(messages: list[dict], params: dict) -> list[dict]:
        """Slack returns metadata only when asked (include_all_metadata)."""
        with_meta = str(params.get("include_all_metadata")).lower() in ("1", "true")
        return [{k: v for k, v in m.items() if with_meta or k != "metadata"} for m in messages]

    async def _download(self, request: web.Request) -> web.StreamResponse:
        auth = request.headers.get("Authorization", "")
        if not auth.startswith("Bearer xoxb-"):
            return web.Response(body=LOGIN_PAGE, content_type="text/html")
        meta, content = self.files[request.match_info["file_id"]]
        self.calls.append(Call("download", {"file": meta["id"], "range": request.headers.get("Range")}, auth[7:]))
        rng = request.headers.get("Range")
        if rng and self.honour_range:
            start, _, end = rng.removeprefix("bytes=").partition("-")
            if start == "":
                part = content[-int(end):]
            else:
                part = content[int(start): int(end) + 1 if end else None]
            return web.Response(body=part, status=206, content_type="application/octet-stream")
        return web.Response(body=content, content_type="application/octet-stream")

    async def _login(self, request: web.Request) -> web.Response:
        """A URL that answers the login page whatever the token: what Slack does without files:read."""
        return web.Response(body=LOGIN_PAGE, content_type="text/html")

    async def _response(self, request: web.Request) -> web.Response:
        message = await request.json()
        self.calls.append(Call("response_url", message, None))
        if self.fail.get("response_url"):
            return web.Response(status=self.fail["response_url"].pop(0), text="service_unavailable")
        if message.get("response_type", "ephemeral") in self.refused_responses:
            return web.Response(status=404, text="channel_not_found")
        return web.Response(text="ok")

    async def _upload(self, request: web.Request) -> web.Response:
        self.uploads[request.match_info["file_id"]] = await request.read()
        return web.Response(text="OK")

    async def _socket(self, request: web.Request) -> web.StreamResponse:
        if not self.socket_accepts:
            return web.Response(status=503)
        ws = web.WebSocketResponse()
        await ws.prepare(request)
        self.sockets.append(ws)
        await ws.send_str(json.dumps({"type": "hello", "num_connections": 1}))
        async for msg in ws:
            if msg.type == WSMsgType.TEXT:
                self.calls.append(Call("socket-ack", json.loads(msg.data), None))
        return ws
