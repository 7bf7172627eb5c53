# Sourced by the wake tests (tests/wake/*.sh): the agents' real interactive
# TUIs in a private tmux server, driven and read as a person would, through
# the pane. Needs $work (tests/support/live_broker.sh) and python3. Sets
# nothing in the caller's tmux: the server's socket is $work/tmux.sock.
#
#   tui_start                     start the server; later windows get the caller's environment as it was then
#   tui_window NAME DIR           a window running an interactive bash (prompt "wake$ ") in DIR; prints its pane id (%N)
#   tui_screen PANE               the visible screen as text
#   tui_wait PANE REGEX [SECS]    wait until the screen matches REGEX (Python syntax, multi-line); 1 on timeout
#   tui_type PANE TEXT            type TEXT as keys (newlines as LF, a new line in the agent's prompt); no Enter
#   tui_enter PANE                press Enter
#   tui_foreground PANE           the name of the pane's foreground command (claude, codex, bash)
#   tui_claude_home KEY DIR...    write ~/.claude.json so Claude Code opens at its prompt: no onboarding,
#                                 API key approved, each DIR trusted
#   tui_claude PANE [ARGS...]     start claude (the $claude binary) in the pane's shell; wait for its idle prompt
#   tui_claude_idle PANE          true when Claude Code shows an empty prompt and is not working
#   tui_codex_home PORT DIR...    write ~/.codex/config.toml: the stub Responses API on PORT (key in
#                                 STUB_API_KEY), each DIR trusted
#   tui_codex_trust_hooks DIR     trust every hook Codex would run in DIR, with the hashes Codex gives
#   tui_codex PANE [ARGS...]      start codex (the $codex binary) in the pane's shell; wait for its idle prompt
#   tui_codex_idle PANE           true when Codex shows its empty composer and is not working
#   tui_stop                      kill the server and every process still carrying its socket in TMUX
#
# Facts these rely on (Claude Code 2.1.332, Codex 0.171.0, tmux 3.3a):
# Claude Code's prompt is a line "❯" + U+00A0 between two rules; Codex's
# empty composer a line "› Ask Codex to do anything" (its placeholder); while
# a turn or a hook runs, either says "esc to interrupt". A hook's
# environment has TMUX and TMUX_PANE (Codex: those of the pane whose codex
# started its shared background server, unless --no-daemon).

TUI_SOCK="$work/tmux.sock"
tui() { tmux -S "$TUI_SOCK" -f /dev/null "$@"; }

tui_start() {
  # The first session holds the server; its window is never used by a test.
  tui new-session -d -s wake -n idle -x 200 -y 50 "sleep 100000"
  tui set-option -g remain-on-exit off >/dev/null
}

tui_window() {
  local name=$1 dir=$2
  tui new-window -d -P -F '#{pane_id}' -t wake -n "$name" -c "$dir" \
    "env PS1='wake\$ ' bash --norc --noprofile -i"
}

tui_screen() { tui capture-pane -p -J -t "$1"; }

tui_wait() {
  local pane=$1 regex=$2 secs=${3:-30}
  TUI_SOCK=$TUI_SOCK python3 - "$pane" "$regex" "$secs" <<'PY'
import os, re, subprocess, sys, time
pane, regex, secs = sys.argv[1], re.compile(sys.argv[2], re.M), float(sys.argv[3])
end = time.time() + secs
while True:
    screen = subprocess.run(["tmux", "-S", os.environ["TUI_SOCK"], "capture-pane", "-p", "-J", "-t", pane],
                            capture_output=True, text=True).stdout
    if regex.search(screen): sys.exit(0)
    if time.time() > end:
        sys.stderr.write("tui_wait: no /%s/ on %s after %ss; the screen:\n%s\n" % (regex.pattern, pane, secs, screen))
        sys.exit(1)
    time.sleep(0.1)
PY
}

tui_type() { tui send-keys -t "$1" -l -- "$2"; }
tui_enter() { tui send-keys -t "$1" Enter; }
tui_foreground() { tui display-message -p -t "$1" '#{pane_current_command}'; }

tui_claude_home() {
  local key=$1
  shift
  python3 - "$HOME/.claude.json" "$key" "$@" <<'PY'
import json, sys
path, key, dirs = sys.argv[1], sys.argv[2], sys.argv[3:]
json.dump({"hasCompletedOnboarding": True, "theme": "dark",
           "customApiKeyResponses": {"approved": [key[-20:]], "rejected": []},
           "projects": {d: {"hasTrustDialogAccepted": True} for d in dirs}}, open(path, "w"))
PY
}

