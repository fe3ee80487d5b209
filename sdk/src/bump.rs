//! The guest's allocator on wasm32: a bump allocator over freshly grown linear memory.
//!
//! The host runs every call in a fresh instance and throws it away afterwards, so nothing allocated
//! ever needs freeing: `dealloc` does nothing, and `realloc` of the newest block grows it in place.
//! That is a fraction of the instructions (and so of the fuel and time) a general-purpose allocator
//! spends, which is most of what a small policy costs per request.

use std::alloc::{GlobalAlloc, Layout};
use std::arch::wasm32;
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};

const PAGE: usize = 65_536;

/// The allocator the SDK installs for every policy built for wasm32.
pub struct Bump {
    /// The next free byte; 0 until the first allocation.
    next: AtomicUsize,
}

impl Bump {
    pub const fn new() -> Self {
        Bump {
            next: AtomicUsize::new(0),
        }
    }

    /// Makes `[start, end)` addressable, growing memory as needed; false when it cannot grow.
    fn reserve(end: usize) -> bool {
        let have = wasm32::memory_size(0) * PAGE;
        if end <= have {
            return true;
        }
        let pages = (end - have).div_ceil(PAGE);
        wasm32::memory_grow(0, pages) != usize::MAX
    }

    fn start(&self) -> usize {
        match self.next.load(Relaxed) {
            // Everything past the module's initial memory (data, stack) is ours.
            0 => wasm32::memory_size(0) * PAGE,
            n => n,
        }
    }
}

impl Default for Bump {
    fn default() -> Self {
        Bump::new()
    }
}

// SAFETY: single-threaded (no wasm threads); every block handed out is fresh memory of at least
// `layout.size()` bytes at `layout.align()`, never handed out twice.
#[allow(unsafe_code)]
unsafe impl GlobalAlloc for Bump {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let at = self.start().next_multiple_of(layout.align());
        let end = at + layout.size().max(1);
        if !Bump::reserve(end) {
            return std::ptr::null_mut();
        }
        self.next.store(end, Relaxed);
        at as *mut u8
    }

    unsafe fn dealloc(&self, _ptr: *mut u8, _layout: Layout) {}

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let at = ptr as usize;
        // The newest block grows (or shrinks) where it is.
        if at + layout.size().max(1) == self.next.load(Relaxed) {
            let end = at + new_size.max(1);
            if !Bump::reserve(end) {
                return std::ptr::null_mut();
            }
            self.next.store(end, Relaxed);
            return ptr;
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
