//! A terminal for tests of `slotgate top`: a program run in a tmux session of a given size on a
//! server of its own (`tmux -L`), keys sent as a person types them (`send-keys`) and the screen read
//! back as text (`capture-pane`).

use std::process::Command;
use std::time::{Duration, Instant};

/// One tmux server with one window running one program; killed on drop.
pub struct Tmux {
    socket: String,
}

impl Tmux {
    /// Runs `argv` in a `width`×`height` window; the pane stays after the program exits, so its
    /// end can be seen.
    pub fn start(argv: &[String], width: u16, height: u16) -> Tmux {
        let socket = format!(
            "sg-top-{}-{}",
            std::process::id(),
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.subsec_nanos())
        );
        let t = Tmux { socket };
        let command = argv
            .iter()
            .map(|a| format!("'{}'", a.replace('\'', r"'\''")))
            .collect::<Vec<_>>()
            .join(" ");
        t.run(&[
            "new-session",
            "-d",
            "-x",
            &width.to_string(),
            "-y",
            &height.to_string(),
            // Exit status shown once it ends, the pane kept.
            &format!("{command}; echo \"[exited $?]\"; sleep 3600"),
        ]);
        t
    }

    fn run(&self, args: &[&str]) -> String {
        let out = Command::new("tmux")
            .arg("-L")
            .arg(&self.socket)
            // No user configuration: the same terminal on every machine.
            .args(["-f", "/dev/null"])
            .args(args)
            .env("TERM", "xterm-256color")
            .output()
            .expect("run tmux (is it installed? scripts/test.sh installs it)");
        assert!(
            out.status.success(),
            "tmux {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// The screen as text, one line per row.
    pub fn screen(&self) -> String {
        self.run(&["capture-pane", "-p", "-t", "0"])
    }

    /// Sends tmux key names (`Tab`, `Enter`, `q`).
    pub fn keys(&self, keys: &[&str]) {
        let mut args = vec!["send-keys", "-t", "0"];
        args.extend_from_slice(keys);
        self.run(&args);
    }

    /// Types `text` as it is.
    pub fn type_text(&self, text: &str) {
        self.run(&["send-keys", "-t", "0", "-l", text]);
    }

    /// Waits until the screen satisfies `ok`; returns it, or panics with the last one seen.
    pub fn wait_for(&self, timeout: Duration, what: &str, ok: impl Fn(&str) -> bool) -> String {
        let deadline = Instant::now() + timeout;
        loop {
            let screen = self.screen();
            if ok(&screen) {
                return screen;
            }
            if Instant::now() > deadline {
                panic!("the screen never showed {what} within {timeout:?}; last:\n{screen}");
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Drop for Tmux {
    fn drop(&mut self) {
        let _ = Command::new("tmux")
            .args(["-L", &self.socket, "kill-server"])
            .output();
    }
}
