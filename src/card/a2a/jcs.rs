//! RFC 8785 (JCS) canonical bytes of a JSON value, written in one pass: object members sorted by the
//! UTF-16 code units of their names, strings escaped as ECMAScript's `JSON.stringify` does, numbers as
//! ECMAScript formats a double. Every card a node hears has its A2A signature checked over these bytes,
//! so they are made without the intermediate buffers of a general serializer. The output is the same
//! as `serde_json_canonicalizer`'s (the tests compare the two on random values).

use serde_json::{Number, Value};

/// The canonical bytes of `value`.
pub fn to_vec(value: &Value) -> Vec<u8> {
    let mut out = Vec::with_capacity(256);
    write(value, &mut out);
    out
}

fn write(value: &Value, out: &mut Vec<u8>) {
    match value {
        Value::Null => out.extend_from_slice(b"null"),
        Value::Bool(true) => out.extend_from_slice(b"true"),
        Value::Bool(false) => out.extend_from_slice(b"false"),
        Value::Number(n) => number(n, out),
        Value::String(s) => string(s, out),
        Value::Array(items) => {
            out.push(b'[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                write(item, out);
            }
            out.push(b']');
        }
        Value::Object(map) => {
            let mut members: Vec<(&String, &Value)> = map.iter().collect();
            members.sort_unstable_by(|a, b| utf16_order(a.0, b.0));
            out.push(b'{');
            for (i, (key, value)) in members.into_iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                string(key, out);
                out.push(b':');
                write(value, out);
            }
            out.push(b'}');
        }
    }
}

/// Names compare by UTF-16 code units (RFC 8785 §3.2.3). UTF-8 bytes compare as code points, and so
/// do UTF-16 code units but in one case: a character beyond the Basic Multilingual Plane (a surrogate
/// pair, from 0xD800) sorts before one from U+E000 to U+FFFF. The first byte in which the names differ
/// tells: there both are inside characters of one length, or both start a character, and those two
/// cases start with a byte of 0xF0 or more (four bytes) and 0xEE or 0xEF (U+E000 to U+FFFF).
pub(super) fn utf16_order(a: &str, b: &str) -> std::cmp::Ordering {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    match a.iter().zip(b).position(|(x, y)| x != y) {
        None => a.len().cmp(&b.len()),
        Some(i) => {
            let (x, y) = (a[i], b[i]);
            let surrogates_first = x >= 0xee && y >= 0xee && ((x >= 0xf0) != (y >= 0xf0));
            if surrogates_first {
                y.cmp(&x)
            } else {
                x.cmp(&y)
            }
        }
    }
}

pub(super) fn string(s: &str, out: &mut Vec<u8>) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let bytes = s.as_bytes();
    out.reserve(bytes.len() + 2);
    out.push(b'"');
    // Most strings need no escape: one pass without an early exit (which the compiler vectorises) tells.
    if bytes.iter().fold(true, |plain, &b| plain & (b >= 0x20) & (b != b'"') & (b != b'\\')) {
        out.extend_from_slice(bytes);
        out.push(b'"');
        return;
    }
    let mut start = 0;
    for (i, &b) in bytes.iter().enumerate() {
        let escape: &[u8] = match b {
            b'"' => b"\\\"",
            b'\\' => b"\\\\",
            0x08 => b"\\b",
            0x0c => b"\\f",
            b'\n' => b"\\n",
            b'\r' => b"\\r",
            b'\t' => b"\\t",
            0x00..=0x1f => &[b'\\', b'u', b'0', b'0', HEX[(b >> 4) as usize], HEX[(b & 0xf) as usize]],
            _ => continue,
        };
        out.extend_from_slice(&bytes[start..i]);
        out.extend_from_slice(escape);
        start = i + 1;
    }
    out.extend_from_slice(&bytes[start..]);
    out.push(b'"');
}

/// A number as ECMAScript prints the double it is (JSON has no other number type).
pub(super) fn number(n: &Number, out: &mut Vec<u8>) {
    match (n.as_u64(), n.as_i64()) {
        // Integers a double holds exactly print as themselves.
        (Some(u), _) if u <= 1 << 53 => out.extend_from_slice(u.to_string().as_bytes()),
        (_, Some(i)) if i.unsigned_abs() <= 1 << 53 => out.extend_from_slice(i.to_string().as_bytes()),
        // The rest (fractions, exponents, large integers): ECMAScript's shortest round-trip form.
        _ => out.extend(serde_json_canonicalizer::to_vec(&Value::Number(n.clone())).unwrap_or_default()),
    }
}

