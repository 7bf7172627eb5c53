"""One live holder per host identity (issue 28): a second bridge for the same
host session refuses to start while the first lives; a bridge killed midway is
replaced and nothing is stranded; concurrent `wait_for_message` calls in one
bridge never share a turn; a refused `reply` never wedges a bridge; the owner
closes a session whose bridge died mid-turn; the broker releases the turn of
a bridge that died mid-turn after its silence, and never the turn of a live
bridge, whose heartbeat keeps it."""

import os
import signal
import subprocess
import time

import anyio
import pytest

from conftest import HOST_SURFACE, LOOPX, Broker, loopx_mcp, text_of, unique

pytestmark = pytest.mark.anyio


def channel_args(session_id: str) -> list[str]:
    return ["--session-id", session_id, "--host-surface", HOST_SURFACE]


def turns(broker, session_id: str) -> list[dict]:
    return broker.ok("GET", f"/v1/sessions/{session_id}/turns?limit=200")["turns"]


async def test_twenty_messages_two_bridges_one_killed_midway_each_answered_once(broker, tmp_path):
    host = unique("host")
    session_id = broker.bind(host)
    args = channel_args(session_id)
    sent = [broker.send(session_id, f"m{n}") for n in range(1, 21)]
    delivered: list[str] = []
    killed = False
    with pytest.raises(BaseException):  # the SDK sees its server die under it
        async with loopx_mcp(tmp_path, broker.url, broker.token, *args, host_session_id=host) as a:
            # A second bridge for the same host refuses to start, with a clear message.
            env = dict(os.environ, LOOPX_BROKER_URL=broker.url, LOOPX_TOKEN=broker.token,
                       CLAUDE_CODE_SESSION_ID=host)
            started = time.monotonic()
            second = await anyio.to_thread.run_sync(lambda: subprocess.run(
                [LOOPX, "mcp", *args], input=b"", capture_output=True, timeout=20, env=env))
            assert second.returncode == 2 and second.stdout == b""
            assert b"already serving this host session" in second.stderr, second.stderr
            assert time.monotonic() - started < 10
            for n in range(1, 12):
                event = await a.next_event()
                delivered.append(event.content)
                assert event.content == f"m{n}"
                if n == 11:  # dies holding m11, unanswered
                    os.kill(a.pid(), signal.SIGKILL)
                    killed = True
                    await a.session.list_tools()
                result = await a.call("reply", chat_id=session_id, text=f"answer to m{n}")
                assert not result.is_error, text_of(result)
    assert killed
    states = {t["turn_id"]: t["state"] for t in turns(broker, session_id)}
    assert states[sent[10]["turn_id"]] == "claimed", "m11 stays claimed by the dead bridge"

    async with loopx_mcp(tmp_path, broker.url, broker.token, *args, host_session_id=host) as b:
        for n in range(11, 21):
            event = await b.next_event()
            delivered.append(event.content)
            assert event.content == f"m{n}"
            result = await b.call("reply", chat_id=session_id, text=f"answer to m{n}")
            assert not result.is_error, text_of(result)
        await b.no_event(0.5)
    # Every message answered once, with its own answer; nothing claimed or queued.
    final = turns(broker, session_id)
    assert [t["state"] for t in final] == ["completed"] * 20
    assert [t["response"] for t in final] == [{"message": f"answer to m{n}"} for n in range(1, 21)]
    # Delivered once each, but m11: its holder died before answering, so it came again.
    assert delivered == [f"m{n}" for n in range(1, 12)] + [f"m{n}" for n in range(11, 21)]


async def test_concurrent_waits_in_one_bridge_never_share_a_turn(broker, tmp_path):
    host = unique("host")
    session_id = broker.bind(host)
    first, second = broker.send(session_id, "one"), broker.send(session_id, "two")
    args = [*channel_args(session_id), "--tools-only"]
    async with loopx_mcp(tmp_path, broker.url, broker.token, *args, host_session_id=host) as m:
        got: list[dict] = []

        async def wait() -> None:
            result = await m.call("wait_for_message", wait_seconds=10)
            assert not result.is_error, text_of(result)
            message = result.structured_content
            got.append(message)
            assert not (await m.call("reply", chat_id=session_id, turn_id=message["turn_id"],
                                     text=f"re: {message['text']}")).is_error

        async with anyio.create_task_group() as group:
            group.start_soon(wait)
            group.start_soon(wait)
        assert sorted(g["turn_id"] for g in got) == sorted([first["turn_id"], second["turn_id"]])
        # A wait while a delivered message is unanswered does not hand it out again.
        third = broker.send(session_id, "three")
        delivered = (await m.call("wait_for_message", wait_seconds=5)).structured_content
        assert delivered["turn_id"] == third["turn_id"]
        again = await m.call("wait_for_message", wait_seconds=1)
        assert again.is_error and "not answered yet" in text_of(again) and third["turn_id"] in text_of(again)
        assert not (await m.call("reply", chat_id=session_id, text="re: three")).is_error
    assert [t["response"]["message"] for t in turns(broker, session_id)] == ["re: one", "re: two", "re: three"]


