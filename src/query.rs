//! Discovery queries: parameter parsing, wildcard matching, filtering and pagination. Pure: no I/O, time
//! is a parameter.

use std::collections::BTreeSet;

use crate::card::held::CapIndex;
use crate::defaults::{
    DISCOVERY_LIMIT, MAX_DISCOVERY_LIMIT, MAX_DISCOVERY_OFFSET, MAX_QUERY_IDS, MAX_QUERY_TAGS,
};
use crate::registry::health::{Health, Millis, Thresholds};
use crate::registry::Entry;

/// A parameter that failed to parse: rendered as the 400 body of the API contract.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid {parameter} parameter")]
pub struct ParamError {
    pub parameter: &'static str,
    pub provided: String,
    pub allowed: &'static [&'static str],
}

/// Response format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Format {
    #[default]
    Json,
    Xml,
    Compact,
}

/// A `*` wildcard pattern, anchored at both ends, case-sensitive.
///
/// The inner parts are searched with prebuilt `memmem` finders: building a substring searcher costs more
/// than running it on a short id, and a query runs the same pattern over every capability in the view.
#[derive(Debug, Clone)]
pub struct Pattern {
    source: String,
    first: String,
    last: String,
    middle: Vec<memchr::memmem::Finder<'static>>,
    wildcard: bool,
}

impl PartialEq for Pattern {
    fn eq(&self, other: &Self) -> bool {
        self.source == other.source
    }
}

impl Eq for Pattern {}

impl Pattern {
    pub fn new(pattern: &str) -> Self {
        let parts: Vec<&str> = pattern.split('*').collect();
        let wildcard = parts.len() > 1;
        let (first, last) = if wildcard { (parts[0], parts[parts.len() - 1]) } else { (pattern, "") };
        let middle = if wildcard {
            parts[1..parts.len() - 1]
                .iter()
                .filter(|p| !p.is_empty())
                .map(|p| memchr::memmem::Finder::new(p.as_bytes()).into_owned())
                .collect()
        } else {
            Vec::new()
        };
        Self { source: pattern.to_owned(), first: first.to_owned(), last: last.to_owned(), middle, wildcard }
    }

    /// True when the pattern matches every string (`*`, `**`, or empty).
    pub fn matches_all(&self) -> bool {
        self.source.bytes().all(|b| b == b'*')
    }

    pub fn matches(&self, s: &str) -> bool {
        if !self.wildcard {
            return self.first.is_empty() || same(self.first.as_bytes(), s.as_bytes());
        }
        let (first, last) = (self.first.as_str(), self.last.as_str());
        // Empty ends are the common case (`*x*`): skip the comparisons, they are calls, not inlined.
        if s.len() < first.len() + last.len()
            || (!first.is_empty() && !same(first.as_bytes(), &s.as_bytes()[..first.len()]))
            || (!last.is_empty() && !same(last.as_bytes(), &s.as_bytes()[s.len() - last.len()..]))
        {
            return false;
        }
        let mut hay = &s.as_bytes()[first.len()..s.len() - last.len()];
        for finder in &self.middle {
            match finder.find(hay) {
                Some(at) => hay = &hay[at + finder.needle().len()..],
                None => return false,
            }
        }
        true
    }
}

/// Byte equality for short strings (ids, tags) without a call into libc's `memcmp`, whose per-call
/// cost dominated filter queries in profiles: eight bytes at a time, then the tail.
fn same(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    let (mut a8, mut b8) = (a.chunks_exact(8), b.chunks_exact(8));
    let word = |c: &[u8]| u64::from_ne_bytes(c.try_into().unwrap_or([0; 8]));
    if !a8.by_ref().zip(b8.by_ref()).all(|(x, y)| word(x) == word(y)) {
        return false;
    }
    a8.remainder().iter().zip(b8.remainder()).all(|(x, y)| x == y)
}

