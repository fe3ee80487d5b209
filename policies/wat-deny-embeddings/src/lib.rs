//! The hand-written WAT policy `policy.wat` (no SDK, no JSON parser: see its header), and its tests,
//! which run it in wasmtime on inputs serialized from the SDK's wire types, as the host sends them.

/// The policy's source text. The host's wasmtime compiles `.wat` text as well as `.wasm` binaries.
pub const WAT: &str = include_str!("../policy.wat");

#[cfg(test)]
mod tests {
    use super::WAT;
    use slotgate_sdk::{Decision, EvaluateInput, RequestSummary, Verdict};
    use wasmtime::{Caller, Engine, Extern, ExternType, Instance, Linker, Module, Store};

    type Logs = Vec<(i32, String)>;

    fn module() -> (Engine, Module) {
        let engine = Engine::default();
        let module = Module::new(&engine, WAT).expect("policy.wat compiles");
        (engine, module)
    }

    /// A fresh instance per call, as the host makes, with `slotgate::log` recording its messages.
    fn instantiate() -> (Store<Logs>, Instance) {
        let (engine, module) = module();
        let mut linker = Linker::new(&engine);
        linker
            .func_wrap(
                "slotgate",
                "log",
                |mut c: Caller<'_, Logs>, level: i32, ptr: i32, len: i32| {
                    let Some(Extern::Memory(mem)) = c.get_export("memory") else {
                        panic!("no memory export");
                    };
                    let (ptr, len) = (ptr as usize, len as usize);
                    let msg = String::from_utf8(mem.data(&c)[ptr..ptr + len].to_vec()).unwrap();
                    c.data_mut().push((level, msg));
                },
            )
            .unwrap();
        let mut store = Store::new(&engine, Logs::new());
        let instance = linker.instantiate(&mut store, &module).unwrap();
        (store, instance)
    }

    /// Runs `slotgate_evaluate` on `input` the way the host's ABI plumbing does.
    fn evaluate(input: &[u8]) -> (Option<String>, Logs) {
        let (mut store, instance) = instantiate();
        let mem = instance.get_memory(&mut store, "memory").unwrap();
        let alloc = instance
            .get_typed_func::<i32, i32>(&mut store, "slotgate_alloc")
            .unwrap();
        let eval = instance
            .get_typed_func::<(i32, i32), i64>(&mut store, "slotgate_evaluate")
            .unwrap();
        let len = i32::try_from(input.len()).unwrap();
        let ptr = alloc.call(&mut store, len).unwrap();
        assert_ne!(ptr, 0);
        mem.write(&mut store, ptr as usize, input).unwrap();
        let packed = eval.call(&mut store, (ptr, len)).unwrap() as u64;
        let out = (packed != 0).then(|| {
            let (p, l) = ((packed >> 32) as usize, (packed & 0xffff_ffff) as usize);
            String::from_utf8(mem.data(&store)[p..p + l].to_vec()).unwrap()
        });
        (out, store.into_data())
    }

    /// An input exactly as the host serializes it, from the shared wire types.
    fn input(path: &str, edit: impl FnOnce(&mut EvaluateInput)) -> Vec<u8> {
        let mut input = EvaluateInput {
            abi: 1,
            request: RequestSummary {
                method: "POST".into(),
                path: path.into(),
                model: Some("m".into()),
                max_tokens: Some(64),
                prompt_chars: 12,
                prompt_tokens_estimate: 3,
                ..RequestSummary::default()
            },
            settings: serde_json::Value::Null,
            now_unix_ms: 1_800_000_000_000,
            earlier: Default::default(),
        };
        edit(&mut input);
        serde_json::to_vec(&input).unwrap()
    }

    fn decision(input: &[u8]) -> (Decision, Logs) {
        let (out, logs) = evaluate(input);
        let out = out.expect("the policy answered");
        (serde_json::from_str(&out).expect("a valid decision"), logs)
    }

    #[test]
    fn chat_is_allowed_unchanged() {
        let (d, logs) = decision(&input("/v1/chat/completions", |_| {}));
        assert_eq!(d, Decision::allow());
        assert!(logs.is_empty());
    }

    #[test]
    fn every_embeddings_endpoint_is_refused_and_logged() {
        for path in [
            "/v1/embeddings",
            "/embeddings",
            "/embedding",
            "/embedding?x=1",
        ] {
            let (d, logs) = decision(&input(path, |_| {}));
            assert_eq!((d.verdict, d.status), (Verdict::Deny, Some(403)), "{path}");
            assert_eq!(
                d.message.as_deref(),
                Some("embeddings are disabled on this server")
            );
            assert_eq!(
                logs,
                [(2, "denied a request to an embeddings endpoint".to_owned())]
            );
        }
    }

    #[test]
    fn only_the_request_path_counts() {
        let bytes = input("/v1/completions", |i| {
            i.request.model = Some("nomic/embedding".into());
            i.request
                .headers
                .insert("x-path".into(), "\"path\":\"/embedding".into());
            i.settings = serde_json::json!({"path": "/embeddings"});
        });
        assert!(decision(&bytes).0.is_allowed());
    }

    #[test]
    fn an_input_without_a_path_is_an_error_not_an_allow() {
        assert_eq!(evaluate(b"{}").0, None);
        assert_eq!(evaluate(br#"{"request":{"path":"/v1/embe"#).0, None);
    }

    #[test]
    fn large_inputs_grow_memory() {
        let bytes = input("/v1/embeddings", |i| {
            i.request
                .headers
                .insert("user-agent".into(), "x".repeat(300_000));
        });
        assert!(!decision(&bytes).0.is_allowed());
        let (mut store, instance) = instantiate();
        let alloc = instance
            .get_typed_func::<i32, i32>(&mut store, "slotgate_alloc")
            .unwrap();
        assert_eq!(alloc.call(&mut store, -1).unwrap(), 0);
        assert_eq!(alloc.call(&mut store, 0).unwrap(), 1024);
        assert_eq!(alloc.call(&mut store, 10).unwrap(), 1024);
        assert_eq!(alloc.call(&mut store, 1).unwrap(), 1034);
    }

    #[test]
    fn exports_and_imports_are_abi_v1_only() {
        let (_, module) = module();
        let mut exports: Vec<_> = module.exports().map(|e| e.name().to_owned()).collect();
        exports.sort();
        assert_eq!(
            exports,
            [
                "memory",
                "slotgate_abi_version",
                "slotgate_alloc",
                "slotgate_evaluate"
            ]
        );
        let imports: Vec<_> = module
            .imports()
            .map(|i| (i.module().to_owned(), i.name().to_owned()))
            .collect();
        assert_eq!(imports, [("slotgate".to_owned(), "log".to_owned())]);
        assert!(matches!(
            module.get_export("slotgate_evaluate"),
            Some(ExternType::Func(_))
        ));
        let (mut store, instance) = instantiate();
        let version = instance
            .get_typed_func::<(), i32>(&mut store, "slotgate_abi_version")
            .unwrap();
        assert_eq!(version.call(&mut store, ()).unwrap(), 1);
    }
}