async def test_a_refused_reply_never_wedges_the_channel(broker, tmp_path):
    host = unique("host")
    session_id = broker.bind(host)
    sent = broker.send(session_id, "first")
    async with loopx_mcp(tmp_path, broker.url, broker.token, *channel_args(session_id), host_session_id=host) as m:
        event = await m.next_event()
        claim_id = broker.api("POST", f"/v1/sessions/{session_id}/close")[1]["error"]["active_claim_id"]
        # The owner releases the turn under the bridge: the agent's reply is refused...
        broker.ok("POST", f"/v1/sessions/{session_id}/claims/{claim_id}/release", {"by": "owner"})
        refused = await m.call("reply", chat_id=session_id, turn_id=event.meta["turn_id"], text="late")
        assert refused.is_error and "not_claimed" in text_of(refused)
        # ...and the bridge goes on: the released turn comes again, then the next.
        again = await m.next_event()
        assert again.meta["turn_id"] == sent["turn_id"]
        assert not (await m.call("reply", chat_id=session_id, text="now")).is_error
        nxt = broker.send(session_id, "second")
        assert (await m.next_event()).meta["turn_id"] == nxt["turn_id"]
        assert not (await m.call("reply", chat_id=session_id, text="and that")).is_error
    turn = broker.turn(session_id, sent["turn_id"])
    assert turn["response"] == {"message": "now"}


async def test_the_owner_closes_a_session_whose_bridge_died_mid_turn(broker, tmp_path):
    host = unique("host")
    session_id = broker.bind(host)
    sent = broker.send(session_id, "you there?")
    with pytest.raises(BaseException):
        async with loopx_mcp(tmp_path, broker.url, broker.token, *channel_args(session_id), host_session_id=host) as m:
            await m.next_event()
            os.kill(m.pid(), signal.SIGKILL)
            await m.session.list_tools()
    status, refused = broker.api("POST", f"/v1/sessions/{session_id}/close")
    assert status == 409 and refused["error"]["code"] == "claim_active"
    claim_id = refused["error"]["active_claim_id"]
    broker.ok("POST", f"/v1/sessions/{session_id}/claims/{claim_id}/release", {"by": "owner"})
    assert broker.turn(session_id, sent["turn_id"])["state"] == "queued"
    closed = broker.ok("POST", f"/v1/sessions/{session_id}/close")
    assert closed["state"] == "closed"
    assert broker.turn(session_id, sent["turn_id"])["state"] == "cancelled"


# A short holder silence for the broker, and a bridge heartbeat well inside it.
SILENCE = 2.0
SHORT_SILENCE = {"LOOPX_HOLDER_SILENCE": "2s"}
FAST_HEARTBEAT = {"LOOPX_HEARTBEAT": "400ms"}


@pytest.fixture
def quick_broker(tmp_path):
    b = Broker(tmp_path, env=SHORT_SILENCE).start()
    yield b
    b.stop()


async def test_the_broker_releases_the_turn_of_a_bridge_killed_mid_turn_and_a_second_bridge_gets_it(
        quick_broker, tmp_path):
    broker = quick_broker
    host = unique("host")
    session_id = broker.bind(host)
    sent = broker.send(session_id, "you there?")
    args = channel_args(session_id)
    with pytest.raises(BaseException):
        async with loopx_mcp(tmp_path, broker.url, broker.token, *args, host_session_id=host,
                             env=FAST_HEARTBEAT) as a:
            event = await a.next_event()
            assert event.meta["turn_id"] == sent["turn_id"]
            killed_at = time.monotonic()
            os.kill(a.pid(), signal.SIGKILL)
            await a.session.list_tools()
    # Nobody else touches it: the broker releases it once the bridge is silent.
    queued = await anyio.to_thread.run_sync(lambda: broker.wait_turn(
        session_id, sent["turn_id"], lambda t: t["state"] == "queued", within=4 * SILENCE))
    assert queued["state"] == "queued"
    assert time.monotonic() - killed_at >= SILENCE / 2
    async with loopx_mcp(tmp_path, broker.url, broker.token, *args, host_session_id=host,
                         env=FAST_HEARTBEAT) as b:
        again = await b.next_event()
        assert again.meta["turn_id"] == sent["turn_id"]
        assert not (await b.call("reply", chat_id=session_id, text="here now")).is_error
    assert broker.turn(session_id, sent["turn_id"])["response"] == {"message": "here now"}


async def test_a_live_bridge_holding_a_turn_longer_than_the_silence_keeps_it(quick_broker, tmp_path):
    broker = quick_broker
    host = unique("host")
    session_id = broker.bind(host)
    sent = broker.send(session_id, "a long job")
    async with loopx_mcp(tmp_path, broker.url, broker.token, *channel_args(session_id), host_session_id=host,
                         env=FAST_HEARTBEAT) as m:
        await m.next_event()
        # The bridge says the agent works on it (its heartbeat).
        assert broker.ok("GET", f"/v1/sessions/{session_id}")["agent"]["state"] == "working"
        started = time.monotonic()
        while time.monotonic() - started < 3 * SILENCE:
            await anyio.sleep(0.25)
            assert broker.turn(session_id, sent["turn_id"])["state"] == "claimed"
        assert not (await m.call("reply", chat_id=session_id, text="done, slowly")).is_error
    assert broker.turn(session_id, sent["turn_id"])["response"] == {"message": "done, slowly"}
