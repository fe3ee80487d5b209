//! llama-server's command line as llama-server reads it (`common/arg.cpp`, `tools/server/server.cpp`
//! of the sdist): environment variables first, then arguments, which win. slotgate reads what
//! `/props` does not say: whether the slots share one KV pool and how large it is, and the API keys
//! it wants. Under `slotgate wrap` this is the child's own command line; beside a llama-server on
//! the same host it is the command line of the process behind the upstream socket (see
//! `upstream_process`).

use std::path::PathBuf;

/// What slotgate needs from a llama-server command line.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Launch {
    /// `-np` / `--parallel` (`LLAMA_ARG_N_PARALLEL`); negative or absent: auto.
    pub n_parallel: Option<i64>,
    /// `-c` / `--ctx-size` (`LLAMA_ARG_CTX_SIZE`); 0: the model's training context.
    pub ctx_size: Option<u64>,
    /// `-kvu` / `--kv-unified`, `-no-kvu` / `--no-kv-unified` (`LLAMA_ARG_KV_UNIFIED`,
    /// `LLAMA_ARG_NO_KV_UNIFIED`).
    pub kv_unified: Option<bool>,
    /// `--kv-unified-per-slot` (`LLAMA_ARG_KV_UNIFIED_PER_SLOT`).
    pub kv_unified_per_slot: Option<u64>,
    /// `--api-key` (comma-separated, `LLAMA_API_KEY`).
    pub api_keys: Vec<String>,
    /// `--api-key-file` (`LLAMA_ARG_API_KEY_FILE`): one key per line, `#` comments.
    pub api_key_file: Option<PathBuf>,
    /// A model was given (`-m`, `-hf`, `-mu`, `-dr` or their variables); without one llama-server
    /// runs as a router of models.
    pub has_model: bool,
    /// `-n` / `--predict` / `--n-predict` (`LLAMA_ARG_N_PREDICT`): the tokens llama-server
    /// generates for a request that sets no limit (-1: until the context is full).
    pub n_predict: Option<i64>,
}

/// How the slots hold their context.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KvLayout {
    /// Each slot has a context of its own (`-np N` without `--kv-unified`).
    PerSlot,
    /// All slots share one pool of this many tokens (llama-server's default, `--kv-unified`).
    Shared(u64),
    /// Shared, of the size `/props` reports as a slot's context (no `-c`: the model's own).
    SharedAsSlot,
}

