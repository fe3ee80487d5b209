//! Fuzz target: a policy's output bytes as a decision and as a settings validation.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| slotgate::fuzzing::policy_output(data));
