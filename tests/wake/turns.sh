# Sourced by the wake tests: the broker side of a case. Needs $loopx,
# $BROKER_URL, $LOOPX_TOKEN and $work (tests/support/live_broker.sh).
#
#   api PATH                      GET the broker's PATH as the owner
#   open_session GOAL             the goal's open session, once a SessionStart hook has bound it
#   send SESSION TEXT             `loopx chat send`; prints the turn's seq; the send time goes to $work/sent.jsonl
#   answers SESSION SECS SEQ...   wait until those turns are completed; their answers, one a line, in order
#   turn_state SESSION SEQ        the turn's state
#   expect_answer ANSWER SEQ TEXT ANSWER is the stub's answer to a request holding TEXT (needs $STUB_LOG)
#   interrupted SESSION SEQ T0    wait until turn SEQ is cancelled `interrupted` (an Esc pressed at
#                                 T0, `date +%s.%N`); prints the seconds it took; fails past 5 s
#   continued SESSION             the session a new host session in its terminal continues it in (10 s)
#   open_sessions GOAL            the goal's open sessions, space-separated
#   closed_within SESSION SECS    wait until the session is closed; fails past SECS
#   latency_report STUB_LOG       per message: send -> the model's request for it (our clock), and the
#                                 broker's enqueued -> claimed -> completed; min, median, max

api() { curl -fsS -H "Authorization: Bearer $LOOPX_TOKEN" "$BROKER_URL$1"; }

open_session() {
  local goal=$1 id
  for _ in $(seq 100); do
    id=$("$loopx" worker-bridge attached-session-list --broker-url "$BROKER_URL" --state open \
      --goal-id "$goal" --format json | python3 -c '
import json, sys
ss = json.load(sys.stdin)["sessions"]
print(ss[0]["session_id"] if ss else "")')
    [ -n "$id" ] && { echo "$id"; return 0; }
    sleep 0.1
  done
  echo "no open session for goal $goal: the SessionStart hook did not bind one" >&2
  return 1
}

send() {
  local seq t
  t=$(date +%s.%N)   # before the send: a waker may type before `chat send` returns
  seq=$("$loopx" chat send --broker-url "$BROKER_URL" --session-id "$1" --text "$2" --format json |
    python3 -c 'import json, sys; print(json.load(sys.stdin)["seq"])')
  python3 -c 'import json, sys; print(json.dumps({"t": float(sys.argv[1]), "session": sys.argv[2], "seq": int(sys.argv[3]), "text": sys.argv[4]}))' \
    "$t" "$1" "$seq" "$2" >>"$work/sent.jsonl"
  echo "$seq"
}

answers() {
  local session=$1 secs=$2
  shift 2
  python3 - "$BROKER_URL" "$LOOPX_TOKEN" "$session" "$secs" "$@" <<'PY'
import json, sys, time, urllib.request
url, token, session, secs, seqs = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4]), [int(s) for s in sys.argv[5:]]
end = time.time() + secs
while True:
    req = urllib.request.Request(f"{url}/v1/sessions/{session}/turns?limit=200", headers={"Authorization": f"Bearer {token}"})
    turns = {t["seq"]: t for t in json.load(urllib.request.urlopen(req))["turns"]}
    if all(turns.get(s, {}).get("state") == "completed" for s in seqs):
        for s in seqs: print(turns[s]["response"]["message"].replace("\n", " "))
        sys.exit(0)
    if time.time() > end:
        sys.stderr.write("turns not completed after %ss: %s\n" % (secs, json.dumps([turns.get(s) for s in seqs], indent=1)))
        sys.exit(1)
    time.sleep(0.2)
PY
}

turn_state() {
  api "/v1/sessions/$1/turns?limit=200" | python3 -c '
import json, sys
print([t["state"] for t in json.load(sys.stdin)["turns"] if t["seq"] == int(sys.argv[1])][0])' "$2"
}

