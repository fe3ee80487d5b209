//! The Debian package, for the tests: built by cargo-deb from the binary this test run built
//! (stripped), and a throwaway root that dpkg installs it into. Also the tools both the package and
//! image tests find through `scripts/setup-package.sh`.
//!
//! ```ignore
//! let root = Root::new("pkg");
//! root.dpkg(&["--install", deb("0.1.0-1").to_str().unwrap()]);
//! ```

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;

use crate::gate::binary_path;
use crate::wait::unique_dir;

const SETUP: &str = "scripts/setup-package.sh";

/// A tool from `$VAR`, else from `default`; panics saying how to install it.
fn tool(var: &str, default: PathBuf) -> PathBuf {
    let path = std::env::var_os(var).map_or(default, PathBuf::from);
    assert!(
        path.is_file(),
        "{var}: {} is missing: the package and image tests need it; run \
         `eval \"$(bash {SETUP})\"; export CARGO_DEB PODMAN` first",
        path.display()
    );
    path
}

fn cache() -> PathBuf {
    std::env::var_os("SLOTGATE_CACHE").map_or_else(
        || PathBuf::from(std::env::var_os("HOME").unwrap_or_default()).join(".cache/slotgate"),
        PathBuf::from,
    )
}

/// `$CARGO_DEB`, else where `scripts/setup-package.sh` installs it.
pub fn cargo_deb() -> PathBuf {
    tool("CARGO_DEB", cache().join("cargo-deb/bin/cargo-deb"))
}

/// `$PODMAN`, else `/usr/bin/podman`.
pub(crate) fn podman_path() -> PathBuf {
    tool("PODMAN", PathBuf::from("/usr/bin/podman"))
}

/// Its stdout and stderr, asserting that it succeeded.
pub fn ok(what: &str, out: &Output) -> String {
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{what} ({}):\n{text}", out.status);
    text
}

/// Runs `cmd` to its end.
pub fn run(cmd: &mut Command) -> Output {
    cmd.output()
        .unwrap_or_else(|e| panic!("cannot run {:?}: {e}", cmd.get_program()))
}

/// The package of version `version` (`0.1.0-1`), built once per test binary and version.
///
/// cargo-deb packages the binary the test run built (`cargo build --workspace --bins`, the debug
/// profile) without building: `--no-build --profile dev`, and `--strip` strips it as it strips a
/// release build. `--fast` compresses lightly: the debug binary is twice the release one.
pub fn deb(version: &'static str) -> &'static Path {
    static BUILT: OnceLock<std::sync::Mutex<Vec<(&'static str, &'static Path)>>> = OnceLock::new();
    let built = BUILT.get_or_init(Default::default);
    let mut built = built.lock().unwrap_or_else(|e| e.into_inner());
    if let Some((_, path)) = built.iter().find(|(v, _)| *v == version) {
        return path;
    }
    // The binary the harness drives is the one packaged.
    binary_path();
    // Under the target directory, replaced by the next run: nothing left in the temp dir.
    let out_dir = crate::target_dir().join("package-test").join(version);
    let _ = std::fs::remove_dir_all(&out_dir);
    std::fs::create_dir_all(&out_dir).expect("the package's output directory");
    let out = run(Command::new(cargo_deb())
        .current_dir(crate::workspace())
        .args([
            "-p",
            "slotgate",
            "--no-build",
            "--profile",
            "dev",
            "--strip",
        ])
        .args(["--fast", "--deb-version", version, "--output"])
        .arg(&out_dir)
        .env("CARGO_TARGET_DIR", crate::target_dir()));
    let text = ok("cargo deb", &out);
    let path = std::fs::read_dir(&out_dir)
        .expect("cargo deb's output directory")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| p.extension().is_some_and(|e| e == "deb"))
        .unwrap_or_else(|| panic!("cargo deb made no .deb in {}:\n{text}", out_dir.display()));
    let path: &'static Path = Box::leak(path.into_boxed_path());
    built.push((version, path));
    path
}