/// A parsed discovery request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Query {
    /// Allow-list of agent ids (empty: all).
    pub ids: BTreeSet<String>,
    pub reasoner: Option<Pattern>,
    pub skill: Option<Pattern>,
    /// Empty: no tag filter.
    pub tags: Vec<Pattern>,
    pub include_input_schema: bool,
    pub include_output_schema: bool,
    pub include_descriptions: bool,
    pub include_examples: bool,
    pub format: Format,
    pub health: Option<Health>,
    pub limit: usize,
    pub offset: usize,
}

impl Default for Query {
    fn default() -> Self {
        Self {
            ids: BTreeSet::new(),
            reasoner: None,
            skill: None,
            tags: Vec::new(),
            include_input_schema: false,
            include_output_schema: false,
            include_descriptions: true,
            include_examples: false,
            format: Format::Json,
            health: None,
            limit: DISCOVERY_LIMIT,
            offset: 0,
        }
    }
}

const BOOL_ALLOWED: &[&str] = &["true", "false"];
const FORMAT_ALLOWED: &[&str] = &["json", "xml", "compact"];
const HEALTH_ALLOWED: &[&str] = &["active", "inactive", "degraded", "unknown"];
const LIMIT_ALLOWED: &[&str] = &["0-500"];
const OFFSET_ALLOWED: &[&str] = &["0-1000000"];

impl Query {
    /// Parses a raw (percent-encoded) query string. The first occurrence of a parameter counts;
    /// unknown parameters are ignored; errors come in the order of the API contract's table.
    pub fn parse(raw: &str) -> Result<Query, ParamError> {
        Self::from_params(&first_params(raw))
    }

    /// Parses already decoded parameters (first occurrence of each, see [`first_params`]).
    pub fn from_params(params: &[(String, String)]) -> Result<Query, ParamError> {
        let get = |name: &str| params.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str());
        let mut q = Query::default();

