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
    "router",
    "policy",
    "keys",
    "budgets",
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
    "owner_only",
    "metrics",
    "error",
];

/// The phases of `pipeline/`, in the order they run; `mod.rs` calls them in turn.
/// (`conversation` is admission for a request naming a conversation, with the stream routes' side.)
const PHASES: &[&str] = &[
    "routes",
    "intake",
    "count",
    "decide",
    "admit",
    "conversation",
    "forward",
    "body",
    "reply",
];

/// The parts of `policy/`, top first: each may name only the parts below it. The contract's part
/// runs `compiled` → `v1` → `guest` → `v2`: a file's contract is told and linked in `compiled`; v1 is
/// an adapter to the contract the chain speaks (`guest`), which speaks v2's records.
const POLICY_PARTS: &[&str] = &[
    "complete", "set", "chain", "fold", "compiled", "v1", "guest", "v2", "sandbox", "engine",
    "error",
];

/// Names only ABI v1 has. Outside `policy/v1/` only `policy/compiled.rs`, which tells a policy
/// file's contract, and `fuzzing/`, which fuzzes v1's decision parser, may use them.
const V1_NAMES: &[&str] = &[
    "v1::",
    "parse_decision",
    "settings_verdict",
    "raw_v1_wat",
    "evaluate_json",
    "InputJson",
];

