# What the bench scripts share, sourced by them (`source "$here/lib.sh"`), never run: a scratch
# folder removed at exit with the processes started into it, free ports, slotgate's readiness, the
# binary to run, llama-server's environment, the nginx mock (mock.conf.in) with slotgates in front
# of it, and wrk's numbers with their medians. The caller is at the repository's root, with
# `set -euo pipefail`.

bench_dir="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
bench_name="$(basename "$0")"

# bench_root NAME: makes $root, a scratch folder, and the EXIT trap that stops every pid in `pids`
# and removes it.
bench_root() {
  root="$(mktemp -d -t "slotgate-$1.XXXXXX")"
  pids=()
  trap bench_cleanup EXIT
}
bench_cleanup() {
  local p
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$root"
}

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

# cargo_target_dir: Cargo's own answer, so CARGO_TARGET_DIR and .cargo/config.toml are honoured.
cargo_target_dir() {
  cargo metadata --format-version 1 --no-deps | sed -n 's/.*"target_directory":"\([^"]*\)".*/\1/p'
}

# wait_ready SOCKET [TRIES]: whether slotgate's /readyz answers on its admin socket SOCKET within
# TRIES (200) tries 0.1 s apart.
wait_ready() {
  local i
  for i in $(seq "${2:-200}"); do
    curl -sf --unix-socket "$1" http://localhost/readyz >/dev/null && return 0
    sleep 0.1
  done
  curl -sf --unix-socket "$1" http://localhost/readyz >/dev/null
}

# find_slotgate: $slotgate, target/release/slotgate, else target/debug/slotgate, else built.
find_slotgate() {
  slotgate=target/release/slotgate
  [ -x "$slotgate" ] || slotgate=target/debug/slotgate
  [ -x "$slotgate" ] || { cargo build -q -p slotgate; slotgate=target/debug/slotgate; }
}

# llama_env: scripts/setup-llama.sh's LLAMA_* variables, and llama-server's libraries on the path.
llama_env() {
  eval "$(bash scripts/setup-llama.sh)"
  export LD_LIBRARY_PATH="$(dirname "$LLAMA_SERVER")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
}

# llama_bench NAME MODEL CONTEXT: llama_env, bench_root NAME and find_slotgate, then llama-server
# with the model in variable MODEL (LLAMA_MODEL, say: setup-llama.sh sets it), one slot and CONTEXT tokens of context on $root/llama.sock (its log
# $root/llama.log); returns once the socket is there, or after 30 s.
llama_bench() {
  llama_env
  bench_root "$1"
  find_slotgate
  "$LLAMA_SERVER" -m "${!2}" -np 1 -c "$3" --host "$root/llama.sock" --no-webui \
    >"$root/llama.log" 2>&1 &
  pids+=($!)
  for _ in $(seq 300); do [ -S "$root/llama.sock" ] && break; sleep 0.1; done
}

# start_mock: the nginx mock in $root/mock, on $root/mock/mock.sock and on 127.0.0.1:$mock_port.
start_mock() {
  local user=""
  [ "$(id -u)" = 0 ] && user="user root;"
  mkdir -p "$root/mock"
  mock_port="$(free_port)"
  sed -e "s|@DIR@|$root/mock|g" -e "s|@USER@|$user|g" -e "s|@BENCH@|$bench_dir|g" \
    -e "s|@MOCK_PORT@|$mock_port|g" "$bench_dir/mock.conf.in" >"$root/mock/nginx.conf"
  nginx -p "$root/mock" -c "$root/mock/nginx.conf" -e "$root/mock/error.log" &
  pids+=($!)
}

# start_mock_gate NAME COMMAND...: COMMAND (a slotgate binary and flags of its own, or a wrapper before
# them) in front of the mock, on 127.0.0.1:$gate_port, its admin socket and log in $root/NAME;
# $gate_pid is its pid. Returns once it is ready; exits if it never is.
start_mock_gate() {
  local name="$1"
  shift
  gate_port="$(free_port)"
  mkdir -p "$root/$name"
  "$@" --listen "tcp:127.0.0.1:$gate_port" --upstream "unix:$root/mock/mock.sock" \
    --admin-listen "unix:$root/$name/admin.sock" --log-format json --slots 64 --queue-depth 1024 \
    >"$root/$name/slotgate.log" 2>&1 &
  gate_pid=$!
  pids+=($gate_pid)
  wait_ready "$root/$name/admin.sock" \
    || { echo "$bench_name: $name never became ready" >&2; tail -20 "$root/$name/slotgate.log" >&2; exit 1; }
}

# rps_p50 URL SCRIPT: wrk's requests/s at c=64 for $secs seconds and its p50 at c=1 for 5 s, on one
# line, SCRIPT (a .lua here) making the requests.
rps_p50() {
  local rps p50
  rps=$(wrk -t2 -c64 -d"${secs}s" -s "$bench_dir/$2" "$1" | awk '/Requests\/sec/{print $2}')
  p50=$(wrk -t1 -c1 -d5s --latency -s "$bench_dir/$2" "$1" | awk '/ 50%/{print $2}')
  echo "$rps $p50"
}

# medians ROWS BASE WIDTH: each system's median requests/s and p50 over the rows `round system rps
# p50` in the file ROWS, as ratios to system BASE's (throughput: higher is better; p50: lower is),
# names in a column WIDTH wide.
medians() {
  python3 - "$@" <<'PY'
import re, statistics, sys
rows = {}
for line in open(sys.argv[1]):
    _, name, rps, p50 = line.split()
    m = re.fullmatch(r"([\d.]+)(us|ms|s)", p50)
    p50 = float(m[1]) * {"us": 1e-3, "ms": 1.0, "s": 1e3}[m[2]]
    rows.setdefault(name, []).append((float(rps), p50))
base = rows[sys.argv[2]]
w = int(sys.argv[3])
b_rps = statistics.median(r for r, _ in base)
b_p50 = statistics.median(p for _, p in base)
print(f"\n{'system':<{w}} {'c=64 rps':>10} {'ratio':>6} {'c=1 p50 ms':>11} {'ratio':>6}")
for name, v in rows.items():
    rps = statistics.median(r for r, _ in v)
    p50 = statistics.median(p for _, p in v)
    print(f"{name:<{w}} {rps:>10.0f} {rps / b_rps:>6.3f} {p50:>11.3f} {p50 / b_p50:>6.3f}")
PY
}
