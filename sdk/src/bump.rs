//! The guest's allocator on wasm32: a bump allocator, first over an arena inside the module's
//! initial memory, then over linear memory grown past it.
//!
//! A v1 module runs every call in a fresh instance and throws it away afterwards, so nothing
//! allocated ever needs freeing: `dealloc` does nothing, and `realloc` of the newest block grows it
//! in place. That is a fraction of the instructions (and so of the fuel and time) a
//! general-purpose allocator spends, which is most of what a small policy costs per request.
//!
//! A v2 component (feature `v2`) may serve many calls of one caller in one instance
//! (docs/policies.md, "Isolation"), so the allocator counts the blocks alive and starts over from
//! the bottom whenever the count falls to zero: after each call, once the host has taken the answer
//! (its post-return frees the last blocks). What must outlive calls (the parsed settings) is
//! allocated [`pinned`], from the top of the arena down, and never freed or counted.
//!
//! The arena is there because growing linear memory is a system call on the host (the grown pages
//! are made accessible with `mprotect`), and the next instance in the same slot shrinks it back with
//! another, which also flushes the TLB of every core the host runs on. An evaluation that fits in
//! the arena never grows memory. The arena is zero-initialised (`.bss`): it adds no bytes to the
//! module and costs an instance nothing until a page of it is written.

use std::alloc::{GlobalAlloc, Layout};
use std::arch::wasm32;
use std::cell::UnsafeCell;
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};

const PAGE: usize = 65_536;

/// Bytes an evaluation may allocate before memory grows: a 2 KB request, its parse and the decision
/// need a few KiB; 256 KiB leaves room for large headers and settings.
const ARENA_BYTES: usize = 256 << 10;

/// The allocator's state and its arena, in one static: the pointers sit right before the bytes
/// handed out. Kept apart, the linker may put them far past the arena; then a snapshot of an
/// instance (see `keeps_settings` in `types.rs`), which holds every non-zero byte from the lowest to
/// the highest, would hold the whole arena, and every instance would reset all of it.
#[repr(C, align(16))]
struct Arena {
    /// The next free byte; 0 until the first allocation (then: the arena's start).
    next: AtomicUsize,
    /// Blocks alive below `next` (v2 starts over from the bottom when it falls to zero).
    live: AtomicUsize,
    /// The lowest pinned byte; 0 while nothing is pinned (then: the arena's end).
    top: AtomicUsize,
    /// Where memory grown past the arena starts; 0 until it first grows.
    spill: AtomicUsize,
    /// 1 while [`pinned`] runs; 2 once a pinned block had to go below `next`: from then on the
    /// allocator never starts over (the instance is a v1 one in all but name).
    mode: AtomicUsize,
    bytes: UnsafeCell<[u8; ARENA_BYTES]>,
}

const PINNING: usize = 1;
const NEVER_OVER: usize = 2;

// SAFETY: wasm32 policies are single-threaded (no wasm threads); the arena is only ever handed out
// in disjoint blocks by `Bump`.
#[allow(
    unsafe_code,
    reason = "the guest allocator hands out a static arena by hand"
)]
unsafe impl Sync for Arena {}

static ARENA: Arena = Arena {
    next: AtomicUsize::new(0),
    live: AtomicUsize::new(0),
    top: AtomicUsize::new(0),
    spill: AtomicUsize::new(0),
    mode: AtomicUsize::new(0),
    bytes: UnsafeCell::new([0; ARENA_BYTES]),
};

/// Runs `f` with every allocation it makes pinned: kept for the life of the instance, never freed
/// and not counted, so the allocator can start over beneath them (see the module's docs).
#[cfg_attr(not(feature = "v2"), allow(dead_code, reason = "only components pin"))]
pub fn pinned<R>(f: impl FnOnce() -> R) -> R {
    let was = ARENA.mode.load(Relaxed);
    if was == 0 {
        ARENA.mode.store(PINNING, Relaxed);
    }
    let r = f();
    if was == 0 && ARENA.mode.load(Relaxed) == PINNING {
        ARENA.mode.store(0, Relaxed);
    }
    r
}

/// The allocator the SDK installs for every policy built for wasm32.
pub struct Bump {
    a: &'static Arena,
}

impl Bump {
    pub const fn new() -> Self {
        Bump { a: &ARENA }
    }

    /// The arena's start, and the end of the part below the pinned blocks.
    fn arena(&self) -> (usize, usize) {
        let start = self.a.bytes.get() as usize;
        let top = match self.a.top.load(Relaxed) {
            0 => start + ARENA_BYTES,
            t => t,
        };
        (start, top)
    }

    fn next(&self, arena_start: usize) -> usize {
        match self.a.next.load(Relaxed) {
            0 => arena_start,
            n => n,
        }
    }

