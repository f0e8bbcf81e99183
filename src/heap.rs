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
//!
//! The module also keeps the allocator's purge policy ([`manage_purge_delay`]): freed pages go back to
//! the system at once, except during a burst of allocation ([`burst`], a catch-up's sync answers),
//! when they are kept a while because the next batch would fault them in again; when the burst ends
//! every thread hands back what it kept.

use std::alloc::{GlobalAlloc, Layout};
use std::cell::Cell;
use std::sync::atomic::{AtomicIsize, AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use crate::clock::{now_millis, Millis};

/// Counters the threads spread over (more threads than this share them).
pub const SHARDS: usize = 16;

#[repr(align(64))]
struct Shard(AtomicIsize);

static LIVE: [Shard; SHARDS] = [const { Shard(AtomicIsize::new(0)) }; SHARDS];
static NEXT_SHARD: AtomicUsize = AtomicUsize::new(0);

/// What a thread keeps for the allocator's bookkeeping. Plain `Cell`s with constant initial values:
/// reading them never allocates and they have no destructor, as an allocator requires.
struct Mine {
    /// This thread's shard, picked at its first allocation.
    shard: Cell<usize>,
    /// The bursts ended as of this thread's last hand-back ([`count_free`]).
    seen_ended: Cell<usize>,
}

thread_local! {
    static MINE: Mine = const { Mine { shard: Cell::new(usize::MAX), seen_ended: Cell::new(0) } };
}

fn shard_of(mine: &Mine) -> usize {
    let mut at = mine.shard.get();
    if at == usize::MAX {
        at = NEXT_SHARD.fetch_add(1, Ordering::Relaxed) % SHARDS;
        mine.shard.set(at);
    }
    at
}

fn count(bytes: isize) {
    // A thread past its thread-locals (during its exit) counts on the first shard.
    let at = MINE.try_with(shard_of).unwrap_or(0);
    LIVE[at].0.fetch_add(bytes, Ordering::Relaxed);
}

/// [`count`] for a free, with one look at the thread's locals. The first free on a thread after a
/// burst ended ([`bursting`]) hands back what the thread kept during it ([`collect_thread`]): a page
/// freed with the burst's delay on a thread that then slept (sled's I/O threads, after a catch-up's
/// writes) stayed resident, 12 MB on a node that had just caught up with 10,000 agents.
fn count_free(bytes: isize) {
    let ended = BURSTS_ENDED.load(Ordering::Relaxed);
    let (at, due) =
        MINE.try_with(|mine| (shard_of(mine), mine.seen_ended.replace(ended) != ended)).unwrap_or((0, false));
    LIVE[at].0.fetch_add(bytes, Ordering::Relaxed);
    if due {
        collect_thread();
    }
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
        count_free(-(layout.size() as isize));
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

/// mimalloc's `mi_option_purge_delay` (`mimalloc.h` of the version the lock file pins; the sys crate
/// does not name it).
pub const MI_OPTION_PURGE_DELAY: libmimalloc_sys::mi_option_t = 15;

/// A burst of allocation ends once this long went by without a new mark ([`burst`]).
pub const BURST_QUIET: Duration = Duration::from_secs(3);
/// A burst ends after this long whatever the marks, and the next starts only after a quiet period: a
/// node under steady churn hands pages back as a calm one does.
pub const BURST_LONGEST: Duration = Duration::from_secs(30);

fn ms(d: Duration) -> Millis {
    d.as_millis() as Millis
}

/// The bursts' marks: the pure part of the purge policy, time given.
#[derive(Debug, Default)]
pub struct Bursts {
    /// When the burst on started.
    started: Option<Millis>,
    /// The last mark, whether a burst is on or was cut off.
    last: Option<Millis>,
}

impl Bursts {
    /// A mark at `now`; true when it starts a burst.
    pub fn mark(&mut self, now: Millis) -> bool {
        let starts = self.last.is_none();
        if starts {
            self.started = Some(now);
        }
        self.last = Some(now);
        starts
    }

    /// Whether a burst is on.
    pub fn on(&self) -> bool {
        self.started.is_some()
    }

    /// True when a burst was on and ended at `now`: nothing marked for [`BURST_QUIET`], or on for
    /// [`BURST_LONGEST`] (then marks start no new one until a quiet period).
    pub fn settle(&mut self, now: Millis) -> bool {
        let Some(last) = self.last else { return false };
        if now.saturating_sub(last) >= ms(BURST_QUIET) {
            self.last = None;
            return self.started.take().is_some();
        }
        self.started.take_if(|started| now.saturating_sub(*started) >= ms(BURST_LONGEST)).is_some()
    }
}

/// Bursts ended so far: a thread that has seen fewer hands back what it kept at its next free.
static BURSTS_ENDED: AtomicUsize = AtomicUsize::new(0);

/// Hands back what the calling thread's heap holds free (`mi_collect(true)`): its freed pages, and the
/// blocks other threads freed on them. mimalloc does so for a thread only when that thread itself
/// allocates, frees or collects.
pub fn collect_thread() {
    // SAFETY: collects the calling thread's own heap, which mimalloc allows at any time; it touches
    // no live allocation and allocates nothing through the global allocator (so it may run inside
    // `Counting::dealloc`, once the free has returned).
    unsafe { libmimalloc_sys::mi_collect(true) };
}

/// The purge policy, once [`manage_purge_delay`] set it.
struct Policy {
    /// Purge delays in ms, calm and during a burst.
    calm: i64,
    burst: i64,
    bursts: Bursts,
}

static POLICY: Mutex<Option<Policy>> = Mutex::new(None);

fn policy() -> std::sync::MutexGuard<'static, Option<Policy>> {
    POLICY.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn set_purge_delay(ms: i64) {
    // SAFETY: sets one of mimalloc's process-wide options, which it reads atomically. In a process whose
    // allocator is another, mimalloc's options are set and never read.
    unsafe { libmimalloc_sys::mi_option_set(MI_OPTION_PURGE_DELAY, ms) };
}

/// Has the allocator hand freed pages back after `calm` ms, and keep them `burst` ms during a burst
/// of allocation ([`burst`]), when the next batch of the same work would fault them in again. Until
/// it is called (the library's tests, a process whose environment sets the delay), marks do nothing.
pub fn manage_purge_delay(calm: i64, burst: i64) {
    *policy() = Some(Policy { calm, burst, bursts: Bursts::default() });
    set_purge_delay(calm);
}

/// Marks a burst of allocation (a catch-up's sync answer): freed pages are kept for the burst's delay
/// until [`BURST_QUIET`] passes without a mark.
pub fn burst() {
    if let Some(p) = policy().as_mut() {
        if p.bursts.mark(now_millis()) {
            set_purge_delay(p.burst);
        }
    }
}

/// Whether a burst is on, once a burst that has gone quiet has ended: freed pages are then handed
/// back at once again, and every thread hands back what it kept at its next free. While it is on,
/// collecting would hand back the pages the burst keeps.
pub fn bursting() -> bool {
    let mut policy = policy();
    let Some(p) = policy.as_mut() else { return false };
    if p.bursts.settle(now_millis()) {
        set_purge_delay(p.calm);
        BURSTS_ENDED.fetch_add(1, Ordering::Relaxed);
    }
    p.bursts.on()
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

    #[test]
    fn a_burst_lasts_until_marks_stop_for_the_quiet_period_and_never_longer_than_its_bound() {
        let (quiet, longest) = (ms(BURST_QUIET), ms(BURST_LONGEST));
        let mut bursts = Bursts::default();
        assert!(!bursts.settle(0), "calm: nothing to end");
        assert!(bursts.mark(100), "the first mark starts a burst");
        assert!(!bursts.mark(2_000), "later marks extend it");
        assert!(!bursts.settle(2_000 + quiet - 1), "not quiet long enough");
        assert!(bursts.on());
        assert!(bursts.settle(2_000 + quiet), "quiet since the last mark: ended");
        assert!(!bursts.on() && !bursts.settle(60_000), "ended once");

        let start = 100_000;
        assert!(bursts.mark(start), "a new mark starts a new burst");
        let mut now = start;
        while now < start + longest {
            assert!(!bursts.settle(now) && bursts.on(), "marked without a pause: on until its bound");
            now += 500;
            bursts.mark(now);
        }
        assert!(bursts.settle(now), "on for its longest: ended");
        assert!(!bursts.mark(now + 500) && !bursts.on(), "marks without a pause start none");
        assert!(!bursts.settle(now + 500 + quiet), "the quiet period ends nothing more");
        assert!(bursts.mark(now + 600 + quiet), "after it, a mark starts a burst again");
    }
}