impl Launch {
    /// Reads `argv` (the program first) and the environment through `env`.
    pub fn parse(argv: &[String], env: impl Fn(&str) -> Option<String>) -> Launch {
        let mut l = Launch::default();
        let int = |v: &str| v.trim().parse::<i64>().ok();
        let truthy = |v: &str| matches!(v.trim(), "1" | "true" | "on" | "yes" | "enabled");
        if let Some(v) = env("LLAMA_ARG_N_PARALLEL") {
            l.n_parallel = int(&v);
        }
        if let Some(v) = env("LLAMA_ARG_CTX_SIZE") {
            l.ctx_size = int(&v).and_then(|n| u64::try_from(n).ok());
        }
        if let Some(v) = env("LLAMA_ARG_KV_UNIFIED") {
            l.kv_unified = Some(truthy(&v));
        }
        if env("LLAMA_ARG_NO_KV_UNIFIED").is_some() {
            l.kv_unified = Some(false);
        }
        if let Some(v) = env("LLAMA_ARG_KV_UNIFIED_PER_SLOT") {
            l.kv_unified_per_slot = int(&v).and_then(|n| u64::try_from(n).ok());
        }
        if let Some(v) = env("LLAMA_ARG_N_PREDICT") {
            l.n_predict = int(&v);
        }
        if let Some(v) = env("LLAMA_API_KEY") {
            l.api_keys = csv(&v);
        }
        if let Some(v) = env("LLAMA_ARG_API_KEY_FILE") {
            l.api_key_file = Some(PathBuf::from(v));
        }
        l.has_model = [
            "LLAMA_ARG_MODEL",
            "LLAMA_ARG_HF_REPO",
            "LLAMA_ARG_MODEL_URL",
        ]
        .iter()
        .any(|k| env(k).is_some_and(|v| !v.is_empty()));

        let mut args = argv.iter().skip(1).map(String::as_str);
        while let Some(arg) = args.next() {
            // llama-server reads `--a_b` as `--a-b`.
            let arg = match arg.starts_with("--") {
                true => arg.replace('_', "-"),
                false => arg.to_owned(),
            };
            match arg.as_str() {
                "-np" | "--parallel" => l.n_parallel = args.next().and_then(int),
                "-c" | "--ctx-size" => {
                    l.ctx_size = args
                        .next()
                        .and_then(int)
                        .and_then(|n| u64::try_from(n).ok())
                }
                "-n" | "--predict" | "--n-predict" => l.n_predict = args.next().and_then(int),
                "-kvu" | "--kv-unified" => l.kv_unified = Some(true),
                "-no-kvu" | "--no-kv-unified" => l.kv_unified = Some(false),
                "--kv-unified-per-slot" => {
                    l.kv_unified_per_slot = args
                        .next()
                        .and_then(int)
                        .and_then(|n| u64::try_from(n).ok())
                }
                "--api-key" => {
                    if let Some(v) = args.next() {
                        l.api_keys.extend(csv(v));
                    }
                }
                "--api-key-file" => l.api_key_file = args.next().map(PathBuf::from),
                "-m" | "--model" | "-hf" | "-hfr" | "--hf-repo" | "-mu" | "--model-url" | "-dr"
                | "--docker-repo" => {
                    l.has_model |= args.next().is_some_and(|v| !v.is_empty());
                }
                _ => {}
            }
        }
        l
    }

    /// The limit of a request that sets none, when `-n` gives one (`-1`, its default, is none).
    pub fn predict(&self) -> Option<u64> {
        self.n_predict
            .filter(|n| *n > 0)
            .and_then(|n| u64::try_from(n).ok())
    }

    /// The slots llama-server runs: `-np`, or 4 when it is left to llama-server (auto).
    pub fn slots(&self) -> u64 {
        match self.n_parallel {
            Some(n) if n > 0 => n as u64,
            _ => 4,
        }
    }

    /// How the slots hold their context, as `server.cpp` decides: automatic slots (no `-np`)
    /// always share one pool; `-np N` shares only with `--kv-unified`. The pool is `-c` (rounded up
    /// to 256 as llama.cpp pads it), or `np × --kv-unified-per-slot` when `-c` is not given, or the
    /// model's own context (what `/props` then reports per slot).
    pub fn kv_layout(&self) -> KvLayout {
        let auto = !matches!(self.n_parallel, Some(n) if n > 0);
        let unified = auto || self.kv_unified == Some(true);
        if !unified {
            return KvLayout::PerSlot;
        }
        let pad = |n: u64| n.div_ceil(256) * 256;
        match (self.ctx_size.filter(|&c| c > 0), self.kv_unified_per_slot) {
            (Some(c), _) => KvLayout::Shared(pad(c)),
            (None, Some(per)) if per > 0 && self.ctx_size.is_none() => {
                KvLayout::Shared(pad(self.slots() * per))
            }
            _ => KvLayout::SharedAsSlot,
        }
    }

    /// The first API key llama-server accepts, from `--api-key` or the key file.
    pub fn api_key(&self) -> Option<String> {
        if let Some(k) = self.api_keys.first() {
            return Some(k.clone());
        }
        let text = std::fs::read_to_string(self.api_key_file.as_ref()?).ok()?;
        first_key(&text)
    }
}

/// The first key of a key file as llama-server reads it: one per line, `#` starts a comment line.
pub fn first_key(text: &str) -> Option<String> {
    text.lines()
        .map(|l| l.trim_end_matches('\r'))
        .find(|l| !l.is_empty() && !l.starts_with('#'))
        .map(str::to_owned)
}

