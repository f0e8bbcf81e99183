//! Response bodies written into buffers that are used again.
//!
//! A page of 100 cards is a buffer of about 100 KB. Allocated afresh for each answer, it came back from
//! the allocator as untouched pages every time, and writing it faulted each of its pages in: about 19
//! page faults an answer, a fifth of the node's CPU under a load of random pages. A body made here
//! goes back to a small pool when the last holder of its bytes (the response being written, the
//! response cache) lets go, and the next answer writes into pages already mapped.
//!
//! The pool is bounded ([`RESPONSE_POOL_BYTES`]) and holds only buffers between
//! [`RESPONSE_POOL_MIN_BUFFER`] and [`RESPONSE_POOL_MAX_BUFFER`]: small bodies cost the allocator
//! little, and a rare large one should not stay. [`trim`] empties a pool that went unused for
//! [`RESPONSE_POOL_IDLE`], so a node that is no longer asked holds none of it.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use bytes::Bytes;

use crate::defaults::{RESPONSE_POOL_BYTES, RESPONSE_POOL_MAX_BUFFER, RESPONSE_POOL_MIN_BUFFER};

/// How long a pool may go without a buffer taken before [`trim`] empties it.
pub const RESPONSE_POOL_IDLE: Duration = Duration::from_secs(2);

/// A bounded set of empty buffers.
#[derive(Debug, Default)]
pub struct Pool {
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    buffers: Vec<Vec<u8>>,
    /// The sum of the held buffers' capacities.
    bytes: usize,
    /// When a buffer was last asked for.
    last_take: Option<Instant>,
}

