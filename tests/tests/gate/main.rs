//! Integration tests of the gate on the fake llama-server (`slotgate_tests::FakeUpstream`): admission,
//! the queue, priority, fairness, Retry-After, bad input, passthrough and routes, status and metrics,
//! shutdown, keep-alive, and the `endpoints` of today's llama-server as the fake plays them.
//!
//! Needs only Rust: the built `slotgate` binary and the Rust example policies
//! (`scripts/build-policies.sh`). Part of the fast tier (`scripts/test.sh fast`).

mod access_line;
mod admin_plane;
mod admission;
mod bad_input;
mod burst;
mod callers;
mod console;
mod cost;
mod deadlines;
mod displacement;
mod doomed_waits;
mod early_reject;
mod endpoints;
mod fairness;
mod fake_upstream_selftest;
mod hints;
mod keep_alive;
mod keys;
mod live;
mod load_report;
mod metrics;
mod openapi;
mod passthrough;
mod peer_credentials;
mod priority;
mod queue_timeout;
mod readiness;
mod request_id;
mod retry_after;
mod routes;
mod sessions;
mod shedding;
mod shutdown;
mod slots_auto;
mod spend;
mod status;
mod stream_holds_slot;
mod tcp_listener;
mod tenant_cap;
mod traces;
mod waiting_streams;