/// A throwaway root that dpkg installs into: `dpkg --root ROOT --force-script-chrootless`, so the
/// maintainer scripts run with this machine's tools (`systemd-sysusers`, `deb-systemd-helper`) and
/// reach the root through `$DPKG_ROOT`, as in a bootstrap of a Debian system. Its database holds
/// this machine's `libc6` entry, so the package's `Depends:` is checked, not forced.
pub struct Root {
    pub dir: PathBuf,
}

impl Root {
    pub fn new(prefix: &str) -> Self {
        let dir = unique_dir(prefix);
        let admin = dir.join("var/lib/dpkg");
        for sub in ["info", "updates", "triggers"] {
            std::fs::create_dir_all(admin.join(sub)).expect("dpkg admin dir");
        }
        let libc = ok(
            "dpkg-query -s libc6",
            &run(Command::new("dpkg-query").args(["-s", "libc6"])),
        );
        // Stand-in for the host's own libc: installed in the database, its files the host's.
        let stanza: String = libc
            .lines()
            .take_while(|l| !l.is_empty())
            .map(|l| {
                if l.starts_with("Status:") {
                    "Status: install ok installed\n".to_owned()
                } else {
                    format!("{l}\n")
                }
            })
            .collect();
        std::fs::write(admin.join("status"), stanza + "\n").expect("dpkg status");
        let arch = ok(
            "dpkg --print-architecture",
            &run(Command::new("dpkg").arg("--print-architecture")),
        );
        std::fs::write(admin.join(format!("info/libc6:{}.list", arch.trim())), "")
            .expect("libc6 file list");
        Root { dir }
    }

    /// `path` (absolute, as installed) inside the root.
    pub fn path(&self, path: &str) -> PathBuf {
        self.dir.join(path.trim_start_matches('/'))
    }

    /// `dpkg --root ROOT --force-script-chrootless ARGS`.
    pub fn dpkg(&self, args: &[&str]) -> Output {
        run(Command::new("dpkg")
            .arg("--root")
            .arg(&self.dir)
            .arg("--force-script-chrootless")
            .args(args)
            .env_remove("DPKG_ROOT"))
    }

    /// dpkg's `Status:` and `Version:` of the package `slotgate` in the root, or `None`.
    pub fn status(&self) -> Option<(String, String)> {
        let out = run(Command::new("dpkg-query")
            .arg("--admindir")
            .arg(self.path("/var/lib/dpkg"))
            .args(["-W", "-f", "${Status}|${Version}", "slotgate"]));
        if !out.status.success() {
            return None;
        }
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        let (status, version) = text.split_once('|')?;
        Some((status.to_owned(), version.to_owned()))
    }

    /// The `passwd` (or `group`) entry `name` of the root, split at `:`.
    pub fn entry(&self, file: &str, name: &str) -> Option<Vec<String>> {
        let text = std::fs::read_to_string(self.path(&format!("/etc/{file}"))).ok()?;
        text.lines()
            .map(|l| l.split(':').map(str::to_owned).collect::<Vec<_>>())
            .find(|f| f[0] == name)
    }

    /// What `systemd-analyze verify --root` needs of a system beside the package: systemd's own
    /// targets and `/bin/kill` (ExecReload=), copied from this machine, as a Debian system has them.
    pub fn seed_for_verify(&self) {
        let units = self.path("/usr/lib/systemd/system");
        std::fs::create_dir_all(&units).unwrap();
        for entry in std::fs::read_dir("/usr/lib/systemd/system").expect("systemd's units") {
            let path = entry.unwrap().path();
            if path.extension().is_some_and(|e| e == "target") && path.is_file() {
                std::fs::copy(&path, units.join(path.file_name().unwrap())).unwrap();
            }
        }
        std::fs::create_dir_all(self.path("/bin")).unwrap();
        std::fs::copy("/bin/kill", self.path("/bin/kill")).expect("/bin/kill");
    }
}

impl Drop for Root {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
