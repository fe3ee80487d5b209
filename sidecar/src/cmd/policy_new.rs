//! `slotgate policy new --lang rust|python|ts NAME`: a policy project that builds outside slotgate's
//! repository and passes `slotgate policy check` as it is. Every file comes from this binary: the
//! templates, the contract (`wit/policy.wit`), and for Rust the SDK's sources, so a project needs
//! only its language's toolchain and its package registry.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context};
use clap::{Args, ValueEnum};

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Lang {
    /// Rust, with slotgate's SDK (wit-bindgen underneath).
    Rust,
    /// Python, built with componentize-py.
    Python,
    /// TypeScript, built with jco componentize.
    Ts,
}

#[derive(Debug, Args)]
pub struct NewArgs {
    /// The policy's language.
    #[arg(long, value_enum)]
    pub lang: Lang,
    /// The project's name: lower-case letters, digits and `-`; also its directory.
    pub name: String,
    /// Where to create the project directory. [default: the current directory]
    #[arg(long, value_name = "DIR")]
    pub dir: Option<PathBuf>,
}

/// One file of a template: its path in the project, and its text with `{{name}}` (and `{{crate}}`,
/// the name as a Rust crate's artifact) still in it.
type File = (&'static str, &'static str);

const CONTRACT: File = (
    "wit/policy.wit",
    include_str!("../../../sdk/wit/policy.wit"),
);

const RUST: &[File] = &[
    ("Cargo.toml", include_str!("new/rust-Cargo.toml")),
    ("src/lib.rs", include_str!("new/rust-lib.rs")),
    ("build.sh", include_str!("new/rust-build.sh")),
    ("README.md", include_str!("new/rust-README.md")),
    ("settings.json", include_str!("new/settings.json")),
    ("request.json", include_str!("new/request.json")),
    (
        "fixtures/example.json",
        include_str!("new/rust-fixture.json"),
    ),
    (".gitignore", "/target\n*.wasm\n"),
    (
        "slotgate-sdk/Cargo.toml",
        include_str!("new/sdk-Cargo.toml"),
    ),
    (
        "slotgate-sdk/wit/policy.wit",
        include_str!("../../../sdk/wit/policy.wit"),
    ),
    (
        "slotgate-sdk/src/lib.rs",
        include_str!("../../../sdk/src/lib.rs"),
    ),
    (
        "slotgate-sdk/src/bucket.rs",
        include_str!("../../../sdk/src/bucket.rs"),
    ),
    (
        "slotgate-sdk/src/bump.rs",
        include_str!("../../../sdk/src/bump.rs"),
    ),
    (
        "slotgate-sdk/src/calendar.rs",
        include_str!("../../../sdk/src/calendar.rs"),
    ),
    (
        "slotgate-sdk/src/component.rs",
        include_str!("../../../sdk/src/component.rs"),
    ),
    (
        "slotgate-sdk/src/dispatch.rs",
        include_str!("../../../sdk/src/dispatch.rs"),
    ),
    (
        "slotgate-sdk/src/export.rs",
        include_str!("../../../sdk/src/export.rs"),
    ),
    (
        "slotgate-sdk/src/guest.rs",
        include_str!("../../../sdk/src/guest.rs"),
    ),
    (
        "slotgate-sdk/src/host.rs",
        include_str!("../../../sdk/src/host.rs"),
    ),
    (
        "slotgate-sdk/src/host/component.rs",
        include_str!("../../../sdk/src/host/component.rs"),
    ),
    (
        "slotgate-sdk/src/host/emulated.rs",
        include_str!("../../../sdk/src/host/emulated.rs"),
    ),
    (
        "slotgate-sdk/src/identity.rs",
        include_str!("../../../sdk/src/identity.rs"),
    ),
    (
        "slotgate-sdk/src/policy.rs",
        include_str!("../../../sdk/src/policy.rs"),
    ),
    (
        "slotgate-sdk/src/testing.rs",
        include_str!("../../../sdk/src/testing.rs"),
    ),
    (
        "slotgate-sdk/src/types.rs",
        include_str!("../../../sdk/src/types.rs"),
    ),
];

pub fn run(a: NewArgs) -> anyhow::Result<()> {
    if a.name.is_empty()
        || a.name.len() > 64
        || !a.name.starts_with(|c: char| c.is_ascii_lowercase())
        || !a
            .name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
    {
        bail!(
            "`{}` is not a usable policy name: use lower-case letters, digits and `-`, starting with a letter (at most 64)",
            a.name
        );
    }
    let root = a.dir.unwrap_or_else(|| PathBuf::from(".")).join(&a.name);
    if root.exists() {
        bail!(
            "{} exists already: pick another name or --dir",
            root.display()
        );
    }
    let files: Vec<File> = match a.lang {
        Lang::Rust => RUST.to_vec(),
        Lang::Python => python(),
        Lang::Ts => typescript(),
    };
    let krate = a.name.replace('-', "_");
    for (path, text) in files.iter().copied().chain(std::iter::once(CONTRACT)) {
        let text = text
            .replace("{{name}}", &a.name)
            .replace("{{crate}}", &krate);
        write(&root.join(path), &text)?;
    }
    let lang = match a.lang {
        Lang::Rust => "Rust",
        Lang::Python => "Python",
        Lang::Ts => "TypeScript",
    };
    println!(
        "created {} ({lang}): see its README.md to test, build and check it",
        root.display()
    );
    Ok(())
}

