-- wrk script: POSTs one small chat request on every connection, and at the end prints one
-- machine-readable line for scripts/bench.sh (exact microseconds and counts, so nothing has to be
-- parsed back out of wrk's human units):
--   BENCH p50_us p99_us requests duration_us non2xx connect_err read_err write_err timeouts
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
wrk.body = '{"model":"m","messages":[{"role":"user","content":"hello there"}],"max_tokens":8}'

function done(summary, latency, requests)
  local e = summary.errors
  io.write(string.format("BENCH %d %d %d %d %d %d %d %d %d\n",
    latency:percentile(50), latency:percentile(99), summary.requests, summary.duration,
    e.status, e.connect, e.read, e.write, e.timeout))
end
