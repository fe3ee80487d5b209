//! What `slotgate policy check` warns of in a policy that loads: a debug build, and a canary
//! evaluation far costlier than the example policies of the same language, with what its author
//! can do about it.

use serde_json::Value;

use crate::policy::chain::Loaded;
use crate::policy::set::canary_input;

/// What a policy was written in, as its component or module says (its `producers` sections).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Language {
    /// A componentize-py component: CPython and the policy's modules.
    Python,
    /// A componentize-js (jco) component: StarlingMonkey and the policy's script.
    JavaScript,
    /// Anything else: compiled to wasm (Rust, AssemblyScript, WAT), no interpreter inside.
    Compiled,
}

impl Language {
    /// The language of a binary policy, from what is nested in its component: componentize-py's
    /// modules import from its runtime library (`libcomponentize_py_runtime.so`, beside
    /// `libpython3.*.so`); ComponentizeJS names itself in a `producers` section.
    pub fn of(wasm: &[u8]) -> Language {
        let mut found = Language::Compiled;
        nested(wasm, &mut |id, contents| {
            let has = |what: &[u8]| contents.windows(what.len()).any(|w| w == what);
            let producers = id == 0 && custom(contents).is_some_and(|(n, _)| n == b"producers");
            if id == IMPORTS && has(b"libcomponentize_py_runtime.so") {
                found = Language::Python;
            } else if producers && (has(b"ComponentizeJS") || has(b"componentize-js")) {
                found = Language::JavaScript;
            }
        });
        found
    }

    /// Fuel the canary evaluation of this language's example policies takes, at most: Python's
    /// request-guard about 714k, TypeScript's tenant-priority about 1.82M, the Rust and
    /// AssemblyScript examples 20k to 32k (measured by `slotgate policy check`).
    pub fn example_fuel(self) -> u64 {
        match self {
            Language::Python => 800_000,
            Language::JavaScript => 2_000_000,
            Language::Compiled => 32_000,
        }
    }

    fn examples(self) -> &'static str {
        match self {
            Language::Python => "the Python example policies' (policies-py/",
            Language::JavaScript => "the TypeScript example policies' (policies-ts/",
            Language::Compiled => "the Rust and AssemblyScript example policies' (policies/",
        }
    }
}

/// A canary evaluation over this many times its language's examples' fuel is warned of.
const OVER_EXAMPLES: u64 = 10;

/// Warns of a debug build (DWARF sections), of a canary evaluation far costlier than the examples
/// of its language, and of one that used most of its fuel limit: all three load, and every request
/// pays for them.
pub fn warn(bytes: &[u8], p: &Loaded, fuel_limit: u64) {
    let wasm = wat::parse_bytes(bytes).map_or_else(|_| Vec::new(), |b| b.into_owned());
    let debug = section_bytes(&wasm, ".debug_");
    if debug > 0 {
        eprintln!(
            "warning: a debug build: {} KB of DWARF sections in a {} KB module; build it with the \
             policy profile (scripts/build-policies.sh) for a smaller, faster module",
            debug.div_ceil(1024),
            wasm.len().div_ceil(1024)
        );
    }
    let settings = if p.preinitialised() {
        Value::Null
    } else {
        p.settings.clone()
    };
    let Ok((_, ev)) = p.policy.evaluate_input(&canary_input(&settings)) else {
        return;
    };
    let language = Language::of(&wasm);
    if let Some(warning) = fuel_warning(language, ev.fuel_used, fuel_limit, debug > 0) {
        eprintln!("{warning}");
    }
}

/// The warning for a canary evaluation that used `used` fuel of `limit`, if it is one.
pub fn fuel_warning(language: Language, used: u64, limit: u64, debug: bool) -> Option<String> {
    let example = language.example_fuel();
    let heavy = used > OVER_EXAMPLES * example;
    // Half the limit: a request a little larger than the canary's may run out.
    let near_limit = used > limit / 2;
    if !heavy && !near_limit {
        return None;
    }
    let mut w = format!("warning: its canary evaluation used {used} fuel");
    if heavy {
        w.push_str(&format!(
            ", {}x {}, at most {example})",
            used / example,
            language.examples()
        ));
    }
    if near_limit {
        w.push_str(&format!(
            ", {}% of its fuel limit ({limit})",
            used * 100 / limit.max(1)
        ));
    }
    w.push_str(": every request pays it");
    if debug {
        w.push_str(" (a debug build?)");
    }
    w.push_str(". What helps: ");
    let mut helps = Vec::new();
    if language != Language::Compiled {
        helps.push(
            "keep the default `isolation = \"caller\"` so a caller's calls reuse a kept instance, \
             and parse the settings once per instance (the SDK's `kept` helper), not per call",
        );
        helps.push("import modules at the top level, not inside `evaluate`");
    }
    helps.push(
        "keep counts and budgets in the host's state interface (buckets, windows, quotas) instead \
         of recomputing them in the policy",
    );
    if near_limit {
        helps.push("raise `fuel` in the policy's [[policy]] entry (docs/policies.md)");
    } else {
        helps.push(
            "if the work is needed, it is within the limit; `fuel` in the [[policy]] entry caps it",
        );
    }
    w.push_str(&helps.join("; "));
    Some(w)
}

