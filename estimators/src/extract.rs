//! Text from arguments: a `serde::Serializer` that walks any `Serialize` value and counts its
//! text as it goes, without building a JSON tree or copying a string.
//!
//! # What counts
//!
//! - **Elsewhere** (plain strings, lists, user structs, maps): every string value, and every
//!   `char`. Map keys, struct field names, enum variant names, numbers and booleans are
//!   structure, not text.
//! - **A chat message** is a map or struct with a `role` field. It is counted the way OpenAI
//!   bills it: 3 tokens of framing, its `role`, its `content` (a string, or a list of parts
//!   whose `text` fields count), its `name` plus 1, and the names and arguments of its tool
//!   calls. A list that holds messages adds 3 tokens once for the priming of the reply. On
//!   messages of role, content and name this is exactly tiktoken-rs's
//!   `num_tokens_from_messages`.
//! - **A request body** is a top-level map or struct with a `messages`, `system`, `prompt` or
//!   `input` field (the shapes of OpenAI's, Anthropic's and Voyage's APIs). Only the billed text
//!   counts: those fields, plus `tools`/`functions` definitions; the model name and the
//!   parameters don't. In `input`, integers count one token each (OpenAI accepts pre-tokenized
//!   input). The output the request reserves, `max_tokens` (or `max_completion_tokens`,
//!   `max_output_tokens`) times `n`, is reported apart in [`Estimate::reserved_output`].

use std::fmt;

use serde::Serialize;
use serde::ser::{self, Impossible};

use crate::Estimator;

/// OpenAI's framing of each chat message.
pub const TOKENS_PER_MESSAGE: u64 = 3;
/// OpenAI's extra token for a message's `name`.
pub const TOKENS_PER_NAME: u64 = 1;
/// OpenAI's priming of the reply, once per conversation.
pub const REPLY_PRIMING: u64 = 3;

/// The tokens a call will cost.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Estimate {
    /// The text the request sends, at least 1 (a call always costs something).
    pub input_tokens: u64,
    /// The output the request reserves (`max_tokens` × `n`), 0 when it names none. Providers
    /// that count the reservation against the token limit charge it up front; a limit can
    /// choose to add it.
    pub reserved_output: u64,
}

impl Estimate {
    /// The sum of two estimates, field by field.
    pub fn plus(self, other: Estimate) -> Estimate {
        Estimate {
            input_tokens: self.input_tokens.saturating_add(other.input_tokens),
            reserved_output: self.reserved_output.saturating_add(other.reserved_output),
        }
    }

    /// Input plus reserved output.
    pub fn total(&self) -> u64 {
        self.input_tokens.saturating_add(self.reserved_output)
    }
}

/// How deep arguments may nest (a list in a map in a list ...). Deeper values are refused with
/// an error rather than walked, so that no input can overflow the stack.
pub const MAX_DEPTH: usize = 128;

/// A `Serialize` implementation that failed while its text was being read, or a value nested
/// deeper than [`MAX_DEPTH`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("could not read the text of the arguments: {0}")]
pub struct ExtractError(String);

impl ser::Error for ExtractError {
    fn custom<T: fmt::Display>(msg: T) -> Self {
        ExtractError(msg.to_string())
    }
}

/// Counts the tokens of `value` with `estimator`; see the [module docs](self) for what counts.
///
/// ```
/// use serde_json::json;
/// use tollgate_estimators::{Words, estimate};
///
/// let body = json!({
///     "model": "gpt-4o",
///     "max_tokens": 256,
///     "n": 2,
///     "messages": [{"role": "user", "content": "Hello there"}],
/// });
/// let estimate = estimate(&Words, &body)?;
/// assert_eq!(estimate.reserved_output, 512);
/// // 3 framing + "user" + "Hello there" + 3 priming; "gpt-4o" is not counted.
/// assert_eq!(estimate.input_tokens, 3 + 1 + 2 + 3);
/// # Ok::<(), tollgate_estimators::ExtractError>(())
/// ```
pub fn estimate<E, T>(estimator: &E, value: &T) -> Result<Estimate, ExtractError>
where
    E: Estimator + ?Sized,
    T: Serialize + ?Sized,
{
    let mut estimate = tally(estimator, value)?;
    estimate.input_tokens = estimate.input_tokens.max(1);
    Ok(estimate)
}

