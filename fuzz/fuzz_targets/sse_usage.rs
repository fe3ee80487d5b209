//! Fuzz target: an upstream response cut into chunks, through the usage filter and scanner.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| slotgate::fuzzing::sse_usage(data));
