"""The permission relay of `loopx mcp` (MCP.md "Permission relay"): the
official MCP Python SDK sends `notifications/claude/channel/permission_request`
as Claude Code does; the request is answered through the broker's API (as the
Web page does) or from a linked Lark chat, and reaches the client as exactly
one `notifications/claude/channel/permission`."""

import json
import threading
import time

import anyio
import pytest

from conftest import HOST_SURFACE, Broker, lark_card_click, lark_event, loopx_mcp, unique

APPROVER = "ou_mcp_approver"
STRANGER = "ou_mcp_stranger"

pytestmark = pytest.mark.anyio


def channel_args(session_id: str) -> list[str]:
    return ["--session-id", session_id, "--host-surface", HOST_SURFACE]


def requests_path(session_id: str, request_id: str = "") -> str:
    path = f"/v1/sessions/{session_id}/permission-requests"
    return f"{path}/{request_id}" if request_id else path


async def wait_recorded(broker: Broker, session_id: str, request_id: str, within: float = 10) -> dict:
    """Polls without blocking the event loop, which must send the notification."""
    deadline = time.monotonic() + within
    while True:
        status, request = broker.api("GET", requests_path(session_id, request_id))
        if status == 200:
            return request
        assert time.monotonic() < deadline, f"the request was not recorded: {status} {request}"
        await anyio.sleep(0.05)


def answer(broker: Broker, session_id: str, request_id: str, behavior: str) -> tuple[int, dict]:
    return broker.api("POST", requests_path(session_id, request_id) + "/answer", {"behavior": behavior})


async def test_answers_given_through_the_api_reach_the_client_once(broker, tmp_path):
    host = unique("host")
    session_id = broker.bind(host)
    async with loopx_mcp(tmp_path, broker.url, broker.token, *channel_args(session_id), host_session_id=host) as m:
        await m.request_permission("abcde", "Bash", "Remove the build directory", "rm -rf build")
        recorded = await wait_recorded(broker, session_id, "abcde")
        assert recorded["state"] == "pending"
        assert (recorded["tool_name"], recorded["input_preview"]) == ("Bash", "rm -rf build")
        assert answer(broker, session_id, "abcde", "allow")[0] == 200
        got = await m.next_permission()
        assert (got.request_id, got.behavior) == ("abcde", "allow")

        await m.request_permission("fghij", "Write", "Write a file", "secret-preview-text")
        await wait_recorded(broker, session_id, "fghij")
        assert answer(broker, session_id, "fghij", "deny")[0] == 200
        got = await m.next_permission()
        assert (got.request_id, got.behavior) == ("fghij", "deny")

        # Claude Code repeating a request, or the same answer again: nothing more.
        await m.request_permission("abcde", "Bash", "Remove the build directory", "rm -rf build")
        assert answer(broker, session_id, "abcde", "allow")[0] == 200
        await m.no_permission(1.5)
    log = (tmp_path / "mcp-stderr.log").read_text()
    assert "rm -rf build" not in log and "secret-preview-text" not in log, "no preview in the logs"
    assert "Remove the build directory" not in log, "no description in the logs"


async def test_racing_answers_give_one_final_answer_and_one_notification(broker, tmp_path):
    host = unique("host")
    session_id = broker.bind(host)
    async with loopx_mcp(tmp_path, broker.url, broker.token, *channel_args(session_id), host_session_id=host) as m:
        await m.request_permission("racer")
        await wait_recorded(broker, session_id, "racer")
        results: dict[str, tuple[int, dict]] = {}
        start = threading.Barrier(2)

        def race(behavior: str) -> None:
            start.wait()
            results[behavior] = answer(broker, session_id, "racer", behavior)

        threads = [threading.Thread(target=race, args=(b,)) for b in ("allow", "deny")]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        statuses = sorted(status for status, _ in results.values())
        assert statuses == [200, 409], results
        final = broker.ok("GET", requests_path(session_id, "racer"))["state"]
        got = await m.next_permission()
        assert got.behavior == {"allowed": "allow", "denied": "deny"}[final]
        await m.no_permission(1.5)


