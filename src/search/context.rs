//! Tiered context for a prompt: what an LLM agent needs to pick a capability, under hard token budgets.
//!
//! - Tier 0: the categories of the whole view, with counts and a few capability ids. It depends on
//!   the view alone (no health, nothing from the query), so it is byte-identical for every query and
//!   on every node holding the same view: a provider's prompt cache can keep it.
//! - Tier 1: one line per top result for the query.
//! - Tier 2: the full detail of the very best: description, parameters as readable lines, output,
//!   side effects, secrets, target.
//!
//! Every tier is cut at an entry boundary so that it never exceeds its budget, and says how many
//! entries it left out.

use std::collections::BTreeMap;

use serde::Serialize;
use serde_json::Value;

use super::Found;
use crate::card::held::CardRef;
use crate::registry::Snapshot;

/// Default budgets and sizes (API contract).
pub const TIER0_TOKENS: usize = 200;
pub const TIER1_TOKENS: usize = 800;
pub const TIER1_TOP_K: usize = 5;
pub const TIER2_TOKENS: usize = 2000;
pub const TIER2_TOP_K: usize = 2;
/// Largest budget accepted for one tier.
pub const MAX_TIER_TOKENS: usize = 32_000;
/// Most entries accepted for Tier 1 and Tier 2.
pub const MAX_TOP_K: usize = 50;
/// Capability ids shown per category in Tier 0.
const NAMES_PER_CATEGORY: usize = 4;
/// Longest one-line summary in Tier 1, in characters.
const MAX_SUMMARY_CHARS: usize = 160;
/// Category of capabilities that name none (nor does their agent).
pub const UNCATEGORIZED: &str = "other";

/// How text is counted in tokens.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum Counter {
    /// Four characters per token, rounded up: the usual estimate for English text.
    #[default]
    Chars4,
    /// Exact: OpenAI's `cl100k_base` encoding (GPT-4, GPT-3.5).
    Cl100kBase,
    /// Exact: OpenAI's `o200k_base` encoding (GPT-4o and later).
    O200kBase,
}

impl Counter {
    /// Every counter, by [`Counter::name`].
    pub const ALL: [Counter; 3] = [Counter::Chars4, Counter::Cl100kBase, Counter::O200kBase];

    pub fn count(self, text: &str) -> usize {
        match self {
            Counter::Chars4 => text.chars().count().div_ceil(4),
            // Special-token text (`<|endoftext|>`) is counted as the ordinary text it is here.
            Counter::Cl100kBase => tiktoken_rs::cl100k_base_singleton().count_ordinary(text),
            Counter::O200kBase => tiktoken_rs::o200k_base_singleton().count_ordinary(text),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Counter::Chars4 => "chars/4",
            Counter::Cl100kBase => "cl100k_base",
            Counter::O200kBase => "o200k_base",
        }
    }

    /// The counter named `name` (`chars4` also names the estimate).
    pub fn parse(name: &str) -> Option<Counter> {
        let name = name.to_ascii_lowercase();
        if name == "chars4" {
            return Some(Counter::Chars4);
        }
        Counter::ALL.into_iter().find(|c| c.name() == name)
    }

    /// Loads the counter's tables now (a first exact count otherwise pays for it).
    pub fn warm(self) {
        self.count("warm");
    }
}

/// One tier: its text, its size, and what was left out.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct Tier {
    pub text: String,
    pub tokens: usize,
    pub entries: usize,
    pub omitted: usize,
}

/// Builds a tier from a heading and entries: as many whole entries as fit in `budget`, then a line
/// saying how many were left out when that fits too.
pub fn build(counter: Counter, budget: usize, heading: &str, entries: &[String]) -> Tier {
    let fits = |text: &str| counter.count(text) <= budget;
    let mut text = String::new();
    if entries.is_empty() || !fits(heading) {
        return Tier { text, tokens: 0, entries: 0, omitted: entries.len() };
    }
    text.push_str(heading);
    let mut taken = 0;
    for entry in entries {
        let before = text.len();
        text.push_str(entry);
        if !fits(&text) {
            text.truncate(before);
            break;
        }
        taken += 1;
    }
    let omitted = entries.len() - taken;
    if taken == 0 {
        text.clear();
    } else if omitted > 0 {
        let before = text.len();
        text.push_str(&format!("(+{omitted} more not shown)\n"));
        if !fits(&text) {
            text.truncate(before);
        }
    }
    Tier { tokens: counter.count(&text), text, entries: taken, omitted }
}

/// The budgets and sizes of the three tiers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Budgets {
    pub tier0: usize,
    pub tier1: usize,
    pub tier1_top_k: usize,
    pub tier2: usize,
    pub tier2_top_k: usize,
}

impl Default for Budgets {
    fn default() -> Self {
        Self {
            tier0: TIER0_TOKENS,
            tier1: TIER1_TOKENS,
            tier1_top_k: TIER1_TOP_K,
            tier2: TIER2_TOKENS,
            tier2_top_k: TIER2_TOP_K,
        }
    }
}

