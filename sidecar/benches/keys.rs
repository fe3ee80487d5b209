//! The key table (issue 47): memory per 100,000 keys, and what one check costs against its floor,
//! a bare SHA-256 of the presented key, measured in the same run. Prints; asserts nothing.
//! `cargo bench -p slotgate --bench keys` (part of `bash scripts/bench/keys.sh`).

use std::hint::black_box;
use std::time::Instant;

use sha2::{Digest, Sha256};
use slotgate::keys::{Keys, NewKey};

fn rss_kb() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.trim().trim_end_matches(" kB").trim().parse().ok())
        })
        .unwrap_or(0)
}

/// Nanoseconds per call of `f`, the median of 5 runs of `n` calls.
fn per_call(n: u32, mut f: impl FnMut(u32)) -> f64 {
    let mut runs: Vec<f64> = (0..5)
        .map(|_| {
            let t = Instant::now();
            for i in 0..n {
                f(i);
            }
            t.elapsed().as_nanos() as f64 / f64::from(n)
        })
        .collect();
    runs.sort_by(f64::total_cmp);
    runs[2]
}

fn main() {
    const KEYS: usize = 100_000;
    let keys = Keys::none();
    let before = rss_kb();
    let mut secrets = Vec::with_capacity(KEYS);
    for i in 0..KEYS {
        let new = NewKey {
            tenant: format!("tenant-{}", i % 1000),
            team: Some("research".into()),
            ..NewKey::default()
        };
        secrets.push(keys.create(new, 0).expect("create").1);
    }
    let secrets_kb = (secrets.iter().map(String::len).sum::<usize>() / 1024) as u64;
    let after = rss_kb();
    let table = (after - before).saturating_sub(secrets_kb);
    println!(
        "memory: {KEYS} keys in the table: {} MiB resident, {} bytes per key",
        table / 1024,
        table * 1024 / KEYS as u64
    );

    let n = 200_000;
    let floor = per_call(n, |i| {
        black_box(Sha256::digest(secrets[i as usize % KEYS].as_bytes()));
    });
    let valid = per_call(n, |i| {
        black_box(keys.check(secrets[i as usize % KEYS].as_bytes(), 1).is_ok());
    });
    let made_up: Vec<String> = (0..1000).map(|i| format!("sk-made-up-{i}")).collect();
    let unknown = per_call(n, |i| {
        black_box(
            keys.check(made_up[i as usize % 1000].as_bytes(), 1)
                .is_err(),
        );
    });
    let forged: Vec<String> = secrets[..1000]
        .iter()
        .map(|s| format!("{}0", &s[..s.len() - 1]))
        .collect();
    let wrong_secret = per_call(n, |i| {
        black_box(keys.check(forged[i as usize % 1000].as_bytes(), 1).is_err());
    });
    println!(
        "\n{:<44} {:>8} {:>7}",
        "one call, 100,000 keys held", "ns", "ratio"
    );
    for (what, ns) in [
        ("SHA-256 of the key (the floor)", floor),
        ("check: a valid key", valid),
        ("check: a made-up key (not slotgate's shape)", unknown),
        ("check: a known id, a wrong secret", wrong_secret),
    ] {
        println!("{what:<44} {ns:>8.0} {:>7.2}", ns / floor);
    }
}