async def test_a_broker_restart_between_request_and_answer_loses_nothing(tmp_path):
    broker = Broker(tmp_path).start()
    try:
        host = unique("host")
        session_id = broker.bind(host)
        async with loopx_mcp(tmp_path, broker.url, broker.token, *channel_args(session_id), host_session_id=host) as m:
            await m.request_permission("durab")
            await wait_recorded(broker, session_id, "durab")
            broker.stop()
            broker = Broker(tmp_path, port=broker.port, token=broker.token).start()
            assert answer(broker, session_id, "durab", "allow")[0] == 200
            got = await m.next_permission(within=40)
            assert (got.request_id, got.behavior) == ("durab", "allow")
            await m.no_permission(1.5)
    finally:
        broker.stop()


async def test_a_restarted_bridge_waits_again_for_pending_requests(broker, tmp_path):
    host = unique("host")
    session_id = broker.bind(host)
    async with loopx_mcp(tmp_path, broker.url, broker.token, *channel_args(session_id), host_session_id=host) as m:
        await m.request_permission("again")
        await wait_recorded(broker, session_id, "again")
    async with loopx_mcp(tmp_path, broker.url, broker.token, *channel_args(session_id), host_session_id=host) as m:
        # The restarted bridge lists the pending request and parks on it.
        await anyio.sleep(0.5)
        assert answer(broker, session_id, "again", "deny")[0] == 200
        got = await m.next_permission()
        assert (got.request_id, got.behavior) == ("again", "deny")
        await m.no_permission(1.5)


async def test_a_closed_session_expires_its_pending_request_and_nothing_is_relayed(broker, tmp_path):
    host = unique("host")
    session_id = broker.bind(host)
    async with loopx_mcp(tmp_path, broker.url, broker.token, *channel_args(session_id), host_session_id=host) as m:
        await m.request_permission("later")
        await wait_recorded(broker, session_id, "later")
        broker.ok("POST", f"/v1/sessions/{session_id}/close")
        assert broker.ok("GET", requests_path(session_id, "later"))["state"] == "expired"
        status, refused = answer(broker, session_id, "later", "allow")
        assert (status, refused["error"]["code"], refused["error"]["state"]) == (
            409, "permission_already_answered", "expired")
        await m.no_permission(1.5)


async def test_the_readme_commands_list_and_answer_a_request(broker, tmp_path):
    import os
    import subprocess

    from test_mcp import readme_block

    host = unique("host")
    session_id = broker.bind(host)
    async with loopx_mcp(tmp_path, broker.url, broker.token, *channel_args(session_id), host_session_id=host) as m:
        await m.request_permission("abcde")
        await wait_recorded(broker, session_id, "abcde")
        script = readme_block("bash", "## Approving tool use from the Web page")
        script = script.replace("http://127.0.0.1:7317", broker.url)
        # The block reads the owner token where `loopx serve` writes it.
        (tmp_path / "xdg" / "loopx").mkdir(parents=True)
        (tmp_path / "xdg" / "loopx" / "owner.token").write_text(broker.token)
        env = dict(os.environ, XDG_DATA_HOME=str(tmp_path / "xdg"), SESSION=session_id)
        out = subprocess.run(["bash", "-c", script], env=env, capture_output=True, text=True, timeout=30, check=True)
        assert '"request_id":"abcde"' in out.stdout and '"state":"allowed"' in out.stdout, out.stdout
        got = await m.next_permission()
        assert (got.request_id, got.behavior) == ("abcde", "allow")


@pytest.fixture
def lark_broker(tmp_path, fake_lark):
    b = Broker(tmp_path, lark_url=fake_lark.url).start()
    yield b
    b.stop()


def linked_chat(broker: Broker, session_id: str) -> str:
    chat_id = unique("oc")
    broker.ok("PUT", f"/v1/sessions/{session_id}/lark-link", {"chat_id": chat_id, "approvers": [APPROVER]})
    return chat_id


