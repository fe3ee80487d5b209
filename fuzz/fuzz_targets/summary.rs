//! Fuzz target: a request body as intake reads it, then policy mutations and the usage request.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| slotgate::fuzzing::summary(data));
