"""`loopx mcp` against a real broker, driven by the official MCP Python SDK
(an MCP client that is not ours), as Claude Code (channel mode) and Codex
(tools-only mode) would drive it."""

import json
import os
import signal
import subprocess
import threading
import time

import anyio
import pytest
from mcp.shared.exceptions import MCPError

from conftest import (
    HOST_SURFACE,
    LOOPX,
    Broker,
    free_port,
    lark_event,
    loopx_mcp,
    text_of,
    unique,
)

pytestmark = pytest.mark.anyio


def channel_args(session_id: str) -> list[str]:
    return ["--session-id", session_id, "--host-surface", HOST_SURFACE]


async def test_initialize_declares_the_channel_and_the_reply_tool(broker, tmp_path):
    host = unique("host")
    session_id = broker.bind(host)
    async with loopx_mcp(tmp_path, broker.url, broker.token, *channel_args(session_id), host_session_id=host) as m:
        assert m.init.protocol_version in ("2025-06-18", "2025-11-25")
        assert m.init.capabilities.experimental == {"claude/channel": {}, "claude/channel/permission": {}}
        assert m.init.capabilities.tools is not None
        assert m.init.server_info.name == "loopx"
        assert "reply" in m.init.instructions and session_id in m.init.instructions
        tools = (await m.session.list_tools()).tools
        assert [t.name for t in tools] == ["reply"], "channel mode offers no release"
        reply = tools[0].input_schema
        assert reply["required"] == ["chat_id", "text"]
        assert set(reply["properties"]) == {"chat_id", "text", "turn_id"}


async def test_tools_only_mode_has_no_channel_and_three_tools(broker, tmp_path):
    host = unique("host")
    session_id = broker.bind(host)
    args = [*channel_args(session_id), "--tools-only", "--name", "loopx-codex"]
    async with loopx_mcp(tmp_path, broker.url, broker.token, *args, host_session_id=host) as m:
        assert not m.init.capabilities.experimental
        assert m.init.server_info.name == "loopx-codex"
        tools = {t.name: t for t in (await m.session.list_tools()).tools}
        assert sorted(tools) == ["release", "reply", "wait_for_message"]
        wait = tools["wait_for_message"]
        assert wait.input_schema["properties"]["wait_seconds"]["maximum"] == 50
        assert wait.input_schema["properties"]["wait_seconds"]["default"] == 45
        assert wait.output_schema["required"] == ["claimed"]
        assert "again" in wait.description
        assert tools["release"].input_schema["required"] == ["turn_id"]


async def test_a_web_message_arrives_as_one_channel_event_and_reply_answers_it(broker, tmp_path):
    host = unique("host")
    session_id = broker.bind(host)
    async with loopx_mcp(tmp_path, broker.url, broker.token, *channel_args(session_id), host_session_id=host) as m:
        sent = broker.send(session_id, "What broke in the nightly build?")
        event = await m.next_event()
        assert event.content == "What broke in the nightly build?"
        assert event.meta == {
            "chat_id": session_id,
            "turn_id": sent["turn_id"],
            "seq": "1",
            "origin": "web",
            "sent_at": sent["enqueued_at"],
        }
        # While the agent works on it, the readback shows it delivered (claimed).
        assert broker.turn(session_id, sent["turn_id"])["state"] == "claimed"
        await m.no_event(0.5)

        result = await m.call("reply", chat_id=session_id, turn_id=sent["turn_id"], text="The fixture is stale.")
        assert not result.is_error, text_of(result)
        assert text_of(result) == "sent"
        turn = broker.turn(session_id, sent["turn_id"])
        assert turn["state"] == "completed"
        assert turn["response"] == {"message": "The fixture is stale."}

        # A repeated reply is a replay: "sent" again, nothing changes.
        again = await m.call("reply", chat_id=session_id, text="The fixture is stale.")
        assert not again.is_error and text_of(again) == "sent"
        # Another text for the answered turn is refused, naming the code.
        changed = await m.call("reply", chat_id=session_id, turn_id=sent["turn_id"], text="Something else.")
        assert changed.is_error and "idempotency_key_reused" in text_of(changed)
        assert broker.turn(session_id, sent["turn_id"])["response"] == {"message": "The fixture is stale."}
        # The wrong chat id is refused before anything is sent.
        wrong = await m.call("reply", chat_id="ses_other", text="x")
        assert wrong.is_error and session_id in text_of(wrong)


