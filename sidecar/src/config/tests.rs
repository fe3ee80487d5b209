//! Parsing, layering and validation of settings.

use super::*;

#[test]
fn parses_human_values() {
    assert_eq!(
        "500ms".parse::<Dur>().unwrap().0,
        Duration::from_millis(500)
    );
    assert_eq!("2m".parse::<Dur>().unwrap().0, Duration::from_secs(120));
    assert!("soon".parse::<Dur>().is_err());
    assert_eq!("8MiB".parse::<ByteSize>().unwrap().0, 8 << 20);
    assert_eq!("1024".parse::<ByteSize>().unwrap().0, 1024);
    assert!("8 parsecs".parse::<ByteSize>().is_err());
    // One meaning per unit: KiB/MiB/GiB are 1024-based, KB/MB/GB 1000-based, a bare letter refused.
    assert_eq!("8MB".parse::<ByteSize>().unwrap().0, 8_000_000);
    assert_eq!("8mib".parse::<ByteSize>().unwrap().0, 8 << 20);
    for bare in ["8M", "8m", "512k", "1G"] {
        let e = bare.parse::<ByteSize>().unwrap_err();
        assert!(
            e.contains("ambiguous") && e.contains("iB") && e.contains("B (1000"),
            "{e}"
        );
    }
    assert_eq!("0660".parse::<SocketMode>().unwrap().0, 0o660);
    assert!("999".parse::<SocketMode>().is_err());
}

#[test]
fn parses_addresses() {
    assert_eq!(
        "unix:/tmp/a.sock".parse::<ListenAddr>().unwrap(),
        ListenAddr::Unix("/tmp/a.sock".into())
    );
    assert!(matches!(
        "tcp:127.0.0.1:8081".parse::<ListenAddr>(),
        Ok(ListenAddr::Tcp(_))
    ));
    assert!("tcp:localhost".parse::<ListenAddr>().is_err());
    assert_eq!(
        "http://127.0.0.1:8080/".parse::<UpstreamAddr>().unwrap(),
        UpstreamAddr::Tcp("127.0.0.1:8080".into())
    );
    assert!("https://x:1".parse::<UpstreamAddr>().is_err());
    assert!("http://x".parse::<UpstreamAddr>().is_err());
    assert_eq!("off".parse::<AdminAddr>().unwrap(), AdminAddr::Off);
}

#[test]
fn layers_merge_and_file_rejects_unknown_keys() {
    let file: Settings = toml::from_str("slots = 2\nqueue-depth = 3\nmax-body = 4096\n").unwrap();
    let flags = Settings {
        slots: Some(Slots::Fixed(5)),
        ..Settings::default()
    };
    let cfg = Config::from_settings(flags.over(file)).unwrap();
    assert_eq!(
        (cfg.slots, cfg.queue_depth, cfg.max_body),
        (Slots::Fixed(5), 3, 4096)
    );
    assert!(toml::from_str::<Settings>("slot = 2").is_err());
    assert!(toml::from_str::<Settings>("queue-timeout = \"forever\"").is_err());
}

#[test]
fn effective_settings_round_trip_through_toml() {
    let cfg = Config::from_settings(Settings::default()).unwrap();
    let text = toml::to_string(&cfg.effective()).unwrap();
    let again = Config::from_settings(toml::from_str(&text).unwrap()).unwrap();
    assert_eq!(toml::to_string(&again.effective()).unwrap(), text);
    assert!(text.contains("queue-timeout = \"1m\""), "{text}");
}