# The turn's answer is the stub's answer to a request whose last text holds
# the message: the typed prompt "[LoopX #SEQ] TEXT", or a Stop hook's block
# that delivered it after another turn. The stubs answer "Stub answer. [<the
# last text's last 60 characters>]".
expect_answer() {
  python3 - "$STUB_LOG" "$@" <<'PY'
import json, sys
log, answer, seq, text = sys.argv[1:5]
lasts = [json.loads(l)["texts"][-1] for l in open(log) if json.loads(l)["texts"]]
first = text.split("\n")[0]
mine = [t for t in lasts if first in t]
assert mine, "no request to the model held message #%s (%r)" % (seq, first)
made = ["Stub answer. [" + t[-60:].replace("\n", " ") + "]" for t in mine]
assert answer in made, "turn #%s was answered %r, not by a request holding it: %r" % (seq, answer, made)
PY
}

interrupted() {
  local session=$1 seq=$2 t0=$3 waited
  for _ in $(seq 100); do [ "$(turn_state "$session" "$seq")" = cancelled ] && break; sleep 0.1; done
  waited=$(python3 -c "import time; print('%.2f' % (time.time() - $t0))")
  api "/v1/sessions/$session/turns?limit=200" | python3 -c '
import json, sys
t = [t for t in json.load(sys.stdin)["turns"] if t["seq"] == int(sys.argv[1])][0]
assert (t["state"], t["cancel_reason"]) == ("cancelled", "interrupted"), "after Esc the turn is %s/%s" % (t["state"], t["cancel_reason"])
' "$seq" || return 1
  python3 -c "import sys; sys.exit(0 if $waited <= 5 else 1)" || { echo "settled $waited s after Esc, not within 5 s" >&2; return 1; }
  echo "$waited"
}

continued() {
  local new
  for _ in $(seq 100); do
    new=$(api "/v1/sessions/$1" | python3 -c 'import json, sys; print(json.load(sys.stdin).get("continued_in") or "")')
    [ -n "$new" ] && { echo "$new"; return 0; }
    sleep 0.1
  done
  echo "$1 names no continued_in: $(api "/v1/sessions/$1")" >&2
  return 1
}

open_sessions() {
  "$loopx" worker-bridge attached-session-list --broker-url "$BROKER_URL" --state open \
    --goal-id "$1" --format json | python3 -c 'import json, sys; print(" ".join(s["session_id"] for s in json.load(sys.stdin)["sessions"]))'
}

closed_within() {
  local state
  for _ in $(seq $(($2 * 10))); do
    state=$(api "/v1/sessions/$1" | python3 -c 'import json, sys; print(json.load(sys.stdin)["state"])')
    [ "$state" = closed ] && return 0
    sleep 0.1
  done
  echo "session $1 is $state after ${2}s, not closed" >&2
  return 1
}

latency_report() {
  python3 - "$work/sent.jsonl" "$1" "$BROKER_URL" "$LOOPX_TOKEN" <<'PY'
import json, re, sys, urllib.request
from datetime import datetime
sent = [json.loads(l) for l in open(sys.argv[1])]
reqs = [json.loads(l) for l in open(sys.argv[2])]
url, token = sys.argv[3], sys.argv[4]
def turns(session):
    req = urllib.request.Request(f"{url}/v1/sessions/{session}/turns?limit=200", headers={"Authorization": f"Bearer {token}"})
    return {t["seq"]: t for t in json.load(urllib.request.urlopen(req))["turns"]}
ts = lambda s: datetime.fromisoformat(s.replace("Z", "+00:00")).timestamp()
typed = []
for m in sent:
    first = m["text"].split("\n")[0]
    marker = re.compile(r"\[LoopX #%d( [a-z]+)?\]" % m["seq"])
    hit = [r["t"] for r in reqs if r["texts"] and marker.search(r["texts"][-1]) and first in r["texts"][-1]]
    t = turns(m["session"]).get(m["seq"], {})
    line = "#%d %-40r" % (m["seq"], first[:40])
    line += " typed +%.2fs" % (hit[0] - m["t"]) if hit else " not typed"
    for name in ("claimed", "completed"):
        if t.get(name + "_at"): line += ", %s +%.2fs" % (name, ts(t[name + "_at"]) - ts(t["enqueued_at"]))
    print("latency", line)
    if hit: typed.append(hit[0] - m["t"])
if typed:
    typed.sort()
    print("latency send->typed over %d messages: min %.2fs, median %.2fs, max %.2fs"
          % (len(typed), typed[0], typed[len(typed) // 2], typed[-1]))
PY
}
