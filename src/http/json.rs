//! JSON read the way the servers behind an API read it: Python's `json` (FastAPI, Starlette,
//! Flask) and JavaScript's `JSON.parse` accept what `serde_json` refuses, and a body the gate
//! can't read must not pass for free.
//!
//! [`parse`] takes text (already decoded from its bytes, see `request.rs`) and answers a
//! `serde_json::Value`:
//!
//! - `NaN`, `Infinity` and `-Infinity` (Python reads them) become `null`; so does a number too
//!   large for an `f64` (`1e400`, which Python reads as infinity);
//! - a lone surrogate escape (`"\ud800"`, which Python keeps) becomes U+FFFD;
//! - nesting deeper than [`FLATTEN_DEPTH`] is kept as the raw text of the deeper value (a
//!   string), so that its words still count and no walk of it can run out of stack; nesting
//!   deeper than [`MOST_DEPTH`] (past Python's recursion limit) is refused;
//! - duplicate keys keep the last value, as Python's `dict` does.
//!
//! It is iterative (no recursion on the input's nesting), linear in the text, and refuses a
//! document of more than [`MOST_VALUES`] values (each costs a `Value`, tens of bytes, where the
//! text spent two).

use serde_json::{Map, Number, Value};

/// Containers deeper than this are kept as their raw text.
pub(crate) const FLATTEN_DEPTH: usize = 64;
/// Deeper than this is refused: Python's parser gives up near 1,000 levels too.
pub(crate) const MOST_DEPTH: usize = 1_000;
/// The most values one document may hold.
pub(crate) const MOST_VALUES: usize = 2_000_000;

/// Why a text is not JSON even to a lenient reader.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct JsonError {
    /// Where (a byte offset into the text).
    pub(crate) at: usize,
    /// What was wrong.
    pub(crate) what: &'static str,
}

/// A field of the top-level object: its key, and where its value's text starts and ends.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Field {
    pub(crate) key: String,
    pub(crate) value: std::ops::Range<usize>,
}

/// A parsed document, and the fields of its top-level object (empty when it is not one).
#[derive(Debug)]
pub(crate) struct Parsed {
    pub(crate) value: Value,
    pub(crate) fields: Vec<Field>,
}

enum Frame {
    Array(Vec<Value>),
    /// The object so far, the key whose value comes next, and (at the top level) where that
    /// value starts.
    Object(Map<String, Value>, Option<String>, usize),
}

struct Reader<'t> {
    text: &'t str,
    bytes: &'t [u8],
    at: usize,
    values: usize,
}

/// Reads `text` as lenient JSON; see the module docs.
pub(crate) fn parse(text: &str) -> Result<Parsed, JsonError> {
    let mut reader = Reader {
        text,
        bytes: text.as_bytes(),
        at: 0,
        values: 0,
    };
    let parsed = reader.document()?;
    reader.space();
    if reader.at != reader.bytes.len() {
        return Err(reader.error("text after the document"));
    }
    Ok(parsed)
}

