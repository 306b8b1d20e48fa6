//! A request body's JSON as the upstream's server will read it, for the proxy's own checks
//! (the stored objects a call names, the inputs it brings that the proxy can't see). The gate
//! reads a body the way Python's `json.loads(bytes)` and JavaScript's `JSON.parse` do (a
//! byte-order mark, UTF-16 and UTF-32, `NaN` and `Infinity`, numbers past a double, lone
//! surrogates); a check that read it strictly would see nothing in a body the upstream reads
//! whole, and a tenant could name another's objects, or hide inputs, behind one odd byte.

use serde_json::{Map, Number, Value};

/// How deep a body may nest before the reader gives up (Python's parser stops near 1,000).
const MOST_DEPTH: usize = 1_000;

/// The JSON of `bytes` as a lenient server reads it (`Null`: empty, or not JSON to anyone).
pub(crate) fn read(bytes: &[u8]) -> Value {
    if bytes.is_empty() {
        return Value::Null;
    }
    if let Ok(value) = serde_json::from_slice(bytes) {
        return value;
    }
    let text = text_of(bytes);
    let mut parser = Parser {
        text: text.as_bytes(),
        chars: &text,
        at: 0,
    };
    parser.white();
    let Some(value) = parser.value(0) else {
        return Value::Null;
    };
    parser.white();
    if parser.at == parser.text.len() {
        value
    } else {
        Value::Null
    }
}

/// The text of a body as Python's `json.detect_encoding` decodes it: a byte-order mark, else
/// the pattern of zero bytes at its start (UTF-32 and UTF-16, either order), else UTF-8.
/// Whatever doesn't decode is U+FFFD (a lone surrogate too).
fn text_of(bytes: &[u8]) -> String {
    let utf16 = |b: &[u8], big: bool| {
        let units = b.chunks_exact(2).map(|c| {
            if big {
                u16::from_be_bytes([c[0], c[1]])
            } else {
                u16::from_le_bytes([c[0], c[1]])
            }
        });
        char::decode_utf16(units)
            .map(|c| c.unwrap_or(char::REPLACEMENT_CHARACTER))
            .collect::<String>()
    };
    let utf32 = |b: &[u8], big: bool| {
        b.chunks_exact(4)
            .map(|c| {
                let code = if big {
                    u32::from_be_bytes([c[0], c[1], c[2], c[3]])
                } else {
                    u32::from_le_bytes([c[0], c[1], c[2], c[3]])
                };
                char::from_u32(code).unwrap_or(char::REPLACEMENT_CHARACTER)
            })
            .collect::<String>()
    };
    match bytes {
        [0xFF, 0xFE, 0, 0, rest @ ..] => utf32(rest, false),
        [0, 0, 0xFE, 0xFF, rest @ ..] => utf32(rest, true),
        [0xFF, 0xFE, rest @ ..] => utf16(rest, false),
        [0xFE, 0xFF, rest @ ..] => utf16(rest, true),
        [0xEF, 0xBB, 0xBF, rest @ ..] => String::from_utf8_lossy(rest).into_owned(),
        [0, 0, _, _, ..] => utf32(bytes, true),
        [0, _, _, _, ..] => utf16(bytes, true),
        [_, 0, 0, 0, ..] => utf32(bytes, false),
        [_, 0, _, _, ..] => utf16(bytes, false),
        [0, _] => utf16(bytes, true),
        [_, 0] => utf16(bytes, false),
        _ => String::from_utf8_lossy(bytes).into_owned(),
    }
}

struct Parser<'t> {
    text: &'t [u8],
    /// The same text, to read a whole character at `at`.
    chars: &'t str,
    at: usize,
}