        let single = get("agent").filter(|v| !v.trim().is_empty()).or_else(|| get("node_id"));
        let lists = [single, get("agent_ids"), get("node_ids")];
        for list in lists.into_iter().flatten() {
            for id in list.split(',').map(str::trim).filter(|s| !s.is_empty()) {
                if q.ids.len() >= MAX_QUERY_IDS {
                    return Err(ParamError {
                        parameter: "agent_ids",
                        provided: format!("more than {MAX_QUERY_IDS} ids"),
                        allowed: &[],
                    });
                }
                q.ids.insert(id.to_owned());
            }
        }
        q.reasoner = get("reasoner").map(Pattern::new).filter(|p| !p.matches_all());
        q.skill = get("skill").map(Pattern::new).filter(|p| !p.matches_all());
        if let Some(tags) = get("tags") {
            let patterns: Vec<Pattern> =
                tags.split(',').map(str::trim).filter(|s| !s.is_empty()).map(Pattern::new).collect();
            if patterns.len() > MAX_QUERY_TAGS {
                return Err(ParamError {
                    parameter: "tags",
                    provided: format!("{} patterns", patterns.len()),
                    allowed: &[],
                });
            }
            // A pattern that matches everything makes the whole filter a no-op.
            if !patterns.iter().any(Pattern::matches_all) {
                q.tags = patterns;
            }
        }
        q.include_input_schema = parse_bool("include_input_schema", get("include_input_schema"), false)?;
        q.include_output_schema = parse_bool("include_output_schema", get("include_output_schema"), false)?;
        q.include_descriptions = parse_bool("include_descriptions", get("include_descriptions"), true)?;
        q.include_examples = parse_bool("include_examples", get("include_examples"), false)?;
        if let Some(v) = get("format") {
            q.format = match v.to_ascii_lowercase().as_str() {
                "json" => Format::Json,
                "xml" => Format::Xml,
                "compact" => Format::Compact,
                _ => {
                    return Err(ParamError {
                        parameter: "format",
                        provided: v.to_owned(),
                        allowed: FORMAT_ALLOWED,
                    })
                }
            };
        }
        if let Some(v) = get("health_status").filter(|v| !v.is_empty()) {
            q.health = Some(Health::parse(v).ok_or_else(|| ParamError {
                parameter: "health_status",
                provided: v.to_owned(),
                allowed: HEALTH_ALLOWED,
            })?);
        }
        if let Some(v) = get("limit") {
            q.limit = parse_int("limit", v, MAX_DISCOVERY_LIMIT, LIMIT_ALLOWED)?;
        }
        if let Some(v) = get("offset") {
            q.offset = parse_int("offset", v, MAX_DISCOVERY_OFFSET, OFFSET_ALLOWED)?;
        }
        Ok(q)
    }

    /// The query in canonical form: equal for every spelling of the same request (aliases, case, order
    /// of parameters, unknown parameters), so it can key a response cache.
    pub fn cache_key(&self) -> String {
        let ids: Vec<&str> = self.ids.iter().map(String::as_str).collect();
        let tags: Vec<&str> = self.tags.iter().map(|p| p.source.as_str()).collect();
        let pattern = |p: &Option<Pattern>| p.as_ref().map(|p| p.source.clone());
        // Strings in their escaped, quoted form: a separator inside one cannot make two queries alike.
        format!(
            "{:?}|{:?}|{:?}|{:?}|{:?}|{}{}{}{}|{:?}|{}|{}",
            self.format,
            ids,
            pattern(&self.reasoner),
            pattern(&self.skill),
            tags,
            u8::from(self.include_input_schema),
            u8::from(self.include_output_schema),
            u8::from(self.include_descriptions),
            u8::from(self.include_examples),
            self.health,
            self.limit,
            self.offset,
        )
    }

    /// Whether one capability passes the filters other than health: the agent id allow-list, its
    /// kind's id pattern and the tag patterns.
    /// Whether no filter on ids, names, tags or health is set: every capability passes.
    pub fn admits_all(&self) -> bool {
        self.ids.is_empty()
            && self.reasoner.is_none()
            && self.skill.is_none()
            && self.tags.is_empty()
            && self.health.is_none()
    }

    pub fn admits(&self, agent_id: &str, reasoner: bool, cap: &CapIndex<'_>) -> bool {
        let pattern = if reasoner { &self.reasoner } else { &self.skill };
        (self.ids.is_empty() || self.ids.contains(agent_id))
            && pattern.as_ref().is_none_or(|p| p.matches(cap.id))
            && self.tags_match(cap.tags.clone())
    }

    /// Does a capability survive the tag filter?
    fn tags_match<'t>(&self, mut tags: impl Iterator<Item = &'t str>) -> bool {
        self.tags.is_empty() || tags.any(|t| self.tags.iter().any(|p| p.matches(t)))
    }
}

/// The parameters of a raw (percent-encoded) query string, decoded: the first occurrence of each name.
pub fn first_params(raw: &str) -> Vec<(String, String)> {
    let mut params: Vec<(String, String)> = Vec::new();
    for (k, v) in form_urlencoded::parse(raw.as_bytes()) {
        if !params.iter().any(|(seen, _)| seen.as_str() == k) {
            params.push((k.into_owned(), v.into_owned()));
        }
    }
    params
}

pub(crate) fn parse_bool(name: &'static str, value: Option<&str>, default: bool) -> Result<bool, ParamError> {
    let Some(v) = value else { return Ok(default) };
    match v.to_ascii_lowercase().as_str() {
        "" => Ok(default),
        "true" | "1" | "yes" | "y" => Ok(true),
        "false" | "0" | "no" | "n" => Ok(false),
        _ => Err(ParamError { parameter: name, provided: v.to_owned(), allowed: BOOL_ALLOWED }),
    }
}

/// Strict decimal: digits only, no sign, no exponent, no radix prefix.
pub(crate) fn parse_int(
    name: &'static str,
    v: &str,
    max: usize,
    allowed: &'static [&'static str],
) -> Result<usize, ParamError> {
    let err = || ParamError { parameter: name, provided: v.to_owned(), allowed };
    if v.is_empty() || v.len() > 12 || !v.bytes().all(|b| b.is_ascii_digit()) {
        return Err(err());
    }
    let n: usize = v.parse().map_err(|_| err())?;
    if n > max {
        return Err(err());
    }
    Ok(n)
}