impl Reader<'_> {
    fn error(&self, what: &'static str) -> JsonError {
        JsonError { at: self.at, what }
    }

    fn space(&mut self) {
        while let Some(b' ' | b'\t' | b'\n' | b'\r') = self.bytes.get(self.at) {
            self.at += 1;
        }
    }

    fn peek(&self) -> Option<u8> {
        self.bytes.get(self.at).copied()
    }

    fn counted(&mut self) -> Result<(), JsonError> {
        self.values += 1;
        if self.values > MOST_VALUES {
            return Err(self.error("more values than a request holds"));
        }
        Ok(())
    }

    fn document(&mut self) -> Result<Parsed, JsonError> {
        let mut stack: Vec<Frame> = Vec::new();
        let mut fields = Vec::new();
        loop {
            // A value is expected here.
            self.space();
            let value = match self.peek() {
                Some(open @ (b'[' | b'{')) if stack.len() >= FLATTEN_DEPTH => {
                    let start = self.at;
                    self.skip_nested(open, stack.len())?;
                    Value::String(self.text[start..self.at].to_owned())
                }
                Some(b'[') => {
                    self.at += 1;
                    self.counted()?;
                    self.space();
                    if self.peek() == Some(b']') {
                        self.at += 1;
                        Value::Array(Vec::new())
                    } else {
                        stack.push(Frame::Array(Vec::new()));
                        continue;
                    }
                }
                Some(b'{') => {
                    self.at += 1;
                    self.counted()?;
                    self.space();
                    if self.peek() == Some(b'}') {
                        self.at += 1;
                        Value::Object(Map::new())
                    } else {
                        let key = self.key()?;
                        let start = self.at;
                        stack.push(Frame::Object(Map::new(), Some(key), start));
                        continue;
                    }
                }
                _ => self.scalar()?,
            };
            // The value is done: put it in its container, then close what ends here.
            let mut value = value;
            loop {
                let top = stack.len() == 1;
                match stack.last_mut() {
                    None => return Ok(Parsed { value, fields }),
                    Some(Frame::Array(items)) => {
                        items.push(value);
                        self.space();
                        match self.peek() {
                            Some(b',') => {
                                self.at += 1;
                                break;
                            }
                            Some(b']') => {
                                self.at += 1;
                                let Some(Frame::Array(items)) = stack.pop() else {
                                    unreachable!("the top frame is an array")
                                };
                                value = Value::Array(items);
                            }
                            _ => return Err(self.error("expected `,` or `]`")),
                        }
                    }
                    Some(Frame::Object(map, key, start)) => {
                        let key = key.take().expect("a value follows its key");
                        if top {
                            fields.push(Field {
                                key: key.clone(),
                                value: *start..self.at,
                            });
                        }
                        map.insert(key, value);
                        self.space();
                        match self.peek() {
                            Some(b',') => {
                                self.at += 1;
                                self.space();
                                let next = self.key()?;
                                if let Some(Frame::Object(_, key, start)) = stack.last_mut() {
                                    *key = Some(next);
                                    *start = self.at;
                                }
                                break;
                            }
                            Some(b'}') => {
                                self.at += 1;
                                let Some(Frame::Object(map, _, _)) = stack.pop() else {
                                    unreachable!("the top frame is an object")
                                };
                                value = Value::Object(map);
                            }
                            _ => return Err(self.error("expected `,` or `}`")),
                        }
                    }
                }
            }
        }
    }

    /// A key and its colon; leaves `at` where the value's whitespace starts.
    fn key(&mut self) -> Result<String, JsonError> {
        if self.peek() != Some(b'"') {
            return Err(self.error("expected a key in quotes"));
        }
        let key = self.string()?;
        self.space();
        if self.peek() != Some(b':') {
            return Err(self.error("expected `:`"));
        }
        self.at += 1;
        self.space();
        Ok(key)
    }

    fn scalar(&mut self) -> Result<Value, JsonError> {
        self.counted()?;
        let rest = &self.bytes[self.at..];
        let literal = |word: &[u8]| rest.starts_with(word);
        let (value, length) = if literal(b"true") {
            (Value::Bool(true), 4)
        } else if literal(b"false") {
            (Value::Bool(false), 5)
        } else if literal(b"null") {
            (Value::Null, 4)
        } else if literal(b"NaN") {
            (Value::Null, 3)
        } else if literal(b"Infinity") {
            (Value::Null, 8)
        } else if literal(b"-Infinity") {
            (Value::Null, 9)
        } else {
            return match self.peek() {
                Some(b'"') => self.string().map(Value::String),
                Some(b'-' | b'0'..=b'9') => self.number(),
                Some(_) => Err(self.error("expected a value")),
                None => Err(self.error("the text ends where a value was expected")),
            };
        };
        self.at += length;
        Ok(value)
    }

    fn number(&mut self) -> Result<Value, JsonError> {
        let start = self.at;
        let digits = |reader: &mut Reader<'_>| {
            let from = reader.at;
            while let Some(b'0'..=b'9') = reader.peek() {
                reader.at += 1;
            }
            reader.at - from
        };
        if self.peek() == Some(b'-') {
            self.at += 1;
        }
        let whole_start = self.at;
        let whole = digits(self);
        if whole == 0 {
            return Err(self.error("a number without digits"));
        }
        if whole > 1 && self.bytes[whole_start] == b'0' {
            return Err(self.error("a number with a leading zero"));
        }
        let mut integer = true;
        if self.peek() == Some(b'.') {
            self.at += 1;
            integer = false;
            if digits(self) == 0 {
                return Err(self.error("a fraction without digits"));
            }
        }
        if let Some(b'e' | b'E') = self.peek() {
            self.at += 1;
            integer = false;
            if let Some(b'+' | b'-') = self.peek() {
                self.at += 1;
            }
            if digits(self) == 0 {
                return Err(self.error("an exponent without digits"));
            }
        }
        let text = &self.text[start..self.at];
        if integer {
            if let Ok(n) = text.parse::<u64>() {
                return Ok(Value::Number(n.into()));
            }
            // `-0` is a float to serde_json (and to Python, an int: either way, not text).
            if let Ok(n) = text.parse::<i64>()
                && n != 0
            {
                return Ok(Value::Number(n.into()));
            }
        }
        // Beyond an f64 (Python's infinity) there is no JSON number to keep.
        Ok(text
            .parse::<f64>()
            .ok()
            .and_then(Number::from_f64)
            .map_or(Value::Null, Value::Number))
    }

    /// A string at `at` (on its opening quote).
    fn string(&mut self) -> Result<String, JsonError> {
        self.at += 1;
        let mut out = String::new();
        loop {
            let from = self.at;
            while let Some(&b) = self.bytes.get(self.at) {
                if b == b'"' || b == b'\\' || b < 0x20 {
                    break;
                }
                self.at += 1;
            }
            out.push_str(&self.text[from..self.at]);
            match self.peek() {
                Some(b'"') => {
                    self.at += 1;
                    return Ok(out);
                }
                Some(b'\\') => {
                    self.at += 1;
                    self.escape(&mut out)?;
                }
                Some(_) => return Err(self.error("a control character in a string")),
                None => return Err(self.error("a string without its closing quote")),
            }
        }
    }

    fn escape(&mut self, out: &mut String) -> Result<(), JsonError> {
        let Some(b) = self.peek() else {
            return Err(self.error("an escape at the end of the text"));
        };
        self.at += 1;
        let c = match b {
            b'"' => '"',
            b'\\' => '\\',
            b'/' => '/',
            b'b' => '\u{8}',
            b'f' => '\u{c}',
            b'n' => '\n',
            b'r' => '\r',
            b't' => '\t',
            b'u' => {
                let first = self.hex4()?;
                match first {
                    0xD800..=0xDBFF => {
                        // A pair, if a low surrogate follows; else a lone one.
                        let rest = &self.bytes[self.at..];
                        if rest.starts_with(b"\\u") {
                            let save = self.at;
                            self.at += 2;
                            let second = self.hex4()?;
                            if (0xDC00..=0xDFFF).contains(&second) {
                                let code = 0x10000 + ((first - 0xD800) << 10) + (second - 0xDC00);
                                char::from_u32(code).unwrap_or('\u{FFFD}')
                            } else {
                                self.at = save;
                                '\u{FFFD}'
                            }
                        } else {
                            '\u{FFFD}'
                        }
                    }
                    0xDC00..=0xDFFF => '\u{FFFD}',
                    code => char::from_u32(code).unwrap_or('\u{FFFD}'),
                }
            }
            _ => return Err(self.error("an unknown escape")),
        };
        out.push(c);
        Ok(())
    }

    fn hex4(&mut self) -> Result<u32, JsonError> {
        let Some(digits) = self.bytes.get(self.at..self.at + 4) else {
            return Err(self.error("a \\u escape without four hex digits"));
        };
        let mut code = 0u32;
        for &d in digits {
            let v = (d as char)
                .to_digit(16)
                .ok_or_else(|| self.error("a \\u escape without four hex digits"))?;
            code = code * 16 + v;
        }
        self.at += 4;
        Ok(code)
    }

    /// Skips a whole container (checking its grammar loosely: brackets balance outside
    /// strings, strings close), for a value kept as raw text.
    fn skip_nested(&mut self, open: u8, depth: usize) -> Result<(), JsonError> {
        let mut closers = vec![if open == b'[' { b']' } else { b'}' }];
        self.at += 1;
        self.counted()?;
        while let Some(&b) = self.bytes.get(self.at) {
            match b {
                b'"' => {
                    self.string()?;
                    continue;
                }
                b'[' | b'{' => {
                    closers.push(if b == b'[' { b']' } else { b'}' });
                    if depth + closers.len() > MOST_DEPTH {
                        return Err(self.error("nested too deep"));
                    }
                    self.counted()?;
                }
                b']' | b'}' => {
                    if closers.pop() != Some(b) {
                        return Err(self.error("brackets that don't match"));
                    }
                    if closers.is_empty() {
                        self.at += 1;
                        return Ok(());
                    }
                }
                _ => {}
            }
            self.at += 1;
        }
        Err(self.error("a container without its end"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn value(text: &str) -> Value {
        parse(text).expect("lenient JSON").value
    }

    #[test]
    fn standard_json_reads_as_serde_json_reads_it() {
        for text in [
            r#"{"a":[1,-2,3.5,true,false,null],"b":{"c":"d\n\u00e9\ud83d\ude00"}}"#,
            "[]",
            "{}",
            " 0 ",
            "-0",
            "1e5",
            "18446744073709551615",
            "-9223372036854775808",
            r#""\"\\\/\b\f\n\r\t""#,
        ] {
            let expected: Value = serde_json::from_str(text).unwrap();
            assert_eq!(value(text), expected, "{text}");
        }
    }

    #[test]
    fn what_python_reads_and_serde_json_refuses_is_read() {
        assert_eq!(
            value(r#"{"t":NaN,"u":Infinity,"v":-Infinity,"w":1e400}"#),
            json!({"t": null, "u": null, "v": null, "w": null})
        );
        assert_eq!(value(r#""a\ud800b""#), json!("a\u{FFFD}b"));
        assert_eq!(value(r#""\udc00\ud800\u0041""#), json!("\u{FFFD}\u{FFFD}A"));
        assert_eq!(value(r#"{"k":1,"k":2}"#), json!({"k": 2}));
        assert_eq!(
            value("123456789012345678901234567890"),
            json!(123456789012345678901234567890.0)
        );
    }

    #[test]
    fn deep_nesting_is_kept_as_text_and_too_deep_is_refused() {
        let deep = format!("{}\"word\"{}", "[".repeat(130), "]".repeat(130));
        let parsed = value(&format!(r#"{{"messages":{deep}}}"#));
        let mut at = &parsed["messages"];
        for _ in 0..FLATTEN_DEPTH - 1 {
            at = &at[0];
        }
        let raw = at.as_str().expect("the deep part as its text");
        assert!(raw.contains("\"word\""));
        assert_eq!(raw.len(), 2 * (130 - FLATTEN_DEPTH + 1) + 6);
        let too_deep = format!(
            "{}{}",
            "[".repeat(MOST_DEPTH + 5),
            "]".repeat(MOST_DEPTH + 5)
        );
        assert!(parse(&too_deep).is_err());
    }

    #[test]
    fn what_no_parser_reads_is_refused() {
        for text in [
            "",
            "{",
            "[1,]",
            "{\"a\"}",
            "{\"a\":1,}",
            "01",
            "1.",
            "-",
            "tru",
            "\"\u{1}\"",
            "[1] x",
            "{'a':1}",
            "\"\\x\"",
            "\"abc",
            "[}",
        ] {
            assert!(parse(text).is_err(), "{text:?}");
        }
    }

    #[test]
    fn top_level_fields_know_where_their_values_are() {
        let text = r#" { "model" : "gpt-4o", "stream_options":{"x":1} ,"n":2}"#;
        let parsed = parse(text).unwrap();
        let spans: Vec<(&str, &str)> = parsed
            .fields
            .iter()
            .map(|f| (f.key.as_str(), &text[f.value.clone()]))
            .collect();
        assert_eq!(
            spans,
            [
                ("model", "\"gpt-4o\""),
                ("stream_options", "{\"x\":1}"),
                ("n", "2")
            ]
        );
    }

    #[test]
    fn a_flood_of_values_is_refused() {
        let many = format!("[{}0]", "0,".repeat(MOST_VALUES));
        assert!(parse(&many).is_err());
    }
}
