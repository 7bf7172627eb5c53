"""A stub of the OpenAI Responses API (`POST /v1/responses`, streamed) for
tests/hooks/codex.sh. Each request is answered with "Stub answer. [<the tail
of the last user text>] Asked: <its last line ending in ?>", so the test sees
which instruction each turn answered; a last user text holding "RUN: <command>" is answered instead with a
call of Codex's shell tool (`exec_command`) that asks to run <command> outside
the sandbox (so Codex asks for approval), and the tool's output with a text
naming it.

With a GATE path, no request is answered before that file exists (at most
60 s): the test queues a message while Codex's first turn is under way.

Usage: python3 stub_responses.py PORT [GATE]
"""
import json, os, sys, time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

GATE = sys.argv[2] if len(sys.argv) > 2 else None


def last_user_text(items):
    last = ""
    for item in items:
        if item.get("type") == "message" and item.get("role") == "user":
            for part in item.get("content", []):
                if part.get("type") == "input_text":
                    last = part["text"]
    return last


def output(body):
    """The items of the answer: one message, or one shell call."""
    items = body.get("input", [])
    if items and items[-1].get("type") == "function_call_output":
        text = "Stub answer. [the command's output: %s]" % json.dumps(items[-1].get("output"))[:200]
    else:
        last = last_user_text(items)
        if "RUN: " in last:
            command = last.split("RUN: ", 1)[1].strip()
            arguments = {"cmd": command, "sandbox_permissions": "require_escalated",
                         "justification": "Create the marker file"}
            return [{"type": "function_call", "id": "fc_1", "call_id": "call_%d" % time.time_ns(),
                     "name": "exec_command", "arguments": json.dumps(arguments)}]
        text = "Stub answer. [" + last[-60:].replace("\n", " ") + "]"
        questions = [line.strip() for line in last.splitlines() if line.strip().endswith("?")]
        if questions:
            text += " Asked: " + questions[-1]
    return [{"type": "message", "role": "assistant", "id": "msg_1",
             "content": [{"type": "output_text", "text": text}]}]


class Handler(BaseHTTPRequestHandler):
    def log_message(self, *args):
        sys.stderr.write("stub: %s %s\n" % (self.command, self.path))

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers.get("content-length") or 0)) or b"{}")
        deadline = time.time() + 60
        while GATE and not os.path.exists(GATE) and time.time() < deadline:
            time.sleep(0.05)
        self.send_response(200)
        self.send_header("content-type", "text/event-stream")
        self.end_headers()

        def event(data):
            self.wfile.write(("event: %s\ndata: %s\n\n" % (data["type"], json.dumps(data))).encode())

        event({"type": "response.created", "response": {"id": "resp_1"}})
        for item in output(body):
            if item["type"] == "message":
                event({"type": "response.output_item.added", "item": dict(item, content=[])})
                event({"type": "response.output_text.delta", "item_id": item["id"],
                       "delta": item["content"][0]["text"]})
            else:
                event({"type": "response.output_item.added", "item": item})
            event({"type": "response.output_item.done", "item": item})
        event({"type": "response.completed", "response": {"id": "resp_1", "usage": {
            "input_tokens": 1, "input_tokens_details": None, "output_tokens": 1,
            "output_tokens_details": None, "total_tokens": 2}}})


ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), Handler).serve_forever()
