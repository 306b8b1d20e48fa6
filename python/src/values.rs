//! What Python hands in: rates, timeouts, amounts, and arguments to count (read into JSON,
//! the shape the estimators walk).

use std::time::Duration;

use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyDict, PyFloat, PyInt, PyList, PyString, PyTuple};
use serde_json::{Map, Number, Value};
use tollgate::{Limits, Rates};

use crate::errors::value_error;

/// The limits of `requests`, `tokens` and `output_tokens`, each a rate string or `None`; a bad
/// one is a `ValueError` with the grammar's message.
pub(crate) fn limits(
    requests: Option<&str>,
    tokens: Option<&str>,
    output_tokens: Option<&str>,
) -> PyResult<Limits> {
    let rates = |text: Option<&str>| -> PyResult<Rates> {
        match text {
            None => Ok(Rates::none()),
            Some(text) => text
                .parse::<Rates>()
                .map_err(|err| PyValueError::new_err(err.to_string())),
        }
    };
    let limits =
        Limits::new(rates(requests)?, rates(tokens)?).with_output_tokens(rates(output_tokens)?);
    if limits.is_empty() {
        return Err(value_error(
            "no limits given; give at least one of requests, tokens or output_tokens (like requests=\"500/m\")",
        ));
    }
    Ok(limits)
}

/// A call's timeout, as Python gives it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Timeout {
    /// The limiter's default (60 s).
    Default,
    /// No deadline.
    Never,
    /// This long.
    After(Duration),
}

/// `None` (the default, 60 s), seconds as a number (`math.inf`: no deadline), or a duration
/// string in the rates' units (`"30s"`, `"2 min"`, `"none"`).
pub(crate) fn timeout(value: Option<&Bound<'_, PyAny>>) -> PyResult<Timeout> {
    let Some(value) = value.filter(|v| !v.is_none()) else {
        return Ok(Timeout::Default);
    };
    if let Ok(text) = value.cast::<PyString>() {
        let text = text.to_cow()?;
        return match tollgate_grammar::parse_timeout(&text) {
            Ok(Some(d)) => Ok(Timeout::After(d)),
            Ok(None) => Ok(Timeout::Never),
            Err(err) => Err(value_error(err.to_string())),
        };
    }
    if value.is_instance_of::<PyBool>() {
        return Err(PyTypeError::new_err(
            "timeout: expected seconds or a duration like \"30s\", got a bool",
        ));
    }
    let seconds: f64 = value.extract().map_err(|_| {
        PyTypeError::new_err(format!(
            "timeout: expected seconds or a duration like \"30s\", got {}",
            type_name(value)
        ))
    })?;
    if seconds.is_nan() || seconds < 0.0 {
        return Err(value_error(format!(
            "timeout: {seconds} seconds; a timeout is 0 or more (math.inf or \"none\": no deadline)"
        )));
    }
    if seconds.is_infinite() {
        return Ok(Timeout::Never);
    }
    Duration::try_from_secs_f64(seconds)
        .map(Timeout::After)
        .map_err(|_| {
            value_error(format!(
                "timeout: {seconds} seconds is too long; use math.inf or \"none\" for no deadline"
            ))
        })
}

/// A whole number of tokens, 0 or more.
pub(crate) fn amount(name: &str, value: Option<&Bound<'_, PyAny>>) -> PyResult<u64> {
    let Some(value) = value.filter(|v| !v.is_none()) else {
        return Ok(0);
    };
    if value.is_instance_of::<PyBool>() || !value.is_instance_of::<PyInt>() {
        return Err(PyTypeError::new_err(format!(
            "{name}: expected a whole number of tokens, got {}",
            type_name(value)
        )));
    }
    let n: i128 = value.extract().map_err(|_| {
        value_error(format!(
            "{name}: {value} is out of range; at most {}",
            u64::MAX
        ))
    })?;
    u64::try_from(n).map_err(|_| {
        value_error(if n < 0 {
            format!("{name}: {n}; a count of tokens is 0 or more")
        } else {
            format!("{name}: {n} is out of range; at most {}", u64::MAX)
        })
    })
}

fn type_name(value: &Bound<'_, PyAny>) -> String {
    value
        .get_type()
        .name()
        .map(|n| n.to_string())
        .unwrap_or_else(|_| "an object".to_owned())
}

/// How deep arguments may nest (the estimators' own limit).
const MAX_DEPTH: usize = 128;

/// The JSON of an argument, as the Rust macro counts a `Serialize` one: strings, numbers,
/// lists, tuples and dicts as they are, pydantic models through `model_dump()`, dataclasses
/// through `dataclasses.asdict`; anything else (a client, a connection) is skipped (`None`).
pub(crate) fn json_of(value: &Bound<'_, PyAny>) -> PyResult<Option<Value>> {
    walk(value, 0)
}

fn walk(value: &Bound<'_, PyAny>, depth: usize) -> PyResult<Option<Value>> {
    if depth > MAX_DEPTH {
        return Err(value_error(format!(
            "the arguments nest deeper than {MAX_DEPTH} levels; they can't be counted"
        )));
    }
    let py = value.py();
    if value.is_none() {
        return Ok(Some(Value::Null));
    }
    if let Ok(text) = value.cast::<PyString>() {
        return Ok(Some(Value::String(text.to_cow()?.into_owned())));
    }
    if let Ok(b) = value.cast::<PyBool>() {
        return Ok(Some(Value::Bool(b.is_true())));
    }
    if value.is_instance_of::<PyInt>() {
        if let Ok(n) = value.extract::<u64>() {
            return Ok(Some(Value::Number(n.into())));
        }
        if let Ok(n) = value.extract::<i64>() {
            return Ok(Some(Value::Number(n.into())));
        }
        let f: f64 = value.extract().unwrap_or(f64::MAX);
        return Ok(Number::from_f64(f).map(Value::Number));
    }
    if let Ok(f) = value.cast::<PyFloat>() {
        return Ok(Some(
            Number::from_f64(f.value()).map_or(Value::Null, Value::Number),
        ));
    }
    if let Ok(dict) = value.cast::<PyDict>() {
        let mut map = Map::new();
        for (k, v) in dict.iter() {
            let Ok(k) = k.cast::<PyString>() else {
                continue;
            };
            if let Some(v) = walk(&v, depth + 1)? {
                map.insert(k.to_cow()?.into_owned(), v);
            }
        }
        return Ok(Some(Value::Object(map)));
    }
    if let Ok(list) = value.cast::<PyList>() {
        let mut items = Vec::with_capacity(list.len());
        for item in list.iter() {
            if let Some(v) = walk(&item, depth + 1)? {
                items.push(v);
            }
        }
        return Ok(Some(Value::Array(items)));
    }
    if let Ok(tuple) = value.cast::<PyTuple>() {
        let mut items = Vec::with_capacity(tuple.len());
        for item in tuple.iter() {
            if let Some(v) = walk(&item, depth + 1)? {
                items.push(v);
            }
        }
        return Ok(Some(Value::Array(items)));
    }
    // A pydantic model (the SDKs' own request types), or a dataclass.
    if let Ok(dump) = value.getattr(pyo3::intern!(py, "model_dump"))
        && dump.is_callable()
    {
        return walk(&dump.call0()?, depth + 1);
    }
    if value.hasattr(pyo3::intern!(py, "__dataclass_fields__"))?
        && !value.is_instance_of::<pyo3::types::PyType>()
    {
        let asdict = py.import("dataclasses")?.getattr("asdict")?;
        return walk(&asdict.call1((value,))?, depth + 1);
    }
    Ok(None)
}
