//! The clean canonical form of JSON written in one pass: what [`canonical`](super::canonical) makes of
//! a value [`clean`](super::clean)ed, without building either value.
//!
//! Members and elements are written as they come; one whose value turns out empty (`""`, `[]`, `{}`,
//! `null`, or a container left empty by the same rule) is cut off again, and so is a container left
//! with nothing in it. An object's members are written in the order given and reordered by UTF-16
//! code units (RFC 8785 §3.2.3) only if they were not already in that order, keeping the last of
//! members that share a name, as a JSON object (a `serde_json::Map`) keeps the last insert. Raw JSON
//! from a card (schemas, held A2A fields) is streamed through the same writer by `serde_json`'s own
//! parser, so numbers and strings read exactly as they read into a `Value`.

use std::borrow::Cow;
use std::fmt;
use std::ops::Range;

use serde::de::{DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};
use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::Number;

use super::jcs;

/// The bytes written so far, and the members of the objects still open.
pub struct Writer<'a> {
    out: Vec<u8>,
    /// Members of every open object, innermost last: each object reorders its own tail when it closes.
    members: Vec<Member<'a>>,
    /// Where an object whose members came out of order is put together again.
    scratch: Vec<u8>,
}

/// A member as written: its name and the bytes `"name":value` in `out`, empty when the value was.
struct Member<'a> {
    name: Cow<'a, str>,
    bytes: Range<usize>,
}

/// An object being written: where it starts in `out` and on the member stack.
#[must_use = "an object is closed with `Writer::end_object`"]
pub struct Object {
    start: usize,
    first_member: usize,
}

/// An array being written: where it starts in `out`.
#[must_use = "an array is closed with `Writer::end_array`"]
pub struct Array {
    start: usize,
}

impl<'a> Writer<'a> {
    pub fn with_capacity(capacity: usize) -> Self {
        Self { out: Vec::with_capacity(capacity), members: Vec::new(), scratch: Vec::new() }
    }

    /// The bytes, given whether the outermost value was kept: a value cleaned away entirely is `null`,
    /// as [`payload`](super::payload) makes it.
    pub fn finish(mut self, kept: bool) -> Vec<u8> {
        if !kept {
            self.out.clear();
            self.out.extend_from_slice(b"null");
        }
        self.out
    }

    /// A string; the empty string is dropped.
    pub fn text(&mut self, s: &str) -> bool {
        if s.is_empty() {
            return false;
        }
        jcs::string(s, &mut self.out);
        true
    }

    /// An array of strings, without its empty ones.
    pub fn texts<S: AsRef<str>>(&mut self, list: &[S]) -> bool {
        let array = self.begin_array();
        for s in list {
            let mark = self.begin_element();
            let kept = self.text(s.as_ref());
            self.end_element(mark, kept);
        }
        self.end_array(array)
    }

    pub fn flag(&mut self, value: bool) -> bool {
        self.out.extend_from_slice(if value { b"true" } else { b"false" });
        true
    }

    /// A number as a double, as JCS prints it.
    pub fn number(&mut self, n: &Number) -> bool {
        jcs::number(n, &mut self.out);
        true
    }

    /// A string-to-string map (card metadata) as an object.
    pub fn text_map(&mut self, map: &'a std::collections::BTreeMap<String, String>) -> bool {
        let object = self.begin_object();
        for (name, value) in map {
            let mark = self.begin_member(name.as_str());
            let kept = self.text(value);
            self.end_member(mark, kept);
        }
        self.end_object(object)
    }

    /// Raw JSON, cleaned. An error (JSON a `Value` could not hold) leaves the writer half-written: the
    /// caller gives up on it.
    pub fn raw(&mut self, raw: &'a str) -> Result<bool, serde_json::Error> {
        let mut de = serde_json::Deserializer::from_str(raw);
        let kept = Clean(self).deserialize(&mut de)?;
        de.end()?;
        Ok(kept)
    }

    pub fn begin_object(&mut self) -> Object {
        let object = Object { start: self.out.len(), first_member: self.members.len() };
        self.out.push(b'{');
        object
    }

    /// Writes member `name` with the value `value` writes (`Ok(false)`: nothing, which drops it). A
    /// later member of the same name replaces this one, even when the later one is dropped.
    pub fn member(
        &mut self,
        name: impl Into<Cow<'a, str>>,
        value: impl FnOnce(&mut Self) -> Result<bool, serde_json::Error>,
    ) -> Result<(), serde_json::Error> {
        let mark = self.begin_member(name);
        let kept = value(self)?;
        self.end_member(mark, kept);
        Ok(())
    }

