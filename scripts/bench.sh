#!/usr/bin/env bash
# Side by side (issue 9, item 5): what slotgate adds to a request, against baselines run in the same
# invocation. Prints one table of ratios; asserts nothing about time.
#
#   1. wrk against a mock llama-server (nginx answering fixed JSON on a Unix socket), directly and
#      through: nginx as a keep-alive reverse proxy (the baseline), slotgate with no policy, with a new
#      prompt in every request, with token-budget, with the three-policy chain (each as ABI v1
#      modules and as v2 components), with
#      --cost-tokenizer estimate, and the seed's Python queue proxy (scripts/bench/seed_queue_proxy.py).
#      c=1 for latency (p50/p99, minus the mock's own: "added"), c=64 for throughput. slotgate runs
#      with --slots 64, so the hot path is measured, not the queue.
#      And the stack's limit: a bare hyper reverse proxy (scripts/bench/stack, stack-proxy) on the
#      same hyper, hyper-util, http-body-util and tokio as slotgate, in each runtime shape (multi:
#      slotgate's before issue 19; current; per-core: slotgate's own), so every slotgate figure reads against nginx and against
#      what its own stack can do.
#   2. The fast 429: slotgate with one slot, held by a request that is never answered, and no queue,
#      against nginx `return 429` and a bare hyper 429 responder (stack-429) in the same shapes.
#   3. Time to first token on the real llama-server (tiny model), one streamed request at a time:
#      direct; through slotgate as it runs by default (exact counting on, so a request that finds a
#      slot free goes at once and is settled from usage); with --cost-count-first (every prompt counted
#      with llama-server before it is forwarded: what exact counting cost before); and with
#      --cost-tokenizer estimate (never counted).
#
# Every system runs in a temp dir of its own, removed at exit. Runs are interleaved (round 1: A B C
# ..., round 2: A B C ...) and each figure is the median over the rounds, since a 2-core machine is
# noisy. Checks that every system really answered what it must (200, or 429 for the 429 rows), and
# exits non-zero if one did not. Each system's CPU over each wrk run (utime + stime of its processes
# in /proc) gives its CPU per request.
#
# Environment: BENCH_SECONDS (each wrk run, default 10), BENCH_ROUNDS (default 2), TTFT_REQUESTS
# (per target, default 60), BENCH_STACK_SHAPES (the stack's shapes to run, default
# "multi current per-core"; each adds a proxy and a 429 row), BENCH_LOG (also write the report there;
# `1` means bench-<date>.log in the current directory), BENCH_KEEP=1 (keep the temp dir and its
# logs), BENCH_SLOTGATE (the slotgate binary to measure instead of this tree's release build: a
# before-and-after is two invocations, one with the earlier commit's binary). With the defaults it
# takes about 13 minutes once the release binaries and llama-server are built.
set -euo pipefail
secs="${BENCH_SECONDS:-10}"
rounds="${BENCH_ROUNDS:-2}"
ttft_requests="${TTFT_REQUESTS:-60}"
read -r -a stack_shapes <<<"${BENCH_STACK_SHAPES-multi current per-core}"
for shape in "${stack_shapes[@]}"; do
  case "$shape" in multi | current | per-core) ;; *) echo "bench: unknown stack shape $shape" >&2; exit 2 ;; esac
done
command_line="${BENCH_SLOTGATE:+BENCH_SLOTGATE=$BENCH_SLOTGATE }BENCH_SECONDS=$secs BENCH_ROUNDS=$rounds TTFT_REQUESTS=$ttft_requests BENCH_STACK_SHAPES=\"${stack_shapes[*]}\" bash scripts/bench.sh"
started="$(date -u +%Y-%m-%dT%H:%M:%SZ), load average $(cut -d' ' -f1-3 /proc/loadavg)"
cd "$(dirname "${BASH_SOURCE[0]}")/.."
here="$PWD/scripts/bench"

