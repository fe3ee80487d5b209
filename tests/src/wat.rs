//! Policies for tests: hand-written ABI v1 modules in WAT (a fixed decision, optionally after hostile
//! code), the example policies as `scripts/build-policies.sh` built them, and config files loading them.

use std::path::{Path, PathBuf};

/// The import of `bucket_take` every [`policy`] has (as `$take`).
pub const BUCKET_TAKE: &str =
    r#"(import "slotgate" "bucket_take" (func $take (param i32 i32 f64 f64 f64) (result f64)))"#;

/// The import of `window_add` (as `$add`), for [`policy_with`].
pub const WINDOW_ADD: &str =
    r#"(import "slotgate" "window_add" (func $add (param i32 i32 i64 i64) (result i64)))"#;

/// Writes `<dir>/<name>.wat`: ABI `version`, answering `decision` (JSON) after running
/// `evaluate_body` (WAT instructions, e.g. `(loop $l (br $l))`). `extra` adds module fields.
pub fn policy(
    dir: &Path,
    name: &str,
    version: i32,
    decision: &str,
    evaluate_body: &str,
    extra: &str,
) -> PathBuf {
    policy_with(
        dir,
        name,
        version,
        BUCKET_TAKE,
        decision,
        evaluate_body,
        extra,
    )
}

/// [`policy`] with other host imports than [`BUCKET_TAKE`] (`imports`: WAT import fields). The
/// decision's text is at offset 16; memory from 8192 on is the allocator's.
pub fn policy_with(
    dir: &Path,
    name: &str,
    version: i32,
    imports: &str,
    decision: &str,
    evaluate_body: &str,
    extra: &str,
) -> PathBuf {
    let escaped = decision.replace('\\', "\\\\").replace('"', "\\\"");
    let wat = format!(
        r#"(module
  {imports}
  (memory (export "memory") 1)
  (global $next (mut i32) (i32.const 8192))
  (data (i32.const 16) "{escaped}")
  (func (export "slotgate_abi_version") (result i32) (i32.const {version}))
  (func (export "slotgate_alloc") (param $n i32) (result i32)
    (local $p i32)
    (local.set $p (global.get $next))
    (global.set $next (i32.add (global.get $next) (local.get $n)))
    (local.get $p))
  (func (export "slotgate_evaluate") (param $p i32) (param $n i32) (result i64)
    {evaluate_body}
    (i64.or (i64.shl (i64.const 16) (i64.const 32)) (i64.const {len})))
  {extra}
)"#,
        len = decision.len()
    );
    let path = dir.join(format!("{name}.wat"));
    std::fs::write(&path, wat).expect("write policy");
    path
}

/// A policy answering `decision` with no other code.
pub fn fixed(dir: &Path, name: &str, decision: &str) -> PathBuf {
    policy(dir, name, 1, decision, "", "")
}

/// Writes `<dir>/slotgate.toml` loading `policies` in chain order: each a module and, if any, its
/// settings as inline TOML.
pub fn config(dir: &Path, policies: &[(&Path, Option<&str>)]) -> PathBuf {
    let mut toml = String::new();
    for (path, settings) in policies {
        toml += &format!("[[policy]]\npath = \"{}\"\n", path.display());
        if let Some(settings) = settings {
            toml += &format!("settings = {settings}\n");
        }
    }
    let config = dir.join("slotgate.toml");
    std::fs::write(&config, toml).expect("write config");
    config
}

/// `<target>/policies/<name>.wasm|.wat`, as `scripts/build-policies.sh` leaves them.
pub fn built(name: &str) -> PathBuf {
    let dir = crate::target_dir().join("policies");
    for ext in ["wasm", "wat"] {
        let p = dir.join(format!("{name}.{ext}"));
        if p.exists() {
            return p;
        }
    }
    panic!(
        "{name} is not built in {}: run scripts/build-policies.sh first",
        dir.display()
    );
}

/// `<target>/policies/as-<name>.wasm`: the AssemblyScript port of an example policy, as
/// `scripts/build-policies-as.sh` leaves it.
pub fn built_as(name: &str) -> PathBuf {
    let path = crate::target_dir()
        .join("policies")
        .join(format!("as-{name}.wasm"));
    assert!(
        path.exists(),
        "{} is missing: run scripts/build-policies-as.sh first",
        path.display()
    );
    path
}

/// The bytes that turn a [`hostile`] policy hostile when they occur anywhere in its evaluate input.
/// Tests put them in the request body's `model` field (`Req::chat(..).set("model", MARKER)`), which
/// the input carries verbatim; the load-time canary and ordinary requests never contain them.
pub const MARKER: &str = "HOSTILE";