    /// Writes `"name":` and notes the member as begun (its bytes still empty).
    fn begin_member(&mut self, name: impl Into<Cow<'a, str>>) -> usize {
        let mark = self.out.len();
        self.separate(b'{');
        let start = self.out.len();
        let name = name.into();
        jcs::string(&name, &mut self.out);
        self.out.push(b':');
        self.members.push(Member { name, bytes: start..start });
        mark
    }

    /// Ends the member begun at `mark`: its bytes noted if its value was kept, cut off if not.
    fn end_member(&mut self, mark: usize, kept: bool) {
        let end = self.out.len();
        if let Some(member) = self.members.last_mut() {
            if kept {
                member.bytes.end = end;
            } else {
                member.bytes = 0..0;
                self.out.truncate(mark);
            }
        }
    }

    /// Closes `object`: `false` (and nothing written) when no member was kept.
    pub fn end_object(&mut self, object: Object) -> bool {
        let members = &mut self.members[object.first_member..];
        let in_order =
            members.windows(2).all(|m| jcs::utf16_order(&m[0].name, &m[1].name) == std::cmp::Ordering::Less);
        if !in_order {
            members.sort_by(|a, b| jcs::utf16_order(&a.name, &b.name));
            self.scratch.clear();
            self.scratch.push(b'{');
            for (i, member) in members.iter().enumerate() {
                let replaced = members.get(i + 1).is_some_and(|next| next.name == member.name);
                if replaced || member.bytes.is_empty() {
                    continue;
                }
                if self.scratch.len() > 1 {
                    self.scratch.push(b',');
                }
                self.scratch.extend_from_slice(&self.out[member.bytes.clone()]);
            }
            self.out.truncate(object.start);
            self.out.extend_from_slice(&self.scratch);
        }
        self.members.truncate(object.first_member);
        self.close(object.start, b'}')
    }

    pub fn begin_array(&mut self) -> Array {
        let array = Array { start: self.out.len() };
        self.out.push(b'[');
        array
    }

    /// Writes the element `value` writes; one that writes nothing is dropped.
    pub fn element(
        &mut self,
        value: impl FnOnce(&mut Self) -> Result<bool, serde_json::Error>,
    ) -> Result<(), serde_json::Error> {
        let mark = self.begin_element();
        let kept = value(self)?;
        self.end_element(mark, kept);
        Ok(())
    }

    fn begin_element(&mut self) -> usize {
        let mark = self.out.len();
        self.separate(b'[');
        mark
    }

    fn end_element(&mut self, mark: usize, kept: bool) {
        if !kept {
            self.out.truncate(mark);
        }
    }

    /// Closes `array`: `false` (and nothing written) when no element was kept.
    pub fn end_array(&mut self, array: Array) -> bool {
        self.close(array.start, b']')
    }

    /// A comma, unless the container just opened with `open` (a kept value never ends in `{` or `[`).
    fn separate(&mut self, open: u8) {
        if self.out.last() != Some(&open) {
            self.out.push(b',');
        }
    }

    fn close(&mut self, start: usize, end: u8) -> bool {
        if self.out.len() == start + 1 {
            self.out.truncate(start);
            false
        } else {
            self.out.push(end);
            true
        }
    }
}

/// The members of a raw JSON object, each value left raw: how a card's held A2A fields are picked
/// apart. Names may repeat; the last one counts, as in a `serde_json::Map`.
pub struct Members<'a>(pub Vec<(Cow<'a, str>, &'a RawValue)>);

impl<'a> Members<'a> {
    /// The members of `raw` when it is an object every part of which reads as a `Value`; none
    /// otherwise, as a held field that does not read as an object contributes nothing.
    pub fn of(raw: Option<&'a RawValue>) -> Self {
        let read = raw.filter(|r| reads_as_value(r.get())).map(|r| serde_json::from_str(r.get()));
        match read {
            Some(Ok(members)) => members,
            _ => Self(Vec::new()),
        }
    }

    /// The value of the last member named `name`.
    pub fn last(&self, name: &str) -> Option<&'a RawValue> {
        self.0.iter().rev().find(|(n, _)| n == name).map(|(_, v)| *v)
    }
}

impl<'de> Deserialize<'de> for Members<'de> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_map(MembersVisitor)
    }
}

struct MembersVisitor;

impl<'de> Visitor<'de> for MembersVisitor {
    type Value = Members<'de>;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a JSON object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut members = Vec::new();
        while let Some(name) = map.next_key_seed(Name)? {
            members.push((name, map.next_value()?));
        }
        Ok(Members(members))
    }
}

/// The elements of a raw JSON array, each left raw; `None` when `raw` is not an array.
pub fn elements(raw: &RawValue) -> Option<Vec<&RawValue>> {
    serde_json::from_str(raw.get()).ok()
}

/// The text of `raw` when it is a JSON string (borrowed unless it has escapes to decode).
pub fn json_string(raw: &str) -> Option<Cow<'_, str>> {
    let mut de = serde_json::Deserializer::from_str(raw);
    let text = Name.deserialize(&mut de).ok()?;
    de.end().ok()?;
    Some(text)
}

