//! Fuzz target: clients' text in the access line (text and JSON), a CLI table and a CSV cell.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| slotgate::fuzzing::access_line(data));