/// What every phase may use and which uses no phase: the request's record, its caller, the usage
/// stripper, the request id, its lineage, the load report and a waiting stream's early answer.
const BESIDE_PHASES: &[&str] = &[
    "access",
    "caller",
    "strip",
    "request_id",
    "lineage",
    "orca",
    "loads",
    "me",
    "waiting",
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

/// The modules of `pipeline/` a file's code names (`super::x`, `crate::pipeline::x`), comments left
/// out; items of `mod.rs` itself (`super::Ctx`, `super::DEADLINE_HEADER`) are not modules.
fn phases_used(text: &str) -> BTreeSet<String> {
    modules_named(text, &["super::", "crate::pipeline::"])
}

/// The lower-case names a file's code puts after any of `prefixes` (alone or in a `{…}` group),
/// comments left out.
fn modules_named(text: &str, prefixes: &[&str]) -> BTreeSet<String> {
    let mut used = BTreeSet::new();
    for line in text.lines() {
        let code = line.split("//").next().unwrap_or("");
        for prefix in prefixes {
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

/// Rooms that hold plain Rust only: the budgets are called by the policy host and know nothing of
/// the sandbox, so they can be tested, reasoned about and reused without a wasm engine.
const WITHOUT_WASMTIME: &[&str] = &["budgets"];

/// The lines of `text`'s code, comments left out, that name `wasmtime`.
fn names_wasmtime(text: &str) -> Vec<&str> {
    text.lines()
        .filter(|l| l.split("//").next().unwrap_or("").contains("wasmtime"))
        .collect()
}

#[test]
fn the_budgets_know_no_wasmtime() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut wrong = Vec::new();
    for room in WITHOUT_WASMTIME {
        let mut files = Vec::new();
        sources(&src.join(room), &mut files);
        assert!(!files.is_empty(), "no files under src/{room}");
        for file in files {
            let text = std::fs::read_to_string(&file).unwrap();
            for line in names_wasmtime(&text) {
                let rel = file.strip_prefix(&src).unwrap().display().to_string();
                wrong.push(format!("{rel}: {}", line.trim()));
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "rooms to be plain Rust name wasmtime:\n{}",
        wrong.join("\n")
    );
    assert_eq!(
        names_wasmtime("use wasmtime::StoreLimits; // no wasmtime here"),
        ["use wasmtime::StoreLimits; // no wasmtime here"]
    );
    assert!(names_wasmtime("// wasmtime").is_empty());
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

/// docs/architecture.md, read at test time.
fn architecture_doc() -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/architecture.md");
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The first fenced block after the heading `heading` of `doc`.
fn block_after<'a>(doc: &'a str, heading: &str) -> &'a str {
    let at = doc
        .find(&format!("\n{heading}\n"))
        .unwrap_or_else(|| panic!("no heading `{heading}`"));
    let rest = &doc[at..];
    let open = rest.find("```").expect("a fenced block after the heading");
    let body = &rest[open..];
    let body = &body[body.find('\n').unwrap_or(body.len())..];
    &body[..body.find("```").expect("an unclosed fenced block")]
}

/// The rooms of the doc's arrow list, in order: `a → b → c`, over as many lines as it takes.
fn doc_arrows(doc: &str) -> Vec<String> {
    block_after(doc, "## The one-way arrows")
        .split('→')
        .map(|r| r.trim().to_owned())
        .filter(|r| !r.is_empty())
        .collect()
}

/// The files the code map names: the first word of every line that does not start with a space.
fn code_map(doc: &str) -> BTreeSet<String> {
    block_after(doc, "## The code map")
        .lines()
        .filter(|l| !l.is_empty() && !l.starts_with(' '))
        .filter_map(|l| l.split_whitespace().next())
        .map(str::to_owned)
        .collect()
}

/// Every file under `dir`, by its path relative to `src` with `/` between folders.
fn every_file(src: &Path, dir: &Path, out: &mut BTreeSet<String>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            every_file(src, &path, out);
        } else {
            let rel = path.strip_prefix(src).unwrap();
            let parts: Vec<_> = rel.iter().map(|p| p.to_string_lossy()).collect();
            out.insert(parts.join("/"));
        }
    }
}

/// What the code map lacks (files without a line) and what it names that is gone.
fn code_map_gaps(map: &BTreeSet<String>, files: &BTreeSet<String>) -> (Vec<String>, Vec<String>) {
    let missing = files.difference(map).cloned().collect();
    let stale = map.difference(files).cloned().collect();
    (missing, stale)
}

#[test]
fn the_docs_arrow_list_is_the_one_enforced() {
    assert_eq!(
        doc_arrows(&architecture_doc()),
        ROOMS,
        "docs/architecture.md's arrow list (## The one-way arrows) must equal ROOMS in arrows.rs"
    );
}

#[test]
fn the_code_map_names_every_file() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = BTreeSet::new();
    every_file(&src, &src, &mut files);
    let (missing, stale) = code_map_gaps(&code_map(&architecture_doc()), &files);
    assert!(
        missing.is_empty() && stale.is_empty(),
        "docs/architecture.md's code map (## The code map), one line per file of sidecar/src/:\n\
         files without a line: {missing:?}\nlines naming no file: {stale:?}"
    );
}

#[test]
fn a_drifted_doc_is_caught() {
    let doc = "x\n## The one-way arrows\n\n```\ncmd → app\n  → error\n```\n\n\
               ## The code map\n\n```\nmain.rs   parse\n          and dispatch\n\ncmd/run.rs  run\n```\n";
    assert_eq!(doc_arrows(doc), ["cmd", "app", "error"]);
    let map = code_map(doc);
    let files: BTreeSet<String> = ["main.rs", "cmd/new.rs"].map(str::to_owned).into();
    let (missing, stale) = code_map_gaps(&map, &files);
    assert_eq!(
        (missing, stale),
        (vec!["cmd/new.rs".to_owned()], vec!["cmd/run.rs".to_owned()])
    );
}

/// The parts of `policy/` that `file` (its path under `policy/`) names: from a file of a folder
/// (`v1/json.rs`) `super::` is its own folder's, so only `super::super::` and `crate::policy::`
/// name parts.
fn policy_parts_used(file: &str, text: &str) -> BTreeSet<String> {
    let nested = file.contains('/') && !file.ends_with("/mod.rs");
    let prefixes: &[&str] = match nested {
        true => &["super::super::", "crate::policy::"],
        false => &["super::", "crate::policy::"],
    };
    let mut used = modules_named(text, prefixes);
    used.retain(|u| POLICY_PARTS.contains(&u.as_str()));
    used
}

/// What is wrong with `file` (its path under `policy/`) naming `used`.
fn policy_arrows(file: &str, used: &BTreeSet<String>) -> Vec<String> {
    let part = file
        .split('/')
        .next()
        .unwrap_or(file)
        .trim_end_matches(".rs");
    let rank = |p: &str| POLICY_PARTS.iter().position(|x| *x == p);
    let Some(own) = rank(part) else {
        return vec![format!(
            "policy/{file}: part `{part}` is not in POLICY_PARTS"
        )];
    };
    used.iter()
        .filter(|u| **u != part && rank(u).is_some_and(|r| r <= own))
        .map(|u| format!("policy/{file}: `{part}` names `{u}`, not below it"))
        .collect()
}

/// Where `text` (the file `rel`, under `src/`) uses a name only ABI v1 has, outside the rooms
/// allowed to.
fn v1_names_outside(rel: &str, text: &str) -> Vec<String> {
    let allowed = rel.starts_with("policy/v1/") || rel.starts_with("fuzzing/");
    if allowed || matches!(rel, "policy/compiled.rs" | "arrows.rs") {
        return Vec::new();
    }
    let code: String = text
        .lines()
        .map(|l| l.split("//").next().unwrap_or(""))
        .collect::<Vec<_>>()
        .join("\n");
    V1_NAMES
        .iter()
        .filter(|n| {
            code.match_indices(**n).any(|(at, _)| {
                // A whole name: not the tail of a longer one (`my_v1::`, `parse_decisions`).
                let before = code[..at].chars().next_back();
                let after = code[at + n.len()..].chars().next();
                !before.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_')
                    && (n.ends_with("::")
                        || !after.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_'))
            })
        })
        .map(|n| format!("{rel}: uses `{n}`, a name of ABI v1's adapter"))
        .collect()
}

#[test]
fn the_policy_room_runs_one_way_and_only_v1_names_v1() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    sources(&src, &mut files);
    let mut wrong = Vec::new();
    for path in files {
        let rel = path
            .strip_prefix(&src)
            .unwrap()
            .to_string_lossy()
            .replace('\\', "/");
        let text = std::fs::read_to_string(&path).unwrap();
        wrong.extend(v1_names_outside(&rel, &text));
        if let Some(file) = rel.strip_prefix("policy/").filter(|f| *f != "mod.rs") {
            wrong.extend(policy_arrows(file, &policy_parts_used(file, &text)));
        }
    }
    assert!(
        wrong.is_empty(),
        "the policy room's parts must name only parts below them (POLICY_PARTS), and only v1/ \
         (and compiled.rs) names ABI v1:\n{}",
        wrong.join("\n")
    );
}

#[test]
fn a_circle_in_the_policy_room_and_a_v1_name_outside_are_caught() {
    // The circle issue 49 removed: the store's data naming v2's WASI type, v2 naming the sandbox.
    let used = policy_parts_used("sandbox.rs", "pub wasi: Option<Box<super::v2::Wasi>>,");
    assert_eq!(policy_arrows("sandbox.rs", &used).len(), 1);
    // From inside a folder, `super::` is the folder's own; `super::super::` is the room's.
    assert!(
        policy_parts_used("v1/json.rs", "use super::abi; use super::super::set;").contains("set")
    );
    assert_eq!(
        policy_arrows(
            "v1/json.rs",
            &policy_parts_used("v1/json.rs", "use super::guest;")
        ),
        Vec::<String>::new()
    );
    assert_eq!(
        policy_arrows(
            "v2/mod.rs",
            &policy_parts_used("v2/mod.rs", "use super::guest::Ask;")
        )
        .len(),
        1
    );
    // The chain calling the v1 decoder, as it once did.
    assert_eq!(
        v1_names_outside("policy/chain.rs", "core.evaluate_json(input)").len(),
        1
    );
    assert!(v1_names_outside("policy/chain.rs", "// evaluate_json").is_empty());
    assert!(v1_names_outside("policy/v1/mod.rs", "evaluate_json").is_empty());
    assert!(v1_names_outside("pipeline/x.rs", "parse_decisions()").is_empty());
}
