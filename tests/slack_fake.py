"""A stand-in for Slack on 127.0.0.1: the Web API methods the bot calls, private file downloads
(only with a Bearer xoxb- token; the HTML login page otherwise), the external upload flow and a
Socket Mode websocket. Every call is recorded for the tests to assert on.

Slack's answers where the bot is not welcome: `not_member` (channel -> not_in_channel or
channel_not_found for every post, ephemeral, edit and upload there), `file_errors` (file id ->
what files.info answers, e.g. file_deleted), `refused_responses` (response types that the
response_url refuses), and apps.connections.open refuses any token that is not an app token."""
from __future__ import annotations

import asyncio
import itertools
import json
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


@dataclass
class FakeSlack:
    calls: list[Call] = field(default_factory=list)
    files: dict[str, tuple[dict, bytes]] = field(default_factory=dict)  # id -> (meta, content)
    thread: list[dict] = field(default_factory=list)  # what conversations.replies answers
    fail: dict[str, list[int]] = field(default_factory=dict)  # method -> statuses to answer first (429, 500)
    honour_range: bool = True
    socket_accepts: bool = True
    uploads: dict[str, bytes] = field(default_factory=dict)
    sockets: list = field(default_factory=list)
    not_member: dict[str, str] = field(default_factory=dict)
    file_errors: dict[str, str] = field(default_factory=dict)
    refused_responses: set[str] = field(default_factory=set)
    _ts: itertools.count = field(default_factory=lambda: itertools.count(1))
    url: str = ""

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
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"
        return self

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
        if statuses:
            status = statuses.pop(0)
            headers = {"Retry-After": "1"} if status == 429 else {}
            return web.json_response({"ok": False, "error": "ratelimited" if status == 429 else "fatal_error"},
                                     status=status, headers=headers)
        if token not in (BOT_TOKEN, APP_TOKEN):
            return web.json_response({"ok": False, "error": "invalid_auth"})
        if refusal := self._refusal(method, params, token):
            return web.json_response({"ok": False, "error": refusal})
        return web.json_response(self._answer(method, params))

    _IN_CHANNEL = ("chat.postMessage", "chat.postEphemeral", "chat.update", "chat.delete", "files.completeUploadExternal")

    def _refusal(self, method: str, params: dict, token: str) -> str | None:
        """The error Slack gives a well-formed call it will not do, or None."""
        if method == "apps.connections.open" and not token.startswith("xapp-"):
            return "not_allowed_token_type"
        if method in self._IN_CHANNEL:
            return self.not_member.get(params.get("channel") or params.get("channel_id"))
        if method == "files.info":
            return self.file_errors.get(params.get("file"))
        return None

    def _answer(self, method: str, params: dict) -> dict:
        ok = {"ok": True}
        if method == "auth.test":
            return {**ok, "user_id": "UBOT", "bot_id": "BBOT", "team_id": "T1", "user": "trainmedic"}
        if method in ("chat.postMessage", "chat.update"):
            ts = params.get("ts") or f"1700000000.{next(self._ts):06d}"
            return {**ok, "channel": params.get("channel"), "ts": ts}
        if method == "conversations.replies":
            return {**ok, "messages": self.thread, "has_more": False}
        if method == "files.info":
            meta, _ = self.files[params["file"]]
            return {**ok, "file": meta}
        if method == "files.getUploadURLExternal":
            file_id = f"FUP{next(self._ts)}"
            return {**ok, "upload_url": f"{self.url}/upload/{file_id}", "file_id": file_id}
        if method == "files.completeUploadExternal":
            return {**ok, "files": [{"id": f["id"]} for f in json.loads(params["files"])]} \
                if isinstance(params.get("files"), str) else {**ok, "files": params.get("files")}
        if method == "apps.connections.open":
            return {**ok, "url": self.url.replace("http", "ws") + "/socket"}
        return ok

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
