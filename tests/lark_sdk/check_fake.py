"""Checks the tests' fake Lark against Lark's official long-connection client.

A fake that Lark's own client cannot talk to tests nothing. This starts the
fake as a process (`cargo build --example fake_lark_ws`, mode `check`) and
points `lark_oapi.ws.Client` (PyPI `lark-oapi`, pinned in requirements.txt)
at it with its `domain` option. The client must fetch an endpoint, connect,
ping with the endpoint's service id, receive an event the fake sends in 3
fragments (joined into the whole envelope), and acknowledge it with code 200;
the fake judges the wire side and prints its verdict, this script the event.
First, the REST side of the fake's resource route (issue 39): the official
`lark.Client` fetches a tenant token from the fake and downloads an image
(`im.v1.message_resource.get`): its bytes and its file name must come through,
and a rate-limited download must read as code 99991400.

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

EXPECTED_BYTES = b"\x89PNG\r\n\x1a\nsdk-check"

received = []
downloads = {}


def check_resources(url: str) -> bool:
    import lark_oapi as lark
    from lark_oapi.api.im.v1 import GetMessageResourceRequest

    api = lark.Client.builder().app_id(APP_ID).app_secret(APP_SECRET).domain(url).build()

    def get(key):
        request = (
            GetMessageResourceRequest.builder()
            .message_id("om_sdk_check")
            .file_key(key)
            .type("image")
            .build()
        )
        return api.im.v1.message_resource.get(request)

    image = get("img_sdk_check")
    limited = get("img_sdk_limited")
    downloads["image"] = {
        "code": image.code,
        "bytes_equal": image.file is not None and image.file.read() == EXPECTED_BYTES,
        "file_name": image.file_name,
    }
    downloads["limited"] = {"code": limited.code, "status": limited.raw.status_code}
    print(f"official client downloads: {json.dumps(downloads)}")
    return (
        image.code == 0
        and downloads["image"]["bytes_equal"]
        and image.file_name == "sdk.png"
        and limited.code == 99991400
        and limited.raw.status_code == 429
    )


def main() -> None:
    fake = subprocess.Popen([sys.argv[1], "check"], stdout=subprocess.PIPE, text=True)
    first = fake.stdout.readline().strip()
    if not first.startswith("FAKE_LARK_URL="):
        print(f"the fake did not start: {first!r}")
        sys.exit(1)
    url = first.split("=", 1)[1]
    resources_ok = check_resources(url)

    def judge() -> None:
        verdict_line = fake.stdout.read().strip()
        code = fake.wait()
        print(f"fake verdict: {verdict_line}")
        verdict = json.loads(verdict_line.splitlines()[-1]) if verdict_line else {}
        event_ok = len(received) == 1 and received[0] == EXPECTED_TEXT
        print(f"official client received {len(received)} event(s), text intact: {event_ok}")
        ok = (
            code == 0
            and verdict.get("ok") is True
            and verdict.get("pings", 0) >= 1
            and event_ok
            and resources_ok
        )
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
