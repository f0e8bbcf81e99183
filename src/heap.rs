//! What the heap holds live: a wrapper for the process's global allocator that counts the bytes
//! allocated and not yet freed, so that memory can be told apart from what the allocator keeps around
//! it. Resident memory that grows while the live bytes do not is the allocator's (pages holding a few
//! live blocks, freed pages not yet given back); resident memory that follows them is the program's.
//! The count is of what was asked for, touched or not: an allocation whose pages are never written
//! (sled reserves about 21 MB of metrics histograms that way) counts in full and is hardly resident, so
//! the count is compared over time and between processes, not with resident memory.
//!
//! The count is kept in [`SHARDS`] cache-line-sized counters, each thread adding to one of its own,
//! so that threads allocating at once do not contend on one line; [`live_bytes`] sums them. A block
//! freed on another thread than the one that allocated it moves bytes between shards, which the sum
//! does not notice.

use std::alloc::{GlobalAlloc, Layout};
use std::cell::Cell;
use std::sync::atomic::{AtomicIsize, AtomicUsize, Ordering};

/// Counters the threads spread over (more threads than this share them).
pub const SHARDS: usize = 16;

#[repr(align(64))]
struct Shard(AtomicIsize);

static LIVE: [Shard; SHARDS] = [const { Shard(AtomicIsize::new(0)) }; SHARDS];
static NEXT_SHARD: AtomicUsize = AtomicUsize::new(0);

thread_local! {
    /// This thread's shard, picked at its first allocation. A plain `Cell` with a constant initial
    /// value: reading it never allocates and it has no destructor, as an allocator requires.
    static MY_SHARD: Cell<usize> = const { Cell::new(usize::MAX) };
}

fn shard() -> &'static AtomicIsize {
    let at = MY_SHARD
        .try_with(|mine| {
            let mut at = mine.get();
            if at == usize::MAX {
                at = NEXT_SHARD.fetch_add(1, Ordering::Relaxed) % SHARDS;
                mine.set(at);
            }
            at
        })
        // A thread past its thread-locals (during its exit) counts on the first shard.
        .unwrap_or(0);
    &LIVE[at].0
}

fn count(bytes: isize) {
    shard().fetch_add(bytes, Ordering::Relaxed);
}

/// Bytes allocated through a [`Counting`] allocator and not freed yet (what was asked for, not the
/// allocator's size classes), or `None` when the process's allocator does not count: then every
/// counter is still at zero, which a process that counts never comes back to (it holds its runtime).
pub fn live_bytes() -> Option<u64> {
    let shards: [isize; SHARDS] = std::array::from_fn(|at| LIVE[at].0.load(Ordering::Relaxed));
    if shards.iter().all(|&n| n == 0) {
        return None;
    }
    Some(shards.iter().sum::<isize>().max(0) as u64)
}

/// `A`, counting what passes through it (see the module).
pub struct Counting<A>(pub A);

// SAFETY: every call is passed to `A` unchanged; the wrapper only counts the sizes of the calls that
// succeeded, with atomics and a thread-local that never allocate.
unsafe impl<A: GlobalAlloc> GlobalAlloc for Counting<A> {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's contract, passed on.
        let block = unsafe { self.0.alloc(layout) };
        if !block.is_null() {
            count(layout.size() as isize);
        }
        block
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's contract, passed on.
        let block = unsafe { self.0.alloc_zeroed(layout) };
        if !block.is_null() {
            count(layout.size() as isize);
        }
        block
    }

    unsafe fn dealloc(&self, block: *mut u8, layout: Layout) {
        // SAFETY: the caller's contract, passed on.
        unsafe { self.0.dealloc(block, layout) };
        count(-(layout.size() as isize));
    }

    unsafe fn realloc(&self, block: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: the caller's contract, passed on.
        let moved = unsafe { self.0.realloc(block, layout, new_size) };
        if !moved.is_null() {
            count(new_size as isize - layout.size() as isize);
        }
        moved
    }
}

#[cfg(test)]
mod tests {
    use std::alloc::System;

    use super::*;

    /// The tests of this crate run on the system allocator, so only the calls below go through the
    /// counting wrapper and the count moves by exactly what they do (this is the only test that uses it).
    #[test]
    fn live_bytes_follow_allocations_frees_and_resizes_on_any_thread() {
        let counting = Counting(System);
        let layout = Layout::from_size_align(1000, 8).unwrap();
        // SAFETY: a valid non-zero layout; the block is freed below with the layout it has then.
        let block = unsafe { counting.alloc(layout) };
        assert!(!block.is_null());
        let base = live_bytes().expect("counted once something went through the wrapper") - 1000;
        // SAFETY: `block` came from `counting` with `layout`.
        let grown = unsafe { counting.realloc(block, layout, 5000) };
        assert!(!grown.is_null());
        assert_eq!(live_bytes(), Some(base + 5000), "a resize counts the difference");
        let grown = grown as usize;
        std::thread::spawn(move || {
            let layout = Layout::from_size_align(5000, 8).unwrap();
            // SAFETY: the block `counting` resized to 5000 bytes, freed once, on another thread.
            unsafe { Counting(System).dealloc(grown as *mut u8, layout) };
        })
        .join()
        .unwrap();
        assert_eq!(live_bytes(), Some(base), "freed on another thread, the sum is back where it was");
        let zeroed = Layout::from_size_align(64, 8).unwrap();
        // SAFETY: as above.
        let block = unsafe { counting.alloc_zeroed(zeroed) };
        assert_eq!(live_bytes(), Some(base + 64));
        // SAFETY: `block` came from `counting` with `zeroed`.
        unsafe { counting.dealloc(block, zeroed) };
        assert_eq!(live_bytes(), Some(base));
    }
}