async def test_two_messages_arrive_in_order_one_at_a_time(broker, tmp_path):
    host = unique("host")
    session_id = broker.bind(host)
    first = broker.send(session_id, "first")
    second = broker.send(session_id, "second")
    async with loopx_mcp(tmp_path, broker.url, broker.token, *channel_args(session_id), host_session_id=host) as m:
        event = await m.next_event()
        assert (event.content, event.meta["seq"], event.meta["turn_id"]) == ("first", "1", first["turn_id"])
        await m.no_event(1.0)
        assert broker.turn(session_id, second["turn_id"])["state"] == "queued"
        assert not (await m.call("reply", chat_id=session_id, text="one")).is_error
        event = await m.next_event()
        assert (event.content, event.meta["seq"], event.meta["turn_id"]) == ("second", "2", second["turn_id"])
        assert not (await m.call("reply", chat_id=session_id, text="two")).is_error
        assert broker.turn(session_id, first["turn_id"])["response"] == {"message": "one"}
        assert broker.turn(session_id, second["turn_id"])["response"] == {"message": "two"}


async def test_a_lark_message_is_answered_and_the_reply_reaches_lark_once(fake_lark, tmp_path):
    broker = Broker(tmp_path, lark_url=fake_lark.url).start()
    try:
        host = unique("host")
        session_id = broker.bind(host)
        chat_id = unique("oc_chat")
        broker.ok("PUT", f"/v1/sessions/{session_id}/lark-link", {"chat_id": chat_id})
        async with loopx_mcp(tmp_path, broker.url, broker.token, *channel_args(session_id), host_session_id=host) as m:
            message_id = unique("om_msg")
            lark_event(broker, chat_id, message_id, "Is the deploy done?")
            event = await m.next_event()
            assert event.content == "Is the deploy done?"
            assert event.meta["origin"] == "lark"
            turn_id = event.meta["turn_id"]
            for _ in range(2):  # the second reply is a replay
                result = await m.call("reply", chat_id=session_id, turn_id=turn_id, text="Yes, at 14:02.")
                assert not result.is_error, text_of(result)
            broker.wait_turn(session_id, turn_id, lambda t: (t.get("reply") or {}).get("state") == "sent")
            await anyio.sleep(1.0)  # room for a wrongly doubled send
            replies = fake_lark.replies_to(message_id)
            assert [r["text"] for r in replies] == ["Yes, at 14:02."], replies
    finally:
        broker.stop()


async def test_a_killed_and_restarted_bridge_pushes_the_claimed_turn_again(broker, tmp_path):
    host = unique("host")
    session_id = broker.bind(host)
    sent = broker.send(session_id, "Survive a restart?")
    args = channel_args(session_id)
    killed = False
    with pytest.raises(BaseException) as died:  # the SDK sees its server die under it
        async with loopx_mcp(tmp_path, broker.url, broker.token, *args, host_session_id=host) as m:
            event = await m.next_event()
            assert event.meta["turn_id"] == sent["turn_id"]
            os.kill(m.pid(), signal.SIGKILL)
            killed = True
            await m.session.list_tools()
    assert killed, f"failed before the kill: {died.value!r}"
    assert broker.turn(session_id, sent["turn_id"])["state"] == "claimed", "nothing released on a kill"

    async with loopx_mcp(tmp_path, broker.url, broker.token, *args, host_session_id=host) as m:
        event = await m.next_event()
        assert event.meta["turn_id"] == sent["turn_id"]
        assert event.content == "Survive a restart?"
        result = await m.call("reply", chat_id=session_id, text="Yes.")
        assert not result.is_error, text_of(result)
        again = await m.call("reply", chat_id=session_id, text="Yes.")
        assert not again.is_error
    turn = broker.turn(session_id, sent["turn_id"])
    assert turn["state"] == "completed" and turn["response"] == {"message": "Yes."}
    events = broker.ok("GET", f"/v1/sessions/{session_id}/turns")["turns"]
    assert len(events) == 1