/// Like [`estimate`], without the floor of 1 token: for adding up several values (the
/// arguments of one call), where the floor applies once to the sum.
///
/// ```
/// use tollgate_estimators::{Words, tally};
///
/// assert_eq!(tally(&Words, "")?.input_tokens, 0);
/// let sum = tally(&Words, "one")?.plus(tally(&Words, "two")?);
/// assert_eq!(sum.input_tokens, 2);
/// # Ok::<(), tollgate_estimators::ExtractError>(())
/// ```
pub fn tally<E, T>(estimator: &E, value: &T) -> Result<Estimate, ExtractError>
where
    E: Estimator + ?Sized,
    T: Serialize + ?Sized,
{
    let mut counter = Counter {
        estimator,
        reserved: Reserved::default(),
    };
    let tokens = value.serialize(Walker {
        counter: &mut counter,
        ctx: Ctx::Root,
        depth: 0,
    })?;
    Ok(Estimate {
        input_tokens: tokens.total,
        reserved_output: counter.reserved.total(),
    })
}

struct Counter<'e, E: ?Sized> {
    estimator: &'e E,
    reserved: Reserved,
}

impl<E: Estimator + ?Sized> Counter<'_, E> {
    fn text(&self, text: &str) -> u64 {
        self.estimator.count(text) as u64
    }
}

#[derive(Default)]
struct Reserved {
    max_tokens: Option<u64>,
    n: Option<u64>,
}

impl Reserved {
    fn total(&self) -> u64 {
        self.max_tokens
            .unwrap_or(0)
            .saturating_mul(self.n.unwrap_or(1).max(1))
    }
}

/// What a value is, from where it sits.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Ctx {
    /// The value passed in: a map here may be a request body.
    Root,
    /// Ordinary data: every string counts.
    Any,
    /// A message's or system prompt's content: strings count, and in maps only `text`.
    Content,
    /// `input` of an embeddings request: strings count, integers are tokens.
    Input,
    /// Not text (an image part's URL, a `type` tag).
    Skip,
}

/// What a walk found: its tokens, and whether it was a chat message.
#[derive(Clone, Copy, Default)]
struct Found {
    total: u64,
    message: bool,
}

impl Found {
    fn tokens(total: u64) -> Found {
        Found {
            total,
            message: false,
        }
    }
}

/// The keys that change how a value counts.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Key {
    Role,
    Content,
    Name,
    Text,
    ToolCalls,
    FunctionCall,
    Refusal,
    Arguments,
    Messages,
    System,
    Prompt,
    Input,
    Tools,
    MaxTokens,
    N,
    Type,
    ImageUrl,
    Other,
}

fn classify(key: &str) -> Key {
    match key {
        "role" => Key::Role,
        "content" => Key::Content,
        "name" => Key::Name,
        "text" => Key::Text,
        "tool_calls" => Key::ToolCalls,
        "function_call" | "function" => Key::FunctionCall,
        "refusal" => Key::Refusal,
        "arguments" => Key::Arguments,
        "messages" => Key::Messages,
        "system" => Key::System,
        "prompt" => Key::Prompt,
        "input" => Key::Input,
        "tools" | "functions" => Key::Tools,
        "max_tokens" | "max_completion_tokens" | "max_output_tokens" => Key::MaxTokens,
        "n" => Key::N,
        "type" => Key::Type,
        "image_url" | "image" | "source" | "input_audio" => Key::ImageUrl,
        _ => Key::Other,
    }
}

struct Walker<'c, 'e, E: ?Sized> {
    counter: &'c mut Counter<'e, E>,
    ctx: Ctx,
    /// How many maps and lists enclose this value.
    depth: usize,
}

impl<'c, 'e, E: Estimator + ?Sized> Walker<'c, 'e, E> {
    fn text(self, text: &str) -> Result<Found, ExtractError> {
        Ok(Found::tokens(match self.ctx {
            Ctx::Skip => 0,
            _ => self.counter.text(text),
        }))
    }

    fn integer(self) -> Result<Found, ExtractError> {
        Ok(Found::tokens(u64::from(self.ctx == Ctx::Input)))
    }

    fn nested(&self) -> Result<usize, ExtractError> {
        if self.depth >= MAX_DEPTH {
            return Err(ExtractError(format!(
                "the arguments nest deeper than {MAX_DEPTH} levels"
            )));
        }
        Ok(self.depth + 1)
    }

    /// The same walker one level deeper (an `Option`, a newtype), refused past the bound.
    fn inside(self) -> Result<Walker<'c, 'e, E>, ExtractError> {
        let depth = self.nested()?;
        Ok(Walker { depth, ..self })
    }

