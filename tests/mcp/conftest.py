"""Harness for the `loopx mcp` tests: a real broker (`loopx serve` on a free
loopback port with its own data dir), a fake Lark for the reply path, and
`loopx mcp` driven over stdio by the official MCP Python SDK.

LOOPX_BIN names the loopx binary (tests/mcp/run.sh sets it).
"""

import hashlib
import json
import os
import secrets
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.request
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Literal

import anyio
import pytest
from mcp.client import ClientSession, NotificationBinding
from mcp.client.stdio import StdioServerParameters, stdio_client
from pydantic import BaseModel

LOOPX = os.path.abspath(os.environ.get("LOOPX_BIN", "target/debug/loopx"))
HOST_SURFACE = "claude-code"
CHANNEL_EVENT = "notifications/claude/channel"
PERMISSION_REQUEST = "notifications/claude/channel/permission_request"
PERMISSION_ANSWER = "notifications/claude/channel/permission"
LARK_APP_ID = "cli_mcp_test_app"
LARK_APP_SECRET = "mcp-test-secret"
LARK_VERIFICATION_TOKEN = "mcp-test-verification-token"


@pytest.fixture
def anyio_backend():
    return "asyncio"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def unique(prefix: str) -> str:
    return f"{prefix}-{secrets.token_hex(6)}"


class Broker:
    """A real `loopx serve` on loopback, with the owner token."""

    def __init__(self, workdir: Path, port: int | None = None, token: str | None = None, lark_url: str | None = None,
                 env: dict[str, str] | None = None):
        self.workdir = workdir
        self.env = env or {}
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.token = token or secrets.token_hex(16)
        self.lark_url = lark_url
        self.process: subprocess.Popen | None = None

    def start(self) -> "Broker":
        args = [LOOPX, "serve", "--listen", f"127.0.0.1:{self.port}", "--data-dir", str(self.workdir / "data")]
        if self.lark_url:
            args += [
                "--lark-app-id", LARK_APP_ID, "--lark-app-secret", LARK_APP_SECRET,
                "--lark-verification-token", LARK_VERIFICATION_TOKEN, "--lark-base-url", self.lark_url,
            ]
        env = dict(os.environ, LOOPX_TOKEN=self.token, LOOPX_LOG="warn", **self.env)
        log = open(self.workdir / f"broker-{self.port}.log", "a")
        self.process = subprocess.Popen(args, env=env, stdout=log, stderr=log, stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            try:
                urllib.request.urlopen(f"{self.url}/healthz", timeout=1).read()
                return self
            except OSError:
                time.sleep(0.05)
        raise RuntimeError("the broker did not start")

    def stop(self) -> None:
        if self.process and self.process.poll() is None:
            self.process.terminate()
            self.process.wait(timeout=15)

    def api(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(f"{self.url}{path}", data=data, method=method)
        request.add_header("Authorization", f"Bearer {self.token}")
        if data is not None:
            request.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(request, timeout=10) as response:
                return response.status, json.loads(response.read() or b"null")
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read() or b"null")

    def ok(self, method: str, path: str, body: Any = None) -> Any:
        status, answer = self.api(method, path, body)
        assert 200 <= status < 300, (method, path, status, answer)
        return answer

    def bind(self, host_session_id: str) -> str:
        """Registers and binds a host session; answers the session id."""
        thread = {"goal_id": "g-mcp", "agent_id": "agent-mcp", "host_surface": HOST_SURFACE,
                  "host_session_id": host_session_id}
        self.ok("POST", "/v1/agent-threads", thread)
        session = self.ok("POST", "/v1/sessions", {**thread, "executor_endpoint_id": "exec-mcp"})
        return session["session_id"]

    def send(self, session_id: str, text: str) -> dict:
        return self.ok("POST", f"/v1/sessions/{session_id}/messages", {"origin": "web", "text": text})

    def turn(self, session_id: str, turn_id: str) -> dict:
        return self.ok("GET", f"/v1/sessions/{session_id}/turns/{turn_id}")

    def wait_turn(self, session_id: str, turn_id: str, done, within: float = 10) -> dict:
        deadline = time.monotonic() + within
        while True:
            turn = self.turn(session_id, turn_id)
            if done(turn):
                return turn
            assert time.monotonic() < deadline, f"the turn did not get there: {turn}"
            time.sleep(0.05)


@pytest.fixture
def broker(tmp_path):
    b = Broker(tmp_path).start()
    yield b
    b.stop()


# --- a fake Lark: tenant tokens and the reply API, recording every reply ---


@dataclass
class FakeLark:
    url: str = ""
    replies: list = field(default_factory=list)
    # New messages the bot posted (send-message API): {"chat_id", "uuid", "text"}.
    messages: list = field(default_factory=list)
    # Updates of a permission card to its final form: {"message_id", "card"}.
    patches: list = field(default_factory=list)
    server: ThreadingHTTPServer | None = None

    def replies_to(self, message_id: str) -> list:
        return [r for r in self.replies if r["message_id"] == message_id]

    def messages_in(self, chat_id: str) -> list:
        return [m for m in self.messages if m["chat_id"] == chat_id]


def sent_text(body: dict) -> str:
    """The text of a message the bot sent: a `text` message's text, or the
    `markdown` elements of an `interactive` 2.0 card (answers go out so)."""
    content = json.loads(body["content"])
    if body.get("msg_type") == "interactive":
        elements = content.get("body", {}).get("elements", [])
        return "".join(e["content"] for e in elements if e.get("tag") == "markdown")
    return content["text"]


@pytest.fixture
def fake_lark():
    fake = FakeLark()

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):  # quiet
            pass

        def answer(self, body: dict):
            data = json.dumps(body).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json; charset=utf-8")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
            if self.path == "/open-apis/auth/v3/tenant_access_token/internal":
                return self.answer({"code": 0, "msg": "ok", "tenant_access_token": "t-fake", "expire": 7200})
            parts = self.path.split("/")
            if self.path == "/open-apis/im/v1/messages?receive_id_type=chat_id":
                card = json.loads(body["content"]) if body.get("msg_type") == "interactive" else None
                fake.messages.append({"chat_id": body["receive_id"], "uuid": body.get("uuid"),
                                      "text": sent_text(body), "card": card})
                return self.answer({"code": 0, "msg": "success", "data": {"message_id": unique("om_sent")}})
            if self.path.startswith("/open-apis/im/v1/messages/") and parts[-1] == "reply":
                fake.replies.append({"message_id": parts[-2], "uuid": body.get("uuid"),
                                     "text": sent_text(body)})
                return self.answer({"code": 0, "msg": "success", "data": {"message_id": unique("om_reply")}})
            self.send_response(404)
            self.end_headers()

        def do_PATCH(self):
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
            fake.patches.append({"message_id": self.path.split("/")[-1],
                                 "card": json.loads(body.get("content", "null"))})
            return self.answer({"code": 0, "msg": "success", "data": {}})

    fake.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    fake.url = f"http://127.0.0.1:{fake.server.server_address[1]}"
    threading.Thread(target=fake.server.serve_forever, daemon=True).start()
    yield fake
    fake.server.shutdown()


