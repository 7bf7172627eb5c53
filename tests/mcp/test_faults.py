"""`loopx mcp` under faults: malformed JSON-RPC, oversized lines, blank
answers, a shutdown with a call in flight (issue 28), driven by raw JSON-RPC
where the SDK would refuse to send such input, and by the official SDK
otherwise."""

import json
import os
import subprocess
import threading
import time

import pytest

from conftest import HOST_SURFACE, LOOPX, loopx_mcp, text_of, unique

pytestmark = pytest.mark.anyio


class Raw:
    """`loopx mcp` over raw stdio lines: what a buggy or hostile client sends."""

    def __init__(self, broker, *args: str, host: str):
        env = dict(os.environ, LOOPX_BROKER_URL=broker.url, LOOPX_TOKEN=broker.token, LOOPX_LOG="info")
        self.process = subprocess.Popen([LOOPX, "mcp", *args, "--host-session-id", host],
                                        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                        env=env)
        self.lines: list[dict] = []
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        for line in self.process.stdout:
            self.lines.append(json.loads(line))

    def write(self, data: bytes) -> None:
        self.process.stdin.write(data)
        self.process.stdin.flush()

    def send(self, message: dict) -> None:
        self.write((json.dumps({"jsonrpc": "2.0", **message}) + "\n").encode())

    def answer(self, predicate, within: float = 10) -> dict:
        deadline = time.monotonic() + within
        while time.monotonic() < deadline:
            for message in list(self.lines):
                if predicate(message):
                    return message
            time.sleep(0.02)
        raise AssertionError(f"no such answer on stdout: {self.lines}")

    def initialize(self) -> dict:
        self.send({"id": "init", "method": "initialize", "params": {
            "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "raw", "version": "1"}}})
        init = self.answer(lambda m: m.get("id") == "init")
        self.send({"method": "notifications/initialized"})
        return init


def tools_only(session_id: str) -> list[str]:
    return ["--session-id", session_id, "--host-surface", HOST_SURFACE, "--tools-only"]


def test_malformed_lines_get_json_rpc_errors_and_the_bridge_goes_on(broker):
    host = unique("host")
    session_id = broker.bind(host)
    raw = Raw(broker, *tools_only(session_id), "--format", "json", host=host)
    raw.initialize()
    raw.write(b'{"jsonrpc": "2.0", "id": 1, "method": \n')
    parse = raw.answer(lambda m: m.get("error", {}).get("code") == -32700)
    assert parse["id"] is None
    raw.send({"id": 2, "method": "tools/call", "params": {"name": 5}})
    assert raw.answer(lambda m: m.get("id") == 2)["error"]["code"] == -32602
    raw.send({"id": 3, "method": "tools/call", "params": {"name": "wait_for_message", "arguments": "soon"}})
    assert raw.answer(lambda m: m.get("id") == 3)["error"]["code"] == -32602
    raw.send({"id": 4, "method": "tools/call",
              "params": {"name": "wait_for_message", "arguments": {"wait_seconds": "soon"}}})
    assert raw.answer(lambda m: m.get("id") == 4)["error"]["code"] == -32602
    # A line over 16 MiB is answered (with its id), not dropped: the client's request ends.
    head = b'{"jsonrpc": "2.0", "id": 5, "method": "tools/call", "params": {"name": "reply", "arguments": {"chat_id": "x", "text": "'
    raw.write(head + b"a" * (16 * 1024 * 1024) + b'"}}}\n')
    big = raw.answer(lambda m: m.get("id") == 5, within=30)
    assert big["error"]["code"] == -32600 and "16777216" in big["error"]["message"]
    # ... and the bridge still serves.
    raw.send({"id": 6, "method": "tools/call", "params": {"name": "wait_for_message", "arguments": {"wait_seconds": 0}}})
    assert raw.answer(lambda m: m.get("id") == 6)["result"]["structuredContent"] == {"claimed": False}
    raw.process.stdin.close()
    assert raw.process.wait(timeout=5) == 0


def test_stdin_closing_with_a_wait_in_flight_exits_well_within_five_seconds(broker):
    host = unique("host")
    session_id = broker.bind(host)
    raw = Raw(broker, *tools_only(session_id), host=host)
    raw.initialize()
    raw.send({"id": 1, "method": "tools/call", "params": {"name": "wait_for_message", "arguments": {"wait_seconds": 45}}})
    time.sleep(0.5)  # parked on the broker
    started = time.monotonic()
    raw.process.stdin.close()
    assert raw.process.wait(timeout=5) == 0
    took = time.monotonic() - started
    print(f"exit with a wait in flight: {took:.3f} s")
    assert took < 2.5, f"took {took:.2f} s"


async def test_a_blank_reply_is_refused_and_the_turn_stays_to_be_answered(broker, tmp_path):
    host = unique("host")
    session_id = broker.bind(host)
    sent = broker.send(session_id, "Say something")
    args = ["--session-id", session_id, "--host-surface", HOST_SURFACE]
    async with loopx_mcp(tmp_path, broker.url, broker.token, *args, host_session_id=host) as m:
        assert (await m.next_event()).meta["turn_id"] == sent["turn_id"]
        blank = await m.call("reply", chat_id=session_id, text=" \n\t ")
        assert blank.is_error and "blank" in text_of(blank)
        assert broker.turn(session_id, sent["turn_id"])["state"] == "claimed"
        done = await m.call("reply", chat_id=session_id, text="Something.")
        assert not done.is_error, text_of(done)
    assert broker.turn(session_id, sent["turn_id"])["response"] == {"message": "Something."}


def bind_args(goal: str, surface: str = "codex-cli") -> list[str]:
    return ["--goal-id", goal, "--agent-id", "agent-b", "--executor-endpoint-id", "exec-b", "--host-surface", surface]


async def test_tools_only_bind_mode_is_in_the_list_right_after_initialize(broker, tmp_path):
    goal = unique("g-codex")
    args = ["--tools-only", *bind_args(goal)]
    async with loopx_mcp(tmp_path, broker.url, broker.token, *args, host_session_id=unique("codex")) as m:
        (session,) = broker.ok("GET", f"/v1/sessions?goal_id={goal}&state=open")["sessions"]
        assert session["host_surface"] == "codex-cli"
        assert session["session_id"] in m.init.instructions, "the model is told its chat id"
        broker.send(session["session_id"], "found you")
        got = (await m.call("wait_for_message", wait_seconds=5)).structured_content
        assert got["text"] == "found you"
        assert not (await m.call("reply", chat_id=session["session_id"], text="hi")).is_error
    # A session that had a message stays open after the bridge exits.
    assert len(broker.ok("GET", f"/v1/sessions?goal_id={goal}&state=open")["sessions"]) == 1


def test_health_checks_leave_no_open_session_behind(broker):
    goal = unique("g-check")
    for check in range(2):  # `claude mcp list`: start, initialize, exit; a new host id each time
        raw = Raw(broker, *bind_args(goal, "claude-code"), host=unique(f"check-{check}"))
        raw.initialize()
        raw.send({"id": "tools", "method": "tools/list"})
        raw.answer(lambda m: m.get("id") == "tools")
        raw.process.stdin.close()
        assert raw.process.wait(timeout=5) == 0
    sessions = broker.ok("GET", f"/v1/sessions?goal_id={goal}")["sessions"]
    assert len(sessions) == 2 and all(s["state"] == "closed" for s in sessions), sessions
    # A bridge that reused an open session never closes it.
    host = unique("kept")
    thread = {"goal_id": goal, "agent_id": "agent-b", "host_surface": "claude-code", "host_session_id": host}
    broker.ok("POST", "/v1/agent-threads", thread)
    kept = broker.ok("POST", "/v1/sessions", {**thread, "executor_endpoint_id": "exec-b"})["session_id"]
    raw = Raw(broker, *bind_args(goal, "claude-code"), host=host)
    raw.initialize()
    raw.process.stdin.close()
    assert raw.process.wait(timeout=5) == 0
    assert broker.ok("GET", f"/v1/sessions/{kept}")["state"] == "open"
