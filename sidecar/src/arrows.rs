//! The rooms of `src/` depend one way, down the request path (see docs/architecture.md): each may
//! use only the rooms listed below it. A `use crate::…` that points up, or sideways into a room at
//! its own level, fails this test. Inside `pipeline/`, the phases run one way too: each may name
//! only the phases before it (what they handed on), never a later one.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

/// Top first. A room is a folder of `src/` or a file directly in it.
const ROOMS: &[&str] = &[
    "fuzzing",
    "cmd",
    "app",
    "admin",
    "pipeline",
    "server",
    "state",
    "upstream",
    "policy",
    "fleet",
    "store",
    "admission",
    "otel",
    "live",
    "log",
    "config",
    "respond",
    "dialect",
    "json_edit",
    "metrics",
    "error",
];

/// The phases of `pipeline/`, in the order they run; `mod.rs` calls them in turn.
const PHASES: &[&str] = &[
    "routes", "intake", "count", "decide", "admit", "forward", "body", "reply",
];

/// What every phase may use and which uses no phase: the request's record, the usage stripper and
/// the request id.
const BESIDE_PHASES: &[&str] = &["access", "strip", "request_id"];

fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            sources(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The rooms a file's code names as `crate::room`, comments left out.
fn uses(text: &str) -> BTreeSet<String> {
    let mut rooms = BTreeSet::new();
    for line in text.lines() {
        let code = line.split("//").next().unwrap_or("");
        let mut rest = code;
        while let Some(at) = rest.find("crate::") {
            rest = &rest[at + "crate::".len()..];
            if let Some(group) = rest.strip_prefix('{') {
                // `use crate::{a, b::c};`
                let inner = group.split('}').next().unwrap_or("");
                for item in inner.split(',') {
                    let name: String = item
                        .trim()
                        .chars()
                        .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                        .collect();
                    rooms.insert(name);
                }
            } else {
                let name: String = rest
                    .chars()
                    .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                    .collect();
                rooms.insert(name);
            }
        }
    }
    rooms.retain(|r| !r.is_empty() && r.chars().next().is_some_and(|c| c.is_ascii_lowercase()));
    rooms
}

#[test]
fn rooms_depend_one_way() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    sources(&src, &mut files);
    let rank = |room: &str| ROOMS.iter().position(|r| *r == room);
    let mut wrong = Vec::new();
    for file in files {
        let rel = file.strip_prefix(&src).unwrap();
        let first = rel
            .components()
            .next()
            .unwrap()
            .as_os_str()
            .to_string_lossy();
        let room = first.trim_end_matches(".rs").to_string();
        if matches!(room.as_str(), "lib" | "main" | "arrows") {
            continue;
        }
        let Some(own) = rank(&room) else {
            wrong.push(format!("{}: room `{room}` is not in ROOMS", rel.display()));
            continue;
        };
        for used in uses(&std::fs::read_to_string(&file).unwrap()) {
            if used == room {
                continue;
            }
            match rank(&used) {
                Some(r) if r > own => {}
                Some(_) => wrong.push(format!(
                    "{}: `{room}` uses `{used}`, above it",
                    rel.display()
                )),
                None => wrong.push(format!("{}: uses `{used}`, not a room", rel.display())),
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "arrows pointing up:\n{}",
        wrong.join("\n")
    );
}

/// The modules of `pipeline/` a file's code names (`super::x`, `crate::pipeline::x`), comments left
/// out; items of `mod.rs` itself (`super::Ctx`, `super::DEADLINE_HEADER`) are not modules.
fn phases_used(text: &str) -> BTreeSet<String> {
    let mut used = BTreeSet::new();
    for line in text.lines() {
        let code = line.split("//").next().unwrap_or("");
        for prefix in ["super::", "crate::pipeline::"] {
            let mut rest = code;
            while let Some(at) = rest.find(prefix) {
                rest = &rest[at + prefix.len()..];
                let names: Vec<&str> = match rest.strip_prefix('{') {
                    Some(group) => group.split('}').next().unwrap_or("").split(',').collect(),
                    None => vec![rest],
                };
                for item in names {
                    let name: String = item
                        .trim()
                        .chars()
                        .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                        .collect();
                    if name.chars().next().is_some_and(|c| c.is_ascii_lowercase()) {
                        used.insert(name);
                    }
                }
            }
        }
    }
    used
}

/// What is wrong with `file` (a module of `pipeline/`) naming `used`.
fn phase_arrows(file: &str, used: &BTreeSet<String>) -> Vec<String> {
    let rank = |m: &str| PHASES.iter().position(|p| *p == m);
    let mut wrong = Vec::new();
    for u in used {
        if u == file || u == "tests" {
            continue;
        }
        let ok = match (rank(file), rank(u)) {
            // A phase names an earlier phase, or what every phase may use.
            (Some(own), Some(theirs)) => theirs < own,
            (Some(_), None) => BESIDE_PHASES.contains(&u.as_str()),
            // What is beside the phases uses none of them.
            (None, Some(_)) => false,
            (None, None) => BESIDE_PHASES.contains(&u.as_str()),
        };
        if !ok {
            wrong.push(format!("pipeline/{file}.rs names `{u}`"));
        }
    }
    wrong
}

#[test]
fn phases_run_one_way() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/pipeline");
    let mut wrong = Vec::new();
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        let file = path.file_stem().unwrap().to_string_lossy().to_string();
        if file == "mod" {
            continue;
        }
        if !PHASES.contains(&file.as_str()) && !BESIDE_PHASES.contains(&file.as_str()) {
            wrong.push(format!(
                "pipeline/{file}.rs is neither in PHASES nor in BESIDE_PHASES"
            ));
            continue;
        }
        let used = phases_used(&std::fs::read_to_string(&path).unwrap());
        wrong.extend(phase_arrows(&file, &used));
    }
    assert!(
        wrong.is_empty(),
        "phases calling back, or forward into a later phase:\n{}",
        wrong.join("\n")
    );
}

#[test]
fn a_call_back_to_a_later_phase_is_caught() {
    // count.rs asking admit (a later phase) for the model's pool, as it once did.
    let used = phases_used("let pool = super::admit::model_pool(app, intake); // super::reply");
    assert_eq!(used, BTreeSet::from(["admit".to_string()]));
    assert_eq!(phase_arrows("count", &used).len(), 1);
    let grouped = phases_used("use super::{Ctx, Shed, intake::Intake, forward};");
    assert!(phase_arrows("admit", &grouped)
        .iter()
        .any(|w| w.contains("`forward`")));
    assert!(phase_arrows("forward", &grouped).is_empty());
    // What is beside the phases names none of them.
    assert_eq!(
        phase_arrows("access", &phases_used("use super::body::X;")).len(),
        1
    );
}

#[test]
fn an_arrow_up_is_caught() {
    assert!(uses("use crate::pipeline::routes; // crate::app").contains("pipeline"));
    assert!(!uses("// use crate::app;").contains("app"));
    let grouped = uses("use crate::{admin, pipeline::x};");
    assert!(grouped.contains("admin") && grouped.contains("pipeline"));
}
