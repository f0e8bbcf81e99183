//! One render step per discovery format. Each takes the same [`Selection`](crate::query::Selection) and
//! returns the body bytes. Page hits are read through [`CardRef`](crate::card::held::CardRef), a
//! zero-copy view of the held card.

pub mod compact;
pub mod json;
pub mod xml;

/// `<agent_id>:<reasoner_id>`.
pub fn reasoner_target(agent_id: &str, reasoner_id: &str) -> String {
    format!("{agent_id}:{reasoner_id}")
}

/// `<agent_id>:skill:<skill_id>`.
pub fn skill_target(agent_id: &str, skill_id: &str) -> String {
    format!("{agent_id}:skill:{skill_id}")
}