/// The sections of a binary module or component: `(id, contents)`.
fn sections(b: &[u8]) -> Vec<(u8, &[u8])> {
    let leb = |at: &mut usize| -> Option<usize> {
        let (mut v, mut shift) = (0usize, 0);
        loop {
            let byte = *b.get(*at)?;
            *at += 1;
            v |= usize::from(byte & 0x7f).checked_shl(shift)?;
            if byte < 0x80 {
                return Some(v);
            }
            shift += 7;
        }
    };
    let (mut at, mut out) = (8, Vec::new());
    while at < b.len() {
        let id = b[at];
        at += 1;
        let Some(size) = leb(&mut at) else { break };
        let end = at.saturating_add(size).min(b.len());
        out.push((id, &b[at..end]));
        at = end;
    }
    out
}

/// A custom section's name and the rest of its contents.
fn custom(contents: &[u8]) -> Option<(&[u8], &[u8])> {
    let (mut len, mut shift, mut at) = (0usize, 0u32, 0);
    loop {
        let byte = *contents.get(at)?;
        at += 1;
        len |= usize::from(byte & 0x7f).checked_shl(shift)?;
        if byte < 0x80 {
            break;
        }
        shift += 7;
    }
    let name = contents.get(at..at.checked_add(len)?)?;
    Some((name, &contents[at + len..]))
}

/// A core module's import section id.
const IMPORTS: u8 = 2;

/// Calls `each` with every section of every core module of `b`: `b` itself if it is one, else
/// those nested in the component (and in components nested in it), with the component's own
/// custom sections.
fn nested(b: &[u8], each: &mut dyn FnMut(u8, &[u8])) {
    // A component's header says layer 1 (bytes 6-7), a core module's version 1 (bytes 4-7).
    let component = b.get(4..8) == Some(&[0x0d, 0, 1, 0]);
    for (id, contents) in sections(b) {
        match (id, component) {
            // A nested core module (1) or component (4).
            (1 | 4, true) => nested(contents, each),
            (0, true) => each(id, contents),
            (_, false) => each(id, contents),
            _ => {}
        }
    }
}

/// Bytes of a binary module's custom sections whose name starts with `prefix`.
fn section_bytes(b: &[u8], prefix: &str) -> usize {
    sections(b)
        .into_iter()
        .filter(|(id, _)| *id == 0)
        .filter_map(|(_, c)| custom(c))
        .filter(|(name, _)| name.starts_with(prefix.as_bytes()))
        .map(|(name, rest)| name.len() + rest.len() + 1)
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_python_example_is_no_warning_and_ten_times_it_is() {
        assert_eq!(
            fuel_warning(Language::Python, 713_893, 10_000_000, false),
            None
        );
        let w = fuel_warning(Language::Python, 9_000_000, 10_000_000, false).unwrap();
        assert!(w.contains("11x the Python example policies'"), "{w}");
        assert!(w.contains("90% of its fuel limit"), "{w}");
        assert!(w.contains("isolation = \"caller\""), "{w}");
        assert!(w.contains("raise `fuel`"), "{w}");
    }

    #[test]
    fn a_rust_policy_is_held_to_the_rust_examples() {
        assert_eq!(
            fuel_warning(Language::Compiled, 31_000, 10_000_000, false),
            None
        );
        let w = fuel_warning(Language::Compiled, 713_893, 10_000_000, false).unwrap();
        assert!(w.contains("22x the Rust and AssemblyScript"), "{w}");
        assert!(!w.contains("isolation"), "{w}");
        assert!(!w.contains("fuel limit"), "{w}");
    }

    #[test]
    fn a_plain_module_is_compiled() {
        let wasm = wat::parse_str("(module)").unwrap();
        assert_eq!(Language::of(&wasm), Language::Compiled);
    }
}
