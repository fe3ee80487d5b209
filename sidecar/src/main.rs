//! The `slotgate` binary: parse the command line, dispatch to `slotgate::cmd`, exit with its code
//! (0 done, 1 failed while running, 2 refused: bad configuration or arguments).

use std::process::ExitCode;

use slotgate::cmd::cli::Command;

/// mimalloc: a request's many small, short-lived allocations cost about half what glibc's
/// malloc charges for them (measured with callgrind, see docs/performance.md).
#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    slotgate::app::memory::limit_arenas();
    let cli = slotgate::cmd::cli::parse();
    let mut wrapped = None;
    let (check, args) = match cli.command {
        Some(Command::Check(args)) => (true, args),
        Some(Command::Run(args)) => (false, args),
        Some(Command::Wrap(w)) => match slotgate::cmd::wrap::Wrap::prepare(w.command) {
            Ok(wrap) => {
                wrapped = Some(wrap);
                (false, w.run)
            }
            Err(e) => {
                eprintln!("slotgate: {e}");
                return ExitCode::from(2);
            }
        },
        Some(Command::HashKey { key }) => {
            println!("{}", slotgate::pipeline::intake::hash_api_key(&key));
            return ExitCode::SUCCESS;
        }
        Some(Command::Policy(cmd)) => {
            return match slotgate::cmd::policy::run(cmd) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("slotgate: {e:#}");
                    ExitCode::from(2)
                }
            }
        }
        Some(Command::Top(args)) => return slotgate::cmd::top::run(args),
        Some(Command::Quota(cmd)) => return slotgate::cmd::quota::quota(cmd),
        Some(Command::Usage(args)) => return slotgate::cmd::quota::usage(args),
        Some(Command::Key(cmd)) => return slotgate::cmd::key::key(cmd),
        None => (false, cli.run),
    };
    slotgate::cmd::run::run(args, wrapped, check)
}
