//! ABI v1 modules under the sandbox: hostile ones fail cleanly, each with the right kind.

mod hostile {
    use std::sync::Arc;
    use std::time::{Duration, Instant};

    use crate::policy::engine::PolicyEngine;
    use crate::policy::error::{EvalError, LoadError};
    use crate::policy::guest::Guest;
    use crate::policy::sandbox::{Evaluation, PolicyLimits};
    use crate::policy::v1::abi;
    use crate::policy::v1::json::parse_decision;
    use crate::policy::v1::module::{raw_v1_wat, Policy};
    use crate::policy::EngineLimits;

    /// A bump allocator, the ABI version, and `evaluate` returning a fixed decision; `$body` is spliced
    /// into `evaluate` before it returns, to make hostile variants.
    fn wat(version: i32, body: &str, extra: &str) -> String {
        let take = r#"(import "slotgate" "bucket_take" (func $take (param i32 i32 f64 f64 f64) (result f64)))"#;
        raw_v1_wat(
            take,
            version,
            1024,
            r#"{"verdict":"allow","cost":7}"#,
            body,
            extra,
        )
    }

    fn load(src: &str, limits: PolicyLimits) -> Result<Policy, LoadError> {
        let engine = PolicyEngine::new(EngineLimits {
            max_instances: 16,
            max_memory_bytes: 64 << 20,
        })
        .unwrap();
        Policy::load(&engine, Arc::default(), "t", src.as_bytes(), limits)
    }

    fn eval(src: &str, limits: PolicyLimits) -> Result<Evaluation, EvalError> {
        load(src, limits).unwrap().call(abi::EXPORT_EVALUATE, b"{}")
    }