async def wait_message(fake_lark, chat_id: str, request_id: str, within: float = 10) -> dict:
    deadline = time.monotonic() + within
    while True:
        for message in fake_lark.messages_in(chat_id):
            if f'"yes {request_id}"' in message["text"]:
                return message
        assert time.monotonic() < deadline, f"no message about {request_id}: {fake_lark.messages}"
        await anyio.sleep(0.05)


async def test_a_lark_answer_from_an_approver_is_relayed_and_a_strangers_is_not(lark_broker, fake_lark, tmp_path):
    broker = lark_broker
    host = unique("host")
    session_id = broker.bind(host)
    chat_id = linked_chat(broker, session_id)
    async with loopx_mcp(tmp_path, broker.url, broker.token, *channel_args(session_id), host_session_id=host) as m:
        await m.request_permission("abcde", "Bash", "Remove the build directory", "rm -rf build")
        message = await wait_message(fake_lark, chat_id, "abcde")
        assert "rm -rf build" in message["text"] and '"no abcde"' in message["text"]

        lark_event(broker, chat_id, unique("om"), "yes abcde", sender=STRANGER)
        await m.no_permission(1.5)
        assert broker.ok("GET", requests_path(session_id, "abcde"))["state"] == "pending"

        lark_event(broker, chat_id, unique("om"), "Yes abcde", sender=APPROVER)
        got = await m.next_permission()
        assert (got.request_id, got.behavior) == ("abcde", "allow")
        read = broker.ok("GET", requests_path(session_id, "abcde"))
        assert (read["state"], read["answered_via"]) == ("allowed", "lark")
        await m.no_permission(1.5)
    # Neither answer became a turn; the bot said nothing about them.
    turns = broker.ok("GET", f"/v1/sessions/{session_id}/turns")["turns"]
    assert turns == [], turns
    assert len(fake_lark.messages_in(chat_id)) == 1 and fake_lark.replies == []


