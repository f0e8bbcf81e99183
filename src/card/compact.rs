//! Whether a JSON text is already in the form a card keeps its schemas and examples in (serde_json's
//! compact output of the parsed value, keys in their order), without parsing it into a value: a card
//! that came over the mesh was normalised by its publisher, so its schemas are nearly always in that
//! form, and parsing each into a `serde_json::Value` only to write the same text back was 7 % of a
//! joining node's time (BENCHMARKS.md, "Whose code a node at rest runs, and a joiner's").
//!
//! The answer is conservative: `true` only for texts that are certainly the compact form (no whitespace,
//! no escape in any string, integers of at most 18 digits, no repeated key in an object, nesting within
//! serde_json's limit); anything else, valid or not, is `false` and goes the full way. Pure.

/// serde_json's recursion limit: deeper texts fail to parse, so they are left to the parser.
const MAX_DEPTH: usize = 127;
/// Keys one object may have and still be checked here (each key is compared with those before it).
const MAX_KEYS_CHECKED: usize = 64;
/// Digits of an integer that fits `i64` and `u64` whatever they are.
const MAX_INT_DIGITS: usize = 18;

/// Whether `text` is one JSON value exactly as `serde_json::to_string` writes it back after parsing.
pub fn is_compact(text: &str) -> bool {
    let mut scan = Scan { bytes: text.as_bytes(), at: 0, keys: Vec::new() };
    scan.value(0) && scan.at == scan.bytes.len()
}

struct Scan<'a> {
    bytes: &'a [u8],
    at: usize,
    /// Keys of the objects being read, innermost last.
    keys: Vec<&'a [u8]>,
}

impl<'a> Scan<'a> {
    fn peek(&self) -> Option<u8> {
        self.bytes.get(self.at).copied()
    }

    fn eat(&mut self, byte: u8) -> bool {
        let found = self.peek() == Some(byte);
        self.at += usize::from(found);
        found
    }

    fn value(&mut self, depth: usize) -> bool {
        match self.peek() {
            Some(b'{') => depth < MAX_DEPTH && self.object(depth + 1),
            Some(b'[') => depth < MAX_DEPTH && self.array(depth + 1),
            Some(b'"') => self.string().is_some(),
            Some(b'-' | b'0'..=b'9') => self.integer(),
            Some(b't') => self.literal(b"true"),
            Some(b'f') => self.literal(b"false"),
            Some(b'n') => self.literal(b"null"),
            _ => false,
        }
    }

    fn literal(&mut self, word: &[u8]) -> bool {
        let found = self.bytes[self.at..].starts_with(word);
        self.at += if found { word.len() } else { 0 };
        found
    }

    fn object(&mut self, depth: usize) -> bool {
        self.at += 1;
        if self.eat(b'}') {
            return true;
        }
        let first = self.keys.len();
        loop {
            let Some(key) = self.string() else { return false };
            let held = &self.keys[first..];
            if held.len() >= MAX_KEYS_CHECKED || held.contains(&key) {
                return false;
            }
            self.keys.push(key);
            if !self.eat(b':') || !self.value(depth) {
                return false;
            }
            if self.eat(b'}') {
                self.keys.truncate(first);
                return true;
            }
            if !self.eat(b',') {
                return false;
            }
        }
    }

    fn array(&mut self, depth: usize) -> bool {
        self.at += 1;
        if self.eat(b']') {
            return true;
        }
        loop {
            if !self.value(depth) {
                return false;
            }
            if self.eat(b']') {
                return true;
            }
            if !self.eat(b',') {
                return false;
            }
        }
    }