    #[test]
    fn a_good_policy_answers_with_its_decision_and_fuel() {
        let ev = eval(&wat(1, "", ""), PolicyLimits::default()).unwrap();
        assert_eq!(
            ev.output.as_deref(),
            Some(&br#"{"verdict":"allow","cost":7}"#[..])
        );
        assert!(ev.fuel_used > 0);
    }

    #[test]
    fn a_weight_must_be_a_positive_number() {
        for (decision, valid) in [
            (r#"{"verdict":"allow","weight":2.5}"#, true),
            (r#"{"verdict":"allow","weight":0}"#, false),
            (r#"{"verdict":"allow","weight":-1.0}"#, false),
            // Found by fuzzing: a cost over so small a weight is an infinite charge.
            (r#"{"verdict":"allow","weight":1e-300}"#, false),
        ] {
            let src = wat(1, "", "")
                .replace(
                    r#"{\"verdict\":\"allow\",\"cost\":7}"#,
                    &decision.replace('"', "\\\""),
                )
                .replace("(i64.const 28)", &format!("(i64.const {})", decision.len()));
            let adapter: Box<dyn Guest> = Box::new(load(&src, PolicyLimits::default()).unwrap());
            let got = adapter.evaluate_input(&slotgate_sdk::EvaluateInput::default());
            match got {
                Ok((d, _)) => assert!(valid && d.weight == Some(2.5), "{decision}: {d:?}"),
                Err(e) => assert!(!valid && e.kind() == "invalid_output", "{decision}: {e}"),
            }
        }
    }

    #[test]
    fn a_tenant_cap_must_let_one_request_in() {
        let ok = parse_decision(br#"{"verdict":"allow","max_in_service":2,"max_waiting":0}"#);
        let d = ok.unwrap();
        assert_eq!((d.max_in_service, d.max_waiting), (Some(2), Some(0)));
        let err = parse_decision(br#"{"verdict":"allow","max_in_service":0}"#).unwrap_err();
        assert_eq!(err.kind(), "invalid_output", "{err}");
    }

    #[test]
    fn hostile_modules_fail_cleanly_with_the_right_kind() {
        // Generous deadline, so only the fuel can stop these; the timeout case below swaps the two.
        let lim = PolicyLimits {
            fuel: 200_000,
            deadline: Duration::from_secs(10),
            ..PolicyLimits::default()
        };
        let spin = "(loop $l (br $l))";
        assert_eq!(eval(&wat(1, spin, ""), lim).unwrap_err().kind(), "fuel");
        let long_fuel = PolicyLimits {
            fuel: u64::MAX / 4,
            deadline: Duration::from_millis(30),
            ..lim
        };
        let t = Instant::now();
        assert_eq!(
            eval(&wat(1, spin, ""), long_fuel).unwrap_err().kind(),
            "timeout"
        );
        assert!(
            t.elapsed() < Duration::from_secs(2),
            "deadline took {:?}",
            t.elapsed()
        );
        let bomb = "(loop $l (br_if $l (i32.ne (memory.grow (i32.const 16)) (i32.const -1))))";
        assert_eq!(eval(&wat(1, bomb, ""), lim).unwrap_err().kind(), "memory");
        assert_eq!(
            eval(&wat(1, "unreachable", ""), lim).unwrap_err().kind(),
            "trap"
        );
        let recurse = "(call $deep)";
        let deep = "(func $deep (call $deep))";
        assert_eq!(
            eval(&wat(1, recurse, deep), lim).unwrap_err().kind(),
            "trap"
        );
        let host_loop = "(loop $l (drop (call $take (i32.const 0) (i32.const 1) (f64.const 1) (f64.const 1) (f64.const 0))) (br $l))";
        assert_eq!(
            eval(&wat(1, host_loop, ""), lim).unwrap_err().kind(),
            "fuel"
        );
        let huge = wat(
            1,
            "(return (i64.or (i64.shl (i64.const 0) (i64.const 32)) (i64.const 10000000)))",
            "",
        );
        assert_eq!(eval(&huge, lim).unwrap_err().kind(), "invalid_output");
        let outside = wat(
            1,
            "(return (i64.or (i64.shl (i64.const 65530) (i64.const 32)) (i64.const 100)))",
            "",
        );
        assert_eq!(eval(&outside, lim).unwrap_err().kind(), "invalid_output");
    }

    #[test]
    fn a_start_function_is_bounded_too() {
        let lim = PolicyLimits {
            fuel: 200_000,
            deadline: Duration::from_secs(10),
            ..PolicyLimits::default()
        };
        let start = "(func $s (loop $l (br $l))) (start $s)";
        assert!(matches!(
            load(&wat(1, "", start), lim),
            Err(LoadError::Eval(EvalError::Fuel))
        ));
    }

    #[test]
    fn wrong_abi_and_missing_exports_are_refused_at_load() {
        let lim = PolicyLimits::default();
        assert!(
            matches!(load(&wat(2, "", ""), lim), Err(LoadError::Abi(m)) if m.contains("ABI 2"))
        );
        let no_eval = wat(1, "", "").replace("\"slotgate_evaluate\"", "\"other\"");
        assert!(
            matches!(load(&no_eval, lim), Err(LoadError::Abi(m)) if m.contains("slotgate_evaluate"))
        );
        let wasi = wat(1, "", "").replace(
            "(import \"slotgate\" \"bucket_take\"",
            "(import \"wasi\" \"bucket_take\"",
        );
        assert!(matches!(load(&wasi, lim), Err(LoadError::Abi(m)) if m.contains("wasi")));
        let small = PolicyLimits {
            max_module_bytes: 10,
            ..lim
        };
        assert!(matches!(
            load(&wat(1, "", ""), small),
            Err(LoadError::TooLarge { .. })
        ));
    }
}

mod deadline_and_signature {
    use std::sync::Arc;
    use std::time::{Duration, Instant};

    use crate::policy::engine::PolicyEngine;
    use crate::policy::error::{EvalError, LoadError};
    use crate::policy::sandbox::{PolicyLimits, LOAD_DEADLINE};
    use crate::policy::v1::abi;
    use crate::policy::v1::module::Policy;
    use crate::policy::EngineLimits;

    fn policy(evaluate_body: &str, extra: &str, limits: PolicyLimits) -> Result<Policy, LoadError> {
        let src = format!(
            r#"(module
  (memory (export "memory") 1)
  (data (i32.const 16) "{{}}")
  (func (export "slotgate_abi_version") (result i32) (i32.const 1))
  (func (export "slotgate_alloc") (param i32) (result i32) (i32.const 1024))
  (func (export "slotgate_evaluate") (param $p i32) (param $n i32) (result i64)
    (local $i i32)
    {evaluate_body}
    (i64.or (i64.shl (i64.const 16) (i64.const 32)) (i64.const 2)))
  {extra})"#
        );
        let engine = PolicyEngine::new(EngineLimits {
            max_instances: 8,
            max_memory_bytes: 1 << 20,
        })
        .unwrap();
        Policy::load(&engine, Arc::default(), "t", src.as_bytes(), limits)
    }

    #[test]
    fn an_optional_export_with_the_wrong_signature_is_refused() {
        let bad =
            r#"(func (export "slotgate_on_complete") (param i32) (result i32) (i32.const 0))"#;
        let err = policy("", bad, PolicyLimits::default())
            .err()
            .expect("refused");
        assert!(
            err.to_string()
                .contains("`slotgate_on_complete` must have the signature (i32, i32) -> (i64)"),
            "{err}"
        );
        let good =
            r#"(func (export "slotgate_on_complete") (param i32 i32) (result i64) (i64.const 0))"#;
        assert!(policy("", good, PolicyLimits::default()).is_ok());
    }

    /// The deadline counts the time the evaluation ran, not time it spent waiting for a core: with
    /// every core busy with other threads, an evaluation needing a third of its deadline in CPU time
    /// still succeeds, though it takes several deadlines of wall-clock time.
    #[test]
    fn a_busy_machine_does_not_make_a_healthy_policy_time_out() {
        // A counted loop: about a millisecond or more of CPU time in a debug build.
        let burn = "(loop $l (local.set $i (i32.add (local.get $i) (i32.const 1))) (br_if $l (i32.lt_u (local.get $i) (i32.const 300000))))";
        let calibrate = policy(
            burn,
            "",
            PolicyLimits {
                fuel: u64::MAX / 4,
                deadline: Duration::from_secs(5),
                ..PolicyLimits::default()
            },
        )
        .unwrap();
        let alone = (0..5)
            .map(|_| {
                let t0 = Instant::now();
                calibrate.call(abi::EXPORT_EVALUATE, b"{}").unwrap();
                t0.elapsed()
            })
            .min()
            .unwrap();
        let deadline = (alone * 3).max(Duration::from_millis(3));
        let p = policy(
            burn,
            "",
            PolicyLimits {
                fuel: u64::MAX / 4,
                deadline,
                ..PolicyLimits::default()
            },
        )
        .unwrap();

        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
        let spinners: Vec<_> = (0..cores * 4)
            .map(|_| {
                let stop = stop.clone();
                std::thread::spawn(move || {
                    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                        std::hint::spin_loop();
                    }
                })
            })
            .collect();
        let mut slowest = Duration::ZERO;
        let results: Vec<_> = (0..20)
            .map(|_| {
                let t0 = Instant::now();
                let r = p.call(abi::EXPORT_EVALUATE, b"{}");
                slowest = slowest.max(t0.elapsed());
                r
            })
            .collect();
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        for s in spinners {
            s.join().unwrap();
        }
        let failed: Vec<_> = results.iter().filter_map(|r| r.as_ref().err()).collect();
        assert!(
            failed.is_empty(),
            "{} of 20 timed out (deadline {deadline:?}, {alone:?} alone, slowest {slowest:?}): {failed:?}",
            failed.len()
        );

        // A runaway one still ends by its deadline, within the wall-clock ceiling.
        let spin = policy(
            "(loop $l (br $l))",
            "",
            PolicyLimits {
                fuel: u64::MAX / 4,
                deadline: Duration::from_millis(20),
                ..PolicyLimits::default()
            },
        )
        .unwrap();
        let t0 = Instant::now();
        assert_eq!(
            spin.call(abi::EXPORT_EVALUATE, b"{}").unwrap_err(),
            EvalError::Timeout
        );
        assert!(t0.elapsed() < LOAD_DEADLINE * 2, "{:?}", t0.elapsed());
    }
}
