"""A stub of the Anthropic Messages API for tests/hooks/claude_code.sh: every
message is answered with "Stub answer. [<the tail of the last user text>]", as
a stream when asked, so the test sees which instruction each turn answered.
With a TEXT and --same, every message is answered with exactly TEXT (a model
that says "Done." to everything). The interactive TUI appends its own
`<system-reminder>` text blocks after the prompt, and a "system" message
with the environment to the first: those are not the user's text and are
skipped; a Stop hook's block comes as a "system" message too ("Stop hook
blocking error from command: ...") and is kept. With STUB_LOG set, each
request's texts (what is skipped left out) are appended to that file, one
JSON line `{"t": <unix time>, "texts": [...]}`, so a test sees what the
model was sent, and when.

With STUB_TOOL_USE set to `{"name": ..., "input": {...}}`, a streamed request
that offers that tool and carries no tool result yet is answered with one
`tool_use` block calling it (stop_reason "tool_use"), its input streamed as
`input_json_delta` pieces; once the conversation has a tool result, the
answers are text as above. A tool result is logged (and echoed) as a text
"tool_result: <what the tool returned>".

A streamed request whose last user text holds "[slow]" starts its answer
("Working on it, slowly. ") and ends it 120 s later (a slow turn, for a test
to interrupt); the wait ends early when the client goes away.

Usage: python3 stub_model.py PORT [TEXT [--same]]
"""
import json, os, sys, time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
TEXT = sys.argv[2] if len(sys.argv) > 2 else "Stub answer."
SAME = "--same" in sys.argv[3:]
TOOL_USE = json.loads(os.environ["STUB_TOOL_USE"]) if os.environ.get("STUB_TOOL_USE") else None

def wants_tool(body):
    """Whether this request is answered with the tool call: the tool offered,
    no tool result in the conversation yet."""
    if not TOOL_USE or not body.get("stream"): return False
    if TOOL_USE["name"] not in [t.get("name") for t in body.get("tools") or []]: return False
    return not any(isinstance(m.get("content"), list) and any(p.get("type") == "tool_result" for p in m["content"])
                   for m in body.get("messages", []))
class H(BaseHTTPRequestHandler):
    def log_message(self, *a):
        sys.stderr.write("stub: %s %s\n" % (self.command, self.path))
    def do_GET(self):
        self.send_response(200); self.send_header("content-type","application/json"); self.end_headers(); self.wfile.write(b"{}")
    def do_POST(self):
        n = int(self.headers.get("content-length") or 0); body = json.loads(self.rfile.read(n) or b"{}")
        if "count_tokens" in self.path:
            out = json.dumps({"input_tokens": 10}).encode()
            self.send_response(200); self.send_header("content-type","application/json"); self.end_headers(); self.wfile.write(out); return
        # the last user text, echoed in the answer so the test sees which turn it was
        texts = []
        for m in body.get("messages", []):
            if m.get("role") == "assistant": continue
            c = m.get("content")
            if isinstance(c, str): c = [{"type": "text", "text": c}]
            for p in c if isinstance(c, list) else []:
                if p.get("type") == "tool_result":
                    # What the tool returned, as the model reads it.
                    r = p.get("content")
                    r = r if isinstance(r, str) else " ".join(x.get("text", "") for x in r or [] if isinstance(x, dict))
                    texts.append("tool_result: " + r); continue
                if p.get("type") != "text" or p["text"].lstrip().startswith("<system-reminder>"): continue
                # "system" messages: the environment (skipped), a Stop hook's block (kept)
                if m.get("role") == "system" and not p["text"].startswith("Stop hook"): continue
                texts.append(p["text"])
        last = texts[-1] if texts else ""
        if os.environ.get("STUB_LOG"):
            with open(os.environ["STUB_LOG"], "a") as f: f.write(json.dumps({"t": time.time(), "texts": texts, "tools": [t.get("name") for t in body.get("tools") or []]}) + "\n")
        if "[slow]" in last and body.get("stream"):
            # A slow turn: the answer starts at once, then its end waits
            # 120 s, unless the client hangs up first.
            self.send_response(200); self.send_header("content-type","text/event-stream"); self.end_headers()
            def ev(name, data): self.wfile.write(("event: %s\ndata: %s\n\n" % (name, json.dumps(data))).encode())
            msg = {"id":"msg_1","type":"message","role":"assistant","model":body.get("model","m"),"content":[],"stop_reason":None,"stop_sequence":None,"usage":{"input_tokens":1,"output_tokens":1}}
            ev("message_start", {"type":"message_start","message":msg})
            ev("content_block_start", {"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}})
            ev("content_block_delta", {"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"Working on it, slowly. "}})
            self.wfile.flush()
            for _ in range(1200):
                time.sleep(0.1)
                try: self.wfile.write(b": waiting\n\n"); self.wfile.flush()
                except OSError: return
            return
        text = TEXT if SAME else TEXT + " [" + last[-60:].replace("\n"," ") + "]"
        msg = {"id":"msg_1","type":"message","role":"assistant","model":body.get("model","m"),"content":[],"stop_reason":None,"stop_sequence":None,"usage":{"input_tokens":1,"output_tokens":1}}
        if not body.get("stream"):
            msg["content"]=[{"type":"text","text":text}]; msg["stop_reason"]="end_turn"
            out=json.dumps(msg).encode(); self.send_response(200); self.send_header("content-type","application/json"); self.end_headers(); self.wfile.write(out); return
        self.send_response(200); self.send_header("content-type","text/event-stream"); self.end_headers()
        def ev(name, data): self.wfile.write(("event: %s\ndata: %s\n\n" % (name, json.dumps(data))).encode())
        ev("message_start", {"type":"message_start","message":msg})
        if wants_tool(body):
            block = {"type":"tool_use","id":"toolu_stub_%d" % time.time_ns(),"name":TOOL_USE["name"],"input":{}}
            ev("content_block_start", {"type":"content_block_start","index":0,"content_block":block})
            args = json.dumps(TOOL_USE["input"])
            for i in range(0, len(args), 16):  # in pieces, as the real API streams them
                ev("content_block_delta", {"type":"content_block_delta","index":0,"delta":{"type":"input_json_delta","partial_json":args[i:i+16]}})
            ev("content_block_stop", {"type":"content_block_stop","index":0})
            ev("message_delta", {"type":"message_delta","delta":{"stop_reason":"tool_use","stop_sequence":None},"usage":{"output_tokens":5}})
            ev("message_stop", {"type":"message_stop"})
            return
        ev("content_block_start", {"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}})
        ev("content_block_delta", {"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":text}})
        ev("content_block_stop", {"type":"content_block_stop","index":0})
        ev("message_delta", {"type":"message_delta","delta":{"stop_reason":"end_turn","stop_sequence":None},"usage":{"output_tokens":5}})
        ev("message_stop", {"type":"message_stop"})
ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
