//! Fault tests on the fake llama-server: misbehaving clients (mid-stream and queued disconnects,
//! stalls), upstream faults the fake plays, slotgate's own signals and resource exhaustion, socket
//! safety, owner-only files, and discovery that trusts no stranger. The real llama-server's fault
//! rows are `llama/fault_upstream.rs`.
//!
//! Needs only Rust: the built `slotgate` binary. Part of the fast tier (`scripts/test.sh fast`).

mod discovery;
mod fault_clients;
mod fault_self;
mod fd_exhaustion;
mod midstream_disconnect;
mod owner_only_files;
mod probes_under_flood;
mod queued_disconnect;
mod socket_safety;
mod stall_guards;
mod upstream_faults;
