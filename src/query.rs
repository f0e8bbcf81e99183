//! Discovery queries: parameter parsing, wildcard matching, filtering and pagination. Pure: no I/O, time
//! is a parameter.

use std::collections::BTreeSet;

use std::collections::HashMap;

use crate::card::held::{CapIndex, CapRef, CardRef, CardText};
use crate::card::reported::Lifecycle;
use crate::defaults::{
    DISCOVERY_LIMIT, MAX_DISCOVERY_LIMIT, MAX_DISCOVERY_OFFSET, MAX_QUERY_IDS, MAX_QUERY_METADATA,
    MAX_QUERY_TAGS, MAX_TAG_LEN,
};
use crate::registry::health::{Health, Millis, Thresholds};
use crate::registry::Entry;

pub mod index;

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
    /// `version=`: one exact semantic version, or the highest of each agent id.
    pub version: Option<VersionFilter>,
    /// `lifecycle=`: what the agent says of taking new work.
    pub lifecycle: Option<Lifecycle>,
    /// `metadata.KEY=VALUE` filters, by key: a capability passes when its metadata value for each key
    /// (its own, else its agent's) matches the pattern.
    pub metadata: Vec<(String, Pattern)>,
    /// `input_mode=`: a media type the capability must take (its own modes, else its card's).
    pub input_mode: Option<MediaType>,
    /// `output_mode=`: a media type the capability must answer with.
    pub output_mode: Option<MediaType>,
    pub limit: usize,
    pub offset: usize,
}

/// A media type asked for (`audio/wav`, `audio/*`, `*/*`), lower case, parameters dropped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MediaType(String);

impl MediaType {
    pub fn parse(s: &str) -> Option<Self> {
        let essence = s.split(';').next().unwrap_or_default().trim().to_ascii_lowercase();
        let (kind, sub) = essence.split_once('/')?;
        let token = |t: &str| !t.is_empty() && t.bytes().all(|b| b.is_ascii_graphic() && b != b'/');
        (token(kind) && token(sub)).then_some(Self(essence))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// Whether a capability that declares `offered` serves this media type: equal, or either side a
    /// range (`audio/*`, `*/*`) that covers the other.
    pub fn served_by(&self, offered: &str) -> bool {
        let Some(offered) = MediaType::parse(offered) else { return false };
        let covers = |range: &str, other: &str| match range.split_once('/') {
            Some(("*", "*")) => true,
            Some((kind, "*")) => other.split_once('/').is_some_and(|(k, _)| k == kind),
            _ => range == other,
        };
        covers(&offered.0, &self.0) || covers(&self.0, &offered.0)
    }
}

/// The `version` filter.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum VersionFilter {
    Exact(semver::Version),
    /// The highest semantic version among the records of each group (`group_id`, else the agent id; all
    /// of them when none has one).
    Latest,
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
            version: None,
            lifecycle: None,
            metadata: Vec::new(),
            input_mode: None,
            output_mode: None,
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
const VERSION_ALLOWED: &[&str] = &["a semantic version (1.2.3)", "latest"];
const MODE_ALLOWED: &[&str] = &["a media type (audio/wav, audio/*)"];
const LIFECYCLE_ALLOWED: &[&str] = &["ready", "busy", "draining"];
const METADATA_ALLOWED: &[&str] = &["metadata.KEY=VALUE, KEY of A-Z a-z 0-9 _ - ."];

/// The prefix of metadata filter parameters.
pub const METADATA_PREFIX: &str = "metadata.";

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
        if let Some(v) = get("version").filter(|v| !v.is_empty()) {
            q.version = Some(if v.eq_ignore_ascii_case("latest") {
                VersionFilter::Latest
            } else {
                VersionFilter::Exact(semver::Version::parse(v).map_err(|_| ParamError {
                    parameter: "version",
                    provided: v.to_owned(),
                    allowed: VERSION_ALLOWED,
                })?)
            });
        }
        if let Some(v) = get("lifecycle").filter(|v| !v.is_empty()) {
            q.lifecycle = Some(Lifecycle::parse(v).ok_or_else(|| ParamError {
                parameter: "lifecycle",
                provided: v.to_owned(),
                allowed: LIFECYCLE_ALLOWED,
            })?);
        }
        q.metadata = metadata_filters(params)?;
        for (name, slot) in [("input_mode", &mut q.input_mode), ("output_mode", &mut q.output_mode)] {
            if let Some(v) = get(name).filter(|v| !v.is_empty()) {
                *slot = Some(MediaType::parse(v).ok_or_else(|| ParamError {
                    parameter: name,
                    provided: v.to_owned(),
                    allowed: MODE_ALLOWED,
                })?);
            }
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
        let metadata: Vec<(&str, &str)> =
            self.metadata.iter().map(|(k, p)| (k.as_str(), p.source.as_str())).collect();
        let modes = (
            self.input_mode.as_ref().map(MediaType::as_str),
            self.output_mode.as_ref().map(MediaType::as_str),
        );
        format!(
            "{:?}|{:?}|{:?}|{:?}|{:?}|{}{}{}{}|{:?}|{}|{}|{:?}|{:?}|{:?}|{:?}",
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
            self.version.as_ref().map(|v| match v {
                VersionFilter::Exact(v) => v.to_string(),
                VersionFilter::Latest => "latest".to_owned(),
            }),
            self.lifecycle,
            metadata,
            modes,
        )
    }