    fn map(self) -> Result<MapWalker<'c, 'e, E>, ExtractError> {
        let depth = self.nested()?;
        Ok(MapWalker {
            counter: self.counter,
            ctx: self.ctx,
            depth,
            key: Key::Other,
            role_seen: false,
            name_seen: false,
            message_part: 0,
            other: 0,
            billed: 0,
            request: false,
        })
    }

    fn seq(self) -> Result<SeqWalker<'c, 'e, E>, ExtractError> {
        let depth = self.nested()?;
        let ctx = match self.ctx {
            Ctx::Root => Ctx::Any,
            other => other,
        };
        Ok(SeqWalker {
            counter: self.counter,
            ctx,
            depth,
            total: 0,
            messages: false,
        })
    }
}

/// Walks a map or struct, deciding at its end whether it was a message or a request body,
/// since its fields may come in any order.
struct MapWalker<'c, 'e, E: ?Sized> {
    counter: &'c mut Counter<'e, E>,
    ctx: Ctx,
    depth: usize,
    key: Key,
    role_seen: bool,
    name_seen: bool,
    /// Tokens of the fields a message bills (role, content, name, tool calls, refusal).
    message_part: u64,
    /// Tokens of every other string field.
    other: u64,
    /// Tokens of the fields a request body bills.
    billed: u64,
    request: bool,
}

impl<E: Estimator + ?Sized> MapWalker<'_, '_, E> {
    fn value<T: Serialize + ?Sized>(&mut self, key: Key, value: &T) -> Result<(), ExtractError> {
        if self.ctx == Ctx::Root {
            match key {
                Key::MaxTokens => {
                    // A count that isn't a whole number (a list, a map) reserves nothing.
                    if let Some(n) = value.serialize(NumberCatcher).ok().flatten() {
                        self.counter.reserved.max_tokens = Some(n);
                    }
                    return Ok(());
                }
                Key::N => {
                    if let Some(n) = value.serialize(NumberCatcher).ok().flatten() {
                        self.counter.reserved.n = Some(n);
                    }
                    return Ok(());
                }
                Key::Messages | Key::Prompt | Key::Tools => {
                    self.request |= key != Key::Tools;
                    self.billed += self.walk(value, Ctx::Any)?.total;
                    return Ok(());
                }
                Key::System => {
                    self.request = true;
                    self.billed += self.walk(value, Ctx::Content)?.total;
                    return Ok(());
                }
                Key::Input => {
                    self.request = true;
                    self.billed += self.walk(value, Ctx::Input)?.total;
                    return Ok(());
                }
                _ => {}
            }
        }
        let child = match (self.ctx, key) {
            (Ctx::Skip, _) | (_, Key::Type | Key::ImageUrl) => Ctx::Skip,
            (Ctx::Content, Key::Text) => Ctx::Content,
            (Ctx::Content, _) => Ctx::Skip,
            (Ctx::Input, _) => Ctx::Input,
            (_, Key::Content) => Ctx::Content,
            _ => Ctx::Any,
        };
        let found = self.walk(value, child)?;
        match key {
            Key::Role => {
                self.role_seen = true;
                self.message_part += found.total;
            }
            Key::Name => {
                self.name_seen = true;
                self.message_part += found.total;
            }
            Key::Content | Key::ToolCalls | Key::FunctionCall | Key::Refusal => {
                self.message_part += found.total;
            }
            _ => self.other += found.total,
        }
        Ok(())
    }

    fn walk<T: Serialize + ?Sized>(&mut self, value: &T, ctx: Ctx) -> Result<Found, ExtractError> {
        value.serialize(Walker {
            counter: self.counter,
            ctx,
            depth: self.depth,
        })
    }

    fn finish(self) -> Result<Found, ExtractError> {
        if self.request {
            return Ok(Found::tokens(self.billed));
        }
        let plain = self.billed + self.message_part + self.other;
        // A role makes a chat message, unless we are inside a content part or skipped data.
        if self.role_seen && matches!(self.ctx, Ctx::Root | Ctx::Any) {
            let name = if self.name_seen { TOKENS_PER_NAME } else { 0 };
            return Ok(Found {
                total: TOKENS_PER_MESSAGE + self.message_part + name,
                message: true,
            });
        }
        Ok(Found::tokens(plain))
    }
}