#[test]
fn fairness_keys_parse_validate_and_derive_the_tenant_limit() {
    let cfg = Config::from_settings(Settings::default()).unwrap();
    assert_eq!(cfg.priority_aging, Some(Duration::from_secs(10)));
    assert_eq!(
        (cfg.tenant_queue_share, cfg.tenant_queue_limit()),
        (0.5, Some(4))
    );
    let file: Settings =
        toml::from_str("priority-aging = \"0s\"\ntenant-queue-share = 0.3\nqueue-depth = 5\n")
            .unwrap();
    let cfg = Config::from_settings(file).unwrap();
    assert_eq!(cfg.priority_aging, None);
    assert_eq!(cfg.tenant_queue_limit(), Some(2));
    let off = Settings {
        tenant_queue_share: Some(1.0),
        ..Settings::default()
    };
    assert_eq!(
        Config::from_settings(off).unwrap().tenant_queue_limit(),
        None
    );
    for bad in [0.0, -0.5, 1.5, f64::NAN] {
        let s = Settings {
            tenant_queue_share: Some(bad),
            ..Settings::default()
        };
        let err = Config::from_settings(s).unwrap_err().to_string();
        assert!(err.contains("tenant-queue-share"), "{err}");
    }
}

#[test]
fn tenant_caps_default_override_and_are_checked() {
    let cfg = Config::from_settings(Settings::default()).unwrap();
    assert!(!cfg.tenant_caps.any());
    assert_eq!(cfg.tenant_caps.over_cap, OverCap::Wait);
    let text = r#"
tenant-max-in-service = 2
tenant-over-cap = "refuse"

[tenants."team-a"]
max-in-service = 4

[tenants."uid:1000"]
max-waiting = 0
"#;
    let cfg = Config::from_settings(toml::from_str(text).unwrap()).unwrap();
    let caps = &cfg.tenant_caps;
    assert_eq!(caps.over_cap, OverCap::Refuse);
    let of = |t: &str| {
        let c = caps.of(t);
        (c.max_in_service, c.max_waiting)
    };
    assert_eq!(
        of("team-a"),
        (Some(4), None),
        "its own cap over the default"
    );
    assert_eq!(
        of("uid:1000"),
        (Some(2), Some(0)),
        "the default where it sets none"
    );
    assert_eq!(of("anyone"), (Some(2), None));
    // The effective settings read back the same.
    let again = Config::from_settings(cfg.effective()).unwrap();
    assert_eq!(again.tenant_caps, cfg.tenant_caps);
    for (bad, key) in [
        ("tenant-max-in-service = 0", "tenant-max-in-service"),
        ("[tenants.a]\nmax-in-service = 0", "tenants.max-in-service"),
        ("[tenants.a]\n", "limits nothing"),
        ("[tenants.\"\"]\nmax-waiting = 1", "may not be empty"),
    ] {
        let err = Config::from_settings(toml::from_str(bad).unwrap())
            .unwrap_err()
            .to_string();
        assert!(err.contains(key), "{bad}: {err}");
    }
    for bad in [
        "tenant-over-cap = \"drop\"",
        "[tenants.a]\nmax-in-flight = 1",
        "[tenants.a]\nmax-waiting = -1",
    ] {
        assert!(toml::from_str::<Settings>(bad).is_err(), "{bad}");
    }
}

#[test]
fn rejects_zero_slots() {
    let s = Settings {
        slots: Some(Slots::Fixed(0)),
        ..Settings::default()
    };
    assert!(Config::from_settings(s)
        .unwrap_err()
        .to_string()
        .contains("slots"));
}

