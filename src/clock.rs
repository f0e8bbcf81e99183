//! Time, as the rest of the crate sees it: milliseconds since the Unix epoch.
//!
//! A leaf every module may import. Pure code takes a [`Millis`] argument; only the shells (the HTTP
//! handlers, the mesh event loop, the background loops) read [`now_millis`] and pass it down, so the
//! protocol core and health derivation run unchanged under the simulator's virtual clock.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Milliseconds since the Unix epoch. Wall-clock, because heartbeat times are shown to users and
/// (in the mesh) compared across nodes.
pub type Millis = u64;

/// Wall-clock now, in milliseconds since the epoch.
pub fn now_millis() -> Millis {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as Millis)
}

/// RFC 3339 UTC with milliseconds.
pub fn rfc3339(ms: Millis) -> String {
    humantime::format_rfc3339_millis(UNIX_EPOCH + Duration::from_millis(ms)).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc3339_keeps_milliseconds() {
        assert_eq!(rfc3339(1_700_000_000_123), "2023-11-14T22:13:20.123Z");
        assert!(now_millis() > 1_700_000_000_000);
    }
}