    /// Whether a filter reads capability fields beyond the packed index (metadata, media types), so
    /// that the card is parsed once per agent considered.
    pub fn needs_card(&self) -> bool {
        !self.metadata.is_empty() || self.input_mode.is_some() || self.output_mode.is_some()
    }

    /// The filters on the agent as a whole that the packed index cannot answer: lifecycle and version
    /// (held parsed with the card); `latest`, the highest versions when the filter asks for them.
    pub fn admits_agent(&self, entry: &Entry, latest: Option<&Latest>) -> bool {
        if self.lifecycle.is_some_and(|wanted| entry.lifecycle() != wanted) {
            return false;
        }
        match &self.version {
            None => true,
            Some(VersionFilter::Exact(wanted)) => entry.card.semver() == Some(wanted),
            Some(VersionFilter::Latest) => latest.is_none_or(|l| l.admits(entry)),
        }
    }

    /// The filters on one capability of `card` that read its fields: metadata and media types.
    pub fn admits_fields(&self, card: &CardRef<'_>, cap: &CapRef<'_>) -> bool {
        let serves = |wanted: &Option<MediaType>, offered: &[std::borrow::Cow<'_, str>]| {
            wanted.as_ref().is_none_or(|w| offered.iter().any(|m| w.served_by(m)))
        };
        self.metadata
            .iter()
            .all(|(key, pattern)| cap.metadata_in(card, key).is_some_and(|v| pattern.matches(v)))
            && serves(&self.input_mode, cap.input_modes_in(card))
            && serves(&self.output_mode, cap.output_modes_in(card))
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
            && self.version.is_none()
            && self.lifecycle.is_none()
            && self.metadata.is_empty()
            && self.input_mode.is_none()
            && self.output_mode.is_none()
    }

    pub fn admits(&self, agent_id: &str, reasoner: bool, cap: &CapIndex<'_>) -> bool {
        let pattern = if reasoner { &self.reasoner } else { &self.skill };
        (self.ids.is_empty() || self.ids.contains(agent_id))
            && pattern.as_ref().is_none_or(|p| p.matches(cap.id))
            && self.tags_match(cap.tags.clone())
    }

    /// Every filter but health on capability `position` (card order) of its kind in `entry`: what
    /// [`admits`](Self::admits) checks, then lifecycle, version and metadata.
    pub fn admits_capability(
        &self,
        entry: &Entry,
        reasoner: bool,
        position: usize,
        latest: Option<&Latest>,
    ) -> bool {
        let card = &entry.card;
        let mut caps = if reasoner { card.reasoners() } else { card.skills() };
        let Some(cap) = caps.nth(position) else { return false };
        if !self.admits(&entry.key.agent_id, reasoner, &cap) {
            return false;
        }
        if !self.admits_agent(entry, latest) {
            return false;
        }
        let text = self.needs_card().then(|| card.text());
        match text.as_ref().map(CardText::view) {
            Some(v) => {
                let list = if reasoner { &v.reasoners } else { &v.skills };
                list.get(position).is_some_and(|c| self.admits_fields(&v, c))
            }
            None => true,
        }
    }

    /// Does a capability survive the tag filter?
    fn tags_match<'t>(&self, mut tags: impl Iterator<Item = &'t str>) -> bool {
        self.tags.is_empty() || tags.any(|t| self.tags.iter().any(|p| p.matches(t)))
    }
}

/// The `metadata.KEY=VALUE` parameters: keys in the card's metadata key charset, at most
/// `MAX_QUERY_METADATA` of them; an empty value or `*` filters nothing.
fn metadata_filters(params: &[(String, String)]) -> Result<Vec<(String, Pattern)>, ParamError> {
    let mut filters = Vec::new();
    for (name, value) in params {
        let Some(key) = name.strip_prefix(METADATA_PREFIX) else { continue };
        let key_ok = !key.is_empty()
            && key.len() <= MAX_TAG_LEN
            && key.chars().all(|c| c.is_ascii_alphanumeric() || "_-.".contains(c));
        if !key_ok {
            return Err(ParamError {
                parameter: "metadata",
                provided: name.clone(),
                allowed: METADATA_ALLOWED,
            });
        }
        let pattern = Pattern::new(value);
        if value.is_empty() || pattern.matches_all() {
            continue;
        }
        if filters.len() >= MAX_QUERY_METADATA {
            return Err(ParamError {
                parameter: "metadata",
                provided: format!("more than {MAX_QUERY_METADATA} metadata filters"),
                allowed: &[],
            });
        }
        filters.push((key.to_owned(), pattern));
    }
    filters.sort_by(|a, b| a.0.cmp(&b.0));
    Ok(filters)
}