if [ -n "${BENCH_LOG:-}" ]; then
  log="$BENCH_LOG"
  [ "$log" = 1 ] && log="$OLDPWD/bench-$(date +%Y%m%d-%H%M%S).log"
  # The report (stdout) goes to the log too; progress and build output (stderr) only to the terminal.
  exec > >(tee "$log")
  tee_pid=$!
fi

progress() { printf 'bench: %s\n' "$*" >&2; }

# --- what it needs ---------------------------------------------------------------------------------

PATH="$PATH:/usr/sbin:/sbin"
if ! command -v nginx >/dev/null || ! command -v wrk >/dev/null; then
  progress "installing nginx and wrk (Debian packages)"
  sudo=""; [ "$(id -u)" = 0 ] || sudo="sudo"
  $sudo apt-get update >&2 && DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y nginx wrk >&2
fi
cargo build --release -p slotgate --bin slotgate >&2
cargo build --release -p slotgate-bench-stack --bins >&2
bash scripts/build-policies.sh >/dev/null
target_dir=$(cargo metadata --format-version 1 --no-deps | sed -n 's/.*"target_directory":"\([^"]*\)".*/\1/p')
slotgate="${BENCH_SLOTGATE:-$target_dir/release/slotgate}"
[ -x "$slotgate" ] || { echo "bench: no slotgate binary at $slotgate" >&2; exit 2; }
stack_proxy="$target_dir/release/stack-proxy"
stack_429="$target_dir/release/stack-429"
policies="$target_dir/policies"

# --- processes, temp dirs, clean-up ----------------------------------------------------------------

