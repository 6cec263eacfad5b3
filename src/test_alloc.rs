//! A counting global allocator for the unit tests: the bytes the current thread has allocated and not freed, for
//! tests that hold a memory estimate against what the allocator sees. Per thread, so that tests running beside
//! each other do not count each other's allocations.
use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

thread_local! {
    static NET: Cell<isize> = const { Cell::new(0) };
}

struct Counting;

// SAFETY: every call is passed to the system allocator unchanged; only a thread-local counter is kept beside it
// (a const thread-local without a destructor, usable at any point of a thread's life).
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let _ = NET.try_with(|n| n.set(n.get() + layout.size() as isize));
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        let _ = NET.try_with(|n| n.set(n.get() - layout.size() as isize));
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// The bytes this thread has allocated and not freed so far (those freed by another thread count here still).
pub(crate) fn net_bytes() -> isize {
    NET.with(Cell::get)
}
