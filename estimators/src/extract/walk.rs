//! The walk: a `serde::Serializer` that visits every value once, counts text where the rules
//! say it counts, and captures the few parts whose billing depends on their structure.

use std::fmt;

use serde::Serialize;
use serde::ser;

use super::catch::{KeyCatcher, NumberCatcher};
use super::rules::{self, Ctx, Key, PartField, REPLY_PRIMING, TOKENS_PER_MESSAGE, TOKENS_PER_NAME};
use super::tree::Tree;
use super::{Billing, Estimate, ExtractError, MAX_DEPTH, image, tools};
use crate::Estimator;

pub(super) fn tally<E, T>(
    estimator: &E,
    value: &T,
    billing: &Billing,
) -> Result<Estimate, ExtractError>
where
    E: Estimator + ?Sized,
    T: Serialize + ?Sized,
{
    let mut counter = Counter {
        estimator,
        billing,
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

/// Counts bytes instead of tokens.
#[derive(Debug)]
struct Bytes;

impl Estimator for Bytes {
    fn name(&self) -> &str {
        "bytes"
    }
    fn count(&self, text: &str) -> usize {
        text.len()
    }
}

pub(super) fn text_len<T: Serialize + ?Sized>(value: &T) -> usize {
    tally(&Bytes, value, &Billing::default())
        .map_or(0, |e| usize::try_from(e.input_tokens).unwrap_or(usize::MAX))
}

struct Counter<'e, E: ?Sized> {
    estimator: &'e E,
    billing: &'e Billing,
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
            return Err(ExtractError::new(format!(
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
        // A map in `input` is never a list of token ids: it is a message (the responses API's
        // input items) or data, and counts as such.
        let ctx = match self.ctx {
            Ctx::Input => Ctx::Any,
            other => other,
        };
        Ok(MapWalker {
            counter: self.counter,
            ctx,
            depth,
            key: Key::Other,
            role_seen: false,
            name_seen: false,
            message_part: 0,
            other: 0,
            billed: 0,
            params: 0,
            request: false,
            image: None,
            detail: None,
            source: None,
            kind: None,
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

/// Walks a map or struct, deciding at its end whether it was a message, a request body or a
/// part of content, since its fields may come in any order.
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
    /// Tokens of a request's parameters (`model`, `stop` ...): counted only if the map turns
    /// out not to be a request.
    params: u64,
    request: bool,
    /// A part's OpenAI image, its detail, an Anthropic block's source and its type: priced
    /// when the part ends.
    image: Option<Tree>,
    detail: Option<String>,
    source: Option<Tree>,
    kind: Option<String>,
}

impl<E: Estimator + ?Sized> MapWalker<'_, '_, E> {
    fn value<T: Serialize + ?Sized>(&mut self, key: Key, value: &T) -> Result<(), ExtractError> {
        let ctx = self.ctx;
        match ctx {
            Ctx::Root if self.request_field(key, value)? => return Ok(()),
            Ctx::Content => return self.part_field(key, value),
            _ => {}
        }
        let found = self.walk(value, rules::child(self.ctx, key))?;
        match key {
            Key::Role => self.role_seen = true,
            Key::Name => self.name_seen = true,
            _ => {}
        }
        if rules::billed_in_message(key) {
            self.message_part += found.total;
        } else {
            self.other += found.total;
        }
        Ok(())
    }

    /// A field of a top-level map that may be a request body: answers whether it was one of
    /// the fields a request bills (and counted it).
    fn request_field<T: Serialize + ?Sized>(
        &mut self,
        key: Key,
        value: &T,
    ) -> Result<bool, ExtractError> {
        match key {
            Key::MaxTokens => {
                // A count that isn't a whole number (a list, a map) reserves nothing.
                if let Some(n) = value.serialize(NumberCatcher).ok().flatten() {
                    self.counter.reserved.max_tokens = Some(n);
                }
            }
            Key::N => {
                if let Some(n) = value.serialize(NumberCatcher).ok().flatten() {
                    self.counter.reserved.n = Some(n);
                }
            }
            Key::Tools => {
                let tree = Tree::of(value, self.depth)?;
                self.billed += tools::count(&tree, self.counter.estimator);
            }
            Key::Messages | Key::Prompt => {
                self.request = true;
                self.billed += self.walk(value, Ctx::Any)?.total;
            }
            Key::System => {
                self.request = true;
                self.billed += self.walk(value, Ctx::Content)?.total;
            }
            Key::Input => {
                self.request = true;
                self.billed += self.walk(value, Ctx::Input)?.total;
            }
            Key::Billed => {
                self.request = true;
                self.billed += self.walk(value, Ctx::Content)?.total;
            }
            // Parameters are not text the provider bills; in a request, they count nothing.
            Key::Param => self.params += self.walk(value, Ctx::Any)?.total,
            _ => return Ok(false),
        }
        Ok(true)
    }

    /// A field of a part of content (a text part, an image, a tool call or its result).
    fn part_field<T: Serialize + ?Sized>(
        &mut self,
        key: Key,
        value: &T,
    ) -> Result<(), ExtractError> {
        match rules::part_field(key) {
            PartField::Text => self.other += self.walk(value, Ctx::Content)?.total,
            PartField::Nested => self.other += self.walk(value, Ctx::Content)?.total,
            PartField::Json => {
                let json = Tree::of(value, self.depth)?.json();
                self.other += self.counter.text(&json);
            }
            PartField::OpenAiImage => self.image = Some(Tree::of(value, self.depth)?),
            PartField::Source => self.source = Some(Tree::of(value, self.depth)?),
            PartField::Detail => {
                self.detail = Tree::of(value, self.depth)?.as_str().map(str::to_owned);
            }
            PartField::Type => {
                self.kind = Tree::of(value, self.depth)?.as_str().map(str::to_owned);
            }
            PartField::Skip => {}
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
            // Every field of a request that is not a parameter may be billed (a field the
            // rules don't know yet errs high, never low).
            return Ok(Found::tokens(self.billed + self.message_part + self.other));
        }
        let mut plain = self.billed + self.params + self.message_part + self.other;
        if self.ctx == Ctx::Content {
            let counter = &*self.counter;
            if let Some(image) = &self.image {
                let rule = counter
                    .billing
                    .rule()
                    .unwrap_or_else(|| counter.estimator.image_rule());
                plain += image::openai(image, self.detail.as_deref(), rule, counter.billing);
            }
            if let Some(source) = &self.source {
                match self.kind.as_deref() {
                    Some("image") | None => plain += image::anthropic(source, counter.billing),
                    // A text document's data is its text; other documents (PDF) aren't counted.
                    _ => {
                        if let Some(data) = source.get("data").and_then(Tree::as_str)
                            && source.get("type").and_then(Tree::as_str) == Some("text")
                        {
                            plain += counter.text(data);
                        }
                    }
                }
            }
        }
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

macro_rules! struct_impls {
    ($($trait:ident),*) => {
        $(impl<E: Estimator + ?Sized> ser::$trait for MapWalker<'_, '_, E> {
            type Ok = Found;
            type Error = ExtractError;

            fn serialize_field<T: Serialize + ?Sized>(
                &mut self,
                key: &'static str,
                value: &T,
            ) -> Result<(), ExtractError> {
                self.value(rules::classify(key), value)
            }

            fn end(self) -> Result<Found, ExtractError> {
                self.finish()
            }
        })*
    };
}

struct_impls!(SerializeStruct, SerializeStructVariant);
