//! The chain's lifecycle: turns, and policies that keep their settings in a snapshot.

use super::*;
use std::time::Duration;

use serde_json::Value;
use slotgate_sdk::Verdict;

#[tokio::test]
async fn policy_code_takes_turns() {
    let set = PolicySet::load(&[], None).unwrap();
    let turns: Vec<_> = take_turns(&set, MAX_RUNNING).await;
    assert!(
        tokio::time::timeout(Duration::from_millis(50), set.turn())
            .await
            .is_err(),
        "a turn beyond {MAX_RUNNING} must wait"
    );
    drop(turns);
    assert!(
        tokio::time::timeout(Duration::from_millis(50), set.turn())
            .await
            .is_ok(),
        "a finished turn lets the next one run"
    );
}

async fn take_turns(set: &PolicySet, n: usize) -> Vec<tokio::sync::OwnedSemaphorePermit> {
    let mut turns = Vec::new();
    for _ in 0..n {
        turns.push(set.turn().await);
    }
    turns
}

/// A policy that keeps the settings' text it was validated with and answers it as its tenant,
/// with how many evaluations its instance has seen as the priority; it denies any input that
/// carries settings. `keeps`: whether its `validate_settings` says it keeps them.
fn keeping_policy(keeps: bool) -> String {
    let answer = if keeps {
        r#"{"valid":true,"keeps_settings":true}"#
    } else {
        r#"{"valid":true}"#
    };
    r#"(module
  (memory (export "memory") 1)
  (global $heap (mut i32) (i32.const 4096))
  (data (i32.const 100) "{\"tenant\":")
  (data (i32.const 120) ",\"priority\":")
  (data (i32.const 140) "ANSWER")
  (data (i32.const 200) "\"settings\"")
  (data (i32.const 220) "{\"verdict\":\"deny\",\"status\":403,\"message\":\"settings in input\"}")
  (func (export "slotgate_abi_version") (result i32) (i32.const 1))
  (func (export "slotgate_alloc") (param $len i32) (result i32)
(local $p i32)
(local.set $p (global.get $heap))
(global.set $heap (i32.add (global.get $heap) (local.get $len)))
(local.get $p))
  (func $pack (param $p i32) (param $l i32) (result i64)
(i64.or (i64.shl (i64.extend_i32_u (local.get $p)) (i64.const 32)) (i64.extend_i32_u (local.get $l))))
  ;; Keeps the settings' JSON text at 512 (its length at 508).
  (func (export "slotgate_validate_settings") (param $p i32) (param $l i32) (result i64)
(i32.store (i32.const 508) (local.get $l))
(memory.copy (i32.const 512) (local.get $p) (local.get $l))
(call $pack (i32.const 140) (i32.const ANSWER_LEN)))
  ;; Whether the input holds the text "settings" (quoted).
  (func $has_settings (param $p i32) (param $l i32) (result i32)
(local $i i32) (local $j i32)
(block $none
  (loop $outer
    (br_if $none (i32.gt_s (i32.add (local.get $i) (i32.const 10)) (local.get $l)))
    (local.set $j (i32.const 0))
    (block $miss
      (loop $inner
        (br_if $miss (i32.ne
          (i32.load8_u (i32.add (i32.add (local.get $p) (local.get $i)) (local.get $j)))
          (i32.load8_u (i32.add (i32.const 200) (local.get $j)))))
        (local.set $j (i32.add (local.get $j) (i32.const 1)))
        (br_if $inner (i32.lt_u (local.get $j) (i32.const 10))))
      (return (i32.const 1)))
    (local.set $i (i32.add (local.get $i) (i32.const 1)))
    (br $outer)))
(i32.const 0))
  ;; {"tenant":<kept settings>,"priority":<evaluations this instance has seen>}
  (func (export "slotgate_evaluate") (param $p i32) (param $l i32) (result i64)
(local $o i32) (local $k i32)
(if (call $has_settings (local.get $p) (local.get $l))
  (then (return (call $pack (i32.const 220) (i32.const 61)))))
(i32.store (i32.const 500) (i32.add (i32.load (i32.const 500)) (i32.const 1)))
(local.set $k (i32.load (i32.const 508)))
(memory.copy (i32.const 2048) (i32.const 100) (i32.const 10))
(memory.copy (i32.const 2058) (i32.const 512) (local.get $k))
(local.set $o (i32.add (i32.const 2058) (local.get $k)))
(memory.copy (local.get $o) (i32.const 120) (i32.const 12))
(i32.store8 (i32.add (local.get $o) (i32.const 12)) (i32.add (i32.const 48) (i32.load (i32.const 500))))
(i32.store8 (i32.add (local.get $o) (i32.const 13)) (i32.const 125))
(call $pack (i32.const 2048) (i32.sub (i32.add (local.get $o) (i32.const 14)) (i32.const 2048)))))"#
        .replace("ANSWER_LEN", &answer.len().to_string())
        .replace("ANSWER", &answer.replace('"', "\\\""))
}

fn load_inline(wat: &str, settings: &str, tag: &str) -> PolicySet {
    let dir = std::env::temp_dir().join(format!("slotgate-keep-{}-{tag}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("keep.wat");
    std::fs::write(&path, wat).unwrap();
    let settings_path = dir.join("settings.json");
    std::fs::write(&settings_path, settings).unwrap();
    let set = PolicySet::load(&[PolicySpec::from_path(path, Some(settings_path))], None)
        .unwrap_or_else(|e| panic!("{e:?}"));
    let _ = std::fs::remove_dir_all(&dir);
    set
}

#[test]
fn a_policy_that_keeps_its_settings_serves_from_a_snapshot_and_still_fresh_instances() {
    let set = load_inline(&keeping_policy(true), r#""gold""#, "keeps");
    let chain = set.current();
    assert!(chain.policies().all(Loaded::preinitialised));
    let request = canary_input(&Value::Null).request;
    for _ in 0..3 {
        let (outcome, own) = chain.evaluate_each(&request);
        let d = own[0].clone().expect("a decision");
        // The settings it kept in `validate_settings`, and no settings in its input (it would
        // deny): every instance starts from the snapshot.
        assert_eq!(d.verdict, Verdict::Allow, "{d:?}");
        assert_eq!(d.tenant.as_deref(), Some("gold"), "{outcome:?}");
        // Each evaluation in a fresh instance: nothing counted by the one before survives.
        assert_eq!(d.priority, Some(1));
    }
}

#[test]
fn a_policy_that_does_not_keep_its_settings_gets_them_in_every_input() {
    let set = load_inline(&keeping_policy(false), r#""gold""#, "plain");
    let chain = set.current();
    assert!(!chain.policies().any(Loaded::preinitialised));
    let (_, own) = chain.evaluate_each(&canary_input(&Value::Null).request);
    let d = own[0].clone().expect("a decision");
    assert_eq!(d.verdict, Verdict::Deny, "settings in its input: {d:?}");
    assert_eq!(d.message.as_deref(), Some("settings in input"));
}