root="$(mktemp -d -t slotgate-bench.XXXXXX)"
pids=()
cleanup() {
  local i
  # Newest first: the client holding the 429 gate's slot before the gate, gates before upstreams.
  for ((i = ${#pids[@]} - 1; i >= 0; i--)); do kill "${pids[i]}" 2>/dev/null || true; done
  for ((i = ${#pids[@]} - 1; i >= 0; i--)); do wait "${pids[i]}" 2>/dev/null || true; done
  if [ "${BENCH_KEEP:-}" = 1 ]; then progress "kept $root"; else rm -rf "$root"; fi
  # Let tee write the last of the report before the prompt comes back.
  if [ -n "${tee_pid:-}" ]; then exec >&-; wait "$tee_pid" 2>/dev/null || true; fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# Stops with a message and the end of the logs of the system that failed.
die() {
  echo "bench: error: $1" >&2
  shift
  local f
  for f in "$@"; do [ -f "$f" ] && { echo "--- tail of $f" >&2; tail -n 20 "$f" >&2; }; done
  exit 1
}

# Prints N distinct free TCP ports on 127.0.0.1, on one line.
free_ports() {
  python3 -c '
import socket, sys
socks = [socket.socket() for _ in range(int(sys.argv[1]))]
for s in socks: s.bind(("127.0.0.1", 0))
print(" ".join(str(s.getsockname()[1]) for s in socks))' "$1"
}

# wait_for WHAT SECONDS COMMAND...: retries COMMAND until it succeeds; returns 1 after SECONDS.
wait_for() {
  local until=$((SECONDS + $2))
  shift 2
  until "$@" >/dev/null 2>&1; do
    [ "$SECONDS" -lt "$until" ] || return 1
    sleep 0.1
  done
}

# http_code URL [curl args...]: the status of one chat POST (000 when nothing answered).
chat_body='{"model":"m","messages":[{"role":"user","content":"hello there"}],"max_tokens":8}'
http_code() {
  local url="$1"; shift
  curl -s -o /dev/null -w '%{http_code}' --max-time 5 -H 'Content-Type: application/json' \
    -d "$chat_body" "$@" "$url" || true
}
answers() { [ "$(http_code "${@:2}")" = "$1" ]; }

# Fills an nginx template: every @NAME@ from the NAME=value arguments, @DIR@ and @USER@ always.
render() {
  local template="$1" dir="$2"; shift 2
  # As root, nginx's workers would run as nobody, who may not enter the 0700 temp dirs.
  local user=""; [ "$(id -u)" = 0 ] && user="user root;"
  local args=(-e "s|@DIR@|$dir|g" -e "s|@USER@|$user|g" -e "s|@BENCH@|$here|g") kv
  for kv in "$@"; do args+=(-e "s|@${kv%%=*}@|${kv#*=}|g"); done
  sed "${args[@]}" "$template" >"$dir/nginx.conf"
}

# The pid of each system (nginx: its master, whose workers count too), for its CPU per request.
declare -A pid_of

start_nginx() {
  local dir="$1"
  nginx -p "$dir" -c "$dir/nginx.conf" -e "$dir/error.log" &
  pids+=($!)
  last_pid=$!
}

# start_gate NAME PORT UPSTREAM_SOCKET [slotgate args...]: slotgate on tcp:127.0.0.1:PORT in front
# of a Unix socket, JSON logs in its own dir, admin endpoints on a Unix socket there; waits for /readyz.
start_gate() {
  local name="$1" port="$2" upstream="$3"; shift 3
  local dir="$root/$name"
  mkdir -p "$dir"
  "$slotgate" --listen "tcp:127.0.0.1:$port" --upstream "unix:$upstream" \
    --admin-listen "unix:$dir/admin.sock" --log-format json --drain-timeout 1s "$@" \
    >"$dir/slotgate.log" 2>&1 &
  pids+=($!)
  last_pid=$!
  wait_for "$name" 20 curl -sf --unix-socket "$dir/admin.sock" http://localhost/readyz \
    || die "$name never became ready" "$dir/slotgate.log"
}

# --- the systems -----------------------------------------------------------------------------------

# One call for all the ports, so none is handed out twice: ten, then a proxy and a 429 per shape.
read -r p_mock p_nginx p_nginx429 p_seed p_none p_unique p_budget p_chain p_estimate p_gate429 \
  p_budget2 p_chain2 p_stack < <(free_ports $((12 + 2 * ${#stack_shapes[@]})))
read -r -a p_stack <<<"${p_stack:-}"

progress "starting the mock, nginx, the stack's ${#stack_shapes[@]} shapes and eight slotgates in $root"
mkdir -p "$root/mock" "$root/nginx" "$root/blackhole" "$root/seed"
mock_sock="$root/mock/mock.sock"
python3 "$here/blackhole.py" "$root/mock/blackhole.sock" &
pids+=($!)
render "$here/mock.conf.in" "$root/mock" MOCK_PORT="$p_mock"
start_nginx "$root/mock"
pid_of[mock]=$last_pid
render "$here/proxy.conf.in" "$root/nginx" MOCK_SOCK="$mock_sock" PROXY_PORT="$p_nginx" \
  R429_PORT="$p_nginx429"
start_nginx "$root/nginx"
pid_of[nginx]=$last_pid pid_of[nginx429]=$last_pid
wait_for mock 10 answers 200 "http://127.0.0.1:$p_mock/v1/chat/completions" \
  || die "the mock does not answer" "$root/mock/error.log"
wait_for nginx 10 answers 200 "http://127.0.0.1:$p_nginx/v1/chat/completions" \
  || die "the nginx proxy does not answer" "$root/nginx/error.log"
answers 429 "http://127.0.0.1:$p_nginx429/v1/chat/completions" \
  || die "nginx return 429 does not answer 429" "$root/nginx/error.log"
nginx_refusal="$(curl -s -i -H 'Content-Type: application/json' -d "$chat_body" \
  "http://127.0.0.1:$p_nginx429/v1/chat/completions" | tr -d '\r')"

# The stack's limit: stack-proxy in front of the mock's Unix socket, as slotgate is, and stack-429,
# both on TCP for wrk, in each shape.
stack_systems=() stack429_systems=()
start_stack() { # NAME PORT CODE BINARY [args...]
  local name="$1" port="$2" code="$3" bin="$4"; shift 4
  mkdir -p "$root/$name"
  "$bin" --listen "tcp:127.0.0.1:$port" "$@" >"$root/$name/stack.log" 2>&1 &
  pids+=($!)
  pid_of[$name]=$!
  wait_for "$name" 10 answers "$code" "http://127.0.0.1:$port/v1/chat/completions" \
    || die "$name does not answer $code" "$root/$name/stack.log"
}
for i in "${!stack_shapes[@]}"; do
  shape="${stack_shapes[i]}" pp="${p_stack[2 * i]}" pq="${p_stack[2 * i + 1]}"
  start_stack "stack-$shape" "$pp" 200 "$stack_proxy" --shape "$shape" --upstream "unix:$mock_sock"
  start_stack "stack429-$shape" "$pq" 429 "$stack_429" --shape "$shape"
  stack_systems+=("stack-$shape:stack:stack proxy ($shape):$pp")
  stack429_systems+=("stack429-$shape:stack429:stack 429 ($shape):$pq")
  stack_refusal="$(curl -s -i -H 'Content-Type: application/json' -d "$chat_body" \
    "http://127.0.0.1:$pq/v1/chat/completions" | tr -d '\r')"
done

# The example policies' settings, but a budget that never runs dry within the run (as in
# tests/benches/gate_overhead.rs) and a request guard that serves the model "m".
cat >"$root/budget.json" <<'EOF'
{"capacity": 1000000000000, "refill_per_second": 1000000000}
EOF
python3 -c '
import json, sys
s = json.load(open(sys.argv[1])); s["allowed_models"] = ["m"]; print(json.dumps(s))' \
  policies/request-guard/settings.example.json >"$root/guard.json"
chain=(--policy "$policies/token-budget.wasm" --policy-settings "$root/budget.json"
  --policy "$policies/tenant-priority.wasm" --policy-settings "$PWD/policies/tenant-priority/settings.example.json"
  --policy "$policies/request-guard.wasm" --policy-settings "$root/guard.json")
# The same three as v2 components (policies v2, `NAME-v2.wasm`).
chain2=(--policy "$policies/token-budget-v2.wasm" --policy-settings "$root/budget.json"
  --policy "$policies/tenant-priority-v2.wasm" --policy-settings "$PWD/policies/tenant-priority/settings.example.json"
  --policy "$policies/request-guard-v2.wasm" --policy-settings "$root/guard.json")
hot=(--slots 64 --queue-depth 1024)

start_gate gate-none "$p_none" "$mock_sock" "${hot[@]}"
pid_of[none]=$last_pid
start_gate gate-unique "$p_unique" "$mock_sock" "${hot[@]}"
pid_of[unique]=$last_pid
start_gate gate-budget "$p_budget" "$mock_sock" "${hot[@]}" \
  --policy "$policies/token-budget.wasm" --policy-settings "$root/budget.json"
pid_of[budget]=$last_pid
start_gate gate-chain "$p_chain" "$mock_sock" "${hot[@]}" "${chain[@]}"
pid_of[chain]=$last_pid
start_gate gate-budget2 "$p_budget2" "$mock_sock" "${hot[@]}" \
  --policy "$policies/token-budget-v2.wasm" --policy-settings "$root/budget.json"
pid_of[budget2]=$last_pid
start_gate gate-chain2 "$p_chain2" "$mock_sock" "${hot[@]}" "${chain2[@]}"
pid_of[chain2]=$last_pid
start_gate gate-estimate "$p_estimate" "$mock_sock" "${hot[@]}" --cost-tokenizer estimate
pid_of[estimate]=$last_pid
for g in none:$p_none unique:$p_unique budget:$p_budget chain:$p_chain budget2:$p_budget2 \
  chain2:$p_chain2 estimate:$p_estimate; do
  answers 200 "http://127.0.0.1:${g#*:}/v1/chat/completions" \
    || die "slotgate ($g) does not answer 200" "$root/gate-${g%%:*}/slotgate.log"
done

# The fast 429: the only slot is taken by a request the upstream never answers (hold.sock hands it to
# blackhole.py), no queue, so every other request is refused at once. No first-byte timeout, so the
# slot stays held however long the run.
start_gate gate-429 "$p_gate429" "$root/mock/hold.sock" --slots 1 --queue-depth 0 \
  --upstream-first-byte-timeout 0s
pid_of[gate429]=$last_pid
curl -s -o /dev/null --max-time 86400 -H 'Content-Type: application/json' -d "$chat_body" \
  "http://127.0.0.1:$p_gate429/v1/chat/completions" &
pids+=($!)
# Probe only once the holder has the slot: a probe that won the race would hold it instead.
slot_held() {
  curl -sf --unix-socket "$root/gate-429/admin.sock" http://localhost/status | grep -q '"busy":1'
}
wait_for gate-429 10 slot_held || die "the holding request never took the slot" "$root/gate-429/slotgate.log"
wait_for gate-429 10 answers 429 "http://127.0.0.1:$p_gate429/v1/chat/completions" \
  || die "slotgate with its slot held does not answer 429" "$root/gate-429/slotgate.log"
refusal="$(curl -s -i -H 'Content-Type: application/json' -d "$chat_body" \
  "http://127.0.0.1:$p_gate429/v1/chat/completions" | tr -d '\r')"

# The seed's proxy loses its worker thread when a client leaves before its answer (as wrk does at the
# end of every run; see seed_queue_proxy.py), so every run gets a fresh one.
seed_pid=""
seed_start() {
  python3 "$here/seed_queue_proxy.py" "$p_mock" "$p_seed" 2>>"$root/seed/seed.log" &
  seed_pid=$!
  pids+=("$seed_pid")
  wait_for seed 10 answers 200 "http://127.0.0.1:$p_seed/v1/chat/completions" \
    || die "the seed proxy does not answer 200" "$root/seed/seed.log"
}
seed_stop() { kill "$seed_pid" 2>/dev/null || true; wait "$seed_pid" 2>/dev/null || true; }

# name, kind (see report.py), label, port: in the order of the table. wrk sends one fixed body, so
# a prompt slotgate counts upstream is counted once and then found in its count cache; "unique" sends
# a new prompt each time (post-unique.lua), as real traffic does, so the cache never helps.
systems=(
  "mock:base:mock direct (nginx return 200):$p_mock"
  "nginx:ref:nginx proxy (keep-alive upstream):$p_nginx"
  "${stack_systems[@]}"
  "none:proxy:slotgate, no policy:$p_none"
  "unique:proxy:slotgate, no policy, unique prompts:$p_unique"
  "budget:proxy:slotgate, token-budget:$p_budget"
  "chain:proxy:slotgate, 3-policy chain:$p_chain"
  "budget2:proxy:slotgate, token-budget v2:$p_budget2"
  "chain2:proxy:slotgate, 3-policy chain v2:$p_chain2"
  "estimate:proxy:slotgate, --cost-tokenizer estimate:$p_estimate"
  "seed:seed:seed Python queue proxy:$p_seed"
  "nginx429:ref429:nginx return 429:$p_nginx429"
  "${stack429_systems[@]}"
  "gate429:fast429:slotgate, slot held, no queue:$p_gate429"
)

# --- wrk ---------------------------------------------------------------------------------------------

results="$root/results.tsv"
: >"$results"
clk_tck="$(getconf CLK_TCK)"
# cpu_ticks PID: the CPU (user + system, in clock ticks) PID and its children have used so far;
# /proc/PID/stat counts every thread of a process, those that have ended too.
cpu_ticks() {
  local p stat f total=0
  for p in "$1" $(pgrep -P "$1" || true); do
    stat="$(cat "/proc/$p/stat" 2>/dev/null)" || continue
    # The fields after the command name, which may hold spaces: state is [0], utime [11], stime [12].
    read -r -a f <<<"${stat##*) }"
    total=$((total + f[11] + f[12]))
  done
  echo "$total"
}
# run_wrk NAME PORT CONC SECONDS [ROUND]: one wrk run; with a ROUND, its BENCH line goes to results,
# with the CPU the system used over the run (microseconds; -1 when its pid is not known).
run_wrk() {
  local name="$1" port="$2" conc="$3" duration="$4" round="${5:-}"
  local threads=2; [ "$conc" = 1 ] && threads=1
  local out="$root/wrk-$name-c$conc-r${round:-warmup}.txt"
  [ "$name" = seed ] && seed_start
  local pid="${pid_of[$name]:-}"; [ "$name" = seed ] && pid="$seed_pid"
  local cpu_before=""; [ -z "$pid" ] || cpu_before="$(cpu_ticks "$pid")"
  local script=post.lua; [ "$name" = unique ] && script=post-unique.lua
  wrk -t"$threads" -c"$conc" -d"${duration}s" --latency -s "$here/$script" \
    "http://127.0.0.1:$port/v1/chat/completions" >"$out" 2>&1 || die "wrk failed against $name" "$out"
  local cpu_us=-1
  [ -z "$pid" ] || cpu_us=$((($(cpu_ticks "$pid") - cpu_before) * 1000000 / clk_tck))
  [ "$name" = seed ] && seed_stop
  local line; line="$(grep '^BENCH ' "$out")" || die "wrk printed no result for $name" "$out"
  [ -z "$round" ] || echo "$name $conc $round ${line#BENCH } $cpu_us" >>"$results"
}

total=$((${#systems[@]} * 2 * rounds))
progress "wrk: ${#systems[@]} systems x c=1,c=64 x $rounds rounds x ${secs}s (about $((total * (secs + 1) / 60 + 1)) min)"
for s in "${systems[@]}"; do
  IFS=: read -r name _ _ port <<<"$s"
  [ "$name" = seed ] || run_wrk "$name" "$port" 64 1
done
n=0
for ((round = 1; round <= rounds; round++)); do
  for conc in 1 64; do
    for s in "${systems[@]}"; do
      IFS=: read -r name _ label port <<<"$s"
      n=$((n + 1))
      progress "[$n/$total] round $round, c=$conc: $label"
      run_wrk "$name" "$port" "$conc" "$secs" "$round"
    done
  done
done

# --- TTFT on the real llama-server -------------------------------------------------------------------

progress "starting llama-server (scripts/setup-llama.sh)"
eval "$(bash scripts/setup-llama.sh)"
mkdir -p "$root/llama"
llama_sock="$root/llama/llama.sock"
LD_LIBRARY_PATH="$(dirname "$LLAMA_SERVER")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" \
  "$LLAMA_SERVER" -m "$LLAMA_MODEL" --host "$llama_sock" -np 2 -c 4096 --no-webui \
  >"$root/llama/llama-server.log" 2>&1 &
pids+=($!)
wait_for llama-server 120 curl -sf --unix-socket "$llama_sock" http://localhost/health \
  || die "llama-server never became healthy" "$root/llama/llama-server.log"
# On Unix sockets, like llama-server: what is compared is the gate, not TCP.
for g in exact first estimate; do
  dir="$root/ttft-$g"
  mkdir -p "$dir"
  args=()
  [ "$g" = estimate ] && args=(--cost-tokenizer estimate)
  [ "$g" = first ] && args=(--cost-count-first)
  "$slotgate" --listen "unix:$dir/gate.sock" --upstream "unix:$llama_sock" \
    --admin-listen "unix:$dir/admin.sock" --slots 2 --log-format json --drain-timeout 1s "${args[@]}" \
    >"$dir/slotgate.log" 2>&1 &
  pids+=($!)
  wait_for "ttft-$g" 20 curl -sf --unix-socket "$dir/admin.sock" http://localhost/readyz \
    || die "slotgate (ttft-$g) never became ready" "$dir/slotgate.log"
done
progress "TTFT: $ttft_requests streamed requests per target, one at a time"
set +e
ttft="$(python3 "$here/ttft.py" --requests "$ttft_requests" "direct=$llama_sock" \
  "slotgate=$root/ttft-exact/gate.sock" "slotgate (count first)=$root/ttft-first/gate.sock" \
  "slotgate (estimate)=$root/ttft-estimate/gate.sock")"
ttft_status=$?
set -e

# --- the report --------------------------------------------------------------------------------------

specs=()
for s in "${systems[@]}"; do
  IFS=: read -r name kind label _ <<<"$s"
  specs+=("$name:$kind:$label")
done
echo "slotgate bench: started $started; nproc $(nproc); load average at the end $(cut -d' ' -f1-3 /proc/loadavg)"
echo "git: $(git rev-parse --short HEAD 2>/dev/null || echo '?')$(git diff --quiet 2>/dev/null || echo '+dirty'), binary $slotgate"
echo "command: $command_line"
echo "wrk: -t1 -c1 (latency) and -t2 -c64 (throughput), -d${secs}s --latency -s scripts/bench/post.lua; median of $rounds interleaved rounds"
echo "post.lua sends one fixed body (slotgate can take the prompt count from its cache after the first);"
echo "unique prompts: post-unique.lua, a new prompt each request (see 'prompt counted by' below for how)"
echo "slotgate: --slots 64 --queue-depth 1024 --log-format json (logs to a file); mock: nginx on a Unix socket"
echo "stack: scripts/bench/stack, bare hyper on Cargo.lock's versions; proxy to the mock's Unix socket, body streamed."
echo "  multi: $(nproc)-worker multi-thread runtime + hyper-util legacy client (slotgate's shape until issue 19);"
echo "  current: one current-thread runtime, its own pool of HTTP/1 connections;"
echo "  per-core: one current-thread runtime per core ($(nproc)), each its own SO_REUSEPORT listener and pool (slotgate's shape)"
echo "added = the system's c=1 latency minus the mock's own (wrk speaks TCP only, so the mock direct is over TCP)"
echo
set +e
python3 "$here/report.py" "$results" "${specs[@]}"
report_status=$?
set -e
echo "429 check (curl), slotgate: $(head -n1 <<<"$refusal"), $(grep -i '^retry-after' <<<"$refusal"), $(tail -n1 <<<"$refusal")"
echo "429 check (curl), nginx:    $(head -n1 <<<"$nginx_refusal"), $(grep -i '^retry-after' <<<"$nginx_refusal"), $(tail -n1 <<<"$nginx_refusal")"
[ -z "${stack_refusal:-}" ] \
  || echo "429 check (curl), stack:    $(head -n1 <<<"$stack_refusal"), $(grep -i '^retry-after' <<<"$stack_refusal"), $(tail -n1 <<<"$stack_refusal")"
echo
# counter NAME LABEL: "value=count ..." for the non-zero series of a counter in $metrics.
counter() {
  sed -n "s/^$1{$2=\"\([a-z_]*\)\"} \([0-9.e+]*\)\$/\1=\2/p" <<<"$metrics" \
    | { grep -v '=0$' || true; } | sort | tr '\n' ' '
}
echo "slotgate outcomes over the whole run (slotgate_requests_total; client_gone: in flight when a wrk"
echo "run ended and closed its connections), and its log lines at WARN or ERROR:"
for dir in "$root"/gate-* "$root"/ttft-*; do
  metrics="$(curl -s --unix-socket "$dir/admin.sock" http://localhost/metrics)"
  warn="$(grep -c '"level":"WARN"' "$dir/slotgate.log" || true)"
  error="$(grep -c '"level":"ERROR"' "$dir/slotgate.log" || true)"
  printf '  %-14s %s| prompt counted by: %s| WARN %s, ERROR %s\n' "$(basename "$dir")" \
    "$(counter slotgate_requests_total outcome)" "$(counter slotgate_prompt_counts_total source)" \
    "$warn" "$error"
done
echo
echo "TTFT on the real llama-server (tiny model, -np 2 -c 4096, Unix sockets; slotgate --slots 2):"
echo "$ttft_requests streamed chat requests per target, unique prompts, one at a time, interleaved"
echo "$ttft"
[ "$report_status" = 0 ] && [ "$ttft_status" = 0 ] || exit 1
