//! One render step per discovery format. Each takes the same [`Selection`] and returns the body bytes.

pub mod compact;
pub mod json;
pub mod xml;

use crate::card::AgentCard;
use crate::registry::health::Millis;

/// RFC 3339 UTC with milliseconds.
pub fn rfc3339(ms: Millis) -> String {
    let t = std::time::UNIX_EPOCH + std::time::Duration::from_millis(ms);
    humantime::format_rfc3339_millis(t).to_string()
}

/// `<agent_id>:<reasoner_id>`.
pub fn reasoner_target(card: &AgentCard, reasoner: usize) -> String {
    format!("{}:{}", card.agent_id, card.reasoners[reasoner].id)
}

/// `<agent_id>:skill:<skill_id>`.
pub fn skill_target(card: &AgentCard, skill: usize) -> String {
    format!("{}:skill:{}", card.agent_id, card.skills[skill].id)
}
