//! Replays the committed fuzz corpora (`fuzz/corpus/<target>/`) through the fuzz targets' entry
//! points, so every input a fuzzer ever kept, and every crash it found and we fixed, is checked by
//! `cargo test` without libFuzzer.

use std::path::PathBuf;

/// Feeds every file of `fuzz/corpus/<target>` to `entry`; an empty or missing corpus fails.
fn replay(target: &str, entry: fn(&[u8])) {
    let dir = slotgate_tests::workspace().join("fuzz/corpus").join(target);
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("corpus {}: {e}", dir.display()))
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.is_file())
        .collect();
    assert!(!files.is_empty(), "corpus {} is empty", dir.display());
    files.sort();
    // Every input is tried, so one run names all that fail (each panic message is printed above).
    let failed: Vec<String> = files
        .iter()
        .filter(|path| {
            let data = std::fs::read(path).unwrap();
            std::panic::catch_unwind(|| entry(&data)).is_err()
        })
        .map(|path| path.file_name().unwrap().to_string_lossy().into_owned())
        .collect();
    assert!(
        failed.is_empty(),
        "{target}: corpus inputs fail: {failed:?}"
    );
}

#[test]
fn summary_corpus() {
    replay("summary", slotgate::fuzzing::summary);
}

#[test]
fn sse_usage_corpus() {
    replay("sse_usage", slotgate::fuzzing::sse_usage);
}

#[test]
fn policy_output_corpus() {
    replay("policy_output", slotgate::fuzzing::policy_output);
}

#[test]
fn config_corpus() {
    replay("config", slotgate::fuzzing::config);
}

#[test]
fn access_line_corpus() {
    replay("access_line", slotgate::fuzzing::access_line);
}