async def test_tools_only_wait_for_message_is_bounded_and_returns_a_turn(broker, tmp_path):
    host = unique("host")
    session_id = broker.bind(host)
    args = [*channel_args(session_id), "--tools-only"]
    async with loopx_mcp(tmp_path, broker.url, broker.token, *args, host_session_id=host) as m:
        started = time.monotonic()
        nothing = await m.call("wait_for_message", wait_seconds=1)
        assert not nothing.is_error, text_of(nothing)
        assert nothing.structured_content == {"claimed": False}
        assert json.loads(text_of(nothing)) == {"claimed": False}
        assert 0.9 < time.monotonic() - started < 5

        # Arguments outside the tool's schema are JSON-RPC's invalid params.
        with pytest.raises(MCPError) as too_long:
            await m.call("wait_for_message", wait_seconds=51)
        assert too_long.value.code == -32602 and "50" in too_long.value.message

        timer = threading.Timer(0.5, broker.send, (session_id, "Codex, are you there?"))
        timer.start()
        started = time.monotonic()
        got = await m.call("wait_for_message", wait_seconds=20)
        assert time.monotonic() - started < 5, "woken by the message, not the bound"
        message = got.structured_content
        assert message["claimed"] is True and message["text"] == "Codex, are you there?"
        assert message["seq"] == 1 and message["origin"] == "web" and message["chat_id"] == session_id
        assert json.loads(text_of(got)) == message
        assert not m.init.capabilities.experimental
        result = await m.call("reply", chat_id=session_id, text="I am.")
        assert not result.is_error, text_of(result)
        assert broker.turn(session_id, message["turn_id"])["response"] == {"message": "I am."}


async def test_release_hands_the_turn_back_and_a_reply_to_it_names_the_broker_code(broker, tmp_path):
    host = unique("host")
    session_id = broker.bind(host)
    sent = broker.send(session_id, "Hand me back")
    args = [*channel_args(session_id), "--tools-only"]
    async with loopx_mcp(tmp_path, broker.url, broker.token, *args, host_session_id=host) as m:
        got = (await m.call("wait_for_message", wait_seconds=5)).structured_content
        assert got["turn_id"] == sent["turn_id"]
        released = await m.call("release", turn_id=sent["turn_id"])
        assert not released.is_error, text_of(released)
        # Nothing is claimed again until the next wait_for_message.
        await anyio.sleep(0.5)
        assert broker.turn(session_id, sent["turn_id"])["state"] == "queued"
        refused = await m.call("reply", chat_id=session_id, turn_id=sent["turn_id"], text="late")
        assert refused.is_error and "not_claimed" in text_of(refused)

        # The session closes: a reply to it is a tool error with the broker's code.
        broker.ok("POST", f"/v1/sessions/{session_id}/close")
        closed = await m.call("reply", chat_id=session_id, turn_id=sent["turn_id"], text="late")
        assert closed.is_error
        assert "not_claimed" in text_of(closed), text_of(closed)
        waited = await m.call("wait_for_message", wait_seconds=1)
        assert waited.is_error and "session_closed" in text_of(waited)


async def test_broker_down_at_start_then_up_the_first_message_still_arrives(tmp_path):
    port = free_port()
    broker = Broker(tmp_path, port=port)
    host = unique("host")
    args = ["--goal-id", "g-late", "--agent-id", "agent-late", "--executor-endpoint-id", "exec-late",
            "--host-surface", HOST_SURFACE]
    async with loopx_mcp(tmp_path, broker.url, broker.token, *args, host_session_id=host) as m:
        # initialize has answered; tools/list too, and a tool says what is wrong.
        assert [t.name for t in (await m.session.list_tools()).tools] == ["reply"]
        down = await m.call("reply", chat_id="ses_x", text="hello?")
        assert down.is_error
        assert "broker unreachable" in text_of(down) and broker.url in text_of(down)

        broker.start()
        try:
            deadline = time.monotonic() + 20
            while True:  # the bridge binds once the broker answers
                sessions = broker.ok("GET", "/v1/sessions?goal_id=g-late")["sessions"]
                if sessions:
                    break
                assert time.monotonic() < deadline, "the bridge never bound"
                await anyio.sleep(0.1)
            session_id = sessions[0]["session_id"]
            broker.send(session_id, "first message")
            event = await m.next_event(within=40)
            assert event.content == "first message" and event.meta["chat_id"] == session_id
            assert not (await m.call("reply", chat_id=session_id, text="got it")).is_error
        finally:
            broker.stop()


