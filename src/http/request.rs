//! A request body read the way the upstream will read it: its `content-encoding` undone (within
//! a size limit), its bytes decoded as Python's `json` decodes them (a byte-order mark, UTF-16
//! and UTF-32 detected), and its JSON read leniently ([`super::json`]). What still can't be
//! read is charged a bound from its length, never nothing.

use std::borrow::Cow;
use std::io::Read as _;

use bytes::Bytes;
use http::HeaderMap;
use serde_json::Value;

use super::json;

pub use crate::error::BodyError;

/// A request body as the gate read it.
#[derive(Debug)]
pub(crate) struct Read {
    /// The body the upstream will read: the client's bytes, or, when they came compressed,
    /// the bytes they decode to (`None`: the client's bytes as they are).
    pub(crate) decoded: Option<Bytes>,
    /// Its JSON, read leniently (`Null` when empty or unreadable).
    pub(crate) value: Value,
    /// Where the top-level fields are in `text` (for a rewrite), when the lenient reader ran.
    pub(crate) fields: Option<Vec<json::Field>>,
    /// The body as text, when it was not plain UTF-8 already or the lenient reader was needed.
    pub(crate) text: Option<String>,
    /// The body has bytes, but no JSON a server would read.
    pub(crate) unreadable: bool,
    /// The decoded body's length in bytes.
    pub(crate) len: usize,
}

/// Undoes `content-encoding` (each coding named, last applied first undone), into at most
/// `most` bytes.
pub(crate) fn decode_content<'b>(
    headers: &HeaderMap,
    body: &'b [u8],
    most: usize,
) -> Result<Cow<'b, [u8]>, BodyError> {
    let mut codings: Vec<String> = Vec::new();
    for value in headers.get_all(http::header::CONTENT_ENCODING) {
        let Ok(text) = value.to_str() else {
            return Err(BodyError::UnsupportedEncoding(
                String::from_utf8_lossy(value.as_bytes())
                    .chars()
                    .take(40)
                    .collect(),
            ));
        };
        for coding in text.split(',') {
            let coding = coding.trim().to_ascii_lowercase();
            if !coding.is_empty() && coding != "identity" {
                codings.push(coding);
            }
        }
    }
    let mut bytes = Cow::Borrowed(body);
    for coding in codings.iter().rev() {
        let decoded = match coding.as_str() {
            "gzip" | "x-gzip" => {
                read_most(flate2::read::MultiGzDecoder::new(&bytes[..]), most, coding)?
            }
            // HTTP's "deflate" is zlib-wrapped; some clients send the raw stream.
            "deflate" => read_most(flate2::read::ZlibDecoder::new(&bytes[..]), most, coding)
                .or_else(|_| {
                    read_most(flate2::read::DeflateDecoder::new(&bytes[..]), most, coding)
                })?,
            "br" => read_most(
                brotli_decompressor::Decompressor::new(&bytes[..], 4096),
                most,
                coding,
            )?,
            "zstd" => {
                let decoder = ruzstd::decoding::StreamingDecoder::new(&bytes[..])
                    .map_err(|_| BodyError::Corrupt(coding.clone()))?;
                read_most(decoder, most, coding)?
            }
            other => {
                return Err(BodyError::UnsupportedEncoding(
                    other.chars().take(40).collect(),
                ));
            }
        };
        bytes = Cow::Owned(decoded);
    }
    Ok(bytes)
}

fn read_most(reader: impl std::io::Read, most: usize, coding: &str) -> Result<Vec<u8>, BodyError> {
    let mut out = Vec::new();
    let limit = u64::try_from(most).unwrap_or(u64::MAX).saturating_add(1);
    reader
        .take(limit)
        .read_to_end(&mut out)
        .map_err(|_| BodyError::Corrupt(coding.to_owned()))?;
    if out.len() > most {
        return Err(BodyError::TooLarge { most });
    }
    Ok(out)
}

