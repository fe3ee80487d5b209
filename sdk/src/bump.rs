//! The guest's allocator on wasm32: a bump allocator, first over an arena inside the module's
//! initial memory, then over freshly grown linear memory.
//!
//! The host runs every call in a fresh instance and throws it away afterwards, so nothing allocated
//! ever needs freeing: `dealloc` does nothing, and `realloc` of the newest block grows it in place.
//! That is a fraction of the instructions (and so of the fuel and time) a general-purpose allocator
//! spends, which is most of what a small policy costs per request.
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

/// The allocator's state and its arena, in one static: the pointer sits right before the bytes it
/// hands out. Kept apart, the linker may put the pointer far past the arena; then a snapshot of an
/// instance (see `keeps_settings` in `types.rs`), which holds every non-zero byte from the lowest to
/// the highest, would hold the whole arena, and every instance would reset all of it.
#[repr(C, align(16))]
struct Arena {
    /// The next free byte; 0 until the first allocation.
    next: AtomicUsize,
    bytes: UnsafeCell<[u8; ARENA_BYTES]>,
}

// SAFETY: wasm32 policies are single-threaded (no wasm threads); the arena is only ever handed out
// in disjoint blocks by `Bump`.
#[allow(
    unsafe_code,
    reason = "the guest allocator hands out a static arena by hand"
)]
unsafe impl Sync for Arena {}

static ARENA: Arena = Arena {
    next: AtomicUsize::new(0),
    bytes: UnsafeCell::new([0; ARENA_BYTES]),
};

/// The allocator the SDK installs for every policy built for wasm32.
pub struct Bump {
    next: &'static AtomicUsize,
}

impl Bump {
    pub const fn new() -> Self {
        Bump { next: &ARENA.next }
    }

    fn arena() -> (usize, usize) {
        let start = ARENA.bytes.get() as usize;
        (start, start + ARENA_BYTES)
    }

    /// Where a block of `size` bytes at `align` goes, with `[at, at + size)` addressable: in the
    /// arena while it fits, else past the end of memory, growing it. `None` when it cannot grow.
    fn place(&self, size: usize, align: usize) -> Option<(usize, usize)> {
        let (arena_start, arena_end) = Bump::arena();
        let next = match self.next.load(Relaxed) {
            0 => arena_start,
            n => n,
        };
        let at = next.next_multiple_of(align);
        let end = at + size.max(1);
        if next <= arena_end && end <= arena_end {
            return Some((at, end));
        }
        // Past the arena: the memory the module did not declare is ours, from its current end.
        let from = if next <= arena_end {
            wasm32::memory_size(0) * PAGE
        } else {
            next
        };
        let at = from.next_multiple_of(align);
        let end = at + size.max(1);
        Bump::reserve(end).then_some((at, end))
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

// SAFETY: single-threaded (no wasm threads); every block handed out is fresh memory of at least
// `layout.size()` bytes at `layout.align()`, never handed out twice.
#[allow(
    unsafe_code,
    reason = "the guest allocator hands out a static arena by hand"
)]
unsafe impl GlobalAlloc for Bump {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        match self.place(layout.size(), layout.align()) {
            Some((at, end)) => {
                self.next.store(end, Relaxed);
                at as *mut u8
            }
            None => std::ptr::null_mut(),
        }
    }

    unsafe fn dealloc(&self, _ptr: *mut u8, _layout: Layout) {}

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let at = ptr as usize;
        // The newest block grows (or shrinks) where it is, unless that would run past the arena.
        if at + layout.size().max(1) == self.next.load(Relaxed) {
            let end = at + new_size.max(1);
            let (arena_start, arena_end) = Bump::arena();
            let in_arena = (arena_start..arena_end).contains(&at);
            if (in_arena && end <= arena_end) || (!in_arena && Bump::reserve(end)) {
                self.next.store(end, Relaxed);
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
        }
        new
    }
}