struct SeqWalker<'c, 'e, E: ?Sized> {
    counter: &'c mut Counter<'e, E>,
    ctx: Ctx,
    depth: usize,
    total: u64,
    messages: bool,
}

impl<E: Estimator + ?Sized> SeqWalker<'_, '_, E> {
    fn element<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), ExtractError> {
        let found = value.serialize(Walker {
            counter: self.counter,
            ctx: self.ctx,
            depth: self.depth,
        })?;
        self.total += found.total;
        self.messages |= found.message;
        Ok(())
    }

    fn finish(self) -> Result<Found, ExtractError> {
        let priming = if self.messages { REPLY_PRIMING } else { 0 };
        Ok(Found::tokens(self.total + priming))
    }
}

macro_rules! integers {
    ($($method:ident: $ty:ty),*) => {
        $(fn $method(self, _: $ty) -> Result<Found, ExtractError> {
            self.integer()
        })*
    };
}

macro_rules! not_text {
    ($($method:ident: $ty:ty),*) => {
        $(fn $method(self, _: $ty) -> Result<Found, ExtractError> {
            Ok(Found::default())
        })*
    };
}

impl<'c, 'e, E: Estimator + ?Sized> ser::Serializer for Walker<'c, 'e, E> {
    type Ok = Found;
    type Error = ExtractError;
    type SerializeSeq = SeqWalker<'c, 'e, E>;
    type SerializeTuple = SeqWalker<'c, 'e, E>;
    type SerializeTupleStruct = SeqWalker<'c, 'e, E>;
    type SerializeTupleVariant = SeqWalker<'c, 'e, E>;
    type SerializeMap = MapWalker<'c, 'e, E>;
    type SerializeStruct = MapWalker<'c, 'e, E>;
    type SerializeStructVariant = MapWalker<'c, 'e, E>;

    integers!(
        serialize_i8: i8, serialize_i16: i16, serialize_i32: i32, serialize_i64: i64,
        serialize_i128: i128, serialize_u8: u8, serialize_u16: u16, serialize_u32: u32,
        serialize_u64: u64, serialize_u128: u128
    );
    not_text!(serialize_bool: bool, serialize_f32: f32, serialize_f64: f64, serialize_bytes: &[u8]);

    fn serialize_char(self, v: char) -> Result<Found, ExtractError> {
        let mut buf = [0u8; 4];
        self.text(v.encode_utf8(&mut buf))
    }

    fn serialize_str(self, v: &str) -> Result<Found, ExtractError> {
        self.text(v)
    }

    fn serialize_none(self) -> Result<Found, ExtractError> {
        Ok(Found::default())
    }

    fn serialize_some<T: Serialize + ?Sized>(self, value: &T) -> Result<Found, ExtractError> {
        value.serialize(self.inside()?)
    }

    fn serialize_unit(self) -> Result<Found, ExtractError> {
        Ok(Found::default())
    }

    fn serialize_unit_struct(self, _: &'static str) -> Result<Found, ExtractError> {
        Ok(Found::default())
    }

    fn serialize_unit_variant(
        self,
        _: &'static str,
        _: u32,
        _: &'static str,
    ) -> Result<Found, ExtractError> {
        Ok(Found::default())
    }

    fn serialize_newtype_struct<T: Serialize + ?Sized>(
        self,
        _: &'static str,
        value: &T,
    ) -> Result<Found, ExtractError> {
        value.serialize(self.inside()?)
    }

    fn serialize_newtype_variant<T: Serialize + ?Sized>(
        self,
        _: &'static str,
        _: u32,
        _: &'static str,
        value: &T,
    ) -> Result<Found, ExtractError> {
        value.serialize(self.inside()?)
    }

    fn serialize_seq(self, _: Option<usize>) -> Result<Self::SerializeSeq, ExtractError> {
        self.seq()
    }

    fn serialize_tuple(self, _: usize) -> Result<Self::SerializeTuple, ExtractError> {
        self.seq()
    }

    fn serialize_tuple_struct(
        self,
        _: &'static str,
        _: usize,
    ) -> Result<Self::SerializeTupleStruct, ExtractError> {
        self.seq()
    }

    fn serialize_tuple_variant(
        self,
        _: &'static str,
        _: u32,
        _: &'static str,
        _: usize,
    ) -> Result<Self::SerializeTupleVariant, ExtractError> {
        self.seq()
    }

    fn serialize_map(self, _: Option<usize>) -> Result<Self::SerializeMap, ExtractError> {
        self.map()
    }

