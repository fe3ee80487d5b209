//! The rooms of `src/` depend one way, down the request path (see docs/architecture.md): each may
//! use only the rooms listed below it. A `use crate::…` that points up, or sideways into a room at
//! its own level, fails this test.

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

#[test]
fn an_arrow_up_is_caught() {
    assert!(uses("use crate::pipeline::routes; // crate::app").contains("pipeline"));
    assert!(!uses("// use crate::app;").contains("app"));
    let grouped = uses("use crate::{admin, pipeline::x};");
    assert!(grouped.contains("admin") && grouped.contains("pipeline"));
}