/// The three tiers of one answer.
#[derive(Debug, Clone, Serialize)]
pub struct Tiers {
    pub tier0: Tier,
    pub tier1: Tier,
    pub tier2: Tier,
}

impl Tiers {
    /// Tiers 1 and 2 for `results` (best first) beside `tier0`. `for_text`: the tiers will be joined
    /// by [`join`], so one token of each later budget pays for its separator.
    pub fn new(tier0: Tier, results: &[Found], budgets: &Budgets, counter: Counter, for_text: bool) -> Self {
        let reserve = usize::from(for_text);
        let top = |k: usize| &results[..results.len().min(k)];
        let tier1 = build(
            counter,
            budgets.tier1.saturating_sub(reserve),
            "Capabilities that match the request (target (relevance): summary):\n",
            &tier1_entries(top(budgets.tier1_top_k)),
        );
        let tier2 = build(
            counter,
            budgets.tier2.saturating_sub(reserve),
            "Details of the best matches:\n",
            &tier2_entries(top(budgets.tier2_top_k)),
        );
        Self { tier0, tier1, tier2 }
    }

    pub fn total_tokens(&self) -> usize {
        self.tier0.tokens + self.tier1.tokens + self.tier2.tokens
    }

    /// The prompt-ready text: within the sum of the budgets when built `for_text`.
    pub fn text(&self) -> String {
        join(&[&self.tier0, &self.tier1, &self.tier2])
    }
}

/// The tiers' texts joined by blank lines (empty tiers left out), for `format=text`. With
/// [`Counter::Chars4`] the result counts at most one token more than the tiers together: callers
/// build the second and third tiers with one token less.
pub fn join(tiers: &[&Tier]) -> String {
    let parts: Vec<&str> =
        tiers.iter().map(|t| t.text.trim_end_matches('\n')).filter(|t| !t.is_empty()).collect();
    let mut out = parts.join("\n\n");
    if !out.is_empty() {
        out.push('\n');
    }
    out
}

/// Tier 0 entries: one line per category, most capabilities first, from the view alone.
pub fn tier0_entries(snapshot: &Snapshot) -> (String, Vec<String>) {
    let mut categories: BTreeMap<String, (usize, Vec<String>)> = BTreeMap::new();
    let mut seen = std::collections::HashSet::new();
    let mut total = 0;
    for entry in &snapshot.entries {
        let card_text = entry.card.text();
        let card = card_text.view();
        for (kind, list) in [("reasoner", &card.reasoners), ("skill", &card.skills)] {
            for cap in list {
                // The same agent from several publishers counts once.
                if !seen.insert(format!("{}:{kind}:{}", card.agent_id, cap.id)) {
                    continue;
                }
                total += 1;
                let category = cap.category_in(&card).unwrap_or(UNCATEGORIZED).to_owned();
                let slot = categories.entry(category).or_default();
                slot.0 += 1;
                slot.1.push(cap.id.to_string());
            }
        }
    }
    let mut list: Vec<(String, usize, Vec<String>)> =
        categories.into_iter().map(|(name, (count, ids))| (name, count, ids)).collect();
    list.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    let heading = format!("Capabilities on the mesh: {total} in {} categories.\n", list.len());
    let entries = list
        .into_iter()
        .map(|(name, count, mut ids)| {
            ids.sort();
            ids.dedup();
            let shown: Vec<&str> = ids.iter().take(NAMES_PER_CATEGORY).map(String::as_str).collect();
            let more = if ids.len() > shown.len() { ", ..." } else { "" };
            format!("- {name} ({count}): {}{more}\n", shown.join(", "))
        })
        .collect();
    (heading, entries)
}

/// Tier 1 entries: one line per result.
pub fn tier1_entries(results: &[Found]) -> Vec<String> {
    results.iter().map(|f| format!("- {} ({:.2}): {}\n", f.target, f.relevance, summary(f))).collect()
}

/// A result's one-line summary: the first sentence of its description, or its id.
pub fn summary(f: &Found) -> String {
    let card_text = f.entry.card.text();
    let card = card_text.view();
    let summary =
        capability(&card, f).and_then(|c| c.description.as_deref()).map(first_sentence).unwrap_or_default();
    if summary.is_empty() {
        f.id.clone()
    } else {
        summary
    }
}

/// Tier 2 entries: the full detail of each result.
pub fn tier2_entries(results: &[Found]) -> Vec<String> {
    results.iter().map(detail).collect()
}

fn capability<'a, 'b>(card: &'b CardRef<'a>, f: &Found) -> Option<&'b crate::card::held::CapRef<'a>> {
    let list = if f.reasoner { &card.reasoners } else { &card.skills };
    list.get(f.cap)
}

