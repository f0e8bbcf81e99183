//! A card as the view holds it: its canonical compact JSON (the exact text that is stored and served),
//! compressed, plus a packed index of capability ids and tags for filtering.
//!
//! One allocation for the card and one for the index, instead of one per id, tag, description and schema,
//! and the card's text zstd-compressed on its own (about a third of its size): the texts were most of a
//! node's memory (2.4 KB a card with schemas and signature, 120 MB at 50,000 agents). Filters read the
//! index; whoever needs the card's fields takes its [`CardText`] (a few microseconds) and reads it through
//! a zero-copy parse ([`CardRef`]); pages are mostly rendered from prepared bytes that never touch it.

use std::borrow::Cow;
use std::cell::RefCell;

use serde::Deserialize;
use serde_json::value::RawValue;

use super::AgentCard;

/// Separates the reasoner part of the index from the skill part.
const GROUP: u8 = 0x1d;
/// Separates capabilities within a part.
const RECORD: u8 = 0x1e;
/// Separates a capability's id from each of its tags.
const UNIT: u8 = 0x1f;

/// zstd level of the held texts: level 1 compresses these small JSON texts as well as level 3 does here
/// (741 against 745 bytes a card), at a fraction of the time, on every card a node accepts.
const LEVEL: i32 = 1;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeldCard {
    /// The canonical JSON text as one zstd frame (with its content size).
    packed: Box<[u8]>,
    /// `id US tag US tag RS id … GS id US tag …`: reasoners, then skills. Ids and tags never hold
    /// control characters (validation), so the separators cannot occur inside them.
    index: Box<str>,
    /// Byte offset of the GS between the two parts.
    split: u32,
    reasoner_count: u16,
    skill_count: u16,
    /// The card's version when it is a semantic version, parsed once: the `version` filters read it
    /// for every record.
    semver: Option<Box<semver::Version>>,
    /// The card's `group_id`, when it names one (none: the agent id is the group).
    group: Option<Box<str>>,
}

impl HeldCard {
    /// Builds the held form of a validated card.
    pub fn new(card: &AgentCard) -> Self {
        Self::with_text(card, &card.to_json())
    }

    /// [`HeldCard::new`] for a caller that has the card's canonical text (`card.to_json()`) already.
    pub fn with_text(card: &AgentCard, text: &[u8]) -> Self {
        let packed = compress(text);
        fn ids(list: &[super::Capability]) -> Vec<(&str, impl Iterator<Item = &str>)> {
            list.iter().map(|c| (c.id.as_str(), c.tags.iter().map(String::as_str))).collect()
        }
        let (index, split) = pack(ids(&card.reasoners), ids(&card.skills));
        // Validation bounds both counts by MAX_CAPABILITIES and the card by 64 KiB.
        Self {
            packed,
            index,
            split,
            reasoner_count: card.reasoners.len() as u16,
            skill_count: card.skills.len() as u16,
            semver: semver::Version::parse(&card.version).ok().map(Box::new),
            group: card.group_id.as_deref().map(Into::into),
        }
    }

    /// The held form of a card's canonical JSON as this node stored it, without the full parse and
    /// validation of [`AgentCard`]: for rows whose seal shows they were validated when written. `None`
    /// when the text is not the JSON of a card of `agent_id`.
    pub fn from_canonical(json: &str, agent_id: &str) -> Option<Self> {
        Self::from_skeleton(json, agent_id, || compress(json.as_bytes()))
    }

    /// [`HeldCard::from_canonical`] of a text as [`HeldCard::packed`] gave it: the frame is kept as
    /// it is, not compressed again. `None` also when it does not decompress ([`unpack`]).
    pub fn from_packed(packed: &[u8], agent_id: &str) -> Option<Self> {
        let json = unpack(packed)?;
        Self::from_skeleton(&json, agent_id, || packed.into())
    }

