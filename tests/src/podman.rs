//! podman for the image test: the flags that work on this kind of machine, on a storage of its own.
//!
//! ```ignore
//! let podman = Podman::new();
//! let out = podman.run(&["run", "--rm", "slotgate:test", "--version"]);
//! ```

use std::path::PathBuf;
use std::process::{Command, Output};

use crate::package::{podman_path, run};
use crate::wait::unique_dir;

/// podman on a storage of its own (under a temp dir, removed on drop), with what this kind of
/// machine needs: the `vfs` driver (no overlay mounts needed), `runc` (Debian's crun refuses a
/// hybrid cgroup layout), `cgroupfs` (no systemd as pid 1), events to a file, the host's network
/// (no bridge), and `RLIMIT_NOFILE` and `RLIMIT_NPROC` of 4096: podman's defaults, and on this
/// machine anything from 65536 processes up, are refused (`error setting rlimit ... operation not
/// permitted`; the sandbox has no `CAP_SYS_RESOURCE`).
pub struct Podman {
    dir: PathBuf,
}

impl Podman {
    pub fn new() -> Self {
        let dir = unique_dir("podman");
        Podman { dir }
    }

    pub fn command(&self) -> Command {
        let mut cmd = Command::new(podman_path());
        cmd.arg("--root")
            .arg(self.dir.join("storage"))
            .arg("--runroot")
            .arg(self.dir.join("run"))
            .args([
                "--storage-driver",
                "vfs",
                "--runtime",
                "runc",
                "--cgroup-manager",
                "cgroupfs",
                "--events-backend",
                "file",
                "--network-backend",
                "netavark",
            ])
            .env("TMPDIR", &self.dir);
        cmd
    }

    /// `podman ARGS` to its end.
    pub fn run(&self, args: &[&str]) -> Output {
        run(self.command().args(args))
    }

    /// The options of `podman run` that this machine needs (see [`Podman`]).
    pub fn run_options() -> Vec<String> {
        [
            "--network=host",
            "--ulimit=nofile=4096:4096",
            "--ulimit=nproc=4096:4096",
        ]
        .map(String::from)
        .to_vec()
    }
}

impl Default for Podman {
    fn default() -> Self {
        Self::new()
    }
}

impl Drop for Podman {
    fn drop(&mut self) {
        // vfs layers are plain directories; containers still listed are gone with them.
        let _ = self.run(&["rm", "--all", "--force"]);
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