def race_web_deny(broker: Broker, session_id: str, request_id: str, lark) -> tuple[dict, object]:
    """Denies the request on the Web while `lark()` answers it from Lark, at
    the same instant; checks that one answer won, and answers the request as
    read after it and what `lark()` answered."""
    results: dict[str, object] = {}
    start = threading.Barrier(2)

    def web() -> None:
        start.wait()
        results["web"] = answer(broker, session_id, request_id, "deny")

    def from_lark() -> None:
        start.wait()
        results["lark"] = lark()

    threads = [threading.Thread(target=web), threading.Thread(target=from_lark)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    read = broker.ok("GET", requests_path(session_id, request_id))
    expected = {"denied": (200, "owner"), "allowed": (409, "lark")}[read["state"]]
    assert (results["web"][0], read["answered_via"]) == expected, (results, read)
    return read, results["lark"]


async def test_web_and_lark_answers_racing_give_one_notification(lark_broker, fake_lark, tmp_path):
    broker = lark_broker
    host = unique("host")
    session_id = broker.bind(host)
    chat_id = linked_chat(broker, session_id)
    async with loopx_mcp(tmp_path, broker.url, broker.token, *channel_args(session_id), host_session_id=host) as m:
        await m.request_permission("racer")
        await wait_recorded(broker, session_id, "racer")
        read, _ = race_web_deny(broker, session_id, "racer",
                                lambda: lark_event(broker, chat_id, unique("om"), "yes racer", sender=APPROVER))
        got = await m.next_permission()
        assert got.behavior == {"allowed": "allow", "denied": "deny"}[read["state"]]
        await m.no_permission(1.5)


async def test_taps_on_the_card_racing_the_web_give_one_answer_relayed_once(lark_broker, fake_lark, tmp_path):
    broker = lark_broker
    host = unique("host")
    session_id = broker.bind(host)
    chat_id = linked_chat(broker, session_id)
    async with loopx_mcp(tmp_path, broker.url, broker.token, *channel_args(session_id), host_session_id=host) as m:
        for round in range(8):
            request_id = "tap" + "abcdefgh"[round] + "x"
            await m.request_permission(request_id)
            card = (await wait_message(fake_lark, chat_id, request_id))["card"]
            read, tapped = race_web_deny(broker, session_id, request_id,
                                         lambda: lark_card_click(broker, card, "allow", chat_id, APPROVER))
            assert "behaviors" not in json.dumps(tapped["card"]["data"]), "the final card: no buttons"
            got = await m.next_permission()
            assert (got.request_id, got.behavior) == (request_id, {"allowed": "allow", "denied": "deny"}[read["state"]])
        await m.no_permission(1.5)  # each answer relayed once


async def test_an_answer_given_while_the_bridge_was_down_is_relayed_once_after_restart(broker, tmp_path):
    host = unique("host")
    session_id = broker.bind(host)
    args = channel_args(session_id)
    async with loopx_mcp(tmp_path, broker.url, broker.token, *args, host_session_id=host) as m:
        await m.request_permission("awayx")
        await wait_recorded(broker, session_id, "awayx")
    assert answer(broker, session_id, "awayx", "allow")[0] == 200  # the bridge is down
    async with loopx_mcp(tmp_path, broker.url, broker.token, *args, host_session_id=host) as m:
        got = await m.next_permission()
        assert (got.request_id, got.behavior) == ("awayx", "allow")
        await m.no_permission(1.0)
    assert broker.ok("GET", requests_path(session_id, "awayx"))["relayed_at"] is not None
    async with loopx_mcp(tmp_path, broker.url, broker.token, *args, host_session_id=host) as m:
        await m.no_permission(1.5)  # relayed once: never again


async def test_an_answer_committed_but_not_relayed_is_relayed_once_after_a_restart(broker, tmp_path):
    import os
    import signal

    host = unique("host")
    session_id = broker.bind(host)
    args = channel_args(session_id)
    with pytest.raises(BaseException):  # the SDK sees its server die under it
        async with loopx_mcp(tmp_path, broker.url, broker.token, *args, host_session_id=host) as m:
            await m.request_permission("froze")
            await wait_recorded(broker, session_id, "froze")
            await anyio.sleep(0.3)  # parked on the answer
            os.kill(m.pid(), signal.SIGSTOP)  # frozen: the answer commits but never reaches the agent
            assert answer(broker, session_id, "froze", "deny")[0] == 200
            await anyio.sleep(0.3)
            os.kill(m.pid(), signal.SIGKILL)
            await m.session.list_tools()
    request = broker.ok("GET", requests_path(session_id, "froze"))
    assert (request["state"], request["relayed_at"]) == ("denied", None)
    async with loopx_mcp(tmp_path, broker.url, broker.token, *args, host_session_id=host) as m:
        got = await m.next_permission()
        assert (got.request_id, got.behavior) == ("froze", "deny")
        await m.no_permission(1.0)
    async with loopx_mcp(tmp_path, broker.url, broker.token, *args, host_session_id=host) as m:
        await m.no_permission(1.5)


def test_the_relayed_route_is_the_hosts_and_only_for_answered_requests(broker):
    host = unique("host")
    session_id = broker.bind(host)
    identity = {"host_surface": HOST_SURFACE, "host_session_id": host}
    broker.ok("POST", requests_path(session_id), {**identity, "request_id": "route", "tool_name": "Bash",
                                                  "description": "d", "input_preview": "p"})
    relayed = requests_path(session_id, "route") + "/relayed"
    status, refused = broker.api("POST", relayed, identity)
    assert (status, refused["error"]["code"], refused["error"]["state"]) == (409, "permission_not_answered", "pending")
    assert answer(broker, session_id, "route", "allow")[0] == 200
    status, other = broker.api("POST", relayed, {**identity, "host_session_id": "someone-else"})
    assert (status, other["error"]["code"]) == (403, "host_mismatch")
    first = broker.ok("POST", relayed, identity)
    again = broker.ok("POST", relayed, identity)
    assert first["relayed_at"] is not None and again["relayed_at"] == first["relayed_at"]
    status, unknown = broker.api("POST", requests_path(session_id, "nope") + "/relayed", identity)
    assert (status, unknown["error"]["code"]) == (404, "not_found")