    fn from_skeleton(json: &str, agent_id: &str, packed: impl FnOnce() -> Box<[u8]>) -> Option<Self> {
        let skeleton: Skeleton<'_> = serde_json::from_str(json).ok()?;
        if skeleton.agent_id != agent_id {
            return None;
        }
        fn ids<'a>(list: &'a [CapSkeleton<'_>]) -> Vec<(&'a str, impl Iterator<Item = &'a str>)> {
            list.iter().map(|c| (&*c.id, c.tags.iter().map(|t| &**t))).collect()
        }
        let (index, split) = pack(ids(&skeleton.reasoners), ids(&skeleton.skills));
        let reasoner_count = u16::try_from(skeleton.reasoners.len()).ok()?;
        let skill_count = u16::try_from(skeleton.skills.len()).ok()?;
        let semver = semver::Version::parse(&skeleton.version).ok().map(Box::new);
        let group = skeleton.group_id.as_deref().map(Into::into);
        drop(skeleton);
        let packed = packed();
        Some(Self { packed, index, split, reasoner_count, skill_count, semver, group })
    }

    /// The card's version, when it is a semantic version.
    pub fn semver(&self) -> Option<&semver::Version> {
        self.semver.as_deref()
    }

    /// The card's `group_id`, when it names one.
    pub fn group(&self) -> Option<&str> {
        self.group.as_deref()
    }

    /// The canonical JSON text as one zstd frame, as held: what the store keeps.
    pub fn packed(&self) -> &[u8] {
        &self.packed
    }

    /// The canonical JSON text, decompressed.
    pub fn text(&self) -> CardText {
        CardText(decompress(&self.packed))
    }

    /// The reasoners, in card order, as packed index records.
    pub fn reasoners(&self) -> Caps<'_> {
        Caps::new(self.index.get(..self.split as usize).unwrap_or(""))
    }

    /// The skills, in card order, as packed index records.
    pub fn skills(&self) -> Caps<'_> {
        Caps::new(self.index.get(self.split as usize + 1..).unwrap_or(""))
    }

    pub fn reasoner_count(&self) -> usize {
        self.reasoner_count.into()
    }

    pub fn skill_count(&self) -> usize {
        self.skill_count.into()
    }
}

/// The packed index of two lists of `(id, tags)`, reasoners then skills, and the offset of the GS
/// between them.
fn pack<'a, T: Iterator<Item = &'a str>>(
    reasoners: Vec<(&'a str, T)>,
    skills: Vec<(&'a str, T)>,
) -> (Box<str>, u32) {
    let mut index = String::new();
    let mut split = 0;
    for (part, list) in [reasoners, skills].into_iter().enumerate() {
        if part == 1 {
            split = index.len() as u32;
            index.push(GROUP as char);
        }
        for (i, (id, tags)) in list.into_iter().enumerate() {
            if i > 0 {
                index.push(RECORD as char);
            }
            index.push_str(id);
            for tag in tags {
                index.push(UNIT as char);
                index.push_str(tag);
            }
        }
    }
    (index.into_boxed_str(), split)
}

/// A held card's canonical JSON text, decompressed: what the card's fields are read from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CardText(Box<str>);

impl CardText {
    /// The JSON as a raw value, for embedding in a response unchanged.
    pub fn raw(&self) -> &RawValue {
        // A held card's text is a card's canonical JSON; the fallback is unreachable in practice.
        serde_json::from_str(&self.0).unwrap_or_else(|_| empty_object())
    }

    /// A zero-copy view of the card's fields.
    pub fn view(&self) -> CardRef<'_> {
        serde_json::from_str(&self.0).unwrap_or_default()
    }

    pub fn into_string(self) -> String {
        self.0.into()
    }
}

/// Serialised as the JSON it is, unchanged.
impl serde::Serialize for CardText {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        self.raw().serialize(serializer)
    }
}

impl std::ops::Deref for CardText {
    type Target = str;

    fn deref(&self) -> &str {
        &self.0
    }
}

thread_local! {
    /// One compression and one decompression context per thread: a context costs allocations and table
    /// set-up worth more than compressing a card.
    static CONTEXTS: RefCell<Option<(zstd::bulk::Compressor<'static>, zstd::bulk::Decompressor<'static>)>> =
        const { RefCell::new(None) };
}

fn with_contexts<T>(
    f: impl FnOnce(&mut zstd::bulk::Compressor<'static>, &mut zstd::bulk::Decompressor<'static>) -> T,
) -> Option<T> {
    CONTEXTS.with(|cell| {
        let mut cell = cell.try_borrow_mut().ok()?;
        if cell.is_none() {
            *cell = Some((zstd::bulk::Compressor::new(LEVEL).ok()?, zstd::bulk::Decompressor::new().ok()?));
        }
        let (c, d) = cell.as_mut()?;
        Some(f(c, d))
    })
}

