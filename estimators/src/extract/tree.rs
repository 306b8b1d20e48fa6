//! A small tree of a value, for the few parts of a request whose billing depends on their
//! structure (tool definitions, image parts, a tool call's input), captured through serde.

use std::fmt::{self, Write as _};

use serde::Serialize;
use serde::ser;

use super::{ExtractError, MAX_DEPTH};

/// A captured value.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Tree {
    Null,
    Bool(bool),
    Int(i128),
    Float(f64),
    Str(String),
    List(Vec<Tree>),
    Map(Vec<(String, Tree)>),
}

impl Tree {
    /// Captures `value`, refusing values nested deeper than `MAX_DEPTH` (counting `depth`
    /// levels already above it).
    pub(crate) fn of<T: Serialize + ?Sized>(value: &T, depth: usize) -> Result<Tree, ExtractError> {
        value.serialize(Capture { depth })
    }

    /// The value at `key`, if this is a map that has one.
    pub(crate) fn get(&self, key: &str) -> Option<&Tree> {
        match self {
            Tree::Map(fields) => fields.iter().find(|(k, _)| k == key).map(|(_, v)| v),
            _ => None,
        }
    }

    pub(crate) fn as_str(&self) -> Option<&str> {
        match self {
            Tree::Str(s) => Some(s),
            _ => None,
        }
    }

    pub(crate) fn as_list(&self) -> &[Tree] {
        match self {
            Tree::List(items) => items,
            _ => &[],
        }
    }

    pub(crate) fn fields(&self) -> &[(String, Tree)] {
        match self {
            Tree::Map(fields) => fields,
            _ => &[],
        }
    }

    /// The value as compact JSON, the way an API would receive it.
    pub(crate) fn json(&self) -> String {
        let mut out = String::new();
        self.write_json(&mut out);
        out
    }

    fn write_json(&self, out: &mut String) {
        match self {
            Tree::Null => out.push_str("null"),
            Tree::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
            Tree::Int(n) => {
                let _ = write!(out, "{n}");
            }
            // As a JSON writer sends it (the shortest of the plain and the exponent forms, as
            // serde_json's ryu does): `1e308` is 5 characters, not the 309 of Rust's `Display`.
            Tree::Float(x) if x.is_finite() => {
                let plain = format!("{x}");
                let exponent = format!("{x:e}");
                out.push_str(if exponent.len() < plain.len() {
                    &exponent
                } else {
                    &plain
                });
            }
            Tree::Float(_) => out.push_str("null"),
            Tree::Str(s) => quote(s, out),
            Tree::List(items) => {
                out.push('[');
                for (i, item) in items.iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    item.write_json(out);
                }
                out.push(']');
            }
            Tree::Map(fields) => {
                out.push('{');
                for (i, (key, value)) in fields.iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    quote(key, out);
                    out.push(':');
                    value.write_json(out);
                }
                out.push('}');
            }
        }
    }
}

fn quote(s: &str, out: &mut String) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

/// The serializer that builds a [`Tree`].
struct Capture {
    depth: usize,
}

impl Capture {
    fn deeper(&self) -> Result<usize, ExtractError> {
        if self.depth >= MAX_DEPTH {
            return Err(ExtractError::new(format!(
                "the arguments nest deeper than {MAX_DEPTH} levels"
            )));
        }
        Ok(self.depth + 1)
    }
}

/// A list or map being captured.
pub(crate) struct Building {
    depth: usize,
    items: Vec<Tree>,
    fields: Vec<(String, Tree)>,
    key: Option<String>,
}

impl Building {
    fn new(depth: usize) -> Building {
        Building {
            depth,
            items: Vec::new(),
            fields: Vec::new(),
            key: None,
        }
    }

    fn push<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), ExtractError> {
        self.items.push(Tree::of(value, self.depth)?);
        Ok(())
    }

    fn field<T: Serialize + ?Sized>(&mut self, key: String, value: &T) -> Result<(), ExtractError> {
        self.fields.push((key, Tree::of(value, self.depth)?));
        Ok(())
    }
}

impl ser::Serializer for Capture {
    type Ok = Tree;
    type Error = ExtractError;
    type SerializeSeq = Building;
    type SerializeTuple = Building;
    type SerializeTupleStruct = Building;
    type SerializeTupleVariant = Building;
    type SerializeMap = Building;
    type SerializeStruct = Building;
    type SerializeStructVariant = Building;

