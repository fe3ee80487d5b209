;; wat-deny-embeddings: a slotgate ABI v1 policy in hand-written WebAssembly text, with no SDK and
;; no JSON parser, to show that docs/policy-abi.md is the whole contract.
;;
;; It refuses (403) every request whose path contains "/embedding", which covers llama-server's
;; /embedding, /embeddings and /v1/embeddings, and allows everything else unchanged.
;;
;; How it finds the path without parsing JSON: it looks for the first `"path":"` in the input and
;; reads up to the next `"`. Inside a JSON string every `"` is escaped as `\"`, so that byte sequence
;; can only be a real key, and the host serializes `request` (method, then path) before anything that
;; could also hold a "path" key (headers, settings). That is a property of the host's compact serde
;; output, not of JSON: a host that added spaces or reordered fields would break this policy, and the
;; policy then fails closed (no `"path":"` found: it returns 0, which the host counts as an error).
;; It compares raw bytes, so a percent-encoded path (/v1/%65mbeddings) is not recognised.
;;
;; Settings are ignored; there is no slotgate_validate_settings (it is optional) and no
;; slotgate_on_complete.

(module
  ;; The only import: the host's logger, (level, ptr, len).
  (import "slotgate" "log" (func $log (param i32 i32 i32)))

  ;; One page to start with; slotgate_alloc grows it for large inputs.
  (memory (export "memory") 1)

  ;; Constant data lives below 1024; the host's input is bump-allocated from 1024 up.
  (data (i32.const 16) "{\"verdict\":\"allow\"}")                                                  ;; 19 bytes
  (data (i32.const 48) "{\"verdict\":\"deny\",\"status\":403,\"message\":\"embeddings are disabled on this server\"}") ;; 82 bytes
  (data (i32.const 160) "\"path\":\"")                                                              ;; 8 bytes
  (data (i32.const 176) "/embedding")                                                               ;; 10 bytes
  (data (i32.const 192) "denied a request to an embeddings endpoint")                               ;; 42 bytes

  (global $heap (mut i32) (i32.const 1024))

  (func (export "slotgate_abi_version") (result i32)
    (i32.const 1))

  ;; A bump allocator that never frees: the host uses a fresh instance for every call.
  (func (export "slotgate_alloc") (param $len i32) (result i32)
    (local $ptr i32)
    (local $end i32)
    (local $size i32)
    (if (i32.lt_s (local.get $len) (i32.const 0))
      (then (return (i32.const 0))))
    (local.set $ptr (global.get $heap))
    (local.set $end (i32.add (local.get $ptr) (local.get $len)))
    ;; Bytes in memory now. Cannot overflow: the host caps memory far below 4 GiB.
    (local.set $size (i32.shl (memory.size) (i32.const 16)))
    (if (i32.gt_u (local.get $end) (local.get $size))
      (then
        ;; Grow by the missing bytes, rounded up to whole 64 KiB pages.
        (if (i32.eq
              (memory.grow
                (i32.shr_u
                  (i32.add (i32.sub (local.get $end) (local.get $size)) (i32.const 65535))
                  (i32.const 16)))
              (i32.const -1))
          (then (return (i32.const 0))))))
    (global.set $heap (local.get $end))
    (local.get $ptr))

  ;; Offset of the first `$needle_len` bytes at `$needle` within `$hay_len` bytes at `$hay`, or -1.
  (func $find (param $hay i32) (param $hay_len i32) (param $needle i32) (param $needle_len i32)
              (result i32)
    (local $i i32)
    (local $j i32)
    (if (i32.gt_u (local.get $needle_len) (local.get $hay_len))
      (then (return (i32.const -1))))
    (block $not_found
      (loop $next_start
        (br_if $not_found
          (i32.gt_u (local.get $i) (i32.sub (local.get $hay_len) (local.get $needle_len))))
        (local.set $j (i32.const 0))
        (block $mismatch
          (loop $next_byte
            (if (i32.eq (local.get $j) (local.get $needle_len))
              (then (return (local.get $i))))
            (br_if $mismatch
              (i32.ne
                (i32.load8_u (i32.add (local.get $hay) (i32.add (local.get $i) (local.get $j))))
                (i32.load8_u (i32.add (local.get $needle) (local.get $j)))))
            (local.set $j (i32.add (local.get $j) (i32.const 1)))
            (br $next_byte)))
        (local.set $i (i32.add (local.get $i) (i32.const 1)))
        (br $next_start)))
    (i32.const -1))

  ;; Offset of the first `"` within `$len` bytes at `$ptr`, or -1.
  (func $find_quote (param $ptr i32) (param $len i32) (result i32)
    (local $i i32)
    (block $not_found
      (loop $next
        (br_if $not_found (i32.ge_u (local.get $i) (local.get $len)))
        (if (i32.eq (i32.load8_u (i32.add (local.get $ptr) (local.get $i))) (i32.const 34))
          (then (return (local.get $i))))
        (local.set $i (i32.add (local.get $i) (i32.const 1)))
        (br $next)))
    (i32.const -1))

  ;; The ABI's packed output: (ptr << 32) | len.
  (func $pack (param $ptr i32) (param $len i32) (result i64)
    (i64.or
      (i64.shl (i64.extend_i32_u (local.get $ptr)) (i64.const 32))
      (i64.extend_i32_u (local.get $len))))

  (func (export "slotgate_evaluate") (param $ptr i32) (param $len i32) (result i64)
    (local $at i32)
    (local $start i32)
    (local $path_len i32)
    (local.set $at (call $find (local.get $ptr) (local.get $len) (i32.const 160) (i32.const 8)))
    (if (i32.lt_s (local.get $at) (i32.const 0))
      (then (return (i64.const 0))))
    ;; The path's value starts after `"path":"` and ends at the next quote.
    (local.set $start (i32.add (local.get $ptr) (i32.add (local.get $at) (i32.const 8))))
    (local.set $path_len
      (call $find_quote
        (local.get $start)
        (i32.sub (i32.add (local.get $ptr) (local.get $len)) (local.get $start))))
    (if (i32.lt_s (local.get $path_len) (i32.const 0))
      (then (return (i64.const 0))))
    (if (i32.ge_s
          (call $find (local.get $start) (local.get $path_len) (i32.const 176) (i32.const 10))
          (i32.const 0))
      (then
        (call $log (i32.const 2) (i32.const 192) (i32.const 42))
        (return (call $pack (i32.const 48) (i32.const 82)))))
    (call $pack (i32.const 16) (i32.const 19)))
)