/// The text of a JSON body as Python's `json.loads(bytes)` decodes it: the encoding from a
/// byte-order mark or the pattern of zero bytes (UTF-32, UTF-16, UTF-8), surrogates passed
/// (and kept here as U+FFFD). `None`: not text in any of them.
pub(crate) fn text_of(bytes: &[u8]) -> Option<Cow<'_, str>> {
    const UTF8_BOM: &[u8] = b"\xEF\xBB\xBF";
    let utf32 = |b: &[u8], big: bool| -> Option<String> {
        if !b.len().is_multiple_of(4) {
            return None;
        }
        b.chunks_exact(4)
            .map(|c| {
                let code = if big {
                    u32::from_be_bytes([c[0], c[1], c[2], c[3]])
                } else {
                    u32::from_le_bytes([c[0], c[1], c[2], c[3]])
                };
                match code {
                    0xD800..=0xDFFF => Some('\u{FFFD}'),
                    code => char::from_u32(code),
                }
            })
            .collect()
    };
    let utf16 = |b: &[u8], big: bool| -> Option<String> {
        if !b.len().is_multiple_of(2) {
            return None;
        }
        let units = b.chunks_exact(2).map(|c| {
            if big {
                u16::from_be_bytes([c[0], c[1]])
            } else {
                u16::from_le_bytes([c[0], c[1]])
            }
        });
        Some(
            char::decode_utf16(units)
                .map(|c| c.unwrap_or('\u{FFFD}'))
                .collect(),
        )
    };
    if let Some(rest) = bytes.strip_prefix(b"\x00\x00\xFE\xFF") {
        return utf32(rest, true).map(Cow::Owned);
    }
    if let Some(rest) = bytes.strip_prefix(b"\xFF\xFE\x00\x00") {
        return utf32(rest, false).map(Cow::Owned);
    }
    if let Some(rest) = bytes.strip_prefix(b"\xFE\xFF") {
        return utf16(rest, true).map(Cow::Owned);
    }
    if let Some(rest) = bytes.strip_prefix(b"\xFF\xFE") {
        return utf16(rest, false).map(Cow::Owned);
    }
    if let Some(rest) = bytes.strip_prefix(UTF8_BOM) {
        return utf8_surrogates(rest);
    }
    if bytes.len() >= 4 {
        if bytes[0] == 0 {
            return if bytes[1] != 0 {
                utf16(bytes, true)
            } else {
                utf32(bytes, true)
            }
            .map(Cow::Owned);
        }
        if bytes[1] == 0 {
            return if bytes[2] != 0 || bytes[3] != 0 {
                utf16(bytes, false)
            } else {
                utf32(bytes, false)
            }
            .map(Cow::Owned);
        }
    } else if bytes.len() == 2 {
        if bytes[0] == 0 {
            return utf16(bytes, true).map(Cow::Owned);
        }
        if bytes[1] == 0 {
            return utf16(bytes, false).map(Cow::Owned);
        }
    }
    utf8_surrogates(bytes)
}

/// UTF-8, where Python's `surrogatepass` also takes encoded surrogates (`ED A0 80` ...), kept
/// here as U+FFFD.
fn utf8_surrogates(bytes: &[u8]) -> Option<Cow<'_, str>> {
    if let Ok(text) = std::str::from_utf8(bytes) {
        return Some(Cow::Borrowed(text));
    }
    let mut out = String::with_capacity(bytes.len());
    let mut rest = bytes;
    loop {
        match std::str::from_utf8(rest) {
            Ok(text) => {
                out.push_str(text);
                return Some(Cow::Owned(out));
            }
            Err(err) => {
                let (good, bad) = rest.split_at(err.valid_up_to());
                out.push_str(std::str::from_utf8(good).expect("checked valid"));
                // An encoded surrogate: ED, then A0..BF, then a continuation byte.
                match bad {
                    [0xED, 0xA0..=0xBF, 0x80..=0xBF, ..] => {
                        out.push('\u{FFFD}');
                        rest = &bad[3..];
                    }
                    _ => return None,
                }
            }
        }
    }
}

/// Reads a (decoded) body: strict JSON first (the common case, and the fastest), then as a
/// Python or JavaScript server would.
pub(crate) fn read(decoded: Option<Bytes>, bytes: &[u8]) -> Read {
    let len = bytes.len();
    let plain = |value: Value, unreadable: bool| Read {
        decoded: decoded.clone(),
        value,
        fields: None,
        text: None,
        unreadable,
        len,
    };
    if bytes.trim_ascii().is_empty() {
        return plain(Value::Null, false);
    }
    if let Ok(value) = serde_json::from_slice::<Value>(bytes) {
        return plain(value, false);
    }
    let Some(text) = text_of(bytes) else {
        return plain(Value::Null, true);
    };
    match json::parse(&text) {
        Ok(parsed) => Read {
            decoded: decoded.clone(),
            value: parsed.value,
            fields: Some(parsed.fields),
            text: Some(text.into_owned()),
            unreadable: false,
            len,
        },
        Err(_) => plain(Value::Null, true),
    }
}