/// `text` as one zstd frame. zstd fails only when it cannot allocate a context (the process is out of
/// memory then): a fresh context is tried before the text is given up, and an empty frame reads as `{}`.
fn compress(text: &[u8]) -> Box<[u8]> {
    with_contexts(|c, _| c.compress(text).ok())
        .flatten()
        .or_else(|| zstd::bulk::compress(text, 0).ok())
        .unwrap_or_default()
        .into_boxed_slice()
}

/// The text of a frame [`compress`] wrote. Frames are this process's own, always whole and always
/// UTF-8; the empty object stands in for the unreachable failure.
fn decompress(packed: &[u8]) -> Box<str> {
    let len = zstd::zstd_safe::get_frame_content_size(packed).ok().flatten().unwrap_or(0) as usize;
    with_contexts(|_, d| d.decompress(packed, len).ok())
        .flatten()
        .or_else(|| zstd::bulk::decompress(packed, len).ok())
        .and_then(|bytes| String::from_utf8(bytes).ok())
        .unwrap_or_else(|| "{}".to_owned())
        .into_boxed_str()
}

/// The text of a frame that may not be this process's own (a store row): `None` unless it names its
/// content size, at most [`super::MAX_CARD_TEXT`], and decompresses to that much UTF-8.
pub fn unpack(packed: &[u8]) -> Option<String> {
    let len = zstd::zstd_safe::get_frame_content_size(packed).ok().flatten()?;
    let len = usize::try_from(len).ok().filter(|&len| len <= super::MAX_CARD_TEXT)?;
    let bytes = with_contexts(|_, d| d.decompress(packed, len).ok())
        .flatten()
        .or_else(|| zstd::bulk::decompress(packed, len).ok())?;
    String::from_utf8(bytes).ok()
}

fn empty_object() -> &'static RawValue {
    serde_json::from_str("{}").expect("{} is JSON")
}

/// Splits `s` at the first `sep` byte. The parts are short (ids and tags), where a plain byte loop beats
/// `str::split`'s searcher.
fn cut(s: &str, sep: u8) -> (&str, Option<&str>) {
    match s.bytes().position(|b| b == sep) {
        // `sep` is ASCII, so both sides are on char boundaries.
        Some(at) => (&s[..at], Some(&s[at + 1..])),
        None => (s, None),
    }
}

/// Capabilities of one kind from the packed index.
#[derive(Clone)]
pub struct Caps<'a> {
    rest: Option<&'a str>,
}

impl<'a> Caps<'a> {
    fn new(part: &'a str) -> Self {
        Self { rest: (!part.is_empty()).then_some(part) }
    }
}

impl<'a> Iterator for Caps<'a> {
    type Item = CapIndex<'a>;

    fn next(&mut self) -> Option<CapIndex<'a>> {
        let (record, rest) = cut(self.rest?, RECORD);
        self.rest = rest;
        let (id, tags) = cut(record, UNIT);
        Some(CapIndex { id, tags: Tags { rest: tags } })
    }
}

/// One capability's id and tags, borrowed from the index.
pub struct CapIndex<'a> {
    pub id: &'a str,
    pub tags: Tags<'a>,
}

/// A capability's tags, borrowed from the index.
#[derive(Clone)]
pub struct Tags<'a> {
    rest: Option<&'a str>,
}

impl<'a> Iterator for Tags<'a> {
    type Item = &'a str;

    fn next(&mut self) -> Option<&'a str> {
        let (tag, rest) = cut(self.rest?, UNIT);
        self.rest = rest;
        Some(tag)
    }
}

/// The fields of a card its held form is made of; serde skips the rest of the text (schemas,
/// descriptions) without building anything.
#[derive(Deserialize)]
struct Skeleton<'a> {
    #[serde(borrow)]
    agent_id: Cow<'a, str>,
    #[serde(borrow, default)]
    version: Cow<'a, str>,
    #[serde(borrow, default)]
    group_id: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    reasoners: Vec<CapSkeleton<'a>>,
    #[serde(borrow, default)]
    skills: Vec<CapSkeleton<'a>>,
}

#[derive(Deserialize)]
struct CapSkeleton<'a> {
    #[serde(borrow)]
    id: Cow<'a, str>,
    #[serde(borrow, default)]
    tags: Vec<Cow<'a, str>>,
}

