//! Health is derived, never stored: a pure function of the last heartbeat's age, what the agent last
//! reported about itself, and the thresholds.

use std::time::Duration;

use serde::{Deserialize, Serialize};

pub use crate::card::reported::Reported;
pub use crate::clock::Millis;

/// What discovery reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Health {
    Active,
    Degraded,
    Inactive,
    Unknown,
}

impl Health {
    pub const ALL: [Health; 4] = [Health::Active, Health::Inactive, Health::Degraded, Health::Unknown];

    pub fn as_str(self) -> &'static str {
        match self {
            Health::Active => "active",
            Health::Degraded => "degraded",
            Health::Inactive => "inactive",
            Health::Unknown => "unknown",
        }
    }

    /// Case-insensitive parse of the four names.
    pub fn parse(s: &str) -> Option<Health> {
        Health::ALL.into_iter().find(|h| h.as_str().eq_ignore_ascii_case(s))
    }
}

/// When heartbeats count as late. `degraded_after < inactive_after` (checked by config validation).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Thresholds {
    pub degraded_after: Duration,
    pub inactive_after: Duration,
}

impl Default for Thresholds {
    fn default() -> Self {
        Self {
            degraded_after: crate::defaults::DEGRADED_AFTER,
            inactive_after: crate::defaults::INACTIVE_AFTER,
        }
    }
}

impl Thresholds {
    /// Health at `now` of an agent last heard of at `last` (None: never), that last reported `reported`.
    pub fn health(&self, now: Millis, last: Option<Millis>, reported: Reported) -> Health {
        let Some(last) = last else {
            return Health::Unknown;
        };
        let age = now.saturating_sub(last);
        let by_age = if age >= self.inactive_after.as_millis() as u64 {
            Health::Inactive
        } else if age >= self.degraded_after.as_millis() as u64 {
            Health::Degraded
        } else {
            Health::Active
        };
        match (by_age, reported) {
            (Health::Inactive, _) | (_, Reported::Offline) => Health::Inactive,
            (_, Reported::Degraded) => Health::Degraded,
            (h, _) => h,
        }
    }

    /// The next instant after `now` at which `health` would change if no heartbeat arrived, or None
    /// when only a heartbeat can change it.
    pub fn next_change(&self, now: Millis, last: Option<Millis>) -> Option<Millis> {
        let last = last?;
        let degraded = last.saturating_add(self.degraded_after.as_millis() as u64);
        let inactive = last.saturating_add(self.inactive_after.as_millis() as u64);
        [degraded, inactive].into_iter().find(|&t| t > now)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const T: Thresholds =
        Thresholds { degraded_after: Duration::from_secs(7), inactive_after: Duration::from_secs(20) };

    #[test]
    fn health_follows_heartbeat_age() {
        let last = 1_000_000;
        assert_eq!(T.health(last, None, Reported::Ready), Health::Unknown);
        assert_eq!(T.health(last, Some(last), Reported::Ready), Health::Active);
        assert_eq!(T.health(last + 6_999, Some(last), Reported::Ready), Health::Active);
        assert_eq!(T.health(last + 7_000, Some(last), Reported::Ready), Health::Degraded);
        assert_eq!(T.health(last + 19_999, Some(last), Reported::Ready), Health::Degraded);
        assert_eq!(T.health(last + 20_000, Some(last), Reported::Ready), Health::Inactive);
        // A heartbeat from the future (clock skew) counts as fresh, not as a panic.
        assert_eq!(T.health(last - 5, Some(last), Reported::Ready), Health::Active);
    }

    #[test]
    fn reported_status_counts() {
        let t = 5_000;
        assert_eq!(T.health(t, Some(t), Reported::Degraded), Health::Degraded);
        assert_eq!(T.health(t, Some(t), Reported::Offline), Health::Inactive);
        assert_eq!(T.health(t, Some(t), Reported::Starting), Health::Active);
        assert_eq!(T.health(t + 30_000, Some(t), Reported::Degraded), Health::Inactive);
    }

    #[test]
    fn next_change_is_the_next_threshold() {
        assert_eq!(T.next_change(0, None), None);
        assert_eq!(T.next_change(1_000, Some(1_000)), Some(8_000));
        assert_eq!(T.next_change(8_000, Some(1_000)), Some(21_000));
        assert_eq!(T.next_change(21_000, Some(1_000)), None);
    }

    #[test]
    fn names_parse_case_insensitively() {
        assert_eq!(Health::parse("ACTIVE"), Some(Health::Active));
        assert_eq!(Health::parse("gone"), None);
        assert_eq!(Reported::parse("Offline"), Some(Reported::Offline));
        assert_eq!(Reported::from_u8(Reported::Degraded.to_u8()), Reported::Degraded);
    }
}
