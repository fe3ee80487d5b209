//! The soak's entry point (`scripts/soak.sh`): `cargo run --release -p slotgate-tests --example soak --
//! --minutes 30 [--seed N] [--workers N] [--np N]`. Exits 1 if an invariant failed.

use slotgate_tests::soak::{run, SoakOpts};

fn usage() -> ! {
    eprintln!("usage: soak [--minutes M] [--seed N] [--workers N] [--np N]");
    std::process::exit(2)
}

#[tokio::main(flavor = "multi_thread", worker_threads = 4)]
async fn main() {
    let mut args = std::env::args().skip(1);
    let mut minutes = 30.0;
    let mut overrides = Vec::new();
    while let Some(flag) = args.next() {
        let value = args.next().unwrap_or_else(|| usage());
        match flag.as_str() {
            "--minutes" => minutes = value.parse().unwrap_or_else(|_| usage()),
            "--seed" | "--workers" | "--np" => overrides.push((flag, value)),
            _ => usage(),
        }
    }
    let mut opts = SoakOpts::minutes(minutes);
    for (flag, value) in overrides {
        let n: u64 = value.parse().unwrap_or_else(|_| usage());
        match flag.as_str() {
            "--seed" => opts.seed = n,
            "--workers" => opts.workers = n as usize,
            _ => opts.np = n as usize,
        }
    }
    let report = run(opts).await;
    std::process::exit(if report.passed() { 0 } else { 1 });
}