/// Borrowed view of a held card: strings borrow from the JSON unless they had escapes.
#[derive(Debug, Default, Deserialize)]
pub struct CardRef<'a> {
    #[serde(borrow)]
    pub agent_id: Cow<'a, str>,
    #[serde(borrow, default)]
    pub name: Cow<'a, str>,
    #[serde(borrow, default)]
    pub description: Cow<'a, str>,
    #[serde(borrow, default)]
    pub version: Cow<'a, str>,
    #[serde(borrow, default)]
    pub group_id: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    pub base_url: Cow<'a, str>,
    #[serde(borrow, default)]
    pub deployment_type: Cow<'a, str>,
    #[serde(borrow, default)]
    pub tags: Vec<Cow<'a, str>>,
    #[serde(borrow, default)]
    pub category: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    pub metadata: MetadataRef<'a>,
    #[serde(borrow, default)]
    pub reasoners: Vec<CapRef<'a>>,
    #[serde(borrow, default)]
    pub skills: Vec<CapRef<'a>>,
    #[serde(borrow, default)]
    pub input_modes: Vec<Cow<'a, str>>,
    #[serde(borrow, default)]
    pub output_modes: Vec<Cow<'a, str>>,
}

#[derive(Debug, Deserialize)]
pub struct CapRef<'a> {
    #[serde(borrow)]
    pub id: Cow<'a, str>,
    #[serde(borrow, default)]
    pub name: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    pub description: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    pub tags: Vec<Cow<'a, str>>,
    #[serde(borrow, default)]
    pub input_schema: Option<&'a RawValue>,
    #[serde(borrow, default)]
    pub output_schema: Option<&'a RawValue>,
    #[serde(borrow, default)]
    pub examples: Vec<&'a RawValue>,
    #[serde(borrow, default)]
    pub category: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    pub requires: Vec<Cow<'a, str>>,
    #[serde(borrow, default)]
    pub required_secrets: Vec<Cow<'a, str>>,
    #[serde(default)]
    pub has_side_effects: bool,
    #[serde(default)]
    pub confidence_hint: Option<f64>,
    #[serde(borrow, default)]
    pub metadata: MetadataRef<'a>,
    /// The media types it takes; empty: the card's.
    #[serde(borrow, default)]
    pub input_modes: Vec<Cow<'a, str>>,
    /// The media types it answers with; empty: the card's.
    #[serde(borrow, default)]
    pub output_modes: Vec<Cow<'a, str>>,
}

/// Borrowed metadata, in key order.
pub type MetadataRef<'a> = std::collections::BTreeMap<Cow<'a, str>, Cow<'a, str>>;

impl<'a> CapRef<'a> {
    /// The capability's category, or its agent's when it has none of its own.
    pub fn category_in<'b>(&'b self, card: &'b CardRef<'a>) -> Option<&'b str> {
        self.category.as_deref().or(card.category.as_deref())
    }

    /// The media types it takes: its own, else its card's defaults.
    pub fn input_modes_in<'b>(&'b self, card: &'b CardRef<'a>) -> &'b [Cow<'a, str>] {
        if self.input_modes.is_empty() {
            &card.input_modes
        } else {
            &self.input_modes
        }
    }

    /// The media types it answers with: its own, else its card's defaults.
    pub fn output_modes_in<'b>(&'b self, card: &'b CardRef<'a>) -> &'b [Cow<'a, str>] {
        if self.output_modes.is_empty() {
            &card.output_modes
        } else {
            &self.output_modes
        }
    }

    /// The capability's metadata value for `key`, or its agent's when it has none of its own.
    pub fn metadata_in<'b>(&'b self, card: &'b CardRef<'a>, key: &str) -> Option<&'b str> {
        self.metadata.get(key).or_else(|| card.metadata.get(key)).map(|v| v.as_ref())
    }
}