    /// Where a block of `size` bytes at `align` goes, with `[at, at + size)` addressable: in the
    /// arena while it fits, else past it, growing memory. `None` when it cannot grow.
    fn place(&self, size: usize, align: usize) -> Option<(usize, usize)> {
        let (arena_start, arena_end) = self.arena();
        let next = self.next(arena_start);
        let at = next.next_multiple_of(align);
        let end = at + size.max(1);
        if next <= arena_end && end <= arena_end {
            return Some((at, end));
        }
        // Past the arena: the memory the module did not declare is ours, from where it first grew
        // (the same place again after starting over).
        let from = if next <= arena_end {
            match self.a.spill.load(Relaxed) {
                0 => {
                    let s = wasm32::memory_size(0) * PAGE;
                    self.a.spill.store(s, Relaxed);
                    s
                }
                s => s,
            }
        } else {
            next
        };
        let at = from.next_multiple_of(align);
        let end = at + size.max(1);
        Bump::reserve(end).then_some((at, end))
    }

    /// A pinned block, from the top of the arena down; `None` when it would reach `next`.
    fn place_pinned(&self, size: usize, align: usize) -> Option<usize> {
        let (arena_start, top) = self.arena();
        let next = self.next(arena_start);
        let at = top.checked_sub(size.max(1))? & !(align - 1);
        (next <= top && at >= next).then_some(at)
    }

    fn is_pinned(&self, at: usize) -> bool {
        let start = self.a.bytes.get() as usize;
        let top = self.a.top.load(Relaxed);
        top != 0 && (top..start + ARENA_BYTES).contains(&at)
    }

    /// Makes everything below `end` addressable, growing memory as needed; false when it cannot grow.
    fn reserve(end: usize) -> bool {
        let have = wasm32::memory_size(0) * PAGE;
        if end <= have {
            return true;
        }
        let pages = (end - have).div_ceil(PAGE);
        wasm32::memory_grow(0, pages) != usize::MAX
    }
}

impl Default for Bump {
    fn default() -> Self {
        Bump::new()
    }
}

// SAFETY: single-threaded (no wasm threads); every block handed out is memory of at least
// `layout.size()` bytes at `layout.align()` that no live block overlaps: the allocator starts over
// only when no block below `next` is alive, and pinned blocks sit above everything it hands out.
#[allow(
    unsafe_code,
    reason = "the guest allocator hands out a static arena by hand"
)]
unsafe impl GlobalAlloc for Bump {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if self.a.mode.load(Relaxed) == PINNING {
            if let Some(at) = self.place_pinned(layout.size(), layout.align()) {
                self.a.top.store(at, Relaxed);
                return at as *mut u8;
            }
            // No room above: an ordinary block that is never freed, so never start over.
            self.a.mode.store(NEVER_OVER, Relaxed);
        }
        match self.place(layout.size(), layout.align()) {
            Some((at, end)) => {
                self.a.next.store(end, Relaxed);
                self.a.live.fetch_add(1, Relaxed);
                at as *mut u8
            }
            None => std::ptr::null_mut(),
        }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, _layout: Layout) {
        if !cfg!(feature = "v2") || self.is_pinned(ptr as usize) {
            return;
        }
        let live = self.a.live.load(Relaxed).saturating_sub(1);
        self.a.live.store(live, Relaxed);
        if live == 0 && self.a.mode.load(Relaxed) != NEVER_OVER {
            self.a.next.store(0, Relaxed);
        }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let at = ptr as usize;
        // The newest block grows (or shrinks) where it is, unless that would run past the arena.
        if at + layout.size().max(1) == self.a.next.load(Relaxed) {
            let end = at + new_size.max(1);
            let (arena_start, arena_end) = self.arena();
            let in_arena = (arena_start..arena_end).contains(&at);
            if (in_arena && end <= arena_end) || (!in_arena && Bump::reserve(end)) {
                self.a.next.store(end, Relaxed);
                return ptr;
            }
        }
        if new_size <= layout.size() {
            return ptr;
        }
        // SAFETY: `new_size` with the old alignment is a valid layout (the caller's contract).
        let new_layout = unsafe { Layout::from_size_align_unchecked(new_size, layout.align()) };
        // SAFETY: forwarding the caller's contract.
        let new = unsafe { self.alloc(new_layout) };
        if !new.is_null() {
            // SAFETY: both blocks are valid for `layout.size()` bytes and do not overlap.
            unsafe { std::ptr::copy_nonoverlapping(ptr, new, layout.size()) };
            // SAFETY: the old block is the caller's, and no longer used.
            unsafe { self.dealloc(ptr, layout) };
        }
        new
    }
}
