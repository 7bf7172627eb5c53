"""A stub of the OpenAI Responses API (`POST /v1/responses`, streamed) for
tests/wake/codex.sh: each request is answered "Stub answer. [<the tail of the
last user text>]". Codex's own context messages (`<environment_context>`,
`<user_instructions>` and the like) are not the user's text and are skipped
(a Stop hook's block reason comes as `<hook_prompt hook_run_id="...">REASON
</hook_prompt>` and counts as REASON),
and so is its request for a thread's title ("Generate a concise, single-line
task title ..."), made beside the first turn, which quotes the prompt.
With STUB_LOG set, each request's user texts are appended to that file, one
JSON line `{"t": <unix time>, "texts": [...]}`, as tests/hooks/stub_model.py
does for the Anthropic API. With a GATE path, no answer is sent while that
file exists (a turn held open, to see the agent busy). A request whose last
user text holds "[slow]" starts its answer ("Working on it, slowly.") and
ends it 120 s later, unless the client hangs up first (a slow turn, for a
test to interrupt); with "[slowish]", 8 s later.

(tests/hooks/stub_responses.py, on its way from the Codex hooks work, is the
same stub with more; once both are in, this one goes and that one logs.)

Usage: python3 stub_responses.py PORT [GATE]
"""
import json, os, re, sys, time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

GATE = sys.argv[2] if len(sys.argv) > 2 else None


TITLE_REQUEST = "Generate a concise, single-line task title"


def user_texts(items):
    texts = []
    for item in items:
        if item.get("type") == "message" and item.get("role") == "user":
            for part in item.get("content", []):
                if part.get("type") != "input_text":
                    continue
                text = part["text"]
                hook = re.fullmatch(r"\s*<hook_prompt[^>]*>(.*)</hook_prompt>\s*", text, re.S)
                if hook:
                    texts.append(hook.group(1))
                elif not text.lstrip().startswith("<"):
                    texts.append(text)
    return [] if any(t.startswith(TITLE_REQUEST) for t in texts) else texts


class Handler(BaseHTTPRequestHandler):
    def log_message(self, *args):
        sys.stderr.write("stub: %s %s\n" % (self.command, self.path))

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers.get("content-length") or 0)) or b"{}")
        texts = user_texts(body.get("input", []))
        if os.environ.get("STUB_LOG") and texts:
            with open(os.environ["STUB_LOG"], "a") as f:
                f.write(json.dumps({"t": time.time(), "texts": texts}) + "\n")
        while GATE and os.path.exists(GATE):
            time.sleep(0.05)
        last = texts[-1] if texts else ""
        text = "Stub answer. [" + last[-60:].replace("\n", " ") + "]"
        item = {"type": "message", "role": "assistant", "id": "msg_1",
                "content": [{"type": "output_text", "text": text}]}
        self.send_response(200)
        self.send_header("content-type", "text/event-stream")
        self.end_headers()

        def event(data):
            self.wfile.write(("event: %s\ndata: %s\n\n" % (data["type"], json.dumps(data))).encode())

        event({"type": "response.created", "response": {"id": "resp_1"}})
        event({"type": "response.output_item.added", "item": dict(item, content=[])})
        if "[slow]" in last or "[slowish]" in last:
            event({"type": "response.output_text.delta", "item_id": "msg_1", "delta": "Working on it, slowly. "})
            for _ in range(1200 if "[slow]" in last else 80):
                time.sleep(0.1)
                try:
                    self.wfile.write(b": waiting\n\n")
                    self.wfile.flush()
                except OSError:
                    return
        event({"type": "response.output_text.delta", "item_id": "msg_1", "delta": text})
        event({"type": "response.output_item.done", "item": item})
        event({"type": "response.completed", "response": {"id": "resp_1", "usage": {
            "input_tokens": 1, "input_tokens_details": None, "output_tokens": 1,
            "output_tokens_details": None, "total_tokens": 2}}})


ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), Handler).serve_forever()