impl CardRef<'_> {
    /// The agent's group: its `group_id`, else its agent id.
    pub fn group(&self) -> &str {
        self.group_id.as_deref().unwrap_or(&self.agent_id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn held(json: &str) -> HeldCard {
        HeldCard::new(&AgentCard::from_json(json.as_bytes()).unwrap())
    }

    #[test]
    fn index_lists_ids_and_tags_in_card_order() {
        let h = held(
            r#"{"agent_id":"a","base_url":"http://x","reasoners":[{"id":"r1","tags":["t1","t2"]},{"id":"r2"}],
                "skills":[{"id":"s1","tags":["t3"]}]}"#,
        );
        let r: Vec<(String, Vec<String>)> =
            h.reasoners().map(|c| (c.id.to_owned(), c.tags.map(str::to_owned).collect())).collect();
        assert_eq!(r, [("r1".to_owned(), vec!["t1".to_owned(), "t2".to_owned()]), ("r2".to_owned(), vec![])]);
        let s: Vec<&str> = h.skills().map(|c| c.id).collect();
        assert_eq!(s, ["s1"]);
        assert_eq!((h.reasoner_count(), h.skill_count()), (2, 1));
    }

    #[test]
    fn empty_parts_have_no_capabilities() {
        let h = held(r#"{"agent_id":"a","base_url":"http://x","skills":[{"id":"s"}]}"#);
        assert_eq!(h.reasoners().count(), 0);
        assert_eq!(h.skills().count(), 1);
        let h = held(r#"{"agent_id":"a","base_url":"http://x"}"#);
        assert_eq!((h.reasoners().count(), h.skills().count()), (0, 0));
    }

    #[test]
    fn view_borrows_and_unescapes() {
        let h = held(
            r#"{"agent_id":"a","base_url":"http://x","description":"say \"hi\"","reasoners":[{"id":"r","input_schema":{"type":"object"}}]}"#,
        );
        let text = h.text();
        let v = text.view();
        assert_eq!(v.description, "say \"hi\"");
        assert!(matches!(v.agent_id, Cow::Borrowed(_)));
        assert_eq!(v.reasoners[0].input_schema.unwrap().get(), r#"{"type":"object"}"#);
        assert_eq!(text.raw().get(), &*text);
    }

    #[test]
    fn the_held_text_is_the_canonical_text_in_a_third_of_the_bytes() {
        let schema = r#"{"type":"object","properties":{"input":{"type":"string","description":"what to work on"},"max_items":{"type":"integer","default":10}},"required":["input"]}"#;
        let caps: Vec<String> = (0..4)
            .map(|i| format!(r#"{{"id":"cap_{i}","description":"does thing {i} and returns a structured result","tags":["t{i}"],"input_schema":{schema},"output_schema":{schema}}}"#))
            .collect();
        let json = format!(
            r#"{{"agent_id":"a","base_url":"http://x","description":"café \"quoted\"","reasoners":[{}],"skills":[{}]}}"#,
            caps[..2].join(","),
            caps[2..].join(",")
        );
        let card = AgentCard::from_json(json.as_bytes()).unwrap();
        let canonical = card.to_json();
        let h = HeldCard::new(&card);
        assert_eq!(h.text().as_bytes(), &canonical[..]);
        assert!(h.packed.len() * 3 < canonical.len(), "{} of {} bytes", h.packed.len(), canonical.len());
        // Every thread has its own contexts; a text compressed on one reads the same on another.
        let text = std::thread::spawn(move || h.text()).join().unwrap();
        assert_eq!(text.as_bytes(), &canonical[..]);
        assert_eq!(
            HeldCard::new(&AgentCard::from_json(br#"{"agent_id":"b","base_url":"http://y"}"#).unwrap())
                .text()
                .view()
                .agent_id,
            "b"
        );
    }

    #[test]
    fn the_canonical_text_gives_the_same_held_card_as_the_card() {
        for json in [
            r#"{"agent_id":"a","base_url":"http://x"}"#,
            r#"{"agent_id":"a","base_url":"http://x","version":"2.1.0","group_id":"g","reasoners":[{"id":"r1","tags":["t1","t\"2"]},{"id":"r2"}],"skills":[{"id":"s1","tags":["t3"]}]}"#,
            r#"{"agent_id":"b","base_url":"http://x","version":"not semver","skills":[{"id":"s"}]}"#,
        ] {
            let card = AgentCard::from_json(json.as_bytes()).unwrap();
            let canonical = String::from_utf8(card.to_json()).unwrap();
            assert_eq!(HeldCard::from_canonical(&canonical, &card.agent_id), Some(HeldCard::new(&card)));
            assert_eq!(
                HeldCard::from_canonical(&canonical, "another"),
                None,
                "the row's agent id is checked"
            );
        }
        assert_eq!(HeldCard::from_canonical("not json", "a"), None);
    }
}