    /// A string without escapes or control characters; its contents.
    fn string(&mut self) -> Option<&'a [u8]> {
        let bytes: &'a [u8] = self.bytes;
        if bytes.get(self.at) != Some(&b'"') {
            return None;
        }
        let start = self.at + 1;
        let len = bytes[start..].iter().position(|&b| b == b'"' || b == b'\\' || b < 0x20)?;
        let end = start + len;
        if bytes[end] != b'"' {
            return None;
        }
        self.at = end + 1;
        // The text is a `&str`, so the bytes between two quotes are whole UTF-8 characters.
        Some(&bytes[start..end])
    }

    /// An integer as serde_json writes it: no leading zero, no `-0`, no fraction or exponent.
    fn integer(&mut self) -> bool {
        let negative = self.eat(b'-');
        let start = self.at;
        let digits = self.bytes[start..].iter().take_while(|b| b.is_ascii_digit()).count();
        self.at += digits;
        let first = self.bytes.get(start).copied();
        let canonical = match digits {
            0 => false,
            1 => !(negative && first == Some(b'0')),
            n => n <= MAX_INT_DIGITS && first != Some(b'0'),
        };
        canonical && !matches!(self.peek(), Some(b'.' | b'e' | b'E'))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What the full way makes of `text`: serde_json's compact form of the parsed value.
    fn rewritten(text: &str) -> Option<String> {
        let value: serde_json::Value = serde_json::from_str(text).ok()?;
        Some(serde_json::to_string(&value).unwrap())
    }

    #[test]
    fn compact_texts_are_recognised_and_are_what_parsing_writes_back() {
        for text in [
            r#"{}"#,
            r#"{"type":"object","properties":{"q":{"type":"string","maxLength":200}},"required":["q"]}"#,
            r#"{"z":1,"a":[true,false,null,-7,0,123456789012345678],"é":"naïve ✓"}"#,
            r#"[[],[{}],"",{"a":{"a":{"a":1}}}]"#,
            r#"-1"#,
            r#""text""#,
        ] {
            assert!(is_compact(text), "{text}");
            assert_eq!(rewritten(text).as_deref(), Some(text), "{text}");
        }
    }

    #[test]
    fn anything_parsing_would_change_or_refuse_is_left_to_the_parser() {
        for text in [
            r#"{ "a":1}"#,
            "{\"a\":1}\n",
            r#"{"a":1,"a":2}"#,
            r#"{"a":"\"quoted\""}"#,
            r#"{"a":"\u0041"}"#,
            r#"{"a":1.0}"#,
            r#"{"a":1e3}"#,
            r#"{"a":-0}"#,
            r#"{"a":007}"#,
            r#"{"a":1234567890123456789012}"#,
            r#"{"a":tru}"#,
            r#"{"a":1,}"#,
            r#"{"a"}"#,
            r#"[1 ,2]"#,
            r#"{"a":1}{"b":2}"#,
            "\"tab\there\"",
            "",
        ] {
            assert!(!is_compact(text), "{text}");
        }
        let deep = format!("{}{}", "[".repeat(200), "]".repeat(200));
        assert!(!is_compact(&deep), "deeper than serde_json reads");
        let wide: Vec<String> = (0..100).map(|i| format!("\"k{i}\":{i}")).collect();
        assert!(!is_compact(&format!("{{{}}}", wide.join(","))), "too many keys to check");
    }

    /// Over generated values: the compact text of a value with only plain strings and integers is
    /// accepted, and whatever is accepted, parsing writes back unchanged (also after a byte is changed).
    #[test]
    fn generated_values_agree_with_the_parser() {
        use rand::{Rng as _, SeedableRng as _};
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        let words = ["a", "b", "type", "x y", "ü", "", "properties"];
        fn gen(rng: &mut rand::rngs::StdRng, words: &[&str], depth: usize) -> serde_json::Value {
            use serde_json::Value;
            match if depth > 3 { rng.random_range(0..4) } else { rng.random_range(0..6) } {
                0 => Value::from(rng.random_range(-1000i64..1000)),
                1 => Value::from(words[rng.random_range(0..words.len())]),
                2 => Value::Bool(rng.random()),
                3 => Value::Null,
                4 => Value::Array((0..rng.random_range(0..4)).map(|_| gen(rng, words, depth + 1)).collect()),
                _ => Value::Object(
                    (0..rng.random_range(0..4))
                        .map(|_| {
                            (words[rng.random_range(0..words.len())].to_owned(), gen(rng, words, depth + 1))
                        })
                        .collect(),
                ),
            }
        }
        for _ in 0..20_000 {
            let text = serde_json::to_string(&gen(&mut rng, &words, 0)).unwrap();
            assert!(is_compact(&text), "{text}");
            assert_eq!(rewritten(&text).as_deref(), Some(text.as_str()));
            // Any one byte changed: accepted only if parsing would write the result back as it is.
            let mut bytes = text.clone().into_bytes();
            let i = rng.random_range(0..bytes.len());
            let swaps = b" ,:{}[]\\\"0-.e1";
            bytes[i] = swaps[rng.random_range(0..swaps.len())];
            if let Ok(changed) = String::from_utf8(bytes) {
                if is_compact(&changed) {
                    assert_eq!(rewritten(&changed).as_deref(), Some(changed.as_str()), "{text} -> {changed}");
                }
            }
        }
    }
}