def lark_event(broker: Broker, chat_id: str, message_id: str, text: str, sender: str = "ou_mcp_test") -> None:
    """Delivers a signed `im.message.receive_v1` text event from `sender` (an
    open id) to the broker's webhook, as Lark does."""
    now = str(int(time.time()))
    event = {
        "schema": "2.0",
        "header": {"event_id": unique("ev"), "event_type": "im.message.receive_v1", "create_time": now + "000",
                   "token": LARK_VERIFICATION_TOKEN, "app_id": LARK_APP_ID, "tenant_key": "tenant"},
        "event": {
            "sender": {"sender_id": {"open_id": sender}, "sender_type": "user", "tenant_key": "tenant"},
            "message": {"message_id": message_id, "create_time": now + "000", "chat_id": chat_id,
                        "chat_type": "group", "message_type": "text", "content": json.dumps({"text": text})},
        },
    }
    lark_post(broker, event)


def lark_card_click(broker: Broker, card: dict, behavior: str, chat_id: str, operator: str) -> dict:
    """Delivers the `card.action.trigger` callback of `operator` tapping the
    card's `behavior` button; answers the broker's callback answer."""
    values = [b["behaviors"][0]["value"] for column_set in card["body"]["elements"]
              if column_set.get("tag") == "column_set" for column in column_set["columns"]
              for b in column["elements"]]
    value = next(v for v in values if v["behavior"] == behavior)
    event = {
        "schema": "2.0",
        "header": {"event_id": unique("ev"), "event_type": "card.action.trigger",
                   "create_time": str(int(time.time())) + "000",
                   "token": LARK_VERIFICATION_TOKEN, "app_id": LARK_APP_ID, "tenant_key": "tenant"},
        "event": {"operator": {"open_id": operator, "user_id": None}, "token": unique("c"),
                  "action": {"value": value, "tag": "button"}, "host": "im_message",
                  "context": {"open_message_id": unique("om"), "open_chat_id": chat_id}},
    }
    return lark_post(broker, event)