    fn serialize_struct(
        self,
        _: &'static str,
        _: usize,
    ) -> Result<Self::SerializeStruct, ExtractError> {
        self.map()
    }

    fn serialize_struct_variant(
        self,
        _: &'static str,
        _: u32,
        _: &'static str,
        _: usize,
    ) -> Result<Self::SerializeStructVariant, ExtractError> {
        self.map()
    }

    fn collect_str<T: fmt::Display + ?Sized>(self, value: &T) -> Result<Found, ExtractError> {
        // Display-only values (dates, URLs, ...) are text; this is the one place a string is built.
        self.text(&value.to_string())
    }
}

macro_rules! seq_impls {
    ($($trait:ident :: $method:ident),*) => {
        $(impl<E: Estimator + ?Sized> ser::$trait for SeqWalker<'_, '_, E> {
            type Ok = Found;
            type Error = ExtractError;

            fn $method<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), ExtractError> {
                self.element(value)
            }

            fn end(self) -> Result<Found, ExtractError> {
                self.finish()
            }
        })*
    };
}

seq_impls!(
    SerializeSeq::serialize_element,
    SerializeTuple::serialize_element,
    SerializeTupleStruct::serialize_field,
    SerializeTupleVariant::serialize_field
);

impl<E: Estimator + ?Sized> ser::SerializeMap for MapWalker<'_, '_, E> {
    type Ok = Found;
    type Error = ExtractError;

    fn serialize_key<T: Serialize + ?Sized>(&mut self, key: &T) -> Result<(), ExtractError> {
        // Keys that aren't strings (tuples, structs) are ordinary keys.
        self.key = key.serialize(KeyCatcher).unwrap_or(Key::Other);
        Ok(())
    }

    fn serialize_value<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), ExtractError> {
        self.value(self.key, value)
    }

    fn end(self) -> Result<Found, ExtractError> {
        self.finish()
    }
}

impl<E: Estimator + ?Sized> ser::SerializeStruct for MapWalker<'_, '_, E> {
    type Ok = Found;
    type Error = ExtractError;

    fn serialize_field<T: Serialize + ?Sized>(
        &mut self,
        key: &'static str,
        value: &T,
    ) -> Result<(), ExtractError> {
        self.value(classify(key), value)
    }

    fn end(self) -> Result<Found, ExtractError> {
        self.finish()
    }
}

impl<E: Estimator + ?Sized> ser::SerializeStructVariant for MapWalker<'_, '_, E> {
    type Ok = Found;
    type Error = ExtractError;

    fn serialize_field<T: Serialize + ?Sized>(
        &mut self,
        key: &'static str,
        value: &T,
    ) -> Result<(), ExtractError> {
        self.value(classify(key), value)
    }

    fn end(self) -> Result<Found, ExtractError> {
        self.finish()
    }
}

/// Reads a map key as one of the keys that matter, without allocating.
struct KeyCatcher;

/// Reads a whole number (`max_tokens`, `n`), if the value is one.
struct NumberCatcher;