impl Parser<'_> {
    fn white(&mut self) {
        while self
            .text
            .get(self.at)
            .is_some_and(|b| matches!(b, b' ' | b'\t' | b'\n' | b'\r'))
        {
            self.at += 1;
        }
    }

    fn eat(&mut self, word: &[u8]) -> bool {
        if self.text[self.at..].starts_with(word) {
            self.at += word.len();
            true
        } else {
            false
        }
    }

    fn value(&mut self, depth: usize) -> Option<Value> {
        if depth > MOST_DEPTH {
            return None;
        }
        match *self.text.get(self.at)? {
            b'{' => self.object(depth),
            b'[' => self.array(depth),
            b'"' => self.string().map(Value::String),
            b't' if self.eat(b"true") => Some(Value::Bool(true)),
            b'f' if self.eat(b"false") => Some(Value::Bool(false)),
            b'n' if self.eat(b"null") => Some(Value::Null),
            // Python's and JavaScript's extensions: no id hides in a number.
            b'N' if self.eat(b"NaN") => Some(Value::Null),
            b'I' if self.eat(b"Infinity") => Some(Value::Null),
            b'-' if self.eat(b"-Infinity") => Some(Value::Null),
            b'-' | b'0'..=b'9' => self.number(),
            _ => None,
        }
    }

    fn object(&mut self, depth: usize) -> Option<Value> {
        self.at += 1;
        let mut map = Map::new();
        self.white();
        if self.eat(b"}") {
            return Some(Value::Object(map));
        }
        loop {
            self.white();
            if self.text.get(self.at) != Some(&b'"') {
                return None;
            }
            let key = self.string()?;
            self.white();
            if !self.eat(b":") {
                return None;
            }
            self.white();
            let value = self.value(depth + 1)?;
            // The last of a repeated key wins, as in Python and JavaScript.
            map.insert(key, value);
            self.white();
            if self.eat(b",") {
                continue;
            }
            return self.eat(b"}").then_some(Value::Object(map));
        }
    }

    fn array(&mut self, depth: usize) -> Option<Value> {
        self.at += 1;
        let mut items = Vec::new();
        self.white();
        if self.eat(b"]") {
            return Some(Value::Array(items));
        }
        loop {
            self.white();
            items.push(self.value(depth + 1)?);
            self.white();
            if self.eat(b",") {
                continue;
            }
            return self.eat(b"]").then_some(Value::Array(items));
        }
    }

    fn number(&mut self) -> Option<Value> {
        let start = self.at;
        self.eat(b"-");
        while self
            .text
            .get(self.at)
            .is_some_and(|b| b.is_ascii_digit() || matches!(b, b'.' | b'e' | b'E' | b'+' | b'-'))
        {
            self.at += 1;
        }
        let text = std::str::from_utf8(&self.text[start..self.at]).ok()?;
        if let Ok(whole) = text.parse::<i64>() {
            return Some(Value::Number(whole.into()));
        }
        if let Ok(whole) = text.parse::<u64>() {
            return Some(Value::Number(whole.into()));
        }
        let float = text.parse::<f64>().ok()?;
        // Past a double (1e400): infinity to Python, a number to no one here.
        Some(Number::from_f64(float).map_or(Value::Null, Value::Number))
    }

    fn string(&mut self) -> Option<String> {
        self.at += 1;
        let mut out = String::new();
        let mut units: Vec<u16> = Vec::new();
        let flush = |units: &mut Vec<u16>, out: &mut String| {
            out.extend(
                char::decode_utf16(units.drain(..))
                    .map(|c| c.unwrap_or(char::REPLACEMENT_CHARACTER)),
            );
        };
        loop {
            let byte = *self.text.get(self.at)?;
            match byte {
                b'"' => {
                    self.at += 1;
                    flush(&mut units, &mut out);
                    return Some(out);
                }
                b'\\' => {
                    let escape = *self.text.get(self.at + 1)?;
                    self.at += 2;
                    if escape == b'u' {
                        let hex = std::str::from_utf8(self.text.get(self.at..self.at + 4)?).ok()?;
                        units.push(u16::from_str_radix(hex, 16).ok()?);
                        self.at += 4;
                        continue;
                    }
                    flush(&mut units, &mut out);
                    out.push(match escape {
                        b'"' => '"',
                        b'\\' => '\\',
                        b'/' => '/',
                        b'b' => '\u{8}',
                        b'f' => '\u{c}',
                        b'n' => '\n',
                        b'r' => '\r',
                        b't' => '\t',
                        _ => return None,
                    });
                }
                _ => {
                    flush(&mut units, &mut out);
                    // `at` is at a character's start: every byte before it was ASCII or a
                    // whole character.
                    let c = self.chars.get(self.at..)?.chars().next()?;
                    out.push(c);
                    self.at += c.len_utf8();
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_body_is_read_as_a_python_server_reads_it() {
        let plain =
            json!({"previous_response_id": "resp_1", "n": [1, 2.5, -3], "t": true, "x": null});
        let text = plain.to_string();
        assert_eq!(read(text.as_bytes()), plain);
        let bom = [&b"\xEF\xBB\xBF"[..], text.as_bytes()].concat();
        assert_eq!(read(&bom), plain);
        let mut le = vec![0xFF, 0xFE];
        let mut be = Vec::new();
        let mut le32 = Vec::new();
        for unit in text.encode_utf16() {
            le.extend_from_slice(&unit.to_le_bytes());
            be.extend_from_slice(&unit.to_be_bytes());
        }
        for c in text.chars() {
            le32.extend_from_slice(&u32::from(c).to_le_bytes());
        }
        assert_eq!(read(&le), plain);
        assert_eq!(read(&be), plain);
        assert_eq!(read(&le32), plain);
        let odd = r#"{"a": NaN, "b": -Infinity, "c": 1e400, "d": "\ud800 x", "e": "\u0072esp_2", "previous_response_id": "resp_1", "previous_response_id": "resp_3"}"#;
        let value = read(odd.as_bytes());
        assert_eq!(value["a"], Value::Null);
        assert_eq!(value["b"], Value::Null);
        assert_eq!(value["c"], Value::Null);
        assert_eq!(value["d"], "\u{FFFD} x");
        assert_eq!(value["e"], "resp_2");
        assert_eq!(value["previous_response_id"], "resp_3");
        assert_eq!(read(b"{\"a\": 1} trailing"), Value::Null);
        assert_eq!(read(b"not json"), Value::Null);
        assert_eq!(read(&[b'['; 5_000]), Value::Null);
        assert_eq!(
            read("{\"é\": \"ü\", \"s\": \"\\ud83d\\ude00\"}".as_bytes())["s"],
            "😀"
        );
    }
}