/// Writes `<dir>/<name>.wat`: an ABI v1 policy that allows every request, except that an evaluate
/// input containing [`MARKER`] first runs `hostile` (WAT instructions; they may `return` an output of
/// their own, see [`output`]). `extra` adds module fields (functions, data); the names `$marked*` are
/// taken. Ordinary requests keep being allowed, so a test can tell "the hostile request failed" from
/// "the gate failed".
pub fn hostile(dir: &Path, name: &str, hostile: &str, extra: &str) -> PathBuf {
    on_markers(dir, name, &[(MARKER, hostile)], extra)
}

/// A [`hostile`] policy whose hostility is a plain denial: `{"verdict":"deny","status":403,
/// "message":<message>}` for a request carrying [`MARKER`]. `message` has no `"` or `\`.
pub fn denying(dir: &Path, name: &str, message: &str) -> PathBuf {
    let deny = format!(r#"{{"verdict":"deny","status":403,"message":"{message}"}}"#);
    hostile(
        dir,
        name,
        &output(1024, deny.len() as u32),
        &data(1024, deny.as_bytes()),
    )
}

/// Like [`hostile`] with several markers: the body of every marker found in the input runs, in
/// order; then the policy allows. Each marker is 1 to 255 bytes of text without `"` or `\`.
pub fn on_markers(dir: &Path, name: &str, cases: &[(&str, &str)], extra: &str) -> PathBuf {
    let mut body = String::new();
    let mut funcs = String::new();
    for (i, (marker, code)) in cases.iter().enumerate() {
        let func = format!("$marked{i}");
        body.push_str(&format!(
            "(if (call {func} (local.get $p) (local.get $n)) (then {code}))\n    "
        ));
        funcs.push_str(&scan_func(&func, marker));
        funcs.push_str("\n  ");
    }
    policy(
        dir,
        name,
        1,
        r#"{"verdict":"allow"}"#,
        &body,
        &format!("{funcs}{extra}"),
    )
}

/// A WAT function `name (param i32 i32) (result i32)`: 1 when `marker` occurs in the memory range
/// `ptr..ptr+len`, else 0. A plain byte-by-byte scan that never reads outside the range.
pub fn scan_func(name: &str, marker: &str) -> String {
    let bytes = marker.as_bytes();
    assert!(
        !bytes.is_empty() && bytes.len() < 256 && !marker.contains(['"', '\\']),
        "unsuitable marker {marker:?}"
    );
    // Every byte of the marker at $i, and-ed together.
    let mut matches = String::from("(i32.const 1)");
    for (k, b) in bytes.iter().enumerate() {
        matches = format!(
            "(i32.and {matches} (i32.eq (i32.load8_u offset={k} (local.get $i)) (i32.const {b})))"
        );
    }
    format!(
        r#"(func {name} (param $p i32) (param $n i32) (result i32)
    (local $i i32) (local $last i32)
    (if (i32.lt_u (local.get $n) (i32.const {len})) (then (return (i32.const 0))))
    (local.set $i (local.get $p))
    (local.set $last (i32.add (local.get $p) (i32.sub (local.get $n) (i32.const {len}))))
    (loop $scan
      (if {matches} (then (return (i32.const 1))))
      (local.set $i (i32.add (local.get $i) (i32.const 1)))
      (br_if $scan (i32.le_u (local.get $i) (local.get $last))))
    (i32.const 0))"#,
        len = bytes.len()
    )
}

/// A WAT instruction returning the packed ABI output `(ptr << 32) | len` from `slotgate_evaluate`.
pub fn output(ptr: u32, len: u32) -> String {
    format!(
        "(return (i64.const {}))",
        (u64::from(ptr) << 32) | u64::from(len)
    )
}

/// A WAT data segment holding `text` at `offset`, escaped for the WAT string syntax.
pub fn data(offset: u32, text: &[u8]) -> String {
    let escaped: String = text.iter().map(|b| format!("\\{b:02x}")).collect();
    format!("(data (i32.const {offset}) \"{escaped}\")")
}

/// An allowing policy that stamps `x-policy-version: <version>` on every response.
pub fn versioned(dir: &Path, version: u32) -> PathBuf {
    fixed(
        dir,
        &format!("v{version}"),
        &format!(
            r#"{{"verdict":"allow","mutations":{{"response_headers":{{"x-policy-version":"{version}"}}}}}}"#
        ),
    )
}

/// Replaces `live` with `source`'s bytes in one rename, as deploy tools do.
pub fn install(source: &Path, live: &Path) {
    let tmp = live.with_extension("tmp");
    std::fs::copy(source, &tmp).unwrap();
    std::fs::rename(&tmp, live).unwrap();
}
