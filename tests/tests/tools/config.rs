//! Configuration: `slotgate check` prints the effective settings as TOML; bad settings exit 2 with a
//! clear message; precedence is flag > environment > TOML file > default.

use std::path::PathBuf;
use std::process::Output;

use slotgate_tests::gate::command;
use slotgate_tests::*;

/// A TOML file in its own temp dir, removed on drop.
struct ConfigFile(PathBuf);

impl ConfigFile {
    fn to_str(&self) -> Option<&str> {
        self.0.to_str()
    }
}

impl Drop for ConfigFile {
    fn drop(&mut self) {
        if let Some(dir) = self.0.parent() {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

fn config_file(contents: &str) -> ConfigFile {
    let path = unique_dir("cfg").join("slotgate.toml");
    std::fs::write(&path, contents).unwrap();
    ConfigFile(path)
}

fn check(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut cmd = command();
    cmd.arg("check").args(args);
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().expect("run slotgate check")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// Runs `check`, which must reject the settings: exit code 2 and a message. Returns stderr.
fn rejected(args: &[&str]) -> String {
    let out = check(args, &[]);
    let err = text(&out.stderr);
    assert_eq!(
        out.status.code(),
        Some(2),
        "check {args:?} must fail with 2; stdout:\n{}stderr:\n{err}",
        text(&out.stdout),
    );
    assert!(!err.trim().is_empty(), "check {args:?} must say why");
    err
}

/// Parses `check`'s stdout as TOML; panics with the output if it is not.
fn settings(out: &Output) -> toml::Table {
    assert!(
        out.status.success(),
        "check failed with {}: stderr:\n{}",
        out.status,
        text(&out.stderr)
    );
    toml::from_str(&text(&out.stdout))
        .unwrap_or_else(|e| panic!("check output is not TOML ({e}):\n{}", text(&out.stdout)))
}

/// A setting by its documented name, tolerating `_` for `-` in the printed key.
fn get<'a>(t: &'a toml::Table, key: &str) -> &'a toml::Value {
    t.get(key)
        .or_else(|| t.get(&key.replace('-', "_")))
        .unwrap_or_else(|| panic!("check output lacks `{key}`: {t:#?}"))
}

fn slots(out: &Output) -> i64 {
    get(&settings(out), "slots")
        .as_integer()
        .expect("slots is an integer")
}

#[test]
fn check_prints_effective_settings_from_a_file() {
    let file = config_file(
        "slots = 2\nqueue-depth = 4\nqueue-timeout = \"5s\"\nupstream = \"unix:/tmp/sg-llama.sock\"\n\
         trust-client-priority = true\n",
    );
    let out = check(&["--config", file.to_str().unwrap()], &[]);
    let t = settings(&out);
    assert_eq!(get(&t, "slots").as_integer(), Some(2));
    assert_eq!(get(&t, "queue-depth").as_integer(), Some(4));
    assert_eq!(
        get(&t, "upstream").as_str(),
        Some("unix:/tmp/sg-llama.sock")
    );
    assert_eq!(get(&t, "trust-client-priority").as_bool(), Some(true));
    let timeout = get(&t, "queue-timeout").to_string();
    assert!(timeout.contains('5'), "queue-timeout printed as {timeout}");
    // Defaults are part of the effective settings too.
    assert_eq!(get(&t, "max-connections").as_integer(), Some(1024));
}

#[test]
fn unknown_key_is_rejected_with_its_name() {
    let file = config_file("slots = 2\nbogus-knob = 1\n");
    let err = rejected(&["--config", file.to_str().unwrap()]);
    assert!(err.contains("bogus-knob"), "stderr:\n{err}");
}

#[test]
fn bad_duration_is_rejected_clearly() {
    let file = config_file("queue-timeout = \"5 parsecs\"\n");
    let err = rejected(&["--config", file.to_str().unwrap()]);
    assert!(
        err.contains("queue-timeout") || err.contains("queue_timeout") || err.contains("parsecs"),
        "the message should name the key or the value; stderr:\n{err}"
    );

    let out = check(&["--queue-timeout", "soon"], &[]);
    assert!(!out.status.success(), "a bad duration flag must fail");
    assert!(!text(&out.stderr).trim().is_empty());
}

#[test]
fn environment_variable_shows_in_check() {
    let out = check(&[], &[("SLOTGATE_SLOTS", "3")]);
    assert_eq!(slots(&out), 3);
}

#[test]
fn config_path_from_environment() {
    let file = config_file("slots = 5\n");
    let out = check(&[], &[("SLOTGATE_CONFIG", file.to_str().unwrap())]);
    assert_eq!(slots(&out), 5);
}

#[test]
fn flag_beats_env_beats_file() {
    let file = config_file("slots = 2\n");
    let f = file.to_str().unwrap();
    assert_eq!(
        slots(&check(
            &["--config", f, "--slots", "4"],
            &[("SLOTGATE_SLOTS", "3")]
        )),
        4
    );
    assert_eq!(
        slots(&check(&["--config", f], &[("SLOTGATE_SLOTS", "3")])),
        3
    );
    assert_eq!(slots(&check(&["--config", f], &[])), 2);
    assert_eq!(
        get(&settings(&check(&[], &[])), "slots").as_str(),
        Some("auto"),
        "default: follow llama-server's -np"
    );
}

#[test]
fn listen_from_environment_is_comma_separated() {
    let out = check(
        &[],
        &[("SLOTGATE_LISTEN", "unix:/tmp/sg-a.sock,tcp:127.0.0.1:18080")],
    );
    let t = settings(&out);
    let listen: Vec<&str> = get(&t, "listen")
        .as_array()
        .expect("listen is an array")
        .iter()
        .filter_map(|v| v.as_str())
        .collect();
    assert_eq!(listen, ["unix:/tmp/sg-a.sock", "tcp:127.0.0.1:18080"]);
}

#[test]
fn human_units_are_accepted() {
    for (dur, size) in [("500ms", "1048576"), ("2m", "512KiB"), ("1h", "8MiB")] {
        let file = config_file(&format!(
            "queue-timeout = \"{dur}\"\nmax-body = \"{size}\"\n"
        ));
        let out = check(&["--config", file.to_str().unwrap()], &[]);
        settings(&out);
        let out = check(&["--drain-timeout", dur, "--max-body", size], &[]);
        settings(&out);
    }
}

#[test]
fn invalid_values_exit_2() {
    for args in [
        &["--socket-mode", "0999"][..],
        &["--listen", "ftp:somewhere"][..],
        &["--upstream", "not a url"][..],
        &["--max-body", "lots"][..],
        &["--slots", "0"][..],
    ] {
        rejected(args);
    }
}

#[test]
fn fairness_keys_come_from_flag_env_and_file() {
    let t = settings(&check(&[], &[]));
    assert_eq!(get(&t, "priority-aging").as_str(), Some("10s"), "default");
    assert_eq!(
        get(&t, "tenant-queue-share").as_float(),
        Some(0.5),
        "default"
    );

    let file = config_file("priority-aging = \"2s\"\ntenant-queue-share = 1\n");
    let t = settings(&check(&["--config", file.to_str().unwrap()], &[]));
    assert_eq!(get(&t, "priority-aging").as_str(), Some("2s"));
    assert_eq!(get(&t, "tenant-queue-share").as_float(), Some(1.0));

    let out = check(
        &["--priority-aging", "0s"],
        &[("SLOTGATE_TENANT_QUEUE_SHARE", "0.25")],
    );
    let t = settings(&out);
    assert_eq!(get(&t, "priority-aging").as_str(), Some("0s"), "off");
    assert_eq!(get(&t, "tenant-queue-share").as_float(), Some(0.25));

    for share in ["0", "1.5", "-1", "half"] {
        let err = rejected(&[&format!("--tenant-queue-share={share}")]);
        assert!(err.contains("tenant-queue-share"), "stderr:\n{err}");
    }
    rejected(&["--priority-aging", "soon"]);
}

#[test]
fn the_fleet_state_settings_are_checked_and_shown() {
    // The redis backend needs its store's URL.
    let why = rejected(&["--state-backend", "redis"]);
    assert!(why.contains("state.redis-url"), "{why}");
    let why = rejected(&["--state-on-unavailable", "maybe"]);
    assert!(why.contains("local-share, allow or deny"), "{why}");
    // Flags, the environment and the [state] table, as the other settings.
    let file = config_file("[state]\nbackend = \"redis\"\nfleet = \"model-a\"\n");
    let out = check(
        &["--config", file.to_str().unwrap()],
        &[("SLOTGATE_STATE_REDIS_URL", "unix:///run/redis/redis.sock")],
    );
    let s = settings(&out);
    assert_eq!(get(&s, "state")["backend"].as_str(), Some("redis"));
    assert_eq!(get(&s, "state")["fleet"].as_str(), Some("model-a"));
    assert_eq!(
        get(&s, "state")["redis-url"].as_str(),
        Some("unix:///run/redis/redis.sock")
    );
    assert_eq!(
        get(&s, "state")["on-unavailable"].as_str(),
        Some("local-share")
    );
    // The default: each sidecar its own budgets.
    let out = check(&[], &[]);
    assert_eq!(
        get(&settings(&out), "state")["backend"].as_str(),
        Some("memory")
    );
}

#[test]
fn the_lease_settings_have_defaults_come_from_flag_env_and_file_and_are_checked() {
    let url = ("SLOTGATE_STATE_REDIS_URL", "unix:///run/redis/redis.sock");
    let state = |out: &std::process::Output| get(&settings(out), "state").clone();
    let s = state(&check(&["--state-backend", "redis"], &[url]));
    assert_eq!(s["fetch-timeout"].as_str(), Some("5ms"), "{s}");
    assert_eq!(s["lease-horizon"].as_str(), Some("1s"));
    assert_eq!(s["lease-max-share"].as_float(), Some(0.1));
    assert_eq!(s["lease-idle"].as_str(), Some("5s"));
    assert_eq!(s["lease-max-age"].as_str(), Some("30s"));

    let file = config_file(
        "[state]\nbackend = \"redis\"\nfetch-timeout = \"20ms\"\nlease-horizon = \"3s\"\n\
         lease-max-share = 0.25\nlease-idle = \"2s\"\nlease-max-age = \"1m\"\n",
    );
    let s = state(&check(&["--config", file.to_str().unwrap()], &[url]));
    assert_eq!(s["fetch-timeout"].as_str(), Some("20ms"), "{s}");
    assert_eq!(s["lease-horizon"].as_str(), Some("3s"));
    assert_eq!(s["lease-max-share"].as_float(), Some(0.25));
    assert_eq!(s["lease-idle"].as_str(), Some("2s"));
    assert_eq!(s["lease-max-age"].as_str(), Some("1m"));
    // A flag or the environment beats the file.
    let s = state(&check(
        &[
            "--config",
            file.to_str().unwrap(),
            "--state-lease-max-share",
            "0.05",
        ],
        &[url, ("SLOTGATE_STATE_FETCH_TIMEOUT", "2ms")],
    ));
    assert_eq!(s["lease-max-share"].as_float(), Some(0.05), "{s}");
    assert_eq!(s["fetch-timeout"].as_str(), Some("2ms"));
    assert_eq!(
        s["lease-idle"].as_str(),
        Some("2s"),
        "the rest from the file"
    );

    for (args, key) in [
        (
            &["--state-lease-max-share", "0"][..],
            "state.lease-max-share",
        ),
        (
            &["--state-lease-max-share", "1.5"][..],
            "state.lease-max-share",
        ),
        (&["--state-fetch-timeout", "0s"][..], "state.fetch-timeout"),
        (&["--state-fetch-timeout", "2s"][..], "state.fetch-timeout"),
        (&["--state-lease-idle", "0s"][..], "state.lease-idle"),
        (&["--state-lease-horizon", "0ms"][..], "state.lease-horizon"),
    ] {
        let why = rejected(args);
        assert!(why.contains(key), "{args:?}: {why}");
    }
    let file = config_file("[state]\nlease-size = 10\n");
    let why = rejected(&["--config", file.to_str().unwrap()]);
    assert!(why.contains("lease-size"), "an unknown key is named: {why}");
}

#[test]
fn policy_denial_status_comes_from_flag_env_and_file_and_is_a_client_error() {
    let status = |out: &Output| get(&settings(out), "policy-denial-status").as_integer();
    assert_eq!(
        status(&check(&[], &[])),
        Some(429),
        "default: as the policy said"
    );

    let file = config_file("policy-denial-status = 403\n");
    let path = file.to_str().unwrap();
    assert_eq!(status(&check(&["--config", path], &[])), Some(403));
    let env = [("SLOTGATE_POLICY_DENIAL_STATUS", "409")];
    assert_eq!(status(&check(&["--config", path], &env)), Some(409));
    assert_eq!(
        status(&check(
            &["--config", path, "--policy-denial-status", "400"],
            &env
        )),
        Some(400),
        "flag > environment > file"
    );

    for bad in ["200", "399", "500", "503", "forbidden"] {
        let err = rejected(&["--policy-denial-status", bad]);
        assert!(err.contains("policy-denial-status"), "{bad}: {err}");
    }
}

#[test]
fn the_llama_server_settings_are_checked_and_shown_and_the_key_never() {
    let dir = unique_dir("key");
    let key = dir.join("llama.key");
    std::fs::write(
        &key,
        "# the key llama-server was started with\nsk-secret-value\n",
    )
    .unwrap();
    let key_arg = key.display().to_string();
    let file = config_file("kv-pool = 8192\nforward-host-endpoints = true\n");
    let out = check(
        &[
            "--config",
            file.to_str().unwrap(),
            "--upstream-api-key-file",
            &key_arg,
        ],
        &[],
    );
    let t = settings(&out);
    assert_eq!(get(&t, "kv-pool").as_integer(), Some(8192));
    assert_eq!(get(&t, "forward-host-endpoints").as_bool(), Some(true));
    assert_eq!(
        get(&t, "upstream-api-key-file").as_str(),
        Some(key_arg.as_str())
    );
    assert!(
        !text(&out.stdout).contains("sk-secret"),
        "the key itself is never printed"
    );
    let out = check(&[], &[("SLOTGATE_KV_POOL", "per-slot")]);
    assert_eq!(get(&settings(&out), "kv-pool").as_str(), Some("per-slot"));
    assert_eq!(
        get(&settings(&check(&[], &[])), "kv-pool").as_str(),
        Some("auto")
    );

    let err = rejected(&["--kv-pool", "lots"]);
    assert!(
        err.contains("auto, per-slot or a number of tokens"),
        "{err}"
    );
    let err = rejected(&["--kv-pool", "0"]);
    assert!(err.contains("kv-pool"), "{err}");
    let err = rejected(&["--upstream-api-key-file", "/nonexistent/llama.key"]);
    assert!(
        err.contains("upstream-api-key-file") && err.contains("/nonexistent/llama.key"),
        "{err}"
    );
    let empty = dir.join("empty.key");
    std::fs::write(&empty, "# no key here\n\n").unwrap();
    let err = rejected(&["--upstream-api-key-file", empty.to_str().unwrap()]);
    assert!(err.contains("holds no key"), "{err}");
    let unsendable = dir.join("control.key");
    std::fs::write(&unsendable, "sk-\u{1}x\n").unwrap();
    let err = rejected(&["--upstream-api-key-file", unsendable.to_str().unwrap()]);
    assert!(err.contains("control bytes"), "{err}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn overload_bands_are_checked_and_printed() {
    let file = config_file(
        "[bands.background]\npriorities = [10, 1000]\nslots = 0.5\nqueue = 0.25\n\n[bands.batch]\npriorities = [1, 9]\nqueue = 0.5\n",
    );
    let out = check(&["--config", file.to_str().unwrap()], &[]);
    let s = settings(&out);
    let bg = &get(&s, "bands")["background"];
    assert_eq!(bg["priorities"].as_array().unwrap().len(), 2, "{bg}");
    assert_eq!(bg["slots"].as_float(), Some(0.5));
    assert_eq!(get(&s, "bands")["batch"]["queue"].as_float(), Some(0.5));
    for (bad, says) in [
        ("[bands.a]\npriorities = [5, 1]\nqueue = 0.5\n", "no range"),
        ("[bands.a]\npriorities = [1, 5]\nqueue = 1.5\n", "not a share"),
        ("[bands.a]\npriorities = [1, 5]\n", "limits nothing"),
        (
            "[bands.a]\npriorities = [1, 5]\nqueue = 0.5\n[bands.b]\npriorities = [5, 9]\nslots = 0.5\n",
            "overlap",
        ),
    ] {
        let file = config_file(bad);
        let why = rejected(&["--config", file.to_str().unwrap()]);
        assert!(why.contains(says), "{bad}: {why}");
    }
}

#[test]
fn tenant_caps_come_from_flag_env_and_file_and_are_checked() {
    let t = settings(&check(&[], &[]));
    assert_eq!(get(&t, "tenant-over-cap").as_str(), Some("wait"), "default");
    assert!(
        t.get("tenant-max-in-service").is_none(),
        "no cap by default"
    );

    let file = config_file(
        "tenant-max-in-service = 2\n\n[tenants.\"team-a\"]\nmax-in-service = 4\nmax-waiting = 1\n",
    );
    let out = check(
        &[
            "--config",
            file.to_str().unwrap(),
            "--tenant-over-cap",
            "refuse",
        ],
        &[("SLOTGATE_TENANT_MAX_WAITING", "3")],
    );
    let t = settings(&out);
    assert_eq!(get(&t, "tenant-max-in-service").as_integer(), Some(2));
    assert_eq!(get(&t, "tenant-max-waiting").as_integer(), Some(3));
    assert_eq!(get(&t, "tenant-over-cap").as_str(), Some("refuse"));
    let a = &get(&t, "tenants")["team-a"];
    assert_eq!(a["max-in-service"].as_integer(), Some(4), "{a}");
    assert_eq!(a["max-waiting"].as_integer(), Some(1), "{a}");

    for (bad, says) in [
        ("tenant-max-in-service = 0\n", "tenant-max-in-service"),
        ("[tenants.a]\nmax-in-service = 0\n", "tenant `a`"),
        ("[tenants.a]\n", "limits nothing"),
        ("[tenants.a]\nmax-in-flight = 1\n", "max-in-flight"),
        ("tenant-over-cap = \"drop\"\n", "wait or refuse"),
    ] {
        let file = config_file(bad);
        let why = rejected(&["--config", file.to_str().unwrap()]);
        assert!(why.contains(says), "{bad}: {why}");
    }
    rejected(&["--tenant-over-cap", "sometimes"]);
    rejected(&["--tenant-max-in-service", "-1"]);
}