fn csv(v: &str) -> Vec<String> {
    v.split(',')
        .map(str::trim)
        .filter(|k| !k.is_empty())
        .map(str::to_owned)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &str, env: &[(&str, &str)]) -> Launch {
        let argv: Vec<String> = std::iter::once("llama-server")
            .chain(args.split_whitespace())
            .map(str::to_owned)
            .collect();
        Launch::parse(&argv, |k| {
            env.iter()
                .find(|(name, _)| *name == k)
                .map(|(_, v)| (*v).to_owned())
        })
    }

    #[test]
    fn the_layout_follows_llama_servers_rules() {
        // Its defaults: 4 slots over one pool of the model's context.
        assert_eq!(parse("-m m.gguf", &[]).kv_layout(), KvLayout::SharedAsSlot);
        assert_eq!(parse("-m m.gguf", &[]).slots(), 4);
        assert_eq!(
            parse("-m m -c 8192", &[]).kv_layout(),
            KvLayout::Shared(8192)
        );
        // Rounded up as llama.cpp pads it.
        assert_eq!(
            parse("-m m -c 8000", &[]).kv_layout(),
            KvLayout::Shared(8192)
        );
        // Automatic slots share the pool even when told not to.
        assert_eq!(
            parse("-m m -c 4096 --no-kv-unified", &[]).kv_layout(),
            KvLayout::Shared(4096)
        );
        // -np N: a context per slot, unless --kv-unified.
        assert_eq!(
            parse("-m m -np 2 -c 4096", &[]).kv_layout(),
            KvLayout::PerSlot
        );
        assert_eq!(
            parse("-m m -np 2 -c 4096 -kvu", &[]).kv_layout(),
            KvLayout::Shared(4096)
        );
        // The pool sized from --kv-unified-per-slot without -c.
        assert_eq!(
            parse("-m m --kv-unified-per-slot 1000", &[]).kv_layout(),
            KvLayout::Shared(4096)
        );
        assert_eq!(
            parse("-m m -np -1 --kv_unified_per_slot 2048 -c 4096", &[]).kv_layout(),
            KvLayout::Shared(4096)
        );
    }

    #[test]
    fn a_server_wide_output_limit_is_read_from_n() {
        assert_eq!(parse("-m m", &[]).predict(), None);
        assert_eq!(parse("-m m -n 256", &[]).predict(), Some(256));
        assert_eq!(parse("-m m --n_predict 64", &[]).predict(), Some(64));
        assert_eq!(parse("-m m --predict -1", &[]).predict(), None);
        assert_eq!(
            parse("-m m", &[("LLAMA_ARG_N_PREDICT", "128")]).predict(),
            Some(128)
        );
        assert_eq!(
            parse("-m m -n 32", &[("LLAMA_ARG_N_PREDICT", "128")]).predict(),
            Some(32)
        );
    }

    #[test]
    fn arguments_beat_the_environment() {
        let env = [
            ("LLAMA_ARG_N_PARALLEL", "3"),
            ("LLAMA_ARG_CTX_SIZE", "6144"),
            ("LLAMA_API_KEY", "a, b"),
        ];
        let l = parse("-m m", &env);
        assert_eq!((l.slots(), l.kv_layout()), (3, KvLayout::PerSlot));
        assert_eq!(l.api_keys, ["a", "b"]);
        let l = parse("-m m -np 2 -kvu --api-key k", &env);
        assert_eq!((l.slots(), l.kv_layout()), (2, KvLayout::Shared(6144)));
        assert_eq!(l.api_keys, ["a", "b", "k"]);
        assert_eq!(
            parse(
                "-m m",
                &[
                    ("LLAMA_ARG_NO_KV_UNIFIED", "1"),
                    ("LLAMA_ARG_N_PARALLEL", "2")
                ]
            )
            .kv_layout(),
            KvLayout::PerSlot
        );
        assert!(parse("-m m", &[]).has_model);
        assert!(!parse("--models-dir d", &[]).has_model);
    }

    #[test]
    fn key_files_are_read_as_llama_server_reads_them() {
        assert_eq!(
            first_key("# keys\n\nsecret\nother\n").as_deref(),
            Some("secret")
        );
        assert_eq!(first_key("# only a comment\n"), None);
    }
}