fn write(path: &Path, text: &str) -> anyhow::Result<()> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))?;
    if path.extension().is_some_and(|e| e == "sh") {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755))
            .with_context(|| format!("making {} executable", path.display()))?;
    }
    Ok(())
}

/// The Python template (sdk-py/template), with the SDK itself (sdk-py/slotgate_policy) in its
/// `slotgate_policy/`: a project has no repository to take it from.
const PYTHON: &[File] = &[
    (
        "README.md",
        include_str!("../../../sdk-py/template/README.md"),
    ),
    ("app.py", include_str!("../../../sdk-py/template/app.py")),
    ("fixtures/example.json", include_str!("new/fixture.json")),
    (
        "build.sh",
        include_str!("../../../sdk-py/template/build.sh"),
    ),
    (
        "test_app.py",
        include_str!("../../../sdk-py/template/test_app.py"),
    ),
    (
        "slotgate_policy/__init__.py",
        include_str!("../../../sdk-py/slotgate_policy/__init__.py"),
    ),
    (
        "slotgate_policy/_records.py",
        include_str!("../../../sdk-py/slotgate_policy/_records.py"),
    ),
    (
        "slotgate_policy/decisions.py",
        include_str!("../../../sdk-py/slotgate_policy/decisions.py"),
    ),
    (
        "slotgate_policy/identity.py",
        include_str!("../../../sdk-py/slotgate_policy/identity.py"),
    ),
    (
        "slotgate_policy/periods.py",
        include_str!("../../../sdk-py/slotgate_policy/periods.py"),
    ),
    (
        "slotgate_policy/settings.py",
        include_str!("../../../sdk-py/slotgate_policy/settings.py"),
    ),
    (
        "slotgate_policy/testing.py",
        include_str!("../../../sdk-py/slotgate_policy/testing.py"),
    ),
    (
        ".gitignore",
        include_str!("../../../sdk-py/template/.gitignore"),
    ),
];

fn python() -> Vec<File> {
    PYTHON.to_vec()
}

/// The TypeScript template (sdk-ts/template), with the SDK's sources (sdk-ts/src) in
/// `slotgate-sdk/`.
const TYPESCRIPT: &[File] = &[
    (
        "src/policy.ts",
        include_str!("../../../sdk-ts/template/src/policy.ts"),
    ),
    ("fixtures/example.json", include_str!("new/fixture.json")),
    (
        "README.md",
        include_str!("../../../sdk-ts/template/README.md"),
    ),
    (
        "test/policy.test.ts",
        include_str!("../../../sdk-ts/template/test/policy.test.ts"),
    ),
    (
        "package-lock.json",
        include_str!("../../../sdk-ts/template/package-lock.json"),
    ),
    (
        "package.json",
        include_str!("../../../sdk-ts/template/package.json"),
    ),
    (
        "build.sh",
        include_str!("../../../sdk-ts/template/build.sh"),
    ),
    (
        "bundle.config.mjs",
        include_str!("../../../sdk-ts/template/bundle.config.mjs"),
    ),
    (
        "tsconfig.json",
        include_str!("../../../sdk-ts/template/tsconfig.json"),
    ),
    (
        ".gitignore",
        include_str!("../../../sdk-ts/template/.gitignore"),
    ),
    (
        "slotgate-sdk/settings.ts",
        include_str!("../../../sdk-ts/src/settings.ts"),
    ),
    (
        "slotgate-sdk/index.ts",
        include_str!("../../../sdk-ts/src/index.ts"),
    ),
    (
        "slotgate-sdk/testing/fake-host.ts",
        include_str!("../../../sdk-ts/src/testing/fake-host.ts"),
    ),
    (
        "slotgate-sdk/testing/index.ts",
        include_str!("../../../sdk-ts/src/testing/index.ts"),
    ),
    (
        "slotgate-sdk/testing/hooks.ts",
        include_str!("../../../sdk-ts/src/testing/hooks.ts"),
    ),
    (
        "slotgate-sdk/testing/register.ts",
        include_str!("../../../sdk-ts/src/testing/register.ts"),
    ),
    (
        "slotgate-sdk/testing/inputs.ts",
        include_str!("../../../sdk-ts/src/testing/inputs.ts"),
    ),
    (
        "slotgate-sdk/testing/wit/clocks.ts",
        include_str!("../../../sdk-ts/src/testing/wit/clocks.ts"),
    ),
    (
        "slotgate-sdk/testing/wit/log.ts",
        include_str!("../../../sdk-ts/src/testing/wit/log.ts"),
    ),
    (
        "slotgate-sdk/testing/wit/state.ts",
        include_str!("../../../sdk-ts/src/testing/wit/state.ts"),
    ),
    (
        "slotgate-sdk/testing/wit/types.ts",
        include_str!("../../../sdk-ts/src/testing/wit/types.ts"),
    ),
    (
        "slotgate-sdk/testing/calendar.ts",
        include_str!("../../../sdk-ts/src/testing/calendar.ts"),
    ),
    (
        "slotgate-sdk/runtime.ts",
        include_str!("../../../sdk-ts/src/runtime.ts"),
    ),
    (
        "slotgate-sdk/identity.ts",
        include_str!("../../../sdk-ts/src/identity.ts"),
    ),
    (
        "slotgate-sdk/decision.ts",
        include_str!("../../../sdk-ts/src/decision.ts"),
    ),
];

fn typescript() -> Vec<File> {
    TYPESCRIPT.to_vec()
}