def lark_post(broker: Broker, event: dict) -> dict:
    """Posts a signed event to the broker's webhook, as Lark does; its 200 body."""
    now = str(int(time.time()))
    body = json.dumps(event).encode()
    nonce = str(secrets.randbelow(2**31))
    signature = hashlib.sha256(now.encode() + nonce.encode() + body).hexdigest()
    request = urllib.request.Request(f"{broker.url}/v1/connectors/lark/events", data=body, method="POST")
    request.add_header("Content-Type", "application/json;charset=utf-8")
    request.add_header("X-Lark-Request-Timestamp", now)
    request.add_header("X-Lark-Request-Nonce", nonce)
    request.add_header("X-Lark-Signature", signature)
    with urllib.request.urlopen(request, timeout=10) as response:
        assert response.status == 200
        return json.loads(response.read())


# --- `loopx mcp` driven by the official SDK ---


class ChannelParams(BaseModel):
    content: str
    meta: dict[str, str]


class PermissionAnswer(BaseModel):
    request_id: str
    behavior: str


class PermissionRequestParams(BaseModel):
    request_id: str
    tool_name: str
    description: str
    input_preview: str


class PermissionRequestNotification(BaseModel):
    """Claude Code's permission request, sent as any client notification is."""

    method: Literal["notifications/claude/channel/permission_request"] = PERMISSION_REQUEST
    params: PermissionRequestParams


@dataclass
class Mcp:
    session: ClientSession
    init: Any
    events: Any  # a receive stream of ChannelParams
    pid_file: Path
    permissions: Any = None  # a receive stream of PermissionAnswer

    async def request_permission(self, request_id: str, tool_name: str = "Bash",
                                 description: str = "Remove the build directory",
                                 input_preview: str = "rm -rf build") -> None:
        params = PermissionRequestParams(request_id=request_id, tool_name=tool_name,
                                         description=description, input_preview=input_preview)
        await self.session.send_notification(PermissionRequestNotification(params=params))

    async def next_permission(self, within: float = 10) -> PermissionAnswer:
        with anyio.fail_after(within):
            return await self.permissions.receive()

    async def no_permission(self, within: float) -> None:
        with anyio.move_on_after(within):
            answer = await self.permissions.receive()
            raise AssertionError(f"an unexpected permission answer: {answer}")

    async def next_event(self, within: float = 10) -> ChannelParams:
        with anyio.fail_after(within):
            return await self.events.receive()

    async def no_event(self, within: float) -> None:
        with anyio.move_on_after(within):
            event = await self.events.receive()
            raise AssertionError(f"an unexpected channel event: {event}")

    async def call(self, name: str, **arguments) -> Any:
        return await self.session.call_tool(name, arguments)

    def pid(self) -> int:
        return int(self.pid_file.read_text())


@asynccontextmanager
async def loopx_mcp(workdir: Path, broker_url: str, token: str, *args: str, host_session_id: str | None = None,
                    env: dict[str, str] | None = None):
    """`loopx mcp ARGS` over stdio, initialized, with its channel events in a queue.

    The server runs under `sh -c 'echo $$ > pid; exec loopx mcp …'` so a test
    can kill it; its stderr goes to a file the test can read.
    """
    send, receive = anyio.create_memory_object_stream[ChannelParams](100)

    async def on_event(params: ChannelParams) -> None:
        await send.send(params)

    send_answer, answers = anyio.create_memory_object_stream[PermissionAnswer](100)

    async def on_answer(params: PermissionAnswer) -> None:
        await send_answer.send(params)

    pid_file = workdir / unique("pid")
    env = {"LOOPX_BROKER_URL": broker_url, "LOOPX_TOKEN": token, "LOOPX_LOG": "debug", **(env or {})}
    if host_session_id is not None:
        env["CLAUDE_CODE_SESSION_ID"] = host_session_id
    params = StdioServerParameters(
        command="sh",
        args=["-c", f'echo $$ > "{pid_file}"; exec "$0" "$@"', LOOPX, "mcp", *args],
        env=env,
    )
    with open(workdir / "mcp-stderr.log", "a") as errlog:
        async with stdio_client(params, errlog=errlog) as (read, write):
            bindings = [
                NotificationBinding(method=CHANNEL_EVENT, params_type=ChannelParams, handler=on_event),
                NotificationBinding(method=PERMISSION_ANSWER, params_type=PermissionAnswer, handler=on_answer),
            ]
            async with ClientSession(read, write, notification_bindings=bindings) as session:
                init = await session.initialize()
                yield Mcp(session, init, receive, pid_file, answers)


def text_of(result) -> str:
    return "".join(getattr(block, "text", "") for block in result.content)
