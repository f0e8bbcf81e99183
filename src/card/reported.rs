//! What an agent says of itself: AgentField's lifecycle status, carried in heartbeats.

use serde::{Deserialize, Serialize};

/// An agent's own account of itself (AgentField's lifecycle status, plus `busy` and `draining`).
///
/// `busy` (at capacity, still serving) and `draining` (finishing its work before it leaves, taking no
/// new work) are alive for health, and are the agent's [`Lifecycle`] besides `ready`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum Reported {
    Starting = 0,
    #[default]
    Ready = 1,
    Degraded = 2,
    Offline = 3,
    Busy = 4,
    Draining = 5,
}

/// Whether an agent takes new work, as it says: the `lifecycle` discovery filter and field.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Lifecycle {
    /// Everything but busy and draining: health says the rest.
    Ready,
    Busy,
    Draining,
}

impl Lifecycle {
    pub fn as_str(self) -> &'static str {
        match self {
            Lifecycle::Ready => "ready",
            Lifecycle::Busy => "busy",
            Lifecycle::Draining => "draining",
        }
    }

    pub fn parse(s: &str) -> Option<Lifecycle> {
        match s.to_ascii_lowercase().as_str() {
            "ready" => Some(Lifecycle::Ready),
            "busy" => Some(Lifecycle::Busy),
            "draining" => Some(Lifecycle::Draining),
            _ => None,
        }
    }
}

impl Reported {
    pub fn as_str(self) -> &'static str {
        match self {
            Reported::Starting => "starting",
            Reported::Ready => "ready",
            Reported::Degraded => "degraded",
            Reported::Offline => "offline",
            Reported::Busy => "busy",
            Reported::Draining => "draining",
        }
    }

    /// The lifecycle this state means.
    pub fn lifecycle(self) -> Lifecycle {
        match self {
            Reported::Busy => Lifecycle::Busy,
            Reported::Draining => Lifecycle::Draining,
            _ => Lifecycle::Ready,
        }
    }

    /// Accepts AgentField's lifecycle names and the discovery health names, case-insensitively.
    pub fn parse(s: &str) -> Option<Reported> {
        match s.to_ascii_lowercase().as_str() {
            "starting" => Some(Reported::Starting),
            "ready" | "active" | "healthy" | "running" => Some(Reported::Ready),
            "degraded" | "unhealthy" => Some(Reported::Degraded),
            "offline" | "inactive" | "stopped" => Some(Reported::Offline),
            "busy" => Some(Reported::Busy),
            "draining" | "stopping" => Some(Reported::Draining),
            _ => None,
        }
    }

    pub(crate) fn to_u8(self) -> u8 {
        self as u8
    }

    pub(crate) fn from_u8(v: u8) -> Reported {
        match v {
            0 => Reported::Starting,
            2 => Reported::Degraded,
            3 => Reported::Offline,
            4 => Reported::Busy,
            5 => Reported::Draining,
            _ => Reported::Ready,
        }
    }
}