# The empty prompt line, and no turn or hook running.
TUI_CLAUDE_IDLE='\A(?![\s\S]*esc to interrupt)[\s\S]*^❯[ \xa0]*$'

tui_claude() {
  local pane=$1
  shift
  tui_type "$pane" "$(printf '%q ' "$claude" "$@")"
  tui_enter "$pane"
  tui_wait "$pane" "$TUI_CLAUDE_IDLE" 60
}

tui_claude_idle() {
  tui_screen "$1" | python3 -c 'import re, sys; sys.exit(0 if re.search(sys.argv[1], sys.stdin.read(), re.M) else 1)' "$TUI_CLAUDE_IDLE"
}

# Codex's empty composer (its placeholder), and no turn running.
TUI_CODEX_IDLE='\A(?![\s\S]*to interrupt)[\s\S]*^› (Ask Codex to do anything|Ask a follow-up question)'

tui_codex_home() {
  local port=$1
  shift
  mkdir -p "$HOME/.codex"
  {
    printf 'model = "stub-model"\nmodel_provider = "stub"\n\n[model_providers.stub]\nname = "stub"\n'
    printf 'base_url = "http://127.0.0.1:%s/v1"\nwire_api = "responses"\nenv_key = "STUB_API_KEY"\n' "$port"
    for dir in "$@"; do printf '\n[projects."%s"]\ntrust_level = "trusted"\n' "$dir"; done
  } >"$HOME/.codex/config.toml"
}

# Codex's `app-server` (JSON-RPC lines on stdio) lists the hooks for a
# directory with their key and hash; [hooks.state."<key>"] trusted_hash in
# the user config trusts one. The hash is Codex's own, never re-derived.
tui_codex_trust_hooks() {
  python3 - "$codex" "$1" "$HOME/.codex/config.toml" <<'PY'
import json, re, subprocess, sys
codex, cwd, config = sys.argv[1:4]
server = subprocess.Popen([codex, "app-server"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                          stderr=subprocess.DEVNULL, text=True)
def call(i, method, params):
    server.stdin.write(json.dumps({"id": i, "method": method, "params": params}) + "\n")
    server.stdin.flush()
    for line in server.stdout:
        m = json.loads(line)
        if m.get("id") == i and "method" not in m: return m
call(1, "initialize", {"clientInfo": {"name": "wake-test", "version": "0"}})
server.stdin.write(json.dumps({"method": "initialized"}) + "\n"); server.stdin.flush()
hooks = call(2, "hooks/list", {"cwds": [cwd]})["result"]["data"][0]["hooks"]
server.kill(); server.wait()
text = open(config).read()
for h in hooks:
    if h["trustStatus"] != "trusted":
        # A changed hook's old entry goes: TOML refuses a table twice.
        head = '[hooks.state."%s"]' % h["key"]
        text = re.sub(r'\n*%s\ntrusted_hash = "[^"]*"\n' % re.escape(head), "\n", text)
        text += '\n%s\ntrusted_hash = "%s"\n' % (head, h["currentHash"])
open(config, "w").write(text)
print("codex hooks trusted in %s: %d" % (cwd, len(hooks)))
PY
}

tui_codex() {
  local pane=$1
  shift
  # --no-daemon: loopx types into no Codex whose hooks run in the shared
  # background server (they cannot tell which terminal is theirs).
  tui_type "$pane" "$(printf '%q ' "$codex" --no-daemon "$@")"
  tui_enter "$pane"
  tui_wait "$pane" "$TUI_CODEX_IDLE" 60
}

tui_codex_idle() {
  tui_screen "$1" | python3 -c 'import re, sys; sys.exit(0 if re.search(sys.argv[1], sys.stdin.read(), re.M) else 1)' "$TUI_CODEX_IDLE"
}

# The processes whose environment names our server (panes' programs, their
# hooks and anything those left running), by pid.
tui_processes() {
  python3 - "$TUI_SOCK" <<'PY'
import os, sys
mark = ("TMUX=%s," % sys.argv[1]).encode()
for pid in filter(str.isdigit, os.listdir("/proc")):
    try:
        env = open("/proc/%s/environ" % pid, "rb").read().split(b"\0")
    except OSError:
        continue
    if any(v.startswith(mark) for v in env): print(pid)
PY
}

tui_stop() {
  local left
  tui kill-server 2>/dev/null || true
  # SIGHUP from the server ends the panes' programs; anything else that
  # carries the socket (a hook's background helper) is ended here.
  sleep 0.5
  left=$(tui_processes)
  [ -n "$left" ] && kill $left 2>/dev/null
  sleep 0.3
  left=$(tui_processes)
  [ -n "$left" ] && kill -9 $left 2>/dev/null
  return 0
}
