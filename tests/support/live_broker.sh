# Sourced by the checks that run against a live broker (tests/python,
# tests/typescript, tests/readme): a scratch folder `$work`, removed on exit,
# and `start_broker LOOPX [SERVE ARGS...]`, which runs `loopx serve` on a free
# loopback port (its log in $work/broker.log), waits for /healthz and sets
# BROKER_URL. The broker is stopped on exit. `free_port` and `npm_bin` serve
# the checks that run other programs beside it.
work=$(mktemp -d)
broker_pid=
stop_broker() {
  [ -n "$broker_pid" ] && kill "$broker_pid" 2>/dev/null && wait "$broker_pid" 2>/dev/null
  rm -rf "$work"
}
trap stop_broker EXIT

start_broker() {
  local loopx=$1 port
  shift
  port=$(free_port)
  "$loopx" serve --listen "127.0.0.1:$port" "$@" 2>"$work/broker.log" &
  broker_pid=$!
  BROKER_URL="http://127.0.0.1:$port"
  for _ in $(seq 100); do
    curl -fsS "$BROKER_URL/healthz" >/dev/null 2>&1 && return 0
    sleep 0.1
  done
  echo "the broker did not answer /healthz:" >&2
  cat "$work/broker.log" >&2
  return 1
}

# A reader's fresh home: HOME in $work, no token or data dir in the
# environment, so `loopx serve` and the documentation's blocks use the defaults
# under it (the token in $HOME/.local/share/loopx/owner.token).
fresh_home() {
  export HOME="$work/home"
  unset XDG_DATA_HOME LOOPX_TOKEN LOOPX_TOKEN_FILE LOOPX_DATA_DIR
  mkdir -p "$HOME"
}

# free_port: a free loopback port.
free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# npm_bin PACKAGE@VERSION NAME: installs the pinned package into $work and
# prints the path of its NAME binary.
npm_bin() {
  (cd "$work" && npm install --silent --no-audit --no-fund "$1" >/dev/null)
  echo "$work/node_modules/.bin/$2"
}
