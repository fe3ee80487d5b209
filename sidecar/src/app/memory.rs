//! What the allocators keep. The binary allocates with mimalloc (`main.rs`), which keeps per-thread
//! heaps and returns freed pages after a short delay. It is built without transparent huge pages
//! (libmimalloc-sys's `no_thp`): with them an idle slotgate held 16.4 MB instead of 9.5, a queued
//! request 60 KiB instead of 40 (docs/performance.md, "Memory"). C code still uses glibc's malloc,
//! whose arenas the rest of this note is about. glibc's malloc gives each thread that allocates an arena of its
//! own, up to eight per core, and an arena holds on to what was freed in it. slotgate's threads come
//! and go (the blocking pool, which start-up, reloads and a slow policy chain use), so the number of
//! arenas, and with it the idle RSS, crept up to what the busiest moment had created: +1.6 MiB over
//! an 8-minute soak with the default, +0.6 MiB with two arenas (`docs/soak.md`). Two arenas serve
//! the two async workers of a 2-core machine; the few threads beyond them share.
//!
//! A policy reload compiles up to three modules (the module, its instrumented form and the snapshot,
//! see `policy::snapshot`); what the compiler freed stays in the arenas, +6.7 MiB of idle RSS after
//! two reloads in the CI soak. [`trim`] gives it back after each reload.

/// Arenas glibc may create.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
const ARENAS: libc::c_int = 2;

/// Caps glibc's arenas at [`ARENAS`], unless the operator chose (`MALLOC_ARENA_MAX`, or
/// `GLIBC_TUNABLES` naming `arena_max`). Call first thing in `main`, before any thread exists. A
/// no-op on other C libraries.
pub fn limit_arenas() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        let chosen = std::env::var_os("MALLOC_ARENA_MAX").is_some()
            || std::env::var("GLIBC_TUNABLES").is_ok_and(|t| t.contains("arena_max"));
        if !chosen {
            set_arena_max(ARENAS);
        }
    }
}

#[cfg(all(target_os = "linux", target_env = "gnu"))]
#[allow(unsafe_code, reason = "glibc's malloc tuning has no safe wrapper")]
fn set_arena_max(arenas: libc::c_int) {
    // SAFETY: `mallopt` only sets one of malloc's tuning parameters; it takes no pointers and is
    // called before any other thread could be allocating.
    let ok = unsafe { libc::mallopt(libc::M_ARENA_MAX, arenas) };
    if ok != 1 {
        eprintln!("slotgate: could not cap malloc arenas (mallopt returned {ok}); continuing");
    }
}

/// Gives the memory the allocators hold free back to the kernel: after a policy reload, off the
/// request path, where the compiler has just freed megabytes. slotgate's own allocations are
/// mimalloc's (the binary's global allocator), which returns freed pages on its own after a short
/// delay; this collects the calling thread's heap at once, and glibc's arenas (`malloc_trim`, what
/// C code allocates) on glibc.
pub fn trim() {
    mimalloc_collect();
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    malloc_trim();
}

#[allow(unsafe_code, reason = "mimalloc's C interface has no safe wrapper")]
fn mimalloc_collect() {
    // SAFETY: `mi_collect` frees what the calling thread's heap holds unused; it takes no pointers
    // and is safe to call from any thread at any time.
    unsafe {
        libmimalloc_sys::mi_collect(true);
    }
}

#[cfg(all(target_os = "linux", target_env = "gnu"))]
#[allow(unsafe_code, reason = "glibc's malloc tuning has no safe wrapper")]
fn malloc_trim() {
    // SAFETY: `malloc_trim` only returns free memory to the kernel; it takes no pointers and is
    // thread-safe (it locks each arena in turn).
    unsafe {
        libc::malloc_trim(0);
    }
}
