//! Fuzz target: a config file (TOML settings, validation, round trip) and the value parsers.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| slotgate::fuzzing::config(data));