def test_stdout_is_only_json_rpc_and_stderr_has_no_text_or_host_id(broker, tmp_path):
    host = unique("private-host-id")
    session_id = broker.bind(host)
    secret_question = unique("secret-question")
    secret_answer = unique("secret-answer")
    env = dict(os.environ, LOOPX_BROKER_URL=broker.url, LOOPX_TOKEN=broker.token, LOOPX_LOG="debug",
               CLAUDE_CODE_SESSION_ID=host)
    process = subprocess.Popen([LOOPX, "mcp", "--session-id", session_id, "--host-surface", HOST_SURFACE],
                               stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(line.decode() for line in process.stdout))
    reader.start()

    def send(message: dict) -> None:
        process.stdin.write((json.dumps({"jsonrpc": "2.0", **message}) + "\n").encode())
        process.stdin.flush()

    def wait_for(predicate, within: float = 10) -> dict:
        deadline = time.monotonic() + within
        while time.monotonic() < deadline:
            for line in list(lines):
                message = json.loads(line)
                if predicate(message):
                    return message
            time.sleep(0.05)
        raise AssertionError(f"not seen on stdout: {lines}")

    # A client asking for a newer protocol gets a 2025 version Claude Code registers channels on.
    send({"id": 1, "method": "initialize", "params": {"protocolVersion": "2026-07-28", "capabilities": {},
                                                      "clientInfo": {"name": "raw", "version": "1"}}})
    init = wait_for(lambda m: m.get("id") == 1)
    assert init["result"]["protocolVersion"] == "2025-11-25"
    send({"method": "notifications/initialized"})
    send({"id": 2, "method": "tools/list"})
    wait_for(lambda m: m.get("id") == 2)
    broker.send(session_id, secret_question)
    event = wait_for(lambda m: m.get("method") == "notifications/claude/channel")
    assert event["params"]["content"] == secret_question
    send({"id": 3, "method": "tools/call", "params": {"name": "reply",
                                                      "arguments": {"chat_id": session_id, "text": secret_answer}}})
    assert wait_for(lambda m: m.get("id") == 3)["result"]["isError"] is False
    # An unknown tool and arguments of the wrong type are invalid params.
    send({"id": 4, "method": "tools/call", "params": {"name": "nope", "arguments": {}}})
    assert wait_for(lambda m: m.get("id") == 4)["error"]["code"] == -32602
    # Arguments the bridge refuses itself are not quoted in the log either.
    send({"id": 5, "method": "tools/call", "params": {"name": "reply", "arguments": {
        "chat_id": session_id, "text": 7, "turn_id": secret_answer}}})
    assert wait_for(lambda m: m.get("id") == 5)["error"]["code"] == -32602
    send({"id": 6, "method": "tools/call", "params": {"name": "reply", "arguments": {
        "chat_id": secret_question, "text": secret_answer}}})
    refused = wait_for(lambda m: m.get("id") == 6)["result"]
    assert refused["isError"] is True and session_id in refused["content"][0]["text"]

    started = time.monotonic()
    process.stdin.close()  # stdin closes: exit 0 within 5 s, releasing nothing
    assert process.wait(timeout=5) == 0
    assert time.monotonic() - started < 5
    reader.join(timeout=5)
    stderr = process.stderr.read().decode()

    assert lines, "the server answered"
    for line in lines:
        message = json.loads(line)  # every stdout line is one JSON-RPC message
        assert message["jsonrpc"] == "2.0", line
    for private in (secret_question, secret_answer, host):
        assert private not in stderr, f"{private} leaked to stderr:\n{stderr}"
    assert "claimed a turn" in stderr, "the log says what happened, without content"


