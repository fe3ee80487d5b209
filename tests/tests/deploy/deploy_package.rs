//! The Debian package (`[package.metadata.deb]` in sidecar/Cargo.toml, `packaging/deb/`), built by
//! cargo-deb from the binary this test run built, stripped: its control fields and contents; dpkg
//! installing, upgrading, removing and purging it in a throwaway root with its maintainer scripts;
//! its units through `systemd-analyze verify`; and the installed binary checking the installed
//! configuration and serving on sockets handed over as the installed units describe, as the
//! package's user, with the admin token the package wrote.
//!
//! Needs cargo-deb (`eval "$(bash scripts/setup-package.sh)"; export CARGO_DEB PODMAN`), dpkg,
//! `systemd-analyze`, `systemd-socket-activate`, `setpriv` and the built binary.

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use slotgate_tests::gate::free_port;
use slotgate_tests::package::{deb, ok, run, Root};
use slotgate_tests::systemd;
use slotgate_tests::*;

const FIRST: &str = "0.1.0-1";
const NEXT: &str = "0.1.0-2";

/// Every file the package installs (directories aside).
const FILES: &[&str] = &[
    "/etc/slotgate/slotgate.toml",
    "/usr/bin/slotgate",
    "/usr/lib/systemd/system/slotgate-admin.socket",
    "/usr/lib/systemd/system/slotgate.service",
    "/usr/lib/systemd/system/slotgate.socket",
    "/usr/lib/sysusers.d/slotgate.conf",
    "/usr/share/doc/slotgate/README.Debian",
    "/usr/share/doc/slotgate/copyright",
    "/usr/share/doc/slotgate/examples/llama-server.service",
];

const UNITS: &[&str] = &[
    "slotgate.service",
    "slotgate.socket",
    "slotgate-admin.socket",
];

fn text(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn mode(path: &Path) -> u32 {
    std::fs::metadata(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .permissions()
        .mode()
        & 0o7777
}

/// The `KEY=` values of a unit file, in order.
fn values<'a>(unit: &'a str, key: &str) -> Vec<&'a str> {
    unit.lines()
        .filter_map(|l| l.trim().strip_prefix(key)?.strip_prefix('='))
        .collect()
}

/// A unit's settings: its lines without comments and blank lines.
fn settings(unit: &str) -> BTreeSet<String> {
    unit.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#') && !l.starts_with(';'))
        .map(str::to_owned)
        .collect()
}

/// A root with the first package installed, asserting dpkg's success.
fn installed(prefix: &str) -> Root {
    let root = Root::new(prefix);
    let deb = deb(FIRST).to_str().unwrap().to_owned();
    ok("dpkg --install", &root.dpkg(&["--install", &deb]));
    root
}