    fn serialize_bool(self, v: bool) -> Result<Tree, ExtractError> {
        Ok(Tree::Bool(v))
    }
    fn serialize_i8(self, v: i8) -> Result<Tree, ExtractError> {
        Ok(Tree::Int(v.into()))
    }
    fn serialize_i16(self, v: i16) -> Result<Tree, ExtractError> {
        Ok(Tree::Int(v.into()))
    }
    fn serialize_i32(self, v: i32) -> Result<Tree, ExtractError> {
        Ok(Tree::Int(v.into()))
    }
    fn serialize_i64(self, v: i64) -> Result<Tree, ExtractError> {
        Ok(Tree::Int(v.into()))
    }
    fn serialize_i128(self, v: i128) -> Result<Tree, ExtractError> {
        Ok(Tree::Int(v))
    }
    fn serialize_u8(self, v: u8) -> Result<Tree, ExtractError> {
        Ok(Tree::Int(v.into()))
    }
    fn serialize_u16(self, v: u16) -> Result<Tree, ExtractError> {
        Ok(Tree::Int(v.into()))
    }
    fn serialize_u32(self, v: u32) -> Result<Tree, ExtractError> {
        Ok(Tree::Int(v.into()))
    }
    fn serialize_u64(self, v: u64) -> Result<Tree, ExtractError> {
        Ok(Tree::Int(v.into()))
    }
    fn serialize_u128(self, v: u128) -> Result<Tree, ExtractError> {
        Ok(Tree::Int(i128::try_from(v).unwrap_or(i128::MAX)))
    }
    fn serialize_f32(self, v: f32) -> Result<Tree, ExtractError> {
        Ok(Tree::Float(v.into()))
    }
    fn serialize_f64(self, v: f64) -> Result<Tree, ExtractError> {
        Ok(Tree::Float(v))
    }
    fn serialize_char(self, v: char) -> Result<Tree, ExtractError> {
        Ok(Tree::Str(v.to_string()))
    }
    fn serialize_str(self, v: &str) -> Result<Tree, ExtractError> {
        Ok(Tree::Str(v.to_owned()))
    }
    fn serialize_bytes(self, _: &[u8]) -> Result<Tree, ExtractError> {
        Ok(Tree::Null)
    }
    fn serialize_none(self) -> Result<Tree, ExtractError> {
        Ok(Tree::Null)
    }
    fn serialize_some<T: Serialize + ?Sized>(self, value: &T) -> Result<Tree, ExtractError> {
        let depth = self.deeper()?;
        value.serialize(Capture { depth })
    }
    fn serialize_unit(self) -> Result<Tree, ExtractError> {
        Ok(Tree::Null)
    }
    fn serialize_unit_struct(self, _: &'static str) -> Result<Tree, ExtractError> {
        Ok(Tree::Null)
    }
    fn serialize_unit_variant(
        self,
        _: &'static str,
        _: u32,
        variant: &'static str,
    ) -> Result<Tree, ExtractError> {
        Ok(Tree::Str(variant.to_owned()))
    }
    fn serialize_newtype_struct<T: Serialize + ?Sized>(
        self,
        _: &'static str,
        value: &T,
    ) -> Result<Tree, ExtractError> {
        let depth = self.deeper()?;
        value.serialize(Capture { depth })
    }
    fn serialize_newtype_variant<T: Serialize + ?Sized>(
        self,
        _: &'static str,
        _: u32,
        variant: &'static str,
        value: &T,
    ) -> Result<Tree, ExtractError> {
        let depth = self.deeper()?;
        Ok(Tree::Map(vec![(
            variant.to_owned(),
            value.serialize(Capture { depth })?,
        )]))
    }
    fn serialize_seq(self, _: Option<usize>) -> Result<Building, ExtractError> {
        Ok(Building::new(self.deeper()?))
    }
    fn serialize_tuple(self, _: usize) -> Result<Building, ExtractError> {
        Ok(Building::new(self.deeper()?))
    }
    fn serialize_tuple_struct(self, _: &'static str, _: usize) -> Result<Building, ExtractError> {
        Ok(Building::new(self.deeper()?))
    }
    fn serialize_tuple_variant(
        self,
        _: &'static str,
        _: u32,
        _: &'static str,
        _: usize,
    ) -> Result<Building, ExtractError> {
        Ok(Building::new(self.deeper()?))
    }
    fn serialize_map(self, _: Option<usize>) -> Result<Building, ExtractError> {
        Ok(Building::new(self.deeper()?))
    }
    fn serialize_struct(self, _: &'static str, _: usize) -> Result<Building, ExtractError> {
        Ok(Building::new(self.deeper()?))
    }
    fn serialize_struct_variant(
        self,
        _: &'static str,
        _: u32,
        _: &'static str,
        _: usize,
    ) -> Result<Building, ExtractError> {
        Ok(Building::new(self.deeper()?))
    }
    fn collect_str<T: fmt::Display + ?Sized>(self, value: &T) -> Result<Tree, ExtractError> {
        Ok(Tree::Str(value.to_string()))
    }
}

macro_rules! list_impls {
    ($($trait:ident :: $method:ident),*) => {
        $(impl ser::$trait for Building {
            type Ok = Tree;
            type Error = ExtractError;

            fn $method<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), ExtractError> {
                self.push(value)
            }

            fn end(self) -> Result<Tree, ExtractError> {
                Ok(Tree::List(self.items))
            }
        })*
    };
}

list_impls!(
    SerializeSeq::serialize_element,
    SerializeTuple::serialize_element,
    SerializeTupleStruct::serialize_field,
    SerializeTupleVariant::serialize_field
);

macro_rules! struct_impls {
    ($($trait:ident),*) => {
        $(impl ser::$trait for Building {
            type Ok = Tree;
            type Error = ExtractError;

            fn serialize_field<T: Serialize + ?Sized>(
                &mut self,
                key: &'static str,
                value: &T,
            ) -> Result<(), ExtractError> {
                self.field(key.to_owned(), value)
            }

            fn end(self) -> Result<Tree, ExtractError> {
                Ok(Tree::Map(self.fields))
            }
        })*
    };
}

struct_impls!(SerializeStruct, SerializeStructVariant);

impl ser::SerializeMap for Building {
    type Ok = Tree;
    type Error = ExtractError;

    fn serialize_key<T: Serialize + ?Sized>(&mut self, key: &T) -> Result<(), ExtractError> {
        // Keys that aren't strings are written as the JSON an API would get (`1`, `true`).
        let key = match Tree::of(key, self.depth)? {
            Tree::Str(s) => s,
            other => other.json(),
        };
        self.key = Some(key);
        Ok(())
    }

    fn serialize_value<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), ExtractError> {
        let key = self.key.take().unwrap_or_default();
        self.field(key, value)
    }

    fn end(self) -> Result<Tree, ExtractError> {
        Ok(Tree::Map(self.fields))
    }
}