def test_a_protocol_version_of_2025_06_18_is_kept_and_no_host_id_is_a_usage_error(broker):
    process = subprocess.run(
        [LOOPX, "mcp", "--session-id", "ses_x", "--host-surface", HOST_SURFACE],
        input=b"", capture_output=True, timeout=10,
        env={k: v for k, v in os.environ.items() if k != "CLAUDE_CODE_SESSION_ID"} | {"LOOPX_TOKEN": "t"},
    )
    assert process.returncode == 2 and process.stdout == b""
    assert b"host-session-id" in process.stderr

    request = {"jsonrpc": "2.0", "id": 1, "method": "initialize",
               "params": {"protocolVersion": "2025-06-18", "capabilities": {},
                          "clientInfo": {"name": "raw", "version": "1"}}}
    process = subprocess.run(
        [LOOPX, "mcp", "--session-id", "ses_x", "--host-surface", HOST_SURFACE, "--host-session-id", "h"],
        input=(json.dumps(request) + "\n").encode(), capture_output=True, timeout=10,
        env=dict(os.environ, LOOPX_BROKER_URL=broker.url, LOOPX_TOKEN=broker.token),
    )
    assert process.returncode == 0
    (line,) = process.stdout.decode().splitlines()
    assert json.loads(line)["result"]["protocolVersion"] == "2025-06-18"


def readme_block(language: str, after: str) -> str:
    """The first ```language block after the heading `after` in docs/mcp.md."""
    readme = open(os.path.join(os.path.dirname(__file__), "..", "..", "docs", "mcp.md")).read()
    rest = readme[readme.index(after):]
    start = rest.index(f"```{language}\n") + len(language) + 4
    return rest[start:rest.index("```", start)]


async def test_the_readme_host_configurations_start_working_bridges(broker, tmp_path):
    import tomllib

    claude = json.loads(readme_block("json", "## Claude Code"))["mcpServers"]["loopx"]
    assert claude["command"] == "loopx" and claude["args"][0] == "mcp"
    host = unique("claude-session")
    async with loopx_mcp(tmp_path, broker.url, broker.token, *claude["args"][1:], host_session_id=host) as m:
        assert m.init.capabilities.experimental == {"claude/channel": {}, "claude/channel/permission": {}}
        deadline = time.monotonic() + 10
        while not (sessions := broker.ok("GET", "/v1/sessions?goal_id=g-1&state=open")["sessions"]):
            assert time.monotonic() < deadline, "the README's Claude Code bridge never bound"
            await anyio.sleep(0.1)
        broker.send(sessions[0]["session_id"], "from the Web page")
        assert (await m.next_event()).content == "from the Web page"
    run = readme_block("bash", "## Claude Code")
    assert "--dangerously-load-development-channels server:loopx" in run and "mcp__loopx__reply" in run

    codex = tomllib.loads(readme_block("toml", "## Codex CLI"))["mcp_servers"]["loopx"]
    assert codex["command"] == "loopx" and codex["tool_timeout_sec"] >= 55
    async with loopx_mcp(tmp_path, broker.url, broker.token, *codex["args"][1:]) as m:
        assert not m.init.capabilities.experimental
        got = await m.call("wait_for_message", wait_seconds=0)
        assert got.structured_content == {"claimed": False}, text_of(got)


async def test_a_closed_session_stops_the_bridge_and_a_restart_binds_a_new_one(broker, tmp_path):
    host = unique("host")
    args = ["--goal-id", "g-close", "--agent-id", "agent-close", "--executor-endpoint-id", "exec-close",
            "--host-surface", HOST_SURFACE]

    async def open_session() -> str:
        deadline = time.monotonic() + 10
        while not (sessions := broker.ok("GET", "/v1/sessions?goal_id=g-close&state=open")["sessions"]):
            assert time.monotonic() < deadline, "the bridge never bound"
            await anyio.sleep(0.05)
        return sessions[0]["session_id"]

    async with loopx_mcp(tmp_path, broker.url, broker.token, *args, host_session_id=host) as m:
        first = await open_session()
        await anyio.sleep(0.3)  # the claim is parked
        broker.ok("POST", f"/v1/sessions/{first}/close")
        await m.no_event(0.5)
        refused = await m.call("reply", chat_id=first, text="anyone?")
        assert refused.is_error
    async with loopx_mcp(tmp_path, broker.url, broker.token, *args, host_session_id=host) as m:
        second = await open_session()
        assert second != first
        broker.send(second, "hello again")
        event = await m.next_event()
        assert event.meta["chat_id"] == second and event.content == "hello again"
