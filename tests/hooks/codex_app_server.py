"""Drives the real `codex app-server` (JSON-RPC lines over stdio) for
tests/hooks/codex.sh: one thread with approval policy `on-request`, two
turns in which the stub model asks to run `touch <file>` outside the sandbox.
Codex runs the PermissionRequest hook (`loopx hook permission-request`),
which creates a permission request on the thread's LoopX session; this
script answers it as the Web page does (POST .../answer): `allow` in the
first turn (the file is created), `deny` in the second (it is not). Codex
must not ask this client itself: the hook's verdict decides.

Usage: python3 codex_app_server.py CODEX PROJECT_DIR BROKER_URL GOAL_ID
(the owner token in LOOPX_TOKEN). Prints one JSON line per turn.
"""
import json, os, queue, subprocess, sys, threading, time, urllib.request

codex, project, broker, goal = sys.argv[1:5]
token = os.environ["LOOPX_TOKEN"]
TIMEOUT = 60


def broker_call(method, path, body=None):
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(broker + path, data=data, method=method, headers={
        "Authorization": "Bearer " + token, "Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=10) as answer:
        return json.load(answer)


server = subprocess.Popen([codex, "app-server"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                          stderr=open(os.path.join(os.path.dirname(project), "app-server.log"), "w"),
                          text=True)
messages = queue.Queue()
threading.Thread(target=lambda: [messages.put(json.loads(l)) for l in server.stdout], daemon=True).start()
next_id = 0


def send(message):
    server.stdin.write(json.dumps(message) + "\n")
    server.stdin.flush()


def request(method, params):
    global next_id
    next_id += 1
    send({"id": next_id, "method": method, "params": params})
    return next_id


def wait_for(done, on_idle=lambda: None):
    """Reads messages until done(message) holds; Codex's own approval
    requests to this client are declined and counted."""
    deadline = time.time() + TIMEOUT
    while time.time() < deadline:
        try:
            message = messages.get(timeout=0.1)
        except queue.Empty:
            on_idle()
            continue
        if "method" in message and "id" in message:
            asked.append(message["method"])
            send({"id": message["id"], "result": {"decision": "decline"}})
            continue
        if "error" in message:
            raise SystemExit("codex app-server refused: %s" % message)
        if done(message):
            return message
    raise SystemExit("codex app-server: no answer within %d s" % TIMEOUT)


def sessions():
    return {s["session_id"] for s in broker_call("GET", "/v1/sessions?goal_id=" + goal)["sessions"]}


def answer_pending(verdict, answered):
    """The Web page's part: the pending request on the thread's session (the
    goal's session that is new since this script started; the projection
    names no host)."""
    if answered:
        return
    ours = sessions() - before
    if not ours:
        return
    assert len(ours) == 1, ours
    session = ours.pop()
    pending = broker_call("GET", "/v1/sessions/%s/permission-requests?state=pending" % session)
    for permission in pending["permission_requests"]:
        path = "/v1/sessions/%s/permission-requests/%s/answer" % (session, permission["request_id"])
        answered.append(broker_call("POST", path, {"behavior": verdict}))


asked = []
before = sessions()
hello = request("initialize", {"clientInfo": {"name": "loopx-test", "version": "0"}})
wait_for(lambda m: m.get("id") == hello)
send({"method": "initialized"})
started = request("thread/start", {"cwd": project, "approvalPolicy": "on-request", "sandbox": "workspace-write"})
thread_id = wait_for(lambda m: m.get("id") == started)["result"]["thread"]["id"]
for verdict, name in [("allow", "allowed.txt"), ("deny", "denied.txt")]:
    target = os.path.join(project, name)
    answered = []
    request("turn/start", {"threadId": thread_id, "approvalPolicy": "on-request",
                           "input": [{"type": "text", "text": "Please RUN: touch " + target}]})
    commands = []

    def done(message):
        item = message.get("params", {}).get("item", {})
        if message.get("method") == "item/completed" and item.get("type") == "commandExecution":
            commands.append(item["status"])
        return message.get("method") == "turn/completed"

    wait_for(done, lambda: answer_pending(verdict, answered))
    assert answered, "no permission request reached the broker (%s)" % verdict
    request_state = answered[0]["state"]
    print(json.dumps({"verdict": verdict, "request": {k: answered[0][k] for k in
                      ("tool_name", "description", "input_preview", "state")},
                      "command": commands, "file_created": os.path.exists(target)}))
    assert request_state == {"allow": "allowed", "deny": "denied"}[verdict], answered
    assert os.path.exists(target) == (verdict == "allow"), (verdict, commands)
    assert not asked, "Codex asked its client instead of taking the hook's verdict: %s" % asked
server.stdin.close()
server.wait(timeout=10)
