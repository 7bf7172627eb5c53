"""Checks the tests' fake Lark against Lark's official long-connection client.

A fake that Lark's own client cannot talk to tests nothing. This starts the
fake as a process (`cargo build --example fake_lark_ws`, mode `check`) and
points `lark_oapi.ws.Client` (PyPI `lark-oapi`, pinned in requirements.txt)
at it with its `domain` option. The client must fetch an endpoint, connect,
ping with the endpoint's service id, receive an event the fake sends in 3
fragments (joined into the whole envelope), and acknowledge it with code 200;
the fake judges the wire side and prints its verdict, this script the event.

Usage: python check_fake.py path/to/fake_lark_ws
"""

import json
import os
import subprocess
import sys
import threading

APP_ID = "cli_9f5343c580712544"
APP_SECRET = "fake-app-secret-0123456789"
EXPECTED_TEXT = "fragmented event " * 200

received = []


def main() -> None:
    fake = subprocess.Popen([sys.argv[1], "check"], stdout=subprocess.PIPE, text=True)
    first = fake.stdout.readline().strip()
    if not first.startswith("FAKE_LARK_URL="):
        print(f"the fake did not start: {first!r}")
        sys.exit(1)
    url = first.split("=", 1)[1]

    def judge() -> None:
        verdict_line = fake.stdout.read().strip()
        code = fake.wait()
        print(f"fake verdict: {verdict_line}")
        verdict = json.loads(verdict_line.splitlines()[-1]) if verdict_line else {}
        event_ok = len(received) == 1 and received[0] == EXPECTED_TEXT
        print(f"official client received {len(received)} event(s), text intact: {event_ok}")
        ok = code == 0 and verdict.get("ok") is True and verdict.get("pings", 0) >= 1 and event_ok
        print("check_fake: OK" if ok else "check_fake: FAILED")
        sys.stdout.flush()
        os._exit(0 if ok else 1)

    threading.Thread(target=judge, daemon=True).start()

    import lark_oapi as lark

    def on_message(data) -> None:
        content = json.loads(data.event.message.content)
        received.append(content["text"])

    handler = (
        lark.EventDispatcherHandler.builder("", "")
        .register_p2_im_message_receive_v1(on_message)
        .build()
    )
    client = lark.ws.Client(
        APP_ID,
        APP_SECRET,
        event_handler=handler,
        domain=url,
        log_level=lark.LogLevel.DEBUG,
    )
    # Runs until the judge ends the process.
    client.start()


if __name__ == "__main__":
    main()