/// One agent of the result page with the indices of its surviving reasoners and skills.
#[derive(Debug)]
pub struct Hit<'a> {
    pub entry: &'a Entry,
    pub health: Health,
    pub last_heartbeat: Option<Millis>,
    pub reasoners: Vec<usize>,
    pub skills: Vec<usize>,
}

/// The outcome of a query over a view.
#[derive(Debug)]
pub struct Selection<'a> {
    pub total_agents: usize,
    pub total_reasoners: usize,
    pub total_skills: usize,
    pub has_more: bool,
    pub page: Vec<Hit<'a>>,
    /// The earliest instant at which the health of an agent that the filters (other than health)
    /// considered would change by itself. A cached copy of this result is wrong from then on.
    pub valid_until: Option<Millis>,
}

/// Runs `query` over `entries` (already in discovery order) at time `now`.
///
/// One pass, no allocation outside the page: capabilities are only counted for agents off the page.
/// With an id allow-list only those ids are looked up (binary search), not the whole view.
pub fn select<'a, E: AsRef<Entry> + 'a>(
    entries: &'a [E],
    query: &Query,
    now: Millis,
    thresholds: &Thresholds,
) -> Selection<'a> {
    let mut sel = Selection {
        total_agents: 0,
        total_reasoners: 0,
        total_skills: 0,
        has_more: false,
        page: Vec::new(),
        valid_until: None,
    };
    let page_end = query.offset.saturating_add(query.limit);
    let mut visit = |entry: &'a Entry| {
        let card = &entry.card;
        let reasoner_ok = |c: &CapIndex<'_>| {
            query.reasoner.as_ref().is_none_or(|p| p.matches(c.id)) && query.tags_match(c.tags.clone())
        };
        let skill_ok = |c: &CapIndex<'_>| {
            query.skill.as_ref().is_none_or(|p| p.matches(c.id)) && query.tags_match(c.tags.clone())
        };
        // Without id or tag patterns every capability counts: read the counts, skip the index.
        let reasoners = if query.reasoner.is_none() && query.tags.is_empty() {
            card.reasoner_count()
        } else {
            card.reasoners().filter(|c| reasoner_ok(c)).count()
        };
        let skills = if query.skill.is_none() && query.tags.is_empty() {
            card.skill_count()
        } else {
            card.skills().filter(|c| skill_ok(c)).count()
        };
        if reasoners == 0 && skills == 0 {
            return;
        }
        if let Some(t) = entry.next_health_change(now, thresholds) {
            sel.valid_until = Some(sel.valid_until.map_or(t, |v: Millis| v.min(t)));
        }
        if let Some(wanted) = query.health {
            if entry.health(now, thresholds) != wanted {
                return;
            }
        }
        let index = sel.total_agents;
        sel.total_agents += 1;
        sel.total_reasoners += reasoners;
        sel.total_skills += skills;
        if index >= query.offset && index < page_end {
            let positions = |list: crate::card::held::Caps<'_>, ok: &dyn Fn(&CapIndex<'_>) -> bool| {
                list.enumerate().filter(|(_, c)| ok(c)).map(|(i, _)| i).collect()
            };
            sel.page.push(Hit {
                entry,
                health: entry.health(now, thresholds),
                last_heartbeat: entry.last_heartbeat(now),
                reasoners: positions(card.reasoners(), &reasoner_ok),
                skills: positions(card.skills(), &skill_ok),
            });
        }
    };
    if query.ids.is_empty() {
        entries.iter().for_each(|e| visit(e.as_ref()));
    } else {
        for id in &query.ids {
            let start = entries.partition_point(|e| e.as_ref().key.agent_id.as_str() < id.as_str());
            entries[start..]
                .iter()
                .map(AsRef::as_ref)
                .take_while(|e| &e.key.agent_id == id)
                .for_each(&mut visit);
        }
    }
    sel.has_more = page_end < sel.total_agents;
    sel
}

#[cfg(test)]
mod tests;