/// The most tokens any tokenizer can make of `len` bytes: byte-level vocabularies (OpenAI's,
/// Anthropic's, Llama's with byte fallback) never make more than one token of a byte.
pub(crate) fn bound_of(len: usize) -> u64 {
    u64::try_from(len).unwrap_or(u64::MAX).max(1)
}

/// The body with `"stream_options": {"include_usage": true}` set at its top level: inserted
/// after its opening brace, or, when the client gave `stream_options` without it, that object
/// with the field added. `None` when the body is not a JSON object the rewrite can find.
pub(crate) fn with_stream_usage(read: &Read, original: &[u8]) -> Option<Bytes> {
    let options = read.value.get("stream_options");
    match options {
        None => {
            let text: &[u8] = match &read.text {
                Some(text) => text.as_bytes(),
                None => original,
            };
            let open = text.iter().position(|b| !b.is_ascii_whitespace())?;
            if text[open] != b'{' {
                return None;
            }
            let mut out = Vec::with_capacity(text.len() + 40);
            out.extend_from_slice(&text[..=open]);
            out.extend_from_slice(br#""stream_options":{"include_usage":true}"#);
            let rest = &text[open + 1..];
            if rest.iter().any(|b| !b.is_ascii_whitespace() && *b != b'}') {
                out.push(b',');
            }
            out.extend_from_slice(rest);
            Some(Bytes::from(out))
        }
        // An object gains the field; anything else (`null`, which OpenAI's schema allows)
        // becomes an object that asks for the usage.
        Some(value) => {
            let replacement = match value {
                Value::Object(object) => {
                    let mut object = object.clone();
                    object.insert("include_usage".to_owned(), Value::Bool(true));
                    Value::Object(object).to_string()
                }
                _ => r#"{"include_usage":true}"#.to_owned(),
            };
            // Where the field's value sits: from the lenient reader, or found again by it.
            let owned;
            let (text, fields): (&str, &[json::Field]) = match (&read.text, &read.fields) {
                (Some(text), Some(fields)) => (text, fields),
                _ => {
                    let text = std::str::from_utf8(original).ok()?;
                    owned = json::parse(text).ok()?;
                    (text, &owned.fields)
                }
            };
            // Duplicate keys: the last one is the one servers keep.
            let field = fields.iter().rev().find(|f| f.key == "stream_options")?;
            let mut out = String::with_capacity(text.len() + 24);
            out.push_str(&text[..field.value.start]);
            out.push_str(&replacement);
            out.push_str(&text[field.value.end..]);
            Some(Bytes::from(out))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use std::io::Write as _;

    fn headers(encoding: &str) -> HeaderMap {
        let mut headers = HeaderMap::new();
        headers.insert("content-encoding", encoding.parse().unwrap());
        headers
    }

    #[test]
    fn every_encoding_a_client_sends_is_undone_and_a_bomb_is_stopped() {
        let body = br#"{"messages":[{"role":"user","content":"hello"}]}"#;
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
        gz.write_all(body).unwrap();
        let gz = gz.finish().unwrap();
        assert_eq!(
            &decode_content(&headers("gzip"), &gz, 1 << 20).unwrap()[..],
            body
        );
        assert_eq!(
            &decode_content(&headers("x-gzip"), &gz, 1 << 20).unwrap()[..],
            body
        );
        let mut zlib = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::default());
        zlib.write_all(body).unwrap();
        let zlib = zlib.finish().unwrap();
        assert_eq!(
            &decode_content(&headers("deflate"), &zlib, 1 << 20).unwrap()[..],
            body
        );
        let mut raw =
            flate2::write::DeflateEncoder::new(Vec::new(), flate2::Compression::default());
        raw.write_all(body).unwrap();
        let raw = raw.finish().unwrap();
        assert_eq!(
            &decode_content(&headers("deflate"), &raw, 1 << 20).unwrap()[..],
            body
        );
        // Two codings, the last applied undone first.
        let mut twice = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
        twice.write_all(&zlib).unwrap();
        let twice = twice.finish().unwrap();
        assert_eq!(
            &decode_content(&headers("deflate, gzip"), &twice, 1 << 20).unwrap()[..],
            body
        );
        assert_eq!(
            decode_content(&headers("compress"), body, 1 << 20),
            Err(BodyError::UnsupportedEncoding("compress".to_owned()))
        );
        assert_eq!(
            decode_content(&headers("gzip"), body, 1 << 20),
            Err(BodyError::Corrupt("gzip".to_owned()))
        );
        // 64 MiB of zeros in a few kilobytes: stopped at the limit.
        let mut bomb = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
        bomb.write_all(&vec![0u8; 64 << 20]).unwrap();
        let bomb = bomb.finish().unwrap();
        assert!(bomb.len() < 200_000);
        assert_eq!(
            decode_content(&headers("gzip"), &bomb, 1 << 20),
            Err(BodyError::TooLarge { most: 1 << 20 })
        );
        assert!(matches!(
            decode_content(&HeaderMap::new(), body, 10),
            Ok(Cow::Borrowed(_))
        ));
    }

    #[test]
    fn text_is_decoded_as_pythons_json_decodes_bytes() {
        let text = r#"{"a":"é😀"}"#;
        let utf16le: Vec<u8> = text.encode_utf16().flat_map(u16::to_le_bytes).collect();
        let utf16be: Vec<u8> = text.encode_utf16().flat_map(u16::to_be_bytes).collect();
        let utf32le: Vec<u8> = text
            .chars()
            .flat_map(|c| (c as u32).to_le_bytes())
            .collect();
        let utf32be: Vec<u8> = text
            .chars()
            .flat_map(|c| (c as u32).to_be_bytes())
            .collect();
        for bytes in [
            text.as_bytes().to_vec(),
            [b"\xEF\xBB\xBF".as_slice(), text.as_bytes()].concat(),
            utf16le.clone(),
            utf16be.clone(),
            [b"\xFF\xFE".as_slice(), &utf16le].concat(),
            [b"\xFE\xFF".as_slice(), &utf16be].concat(),
            utf32le.clone(),
            utf32be.clone(),
            [b"\xFF\xFE\x00\x00".as_slice(), &utf32le].concat(),
            [b"\x00\x00\xFE\xFF".as_slice(), &utf32be].concat(),
        ] {
            assert_eq!(text_of(&bytes).as_deref(), Some(text), "{bytes:?}");
        }
        // An encoded surrogate passes, as U+FFFD; other broken UTF-8 doesn't.
        assert_eq!(
            text_of(b"\"a\xED\xA0\x80b\"").as_deref(),
            Some("\"a\u{FFFD}b\"")
        );
        assert_eq!(text_of(b"\"a\xFFb\""), None);
    }

    #[test]
    fn a_body_serde_json_refuses_is_read_as_a_server_reads_it() {
        let body =
            "\u{FEFF}{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"temperature\":NaN}";
        let read = read(None, body.as_bytes());
        assert!(!read.unreadable);
        assert_eq!(read.value["messages"][0]["content"], "hi");
        assert_eq!(read.value["temperature"], Value::Null);
        let garbage = super::read(None, b"{\"messages\": [");
        assert!(garbage.unreadable);
        assert_eq!(garbage.len, 14);
        assert_eq!(bound_of(garbage.len), 14);
        assert!(!super::read(None, b"  ").unreadable);
    }

    #[test]
    fn stream_usage_is_added_once_where_servers_read_it() {
        let add = |body: &str| {
            let read = read(None, body.as_bytes());
            with_stream_usage(&read, body.as_bytes())
                .map(|b| serde_json::from_slice::<Value>(&b).unwrap())
        };
        assert_eq!(
            add(r#" {"stream":true,"messages":[]}"#),
            Some(
                json!({"stream": true, "messages": [], "stream_options": {"include_usage": true}})
            )
        );
        assert_eq!(
            add(r#"{}"#),
            Some(json!({"stream_options": {"include_usage": true}}))
        );
        assert_eq!(
            add(r#"{"stream":true,"stream_options":{"include_usage":false,"x":1}}"#),
            Some(json!({"stream": true, "stream_options": {"include_usage": true, "x": 1}}))
        );
        // Read leniently: the rewrite keeps what the lenient reader saw, and stays JSON a
        // Python server reads (NaN is not touched).
        let body = "\u{FEFF}{\"stream\":true,\"t\":NaN,\"stream_options\":{}}";
        let read = read(None, body.as_bytes());
        let out = with_stream_usage(&read, body.as_bytes()).unwrap();
        assert_eq!(
            std::str::from_utf8(&out).unwrap(),
            "{\"stream\":true,\"t\":NaN,\"stream_options\":{\"include_usage\":true}}"
        );
        assert_eq!(add("[1]"), None);
        // `null` (and any other value that is not an object) asks for the usage too.
        assert_eq!(
            add(r#"{"stream":true,"stream_options":null}"#),
            Some(json!({"stream": true, "stream_options": {"include_usage": true}}))
        );
    }
}