/// For each flag: the `[default: X]` that `--help` shows (`None`: it shows none), and the value in
/// force when no layer sets it, as `slotgate check` prints it (`None`: unset).
fn help_defaults() -> Vec<(String, Option<String>, Option<String>)> {
    use clap::{Args, Command};
    let cmd = Settings::augment_args(Command::new("slotgate"));
    let config = Config::from_settings(Settings::default()).unwrap();
    let effective = toml::Value::try_from(config.effective()).unwrap();
    let mut rows = Vec::new();
    for arg in cmd.get_arguments() {
        let Some(key) = arg.get_long() else { continue };
        let help = [arg.get_help(), arg.get_long_help()]
            .into_iter()
            .flatten()
            .map(|h| h.to_string())
            .collect::<Vec<_>>()
            .join(" ");
        let shown = help.rfind("[default: ").map(|at| {
            let rest = &help[at + "[default: ".len()..];
            rest.split(']').next().unwrap().to_owned()
        });
        // `cost-tokenizer` is printed as `tokenizer` in `[cost]`, `state-*` in `[state]`.
        let value = effective.get(key).or_else(|| {
            let (table, rest) = key.split_once('-')?;
            effective.get(table)?.get(rest)
        });
        let in_force = value.map(|v| match v {
            toml::Value::String(s) => s.clone(),
            toml::Value::Array(a) if a.len() == 1 => {
                a[0].as_str().map_or(a[0].to_string(), str::to_owned)
            }
            other => other.to_string(),
        });
        rows.push((key.to_string(), shown, in_force));
    }
    rows
}

/// `--help` is where operators read the defaults; the code is where they are in force. One place
/// holds each (the key tables: `Config`'s in mod.rs, `[state]`'s in state.rs, the admin keys' in
/// admin.rs), and this keeps the help text true to it: a default changed in a table, or a key given
/// a default there, fails here until its doc comment in settings.rs says the same.
#[test]
fn every_default_in_help_is_the_default_in_force() {
    let rows = help_defaults();
    let shown = rows.iter().filter(|(_, shown, _)| shown.is_some()).count();
    assert!(shown >= 40, "only {shown} keys show a default");
    let same = |shown: &str, in_force: &str| {
        shown == in_force
            || matches!((shown.parse::<Dur>(), in_force.parse::<Dur>()), (Ok(a), Ok(b)) if a == b)
    };
    // In force without a word in --help (a gap in its text, not in the table).
    let unsaid = ["trust-client-priority"];
    let wrong: Vec<String> = rows
        .iter()
        .filter(|(key, shown, in_force)| match (shown, in_force) {
            (Some(shown), Some(v)) => !same(shown, v),
            // Unset by default: the help says so in words (`none`, `off; ...`).
            (Some(shown), None) => !(shown.starts_with("none") || shown.starts_with("off")),
            (None, Some(_)) => !unsaid.contains(&key.as_str()),
            (None, None) => false,
        })
        .map(|(k, shown, in_force)| format!("--{k}: help says {shown:?}, in force {in_force:?}"))
        .collect();
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

/// A table's default passes its own checks, and a value its checks refuse is refused by key name.
#[test]
fn table_rows_check_values_and_name_their_key() {
    let cfg = Config::from_settings(Settings::default()).unwrap();
    assert_eq!(cfg.state.lease, LeaseSettings::default());
    for (bad, key, why) in [
        (
            "queue-timeout = \"0s\"",
            "`queue-timeout`",
            "longer than zero",
        ),
        ("max-body = 0", "`max-body`", "at least 1 byte"),
        ("listen = []", "`listen`", "at least one"),
        ("kv-pool = 0", "`kv-pool`", "holds nothing"),
        (
            "policy-denial-status = 500",
            "`policy-denial-status`",
            "500 is not",
        ),
        (
            "[state]\nlease-idle = \"0s\"",
            "`state.lease-idle`",
            "longer than zero",
        ),
        ("[state]\nfleet = \"a b\"", "`state.fleet`", "`a b` must be"),
        (
            "[state]\nfetch-timeout = \"2s\"",
            "`state.fetch-timeout`",
            "`2s` is outside",
        ),
        (
            "[state]\nbackend = \"redis\"",
            "`state.redis-url`",
            "needs the store",
        ),
        (
            "[state]\nlease-max-share = 2.0",
            "`state.lease-max-share`",
            "`2` must be",
        ),
    ] {
        let settings = toml::from_str::<Settings>(bad).unwrap();
        let err = Config::from_settings(settings).unwrap_err().to_string();
        assert!(err.contains(key) && err.contains(why), "{bad}: {err}");
    }
}