/// Whether `raw` reads as a `serde_json::Value` (every string's escapes decode, nesting within the
/// parser's limit), checked without building one.
pub fn reads_as_value(raw: &str) -> bool {
    serde_json::from_str::<Readable>(raw).is_ok()
}

struct Readable;

impl<'de> Deserialize<'de> for Readable {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(ReadableVisitor)
    }
}

struct ReadableVisitor;

impl<'de> Visitor<'de> for ReadableVisitor {
    type Value = Readable;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("any JSON value")
    }
    fn visit_bool<E>(self, _: bool) -> Result<Readable, E> {
        Ok(Readable)
    }
    fn visit_i64<E>(self, _: i64) -> Result<Readable, E> {
        Ok(Readable)
    }
    fn visit_u64<E>(self, _: u64) -> Result<Readable, E> {
        Ok(Readable)
    }
    fn visit_f64<E>(self, _: f64) -> Result<Readable, E> {
        Ok(Readable)
    }
    fn visit_str<E>(self, _: &str) -> Result<Readable, E> {
        Ok(Readable)
    }
    fn visit_unit<E>(self) -> Result<Readable, E> {
        Ok(Readable)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Readable, A::Error> {
        while seq.next_element::<Readable>()?.is_some() {}
        Ok(Readable)
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Readable, A::Error> {
        while map.next_entry::<Readable, Readable>()?.is_some() {}
        Ok(Readable)
    }
}

/// A member name, borrowed from the raw JSON unless it had escapes to decode.
struct Name;

impl<'de> DeserializeSeed<'de> for Name {
    type Value = Cow<'de, str>;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Self::Value, D::Error> {
        deserializer.deserialize_str(self)
    }
}

impl<'de> Visitor<'de> for Name {
    type Value = Cow<'de, str>;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a member name")
    }
    fn visit_borrowed_str<E>(self, s: &'de str) -> Result<Self::Value, E> {
        Ok(Cow::Borrowed(s))
    }
    fn visit_str<E>(self, s: &str) -> Result<Self::Value, E> {
        Ok(Cow::Owned(s.to_owned()))
    }
}

/// Streams one raw JSON value into the writer, cleaned; yields whether anything was kept.
struct Clean<'w, 'a>(&'w mut Writer<'a>);

impl<'a> DeserializeSeed<'a> for Clean<'_, 'a> {
    type Value = bool;

    fn deserialize<D: Deserializer<'a>>(self, deserializer: D) -> Result<bool, D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'a> Visitor<'a> for Clean<'_, 'a> {
    type Value = bool;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("any JSON value")
    }
    fn visit_bool<E>(self, value: bool) -> Result<bool, E> {
        Ok(self.0.flag(value))
    }
    fn visit_i64<E>(self, value: i64) -> Result<bool, E> {
        Ok(self.0.number(&Number::from(value)))
    }
    fn visit_u64<E>(self, value: u64) -> Result<bool, E> {
        Ok(self.0.number(&Number::from(value)))
    }
    /// A double a `Value` cannot hold (never one parsed from JSON) would be `null`: dropped.
    fn visit_f64<E>(self, value: f64) -> Result<bool, E> {
        Ok(Number::from_f64(value).is_some_and(|n| self.0.number(&n)))
    }
    fn visit_str<E>(self, value: &str) -> Result<bool, E> {
        Ok(self.0.text(value))
    }
    fn visit_unit<E>(self) -> Result<bool, E> {
        Ok(false)
    }
    fn visit_seq<A: SeqAccess<'a>>(self, mut seq: A) -> Result<bool, A::Error> {
        let array = self.0.begin_array();
        while seq.next_element_seed(Element(self.0))?.is_some() {}
        Ok(self.0.end_array(array))
    }
    fn visit_map<A: MapAccess<'a>>(self, mut map: A) -> Result<bool, A::Error> {
        let object = self.0.begin_object();
        while let Some(name) = map.next_key_seed(Name)? {
            let mark = self.0.begin_member(name);
            let kept = map.next_value_seed(Clean(&mut *self.0))?;
            self.0.end_member(mark, kept);
        }
        Ok(self.0.end_object(object))
    }
}

/// One element of a raw array: the separator is written only once the parser has found one.
struct Element<'w, 'a>(&'w mut Writer<'a>);

impl<'a> DeserializeSeed<'a> for Element<'_, 'a> {
    type Value = ();

    fn deserialize<D: Deserializer<'a>>(self, deserializer: D) -> Result<(), D::Error> {
        let mark = self.0.begin_element();
        let kept = Clean(&mut *self.0).deserialize(deserializer)?;
        self.0.end_element(mark, kept);
        Ok(())
    }
}
