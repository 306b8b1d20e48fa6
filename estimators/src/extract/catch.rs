//! Reading a single key or number out of a value without walking it: a map key as one of the
//! keys that matter, and `max_tokens` or `n` as a whole number.

use std::fmt;

use serde::Serialize;
use serde::ser::{self, Impossible};

use super::ExtractError;
use super::rules::{Key, classify};

/// Reads a map key as one of the keys that matter, without allocating.
pub(super) struct KeyCatcher;

/// Reads a whole number (`max_tokens`, `n`), if the value is one.
pub(super) struct NumberCatcher;

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
                Err(ExtractError::new("a key or a count was a list"))
            }
            fn serialize_tuple(self, _: usize) -> Result<Self::SerializeTuple, ExtractError> {
                Err(ExtractError::new("a key or a count was a tuple"))
            }
            fn serialize_tuple_struct(
                self,
                _: &'static str,
                _: usize,
            ) -> Result<Self::SerializeTupleStruct, ExtractError> {
                Err(ExtractError::new("a key or a count was a tuple"))
            }
            fn serialize_tuple_variant(
                self,
                _: &'static str,
                _: u32,
                _: &'static str,
                _: usize,
            ) -> Result<Self::SerializeTupleVariant, ExtractError> {
                Err(ExtractError::new("a key or a count was a tuple"))
            }
            fn serialize_map(self, _: Option<usize>) -> Result<Self::SerializeMap, ExtractError> {
                Err(ExtractError::new("a key or a count was a map"))
            }
            fn serialize_struct(
                self,
                _: &'static str,
                _: usize,
            ) -> Result<Self::SerializeStruct, ExtractError> {
                Err(ExtractError::new("a key or a count was a struct"))
            }
            fn serialize_struct_variant(
                self,
                _: &'static str,
                _: u32,
                _: &'static str,
                _: usize,
            ) -> Result<Self::SerializeStructVariant, ExtractError> {
                Err(ExtractError::new("a key or a count was a struct"))
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
