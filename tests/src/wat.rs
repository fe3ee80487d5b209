//! Policies for tests: hand-written ABI v1 modules in WAT (a fixed decision, optionally after hostile
//! code), and the example policies as `scripts/build-policies.sh` built them.

use std::path::{Path, PathBuf};

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
    let escaped = decision.replace('\\', "\\\\").replace('"', "\\\"");
    let wat = format!(
        r#"(module
  (import "slotgate" "bucket_take" (func $take (param i32 i32 f64 f64 f64) (result f64)))
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

/// `<target>/policies/<name>.wasm|.wat`, as `scripts/build-policies.sh` leaves them.
pub fn built(name: &str) -> PathBuf {
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map_or_else(|| workspace.join("target"), PathBuf::from);
    let dir = target.join("policies");
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
