//! Offline commands and library entry points: `slotgate check` (configuration, and the annotated
//! `examples/slotgate.toml`: it passes, and names every key), `slotgate policy check|eval`, and the
//! fuzz corpora replayed through `slotgate::fuzzing` (the `slotgate` library, which only this
//! binary, `fleet` and `llama` link).
//!
//! Needs only Rust: the built `slotgate` binary. Part of the fast tier (`scripts/test.sh fast`).

mod config;
mod example_config;
mod fuzz_corpus;
mod install;
mod policy_cli;
mod policy_test;
mod security_doc;
mod startup;