/// Random texts for the tests of canonical JSON and of what is written in it.
#[cfg(test)]
pub(super) mod random {
    use rand::rngs::StdRng;
    use rand::Rng;

    /// Empty, ASCII, characters that need escapes, two and three bytes, beyond the BMP.
    pub const PIECES: &[&str] = &[
        "a",
        "b",
        "Z",
        "_",
        "-",
        "0",
        " ",
        "é",
        "ö",
        "€",
        "日本",
        "\u{2028}",
        "\u{7f}",
        "\u{ffff}",
        "\u{fb01}",
        "\u{10000}",
        "😀",
        "\u{10ffff}",
        "\"",
        "\\",
        "/",
        "\n",
        "\t",
        "\r",
        "\u{1}",
        "\u{8}",
        "\u{c}",
        "\u{1f}",
    ];

    /// Text of 0 to 5 pieces.
    pub fn text(rng: &mut StdRng) -> String {
        (0..rng.random_range(0..6)).map(|_| PIECES[rng.random_range(0..PIECES.len())]).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::random::text;
    use super::*;
    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};
    use serde_json::{json, Map};

    fn value(rng: &mut StdRng, depth: u32) -> Value {
        match rng.random_range(0..if depth > 3 { 5 } else { 7 }) {
            0 => Value::Null,
            1 => Value::Bool(rng.random()),
            2 => match rng.random_range(0..6) {
                0 => json!(rng.random::<u64>()),
                1 => json!(rng.random::<i64>()),
                2 => json!(rng.random_range(-1000..1000)),
                3 => json!(rng.random::<f64>() * 10f64.powi(rng.random_range(-30..30))),
                4 => json!(rng.random_range(0..100) as f64 / 4.0),
                _ => json!(9_007_199_254_740_993u64),
            },
            3 | 4 => Value::String(text(rng)),
            5 => Value::Array((0..rng.random_range(0..5)).map(|_| value(rng, depth + 1)).collect()),
            _ => {
                let mut map = Map::new();
                for _ in 0..rng.random_range(0..7) {
                    map.insert(text(rng), value(rng, depth + 1));
                }
                Value::Object(map)
            }
        }
    }

    #[test]
    fn the_same_bytes_as_the_reference_canonicalizer() {
        let mut rng = StdRng::seed_from_u64(8785);
        for _ in 0..20_000 {
            let v = value(&mut rng, 0);
            let want = serde_json_canonicalizer::to_vec(&v).unwrap();
            assert_eq!(String::from_utf8_lossy(&to_vec(&v)), String::from_utf8_lossy(&want), "{v:?}");
        }
    }

    #[test]
    fn name_order_is_the_order_of_utf16_code_units() {
        // Characters at the edges of the byte ranges that decide: ASCII, two and three bytes below and
        // from U+E000, four bytes.
        const PIECES: &[&str] = &[
            "a",
            "\u{7f}",
            "é",
            "\u{7ff}",
            "€",
            "\u{d7ff}",
            "\u{e000}",
            "\u{fb01}",
            "\u{ffff}",
            "\u{10000}",
            "😀",
            "\u{10ffff}",
        ];
        let mut rng = StdRng::seed_from_u64(16);
        let text = |rng: &mut StdRng| -> String {
            (0..rng.random_range(0..4)).map(|_| PIECES[rng.random_range(0..PIECES.len())]).collect()
        };
        for _ in 0..100_000 {
            let (a, b) = (text(&mut rng), text(&mut rng));
            assert_eq!(utf16_order(&a, &b), a.encode_utf16().cmp(b.encode_utf16()), "{a:?} {b:?}");
        }
    }

    #[test]
    fn names_sort_by_utf16_code_units() {
        // U+FB01 sorts after U+1F600 in UTF-8 bytes, before it in UTF-16 code units (RFC 8785 §3.2.3).
        let v = json!({"\u{fb01}": 1, "\u{1f600}": 2, "a": 3, "": 4});
        assert_eq!(to_vec(&v), "{\"\":4,\"a\":3,\"\u{1f600}\":2,\"\u{fb01}\":1}".as_bytes());
        assert_eq!(
            to_vec(&json!({"b": [1.5, 1e21, -0.0, "x\u{1}"], "a": null})),
            br#"{"a":null,"b":[1.5,1e+21,0,"x\u0001"]}"#
        );
    }
}