/// The highest semantic version of each group in a view, for `version=latest`.
#[derive(Debug, Default)]
pub struct Latest {
    highest: HashMap<String, semver::Version>,
}

impl Latest {
    /// Reads every record's group and version (held parsed with each card).
    pub fn of<'a>(entries: impl IntoIterator<Item = &'a Entry>) -> Self {
        let mut highest: HashMap<String, semver::Version> = HashMap::new();
        for entry in entries {
            let Some(version) = entry.card.semver() else { continue };
            match highest.get_mut(group_of(entry)) {
                Some(top) if *top >= *version => {}
                Some(top) => *top = version.clone(),
                None => {
                    highest.insert(group_of(entry).to_owned(), version.clone());
                }
            }
        }
        Self { highest }
    }

    /// Whether `entry` has its group's highest version (every record does when none of its group has a
    /// semantic version).
    pub fn admits(&self, entry: &Entry) -> bool {
        match self.highest.get(group_of(entry)) {
            None => true,
            Some(top) => entry.card.semver() == Some(top),
        }
    }
}

/// A record's group: its card's `group_id`, else its agent id. Records of one group are versions and
/// replicas of one service: `latest` compares within it, so two versions can run side by side on one
/// node under two agent ids and one group.
fn group_of(entry: &Entry) -> &str {
    entry.card.group().unwrap_or(&entry.key.agent_id)
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
    let latest = matches!(query.version, Some(VersionFilter::Latest))
        .then(|| Latest::of(entries.iter().map(AsRef::as_ref)));
    let mut visit = |entry: &'a Entry| {
        if !query.admits_agent(entry, latest.as_ref()) {
            return;
        }
        let card = &entry.card;
        let text = query.needs_card().then(|| card.text());
        let view = text.as_ref().map(CardText::view);
        let fields_ok = |reasoner: bool, i: usize| match &view {
            Some(v) => {
                let list = if reasoner { &v.reasoners } else { &v.skills };
                list.get(i).is_some_and(|c| query.admits_fields(v, c))
            }
            None => true,
        };
        let reasoner_ok = |i: usize, c: &CapIndex<'_>| {
            query.reasoner.as_ref().is_none_or(|p| p.matches(c.id))
                && query.tags_match(c.tags.clone())
                && fields_ok(true, i)
        };
        let skill_ok = |i: usize, c: &CapIndex<'_>| {
            query.skill.as_ref().is_none_or(|p| p.matches(c.id))
                && query.tags_match(c.tags.clone())
                && fields_ok(false, i)
        };
        // Without id, tag or metadata patterns every capability counts: read the counts, skip the index.
        let reasoners = if query.reasoner.is_none() && query.tags.is_empty() && !query.needs_card() {
            card.reasoner_count()
        } else {
            card.reasoners().enumerate().filter(|(i, c)| reasoner_ok(*i, c)).count()
        };
        let skills = if query.skill.is_none() && query.tags.is_empty() && !query.needs_card() {
            card.skill_count()
        } else {
            card.skills().enumerate().filter(|(i, c)| skill_ok(*i, c)).count()
        };
        if reasoners == 0 && skills == 0 {
            return;
        }
        // With a health filter, every record the other filters let through decides the answer, so
        // each one's next change of health bounds how long it holds; without one, the page's records do.
        if let Some(wanted) = query.health {
            note_change(&mut sel, entry, now, thresholds);
            if entry.health(now, thresholds) != wanted {
                return;
            }
        }
        let index = sel.total_agents;
        sel.total_agents += 1;
        sel.total_reasoners += reasoners;
        sel.total_skills += skills;
        if index >= query.offset && index < page_end {
            if query.health.is_none() {
                note_change(&mut sel, entry, now, thresholds);
            }
            let positions = |list: crate::card::held::Caps<'_>, ok: &dyn Fn(usize, &CapIndex<'_>) -> bool| {
                list.enumerate().filter(|(i, c)| ok(*i, c)).map(|(i, _)| i).collect()
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

/// Lowers the selection's validity to when `entry`'s health would next change by itself.
fn note_change(sel: &mut Selection<'_>, entry: &Entry, now: Millis, thresholds: &Thresholds) {
    if let Some(t) = entry.next_health_change(now, thresholds) {
        sel.valid_until = Some(sel.valid_until.map_or(t, |v| v.min(t)));
    }
}

#[cfg(test)]
mod tests;
