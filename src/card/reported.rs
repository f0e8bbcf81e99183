//! What an agent says of itself: AgentField's lifecycle status, carried in heartbeats.

use serde::{Deserialize, Serialize};

/// An agent's own account of itself (AgentField's lifecycle status).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum Reported {
    Starting,
    #[default]
    Ready,
    Degraded,
    Offline,
}

impl Reported {
    pub fn as_str(self) -> &'static str {
        match self {
            Reported::Starting => "starting",
            Reported::Ready => "ready",
            Reported::Degraded => "degraded",
            Reported::Offline => "offline",
        }
    }

    /// Accepts AgentField's lifecycle names and the discovery health names, case-insensitively.
    pub fn parse(s: &str) -> Option<Reported> {
        match s.to_ascii_lowercase().as_str() {
            "starting" => Some(Reported::Starting),
            "ready" | "active" | "healthy" | "running" => Some(Reported::Ready),
            "degraded" | "unhealthy" => Some(Reported::Degraded),
            "offline" | "inactive" | "stopped" => Some(Reported::Offline),
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
            _ => Reported::Ready,
        }
    }
}
