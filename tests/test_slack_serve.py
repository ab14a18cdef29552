"""`trainmedic serve` as a real process on a free port: HTTP mode and Socket Mode, against FakeSlack."""
import asyncio
import json
import os
import signal
import socket
import sys

import aiohttp
from faults import PASTE, free_port
from slack_fake import APP_TOKEN, BOT_TOKEN, SIGNING_SECRET, FakeSlack
from slackbot import event_body, message, signed_headers


async def _health(http: aiohttp.ClientSession, port: int) -> int | None:
    try:
        async with http.get(f"http://127.0.0.1:{port}/healthz") as resp:
            return resp.status
    except aiohttp.ClientError:
        return None


async def _until(predicate, timeout: float = 60.0, what: str = "") -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not await predicate():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.2)


async def _serve(tmp_path, fake: FakeSlack, *args: str, **env_extra):
    port = free_port()
    env = {**os.environ, "SLACK_BOT_TOKEN": BOT_TOKEN, "SLACK_SIGNING_SECRET": SIGNING_SECRET,
           "TRAINMEDIC_SLACK_API_URL": fake.api_url, "TRAINMEDIC_DB": str(tmp_path / "serve.db"), **env_extra}
    port_args = [] if "--port" in args else ["--port", str(port)]
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "bot.cli", "serve", *port_args, "--host", "127.0.0.1", *args,
        env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
    return proc, port


async def _stop(proc) -> bytes:
    proc.send_signal(signal.SIGTERM)
    out, _ = await asyncio.wait_for(proc.communicate(), 30)
    return out


def test_serve_http_mode_as_a_process(tmp_path):
    async def scenario():
        fake = await FakeSlack().start()
        proc, port = await _serve(tmp_path, fake)
        async with aiohttp.ClientSession() as http:
            try:
                await _until(lambda: _ready(http, port), what="/healthz 200")
                body = event_body(message(PASTE), "EvSERVE1")
                headers = {"Content-Type": "application/json", **signed_headers(body)}
                for retry in ("", "1"):  # the original delivery and Slack's retry of it
                    extra = {"X-Slack-Retry-Num": retry} if retry else {}
                    async with http.post(f"http://127.0.0.1:{port}/slack/events", data=body,
                                         headers={**headers, **extra}) as resp:
                        assert resp.status == 200
                await fake.wait_for("chat.postMessage")
                forged = {"Content-Type": "application/json", **signed_headers(body, secret="wrong")}
                async with http.post(f"http://127.0.0.1:{port}/slack/events", data=body, headers=forged) as resp:
                    assert resp.status == 401
                await asyncio.sleep(1.0)
                [reply] = fake.called("chat.postMessage")
                assert "cuda-oom" in str(reply.params["blocks"])
            finally:
                out = await _stop(proc)
                await fake.stop()
        assert proc.returncode == 0, out.decode()[-3000:]

    async def _ready(http, port):
        return await _health(http, port) == 200

    asyncio.run(scenario())


def test_serve_socket_mode_as_a_process_and_healthz_follows_the_socket(tmp_path):
    async def scenario():
        fake = await FakeSlack().start()
        proc, port = await _serve(tmp_path, fake, "--socket-mode", SLACK_APP_TOKEN=APP_TOKEN, SLACK_SIGNING_SECRET="")
        async with aiohttp.ClientSession() as http:
            try:
                await _until(lambda: _status_is(http, port, 200), what="socket connected")
                envelope = {"envelope_id": "env-1", "type": "events_api", "accepts_response_payload": False,
                            "payload": json.loads(event_body(message(PASTE), "EvSOCK1"))}
                await fake.sockets[0].send_str(json.dumps(envelope))
                [reply] = await fake.wait_for("chat.postMessage")
                assert "cuda-oom" in str(reply.params["blocks"])
                assert any(c.params.get("envelope_id") == "env-1" for c in fake.called("socket-ack"))
                fake.socket_accepts = False  # Slack goes away: the socket drops and cannot come back
                for ws in fake.sockets:
                    await ws.close()
                await _until(lambda: _status_is(http, port, 503), what="/healthz 503 while the socket is down")
            finally:
                out = await _stop(proc)
                await fake.stop()
        assert proc.returncode == 0, out.decode()[-3000:]

    async def _status_is(http, port, status):
        return await _health(http, port) == status

    asyncio.run(scenario())


def test_serve_refuses_to_start_without_its_secrets(tmp_path):
    async def scenario():
        fake = await FakeSlack().start()
        proc, _ = await _serve(tmp_path, fake, SLACK_SIGNING_SECRET="")
        out, _ = await asyncio.wait_for(proc.communicate(), 60)
        await fake.stop()
        assert proc.returncode == 2 and b"SLACK_SIGNING_SECRET" in out

    asyncio.run(scenario())


def test_every_start_up_failure_is_one_line_and_exit_2(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    held = tmp_path / "held.db"

    async def scenario():
        fake = await FakeSlack().start()
        try:
            cases = [
                ({"TRAINMEDIC_DB": str(blocker / "incidents.db")}, [], "cannot use the incident history"),
                ({"TRAINMEDIC_SHUTDOWN_GRACE": "ten"}, [], "TRAINMEDIC_SHUTDOWN_GRACE='ten'"),
                ({"TRAINMEDIC_ACK_BUDGET_MS": "0"}, [], "TRAINMEDIC_ACK_BUDGET_MS=0"),
                ({}, ["--port", str(taken.getsockname()[1])], "cannot listen on"),
            ]
            first, first_port = await _serve(tmp_path, fake, TRAINMEDIC_DB=str(held))  # a bot already serves held.db
            async with aiohttp.ClientSession() as http:
                await _until(lambda: _is_up(http, first_port), what="the first bot")
            cases.append(({"TRAINMEDIC_DB": str(held)}, [], "in use by another `trainmedic serve`"))
            for env, args, expect in cases:
                proc, _ = await _serve(tmp_path, fake, *args, **env)
                out, _ = await asyncio.wait_for(proc.communicate(), 60)
                text = out.decode()
                assert proc.returncode == 2, text[-2000:]
                assert "Traceback" not in text and expect in text.strip().splitlines()[-1], text[-2000:]
            await _stop(first)
        finally:
            await fake.stop()

    async def _is_up(http, port):
        return await _health(http, port) == 200

    asyncio.run(scenario())
    taken.close()