macro_rules! catcher {
    ($name:ident, $out:ty, $default:expr, $str:expr, $num:expr) => {
        impl ser::Serializer for $name {
            type Ok = $out;
            type Error = ExtractError;
            type SerializeSeq = Impossible<$out, ExtractError>;
            type SerializeTuple = Impossible<$out, ExtractError>;
            type SerializeTupleStruct = Impossible<$out, ExtractError>;
            type SerializeTupleVariant = Impossible<$out, ExtractError>;
            type SerializeMap = Impossible<$out, ExtractError>;
            type SerializeStruct = Impossible<$out, ExtractError>;
            type SerializeStructVariant = Impossible<$out, ExtractError>;

            fn serialize_str(self, v: &str) -> Result<$out, ExtractError> {
                Ok($str(v))
            }
            fn serialize_u64(self, v: u64) -> Result<$out, ExtractError> {
                Ok($num(Some(v)))
            }
            fn serialize_i64(self, v: i64) -> Result<$out, ExtractError> {
                Ok($num(u64::try_from(v).ok()))
            }
            fn serialize_u8(self, v: u8) -> Result<$out, ExtractError> {
                self.serialize_u64(v.into())
            }
            fn serialize_u16(self, v: u16) -> Result<$out, ExtractError> {
                self.serialize_u64(v.into())
            }
            fn serialize_u32(self, v: u32) -> Result<$out, ExtractError> {
                self.serialize_u64(v.into())
            }
            fn serialize_i8(self, v: i8) -> Result<$out, ExtractError> {
                self.serialize_i64(v.into())
            }
            fn serialize_i16(self, v: i16) -> Result<$out, ExtractError> {
                self.serialize_i64(v.into())
            }
            fn serialize_i32(self, v: i32) -> Result<$out, ExtractError> {
                self.serialize_i64(v.into())
            }
            fn serialize_f64(self, v: f64) -> Result<$out, ExtractError> {
                let whole = v.is_finite() && v >= 0.0 && v.fract() == 0.0 && v < 2e19;
                Ok($num(whole.then_some(v as u64)))
            }
            fn serialize_f32(self, v: f32) -> Result<$out, ExtractError> {
                self.serialize_f64(v.into())
            }
            fn serialize_some<T: Serialize + ?Sized>(self, v: &T) -> Result<$out, ExtractError> {
                v.serialize(self)
            }
            fn serialize_newtype_struct<T: Serialize + ?Sized>(
                self,
                _: &'static str,
                v: &T,
            ) -> Result<$out, ExtractError> {
                v.serialize(self)
            }
            fn serialize_bool(self, _: bool) -> Result<$out, ExtractError> {
                Ok($default)
            }
            fn serialize_i128(self, _: i128) -> Result<$out, ExtractError> {
                Ok($default)
            }
            fn serialize_u128(self, _: u128) -> Result<$out, ExtractError> {
                Ok($default)
            }
            fn serialize_char(self, _: char) -> Result<$out, ExtractError> {
                Ok($default)
            }
            fn serialize_bytes(self, _: &[u8]) -> Result<$out, ExtractError> {
                Ok($default)
            }
            fn serialize_none(self) -> Result<$out, ExtractError> {
                Ok($default)
            }
            fn serialize_unit(self) -> Result<$out, ExtractError> {
                Ok($default)
            }
            fn serialize_unit_struct(self, _: &'static str) -> Result<$out, ExtractError> {
                Ok($default)
            }
            fn serialize_unit_variant(
                self,
                _: &'static str,
                _: u32,
                v: &'static str,
            ) -> Result<$out, ExtractError> {
                Ok($str(v))
            }
            fn serialize_newtype_variant<T: Serialize + ?Sized>(
                self,
                _: &'static str,
                _: u32,
                _: &'static str,
                _: &T,
            ) -> Result<$out, ExtractError> {
                Ok($default)
            }
            fn serialize_seq(self, _: Option<usize>) -> Result<Self::SerializeSeq, ExtractError> {
                Err(ExtractError("a key or a count was a list".into()))
            }
            fn serialize_tuple(self, _: usize) -> Result<Self::SerializeTuple, ExtractError> {
                Err(ExtractError("a key or a count was a tuple".into()))
            }
            fn serialize_tuple_struct(
                self,
                _: &'static str,
                _: usize,
            ) -> Result<Self::SerializeTupleStruct, ExtractError> {
                Err(ExtractError("a key or a count was a tuple".into()))
            }
            fn serialize_tuple_variant(
                self,
                _: &'static str,
                _: u32,
                _: &'static str,
                _: usize,
            ) -> Result<Self::SerializeTupleVariant, ExtractError> {
                Err(ExtractError("a key or a count was a tuple".into()))
            }
            fn serialize_map(self, _: Option<usize>) -> Result<Self::SerializeMap, ExtractError> {
                Err(ExtractError("a key or a count was a map".into()))
            }
            fn serialize_struct(
                self,
                _: &'static str,
                _: usize,
            ) -> Result<Self::SerializeStruct, ExtractError> {
                Err(ExtractError("a key or a count was a struct".into()))
            }
            fn serialize_struct_variant(
                self,
                _: &'static str,
                _: u32,
                _: &'static str,
                _: usize,
            ) -> Result<Self::SerializeStructVariant, ExtractError> {
                Err(ExtractError("a key or a count was a struct".into()))
            }
            fn collect_str<T: fmt::Display + ?Sized>(self, _: &T) -> Result<$out, ExtractError> {
                Ok($default)
            }
        }
    };
}

catcher!(KeyCatcher, Key, Key::Other, classify, |_: Option<u64>| {
    Key::Other
});
catcher!(
    NumberCatcher,
    Option<u64>,
    None,
    |_: &str| None,
    |n: Option<u64>| n
);