impl Pool {
    pub const fn new() -> Self {
        Self { state: Mutex::new(State { buffers: Vec::new(), bytes: 0, last_take: None }) }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// An empty buffer with room for at least `capacity` bytes, of the size class of `capacity` (the
    /// next of eight steps between two powers of two): a held one when there is one of that class, else
    /// a new one.
    pub fn take(&self, capacity: usize, now: Instant) -> Vec<u8> {
        if !pooled(capacity) {
            return Vec::with_capacity(capacity);
        }
        let size = class(capacity);
        let mut state = self.state();
        state.last_take = Some(now);
        match state.buffers.iter().position(|b| b.capacity() == size) {
            Some(at) => {
                let buffer = state.buffers.swap_remove(at);
                state.bytes -= buffer.capacity();
                buffer
            }
            None => {
                drop(state);
                Vec::with_capacity(size)
            }
        }
    }

    /// Keeps `buffer` for a later [`take`](Self::take) when it is of a size class the pool holds and
    /// there is room; else frees it. A body that outgrew its buffer is of no class, and no take would
    /// ever find it.
    pub fn give(&self, mut buffer: Vec<u8>) {
        let size = buffer.capacity();
        if !pooled(size) || class(size) != size {
            return;
        }
        let mut state = self.state();
        if state.bytes + size <= RESPONSE_POOL_BYTES {
            buffer.clear();
            state.bytes += size;
            state.buffers.push(buffer);
        }
    }

    /// Frees every held buffer when none was taken for [`RESPONSE_POOL_IDLE`]; whether it did.
    pub fn trim(&self, now: Instant) -> bool {
        let mut state = self.state();
        let idle = state.last_take.is_none_or(|at| now.saturating_duration_since(at) >= RESPONSE_POOL_IDLE);
        if !idle || state.buffers.is_empty() {
            return false;
        }
        let freed = std::mem::take(&mut state.buffers);
        state.bytes = 0;
        drop(state);
        drop(freed);
        true
    }

    /// Bytes held (the buffers' capacities).
    pub fn held(&self) -> usize {
        self.state().bytes
    }
}

/// Whether buffers of `size` bytes are kept (a class of a pooled size is one too).
fn pooled(size: usize) -> bool {
    (RESPONSE_POOL_MIN_BUFFER..=RESPONSE_POOL_MAX_BUFFER).contains(&size)
}

/// `capacity` rounded up to the next of eight steps between two powers of two: pages of one query
/// differ by a few hundred bytes, and a buffer serves every body of its class, less than a quarter
/// larger than asked (the response cache counts a body by its buffer).
fn class(capacity: usize) -> usize {
    let step = (capacity.next_power_of_two() / 8).max(1);
    capacity.div_ceil(step) * step
}

/// The pool response bodies are written into.
static BODIES: Pool = Pool::new();

/// An empty buffer for a response body of about `capacity` bytes.
pub fn take(capacity: usize) -> Vec<u8> {
    BODIES.take(capacity, Instant::now())
}

/// `body` as shared bytes whose buffer goes back to the pool once the last clone is dropped.
pub fn share(body: Vec<u8>) -> Bytes {
    share_into(&BODIES, body)
}

fn share_into(pool: &'static Pool, body: Vec<u8>) -> Bytes {
    Bytes::from_owner(Returned { pool, body })
}

/// Empties the pool when no body was made for a while (the runtime's idle hook calls it).
pub fn trim() {
    BODIES.trim(Instant::now());
}

/// A body's buffer, handed back to its pool when dropped.
struct Returned {
    pool: &'static Pool,
    body: Vec<u8>,
}

impl AsRef<[u8]> for Returned {
    fn as_ref(&self) -> &[u8] {
        &self.body
    }
}

impl Drop for Returned {
    fn drop(&mut self) {
        self.pool.give(std::mem::take(&mut self.body));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A page of about 100 agents, rounded to its size class.
    const PAGE: usize = 112 * 1024;

    #[test]
    fn a_buffer_given_back_is_taken_again_empty_with_its_pages() {
        let pool = Pool::new();
        let now = Instant::now();
        let mut first = pool.take(PAGE, now);
        first.extend_from_slice(&[7; PAGE]);
        let at = first.as_ptr();
        pool.give(first);
        assert_eq!(pool.held(), PAGE);
        let again = pool.take(PAGE - 10, now);
        assert_eq!((again.as_ptr(), again.len()), (at, 0), "the same allocation, emptied");
        assert!(again.capacity() >= PAGE);
        assert_eq!(pool.held(), 0);
    }

    #[test]
    fn it_holds_only_buffers_of_its_sizes_and_no_more_than_its_bound() {
        let pool = Pool::new();
        let now = Instant::now();
        pool.give(Vec::with_capacity(RESPONSE_POOL_MIN_BUFFER - 1));
        pool.give(Vec::with_capacity(RESPONSE_POOL_MAX_BUFFER + 1));
        pool.give(Vec::with_capacity(PAGE + 1));
        assert_eq!(pool.held(), 0, "too small, too large and of no class are freed");
        for _ in 0..RESPONSE_POOL_BYTES / PAGE + 5 {
            pool.give(Vec::with_capacity(PAGE));
        }
        assert!(pool.held() <= RESPONSE_POOL_BYTES && pool.held() > RESPONSE_POOL_BYTES - PAGE);
        // A held buffer of another size class is not handed out.
        let small = pool.take(RESPONSE_POOL_MIN_BUFFER, now);
        assert_eq!(small.capacity(), RESPONSE_POOL_MIN_BUFFER);
    }

    #[test]
    fn sizes_round_up_to_an_eighth_of_their_power_of_two() {
        assert_eq!(class(16 * 1024), 16 * 1024);
        assert_eq!(class(100 * 1024), 112 * 1024);
        assert_eq!(class(97 * 1024), 112 * 1024, "pages of a query a little apart share a class");
        assert_eq!(class(96 * 1024), 96 * 1024);
        assert_eq!(class(129 * 1024), 160 * 1024);
        for n in [16_384, 20_000, 99_999, 100_001, 1 << 20] {
            assert!(class(n) >= n && class(n) - n < n / 4, "{n}");
        }
    }

    #[test]
    fn an_unused_pool_is_emptied_and_a_used_one_kept() {
        let pool = Pool::new();
        let start = Instant::now();
        let taken = pool.take(PAGE, start);
        pool.give(taken);
        assert!(!pool.trim(start + RESPONSE_POOL_IDLE / 2), "used a moment ago");
        assert_eq!(pool.held(), PAGE);
        assert!(pool.trim(start + RESPONSE_POOL_IDLE));
        assert_eq!(pool.held(), 0);
    }

    #[test]
    fn shared_bytes_read_as_the_body_and_return_their_buffer_when_the_last_clone_goes() {
        static POOL: Pool = Pool::new();
        let mut body = POOL.take(PAGE, Instant::now());
        body.extend_from_slice(b"{\"capabilities\":[]}");
        let bytes = share_into(&POOL, body);
        let clone = bytes.slice(1..);
        assert_eq!(&bytes[..], b"{\"capabilities\":[]}");
        drop(bytes);
        assert_eq!(POOL.held(), 0, "a slice still holds it");
        assert_eq!(&clone[..4], b"\"cap");
        drop(clone);
        assert_eq!(POOL.held(), PAGE, "back in the pool");
    }
}