#[test]
fn the_package_holds_the_stripped_binary_the_units_and_the_conffile() {
    let deb = deb(FIRST);
    let info = ok(
        "dpkg-deb --info",
        &run(Command::new("dpkg-deb").arg("--info").arg(deb)),
    );
    let field = |name: &str| -> String {
        let out = run(Command::new("dpkg-deb").arg("--field").arg(deb).arg(name));
        ok("dpkg-deb --field", &out).trim().to_owned()
    };
    assert_eq!(field("Package"), "slotgate");
    assert_eq!(field("Version"), FIRST);
    assert_eq!(field("Section"), "net");
    assert!(field("Depends").starts_with("libc6 (>= "), "{info}");
    for script in ["postinst", "prerm", "postrm"] {
        assert!(info.contains(script), "no {script}:\n{info}");
    }

    let listing = ok(
        "dpkg-deb --contents",
        &run(Command::new("dpkg-deb").arg("--contents").arg(deb)),
    );
    let files: Vec<&str> = listing
        .lines()
        .filter(|l| !l.starts_with('d'))
        .filter_map(|l| l.split_whitespace().last())
        .map(|p| p.trim_start_matches('.'))
        .collect();
    let mut sorted = files.clone();
    sorted.sort_unstable();
    assert_eq!(sorted, FILES, "{listing}");
    for line in listing.lines() {
        assert!(line.contains(" 0/0 "), "not root's: {line}");
    }
    let binary = listing
        .lines()
        .find(|l| l.ends_with("./usr/bin/slotgate"))
        .unwrap();
    assert!(binary.starts_with("-rwxr-xr-x"), "{binary}");

    // The conffile, from the control archive.
    let control = unique_dir("deb-control");
    ok(
        "dpkg-deb --control",
        &run(Command::new("dpkg-deb")
            .arg("--control")
            .arg(deb)
            .arg(&control)),
    );
    assert_eq!(
        text(&control.join("conffiles")).trim(),
        "/etc/slotgate/slotgate.toml"
    );
    // An upgrade restarts the service only: a restarted socket unit drops the clients in its
    // backlog. A removal stops every unit.
    let postinst = text(&control.join("postinst"));
    let restarts: Vec<&str> = postinst
        .lines()
        .filter(|l| l.contains("restart"))
        .filter(|l| !l.trim_start().starts_with('#'))
        .collect();
    assert_eq!(
        restarts,
        ["    deb-systemd-invoke try-restart slotgate.service >/dev/null || true"],
        "{postinst}"
    );
    let prerm = text(&control.join("prerm"));
    assert!(
        prerm.contains(r#"[ "$1" = remove ]; then"#)
            && prerm.contains(
                "deb-systemd-invoke stop slotgate-admin.socket slotgate.service slotgate.socket"
            ),
        "{prerm}"
    );
    let _ = std::fs::remove_dir_all(&control);
}

#[test]
fn the_package_installs_upgrades_removes_and_purges_in_a_throwaway_root() {
    let root = installed("pkg-life");
    assert_eq!(
        root.status(),
        Some(("install ok installed".into(), FIRST.into()))
    );

    // The binary: stripped (no debug sections), and the test run's build otherwise.
    let binary = root.path("/usr/bin/slotgate");
    assert_eq!(mode(&binary), 0o755);
    let sections = ok(
        "readelf -S",
        &run(Command::new("readelf").args(["-S", "-W"]).arg(&binary)),
    );
    for section in [".debug_info", ".debug_line"] {
        assert!(
            !sections.contains(section),
            "the installed binary keeps {section}:\n{sections}"
        );
    }
    let built = std::fs::metadata(slotgate_tests::gate::binary_path())
        .unwrap()
        .len();
    let size = std::fs::metadata(&binary).unwrap().len();
    assert!(size < built, "not stripped: {size} bytes, built {built}");

    // The configuration is the annotated example, root's and readable.
    let config = root.path("/etc/slotgate/slotgate.toml");
    assert_eq!(
        text(&config),
        text(&workspace().join("examples/slotgate.toml"))
    );
    assert_eq!(mode(&config), 0o644);

    // postinst: the user and group through systemd-sysusers, the admin token.
    let user = root
        .entry("passwd", "slotgate")
        .expect("postinst creates the user slotgate");
    assert_eq!(user[5], "/var/lib/slotgate", "{user:?}");
    assert_eq!(user[6], "/usr/sbin/nologin", "{user:?}");
    let uid: u32 = user[2].parse().unwrap();
    assert!((1..1000).contains(&uid), "not a system uid: {user:?}");
    assert!(root.entry("group", "slotgate").is_some());
    assert!(
        root.entry("group", "llm").is_some(),
        "slotgate.socket's group"
    );
    let token_file = root.path("/etc/slotgate/admin-token");
    let token = text(&token_file);
    assert_eq!(mode(&token_file), 0o600);
    assert_eq!(token.trim().len(), 64, "{token:?}");
    assert!(token.trim().chars().all(|c| c.is_ascii_hexdigit()));

    // An upgrade keeps the operator's configuration and token, and the state.
    let mut edited = text(&config);
    edited.push_str("\n# edited by the operator\n");
    std::fs::write(&config, &edited).unwrap();
    let state = root.path("/var/lib/slotgate");
    std::fs::create_dir_all(&state).unwrap();
    std::fs::write(state.join("state.redb"), "budgets").unwrap();
    let next = deb(NEXT).to_str().unwrap().to_owned();
    let upgrade = root.dpkg(&["--install", &next]);
    ok("dpkg --install (upgrade)", &upgrade);
    assert_eq!(
        root.status(),
        Some(("install ok installed".into(), NEXT.into()))
    );
    assert_eq!(text(&config), edited, "the upgrade replaced the conffile");
    assert!(!root.path("/etc/slotgate/slotgate.toml.dpkg-dist").exists());
    assert_eq!(text(&token_file), token, "the upgrade replaced the token");
    assert!(state.join("state.redb").exists());

    // Remove: the files go, the configuration, token and state stay.
    ok("dpkg --remove", &root.dpkg(&["--remove", "slotgate"]));
    assert_eq!(
        root.status().map(|s| s.0),
        Some("deinstall ok config-files".into())
    );
    assert!(!binary.exists());
    assert!(!root
        .path("/usr/lib/systemd/system/slotgate.service")
        .exists());
    assert!(config.exists() && token_file.exists() && state.exists());

    // Purge: the configuration, token and state go; the user stays (Debian keeps system users).
    ok("dpkg --purge", &root.dpkg(&["--purge", "slotgate"]));
    assert_eq!(root.status(), None, "dpkg still knows slotgate");
    assert!(!root.path("/etc/slotgate").exists());
    assert!(!state.exists());
    assert!(root.entry("passwd", "slotgate").is_some());
}

#[test]
fn the_installed_units_pass_systemd_analyze_verify() {
    let root = installed("pkg-units");
    root.seed_for_verify();
    systemd::require("systemd-analyze");
    let units: Vec<String> = UNITS
        .iter()
        .map(|u| format!("/usr/lib/systemd/system/{u}"))
        .collect();
    let out = run(Command::new("systemd-analyze")
        .arg("verify")
        .arg(format!("--root={}", root.dir.display()))
        .args(&units));
    let stderr = String::from_utf8_lossy(&out.stderr);
    // verify only warns (exit 0) about unknown keys and bad values: any output is a failure.
    assert!(
        out.status.success() && stderr.trim().is_empty(),
        "systemd-analyze verify --root {units:?} ({}):\n{stderr}",
        out.status
    );

    let service = text(&root.path("/usr/lib/systemd/system/slotgate.service"));
    assert_eq!(
        values(&service, "ExecStart"),
        ["/usr/bin/slotgate run --config /etc/slotgate/slotgate.toml"]
    );
    assert_eq!(values(&service, "User"), ["slotgate"]);
    assert_eq!(values(&service, "StateDirectory"), ["slotgate"]);
    assert_eq!(
        values(&service, "LoadCredential"),
        ["admin-token:/etc/slotgate/admin-token"]
    );
    assert!(values(&service, "DynamicUser").is_empty(), "a static user");
    assert!(
        values(&service, "MemoryDenyWriteExecute").is_empty(),
        "wasmtime is a JIT"
    );
    // Nothing enabled at install: the operator sets the upstream first.
    let wants = root.path("/etc/systemd/system/sockets.target.wants");
    assert!(!wants.exists(), "{} exists", wants.display());
}

/// The package's units are the examples' (held by deploy_systemd.rs), but for what a package
/// changes: its paths, a static user, and `Also=` one unit a line (cargo-deb reads each line as one
/// name). A hardening option added to one and not the other fails here.
#[test]
fn the_package_units_differ_from_the_examples_only_where_a_package_must() {
    let packaged = workspace().join("packaging/deb");
    let read = |dir: &Path, name: &str| settings(&text(&dir.join(name)));
    for socket in ["slotgate.socket", "slotgate-admin.socket"] {
        assert_eq!(
            read(&packaged, socket),
            read(&systemd::examples_dir(), socket),
            "packaging/deb/{socket} drifted from examples/systemd/{socket}"
        );
    }
    let (ours, theirs) = (
        read(&packaged, "slotgate.service"),
        read(&systemd::examples_dir(), "slotgate.service"),
    );
    let only_ours: Vec<&str> = ours.difference(&theirs).map(String::as_str).collect();
    let only_theirs: Vec<&str> = theirs.difference(&ours).map(String::as_str).collect();
    assert_eq!(
        only_ours,
        [
            "Also=slotgate-admin.socket",
            "Also=slotgate.socket",
            "Documentation=file:/usr/share/doc/slotgate/README.Debian",
            "ExecStart=/usr/bin/slotgate run --config /etc/slotgate/slotgate.toml",
            "Group=slotgate",
        ],
        "settings only packaging/deb/slotgate.service has"
    );
    assert_eq!(
        only_theirs,
        [
            "Also=slotgate.socket slotgate-admin.socket",
            "DynamicUser=yes",
            "ExecStart=/usr/local/bin/slotgate run --config /etc/slotgate/slotgate.toml",
            "SupplementaryGroups=llama",
        ],
        "settings only examples/systemd/slotgate.service has"
    );
}

/// What systemd does for slotgate.service before it starts it, done in `root`: the state directory
/// (`StateDirectory=`, 0700, the package's user's), the credential copied where only that user reads
/// it (`LoadCredential=`). Returns the user's uid and gid and the admin token.
fn prepare_as_systemd(root: &Root) -> (u32, u32, String) {
    let user = root.entry("passwd", "slotgate").expect("the user");
    let (uid, gid): (u32, u32) = (user[2].parse().unwrap(), user[3].parse().unwrap());
    let own = |path: &Path, mode: u32| {
        std::os::unix::fs::chown(path, Some(uid), Some(gid)).unwrap();
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
    };
    let state = root.path("/var/lib/slotgate");
    std::fs::create_dir_all(&state).unwrap();
    own(&state, 0o700);
    let credentials = root.path(CREDENTIALS);
    std::fs::create_dir_all(&credentials).unwrap();
    let token = credentials.join("admin-token");
    std::fs::copy(root.path("/etc/slotgate/admin-token"), &token).unwrap();
    own(&token, 0o400);
    own(&credentials, 0o500);
    (uid, gid, text(&token).trim().to_owned())
}

/// Where systemd puts slotgate.service's credentials (`%d`).
const CREDENTIALS: &str = "/run/credentials/slotgate.service";

/// The installed slotgate.service's `ExecStart=` behind `systemd-socket-activate` on the installed
/// slotgate.socket's path (under `root`) and an admin socket at `admin`, as the user `uid`:`gid`
/// (`setpriv`), with the unit's environment (`%d` resolved) and `upstream` in place of llama-server.
fn activation(root: &Root, admin: SocketAddr, ids: (u32, u32), upstream: &str) -> Vec<String> {
    let unit = |name: &str| text(&root.path(&format!("/usr/lib/systemd/system/{name}")));
    let clients = root.path(values(&unit("slotgate.socket"), "ListenStream")[0]);
    std::fs::create_dir_all(clients.parent().unwrap()).unwrap();
    systemd::require("setpriv");
    let mut argv = systemd::socket_activate(
        &[
            (clients.display().to_string(), "clients"),
            (admin.to_string(), "admin"),
        ],
        &[],
    );
    let credentials = root.path(CREDENTIALS);
    for env in [
        format!(
            "STATE_DIRECTORY={}",
            root.path("/var/lib/slotgate").display()
        ),
        format!("CREDENTIALS_DIRECTORY={}", credentials.display()),
        format!(
            "SLOTGATE_ADMIN_TOKEN_FILE={}/admin-token",
            credentials.display()
        ),
        format!("SLOTGATE_UPSTREAM={upstream}"),
    ] {
        argv.extend(["-E".to_owned(), env]);
    }
    argv.extend([
        "setpriv".to_owned(),
        format!("--reuid={}", ids.0),
        format!("--regid={}", ids.1),
        "--clear-groups".to_owned(),
    ]);
    // Its absolute paths are the root's.
    let exec = values(&unit("slotgate.service"), "ExecStart")[0].to_owned();
    argv.extend(exec.split_whitespace().map(|w| {
        if w.starts_with('/') {
            root.path(w).display().to_string()
        } else {
            w.to_owned()
        }
    }));
    argv
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_installed_binary_checks_its_config_and_serves_as_the_units_run_it() {
    let root = installed("pkg-run");
    let binary = root.path("/usr/bin/slotgate");
    let version = ok(
        "slotgate --version",
        &run(Command::new(&binary).arg("--version")),
    );
    assert!(version.starts_with("slotgate "), "{version}");
    let check = run(Command::new(&binary)
        .args(["check", "--config"])
        .arg(root.path("/etc/slotgate/slotgate.toml"))
        .env_clear());
    assert!(ok("slotgate check", &check).contains("upstream"));

    // As systemd would run it, the admin port a free one instead of 9464, which this machine may use.
    let (uid, gid, token) = prepare_as_systemd(&root);
    let up_dir = unique_dir("pkg-up");
    std::fs::set_permissions(&up_dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    let up = FakeUpstream::instant()
        .at(up_dir.join("llama.sock"))
        .start()
        .await;
    std::fs::set_permissions(up.socket_path(), std::fs::Permissions::from_mode(0o666)).unwrap();
    let admin = SocketAddr::from(([127, 0, 0, 1], free_port()));
    let argv = activation(&root, admin, (uid, gid), &up.url());
    let log = unique_dir("pkg-log").join("slotgate.log");
    let spawning = systemd::spawning().await;
    let mut child = tokio::process::Command::new(&argv[0])
        .args(&argv[1..])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .kill_on_drop(true)
        .spawn()
        .expect("systemd-socket-activate");
    drop(spawning);
    let log_text = || std::fs::read_to_string(&log).unwrap_or_default();

    // The first connection execs slotgate, as a socket unit starts its service.
    let admin_client = Client::tcp(admin);
    eventually(
        Duration::from_secs(30),
        "/livez on the admin socket",
        || {
            let c = admin_client.clone();
            async move {
                (c.try_send(client::get_request("/livez")).await.ok()?.status == 200).then_some(())
            }
        },
    )
    .await;
    eventually(Duration::from_secs(10), "/readyz 200", || {
        let c = admin_client.clone();
        async move { (c.get("/readyz").await.status == 200).then_some(()) }
    })
    .await;
    let clients = Client::unix(root.path("/run/slotgate/slotgate.sock"));
    let chat = clients.post_chat(&Req::chat("pkg")).await;
    assert_eq!(chat.status, 200, "{}\n{}", chat.body, log_text());
    assert_eq!(admin_client.get("/status").await.status, 401, "no token");
    let status = admin_client
        .clone()
        .with_bearer(&token)
        .get("/status")
        .await;
    assert_eq!(status.status, 200, "{}", status.body);

    // The process is the package's user (systemd-socket-activate exec'd setpriv, which exec'd
    // slotgate: one pid), and its state is where StateDirectory= puts it.
    let pid = child.id().expect("running");
    let proc_status = text(Path::new(&format!("/proc/{pid}/status")));
    let uids = proc_status.lines().find(|l| l.starts_with("Uid:")).unwrap();
    assert!(
        uids.split_whitespace()
            .skip(1)
            .all(|u| u == uid.to_string()),
        "{uids}"
    );
    let state = root.path("/var/lib/slotgate");
    eventually(Duration::from_secs(5), "state in /var/lib/slotgate", || {
        let found = std::fs::read_dir(&state)
            .ok()
            .and_then(|mut d| d.next())
            .is_some();
        async move { found.then_some(()) }
    })
    .await;

    let _ = Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status();
    let exited = tokio::time::timeout(Duration::from_secs(15), child.wait())
        .await
        .expect("slotgate exits within 15 s of SIGTERM")
        .unwrap();
    assert!(exited.success(), "{exited}\n{}", log_text());
    let _ = std::fs::remove_dir_all(log.parent().unwrap());
    let _ = std::fs::remove_dir_all(&up_dir);
}