/// The full detail of one result, as prompt-ready text.
pub fn detail(f: &Found) -> String {
    let card_text = f.entry.card.text();
    let card = card_text.view();
    let Some(cap) = capability(&card, f) else { return String::new() };
    let mut out = format!("### {}\n", f.target);
    let name = cap.name.as_deref().unwrap_or(&cap.id);
    out.push_str(&format!("{} ({} of agent {}", name, f.kind(), card.agent_id));
    if let Some(category) = cap.category_in(&card) {
        out.push_str(&format!(", category {category}"));
    }
    out.push_str(&format!(", {})\n", f.health.as_str()));
    if let Some(d) = cap.description.as_deref().filter(|d| !d.is_empty()) {
        out.push_str(d.trim());
        out.push('\n');
    }
    if let Some(schema) = cap.input_schema {
        let lines = parameter_lines(schema.get());
        if !lines.is_empty() {
            out.push_str("Parameters:\n");
            out.push_str(&lines);
        }
    }
    if let Some(schema) = cap.output_schema {
        let lines = parameter_lines(schema.get());
        if !lines.is_empty() {
            out.push_str("Returns:\n");
            out.push_str(&lines);
        }
    }
    if cap.has_side_effects {
        out.push_str("Has side effects: yes\n");
    }
    if !cap.required_secrets.is_empty() {
        out.push_str(&format!("Needs secrets: {}\n", cap.required_secrets.join(", ")));
    }
    if !cap.requires.is_empty() {
        out.push_str(&format!("Requires: {}\n", cap.requires.join(", ")));
    }
    out.push_str(&format!("Call: {} at {}\n", f.target, card.base_url));
    out
}

/// A JSON Schema's top-level properties as `- name (type, required): description` lines.
pub fn parameter_lines(schema: &str) -> String {
    let Ok(Value::Object(root)) = serde_json::from_str::<Value>(schema) else { return String::new() };
    let required: Vec<&str> = root
        .get("required")
        .and_then(Value::as_array)
        .map(|a| a.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    let mut out = String::new();
    let Some(Value::Object(props)) = root.get("properties") else {
        if let Some(t) = root.get("type").and_then(Value::as_str) {
            out.push_str(&format!("- ({t})\n"));
        }
        return out;
    };
    for (name, prop) in props {
        let ty = match prop.get("type") {
            Some(Value::String(t)) => t.clone(),
            Some(Value::Array(ts)) => ts.iter().filter_map(Value::as_str).collect::<Vec<_>>().join("|"),
            _ => "any".to_owned(),
        };
        let mut facts = vec![ty];
        if required.contains(&name.as_str()) {
            facts.push("required".to_owned());
        }
        if let Some(Value::Array(values)) = prop.get("enum") {
            let values: Vec<String> = values.iter().take(8).map(Value::to_string).collect();
            facts.push(format!("one of {}", values.join(", ")));
        }
        if let Some(default) = prop.get("default") {
            facts.push(format!("default {default}"));
        }
        out.push_str(&format!("- {name} ({})", facts.join(", ")));
        if let Some(d) = prop.get("description").and_then(Value::as_str) {
            out.push_str(": ");
            out.push_str(d.trim());
        }
        out.push('\n');
    }
    out
}

/// The first sentence of a description, at most `MAX_SUMMARY_CHARS` characters, on one line.
fn first_sentence(text: &str) -> String {
    let flat: String = text.split_whitespace().collect::<Vec<_>>().join(" ");
    let end = flat
        .char_indices()
        .find(|&(i, c)| c == '.' && flat[i + 1..].starts_with(' '))
        .map_or(flat.len(), |(i, _)| i + 1);
    let sentence = &flat[..end];
    match sentence.char_indices().nth(MAX_SUMMARY_CHARS) {
        Some((cut, _)) => format!("{}...", sentence[..cut].trim_end()),
        None => sentence.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tier_never_exceeds_its_budget_and_counts_what_it_left_out() {
        let entries: Vec<String> = (0..10).map(|i| format!("- entry number {i} with some words\n")).collect();
        for budget in 0..120 {
            let tier = build(Counter::Chars4, budget, "Heading:\n", &entries);
            assert!(tier.tokens <= budget, "budget {budget}: {tier:?}");
            assert_eq!(tier.tokens, Counter::Chars4.count(&tier.text));
            assert_eq!(tier.entries + tier.omitted, entries.len());
        }
        let all = build(Counter::Chars4, 10_000, "Heading:\n", &entries);
        assert_eq!((all.entries, all.omitted), (10, 0));
    }

    #[test]
    fn parameters_read_as_lines() {
        let lines = parameter_lines(
            r#"{"type":"object","properties":{"city":{"type":"string","description":"City name"},
               "units":{"type":"string","enum":["metric","imperial"],"default":"metric"}},"required":["city"]}"#,
        );
        assert_eq!(
            lines,
            "- city (string, required): City name\n- units (string, one of \"metric\", \"imperial\", default \"metric\")\n"
        );
    }

    #[test]
    fn summaries_are_one_sentence() {
        assert_eq!(first_sentence("Gets the weather. Uses a paid API."), "Gets the weather.");
        assert_eq!(first_sentence("v1.2 parser\nfor  logs"), "v1.2 parser for logs");
        assert!(first_sentence(&"x".repeat(500)).chars().count() <= MAX_SUMMARY_CHARS + 3);
    }
}
