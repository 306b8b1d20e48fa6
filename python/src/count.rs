//! `count_tokens` and `estimate`: the estimators of the Rust crate, every one of them.

use pyo3::prelude::*;
use pyo3::types::PyString;
use serde_json::Value;

use crate::errors::value_error;
use crate::values;

fn estimator(name: &str) -> PyResult<std::sync::Arc<dyn tollgate::Estimator>> {
    tollgate::estimators::estimator_strict(name).map_err(|e| value_error(e.to_string()))
}

/// The number of tokens of `text` by `estimator` (`"openai"` is o200k_base), counted
/// without the GIL.
#[pyfunction]
#[pyo3(signature = (text, estimator="openai"))]
pub(crate) fn count_tokens(
    py: Python<'_>,
    text: &Bound<'_, PyString>,
    estimator: &str,
) -> PyResult<usize> {
    let estimator = self::estimator(estimator)?;
    let text = text.to_cow()?;
    if text.len() < 4096 {
        // Shorter than a thread switch is worth.
        return Ok(estimator.count(&text));
    }
    Ok(py.detach(|| estimator.count(&text)))
}

/// What a call with these arguments (a request body, or any value) costs, as the gate and the
/// decorator count it: `(input_tokens, reserved_output)`.
#[pyfunction]
#[pyo3(signature = (value, estimator="openai"))]
pub(crate) fn estimate(
    py: Python<'_>,
    value: &Bound<'_, PyAny>,
    estimator: &str,
) -> PyResult<(u64, u64)> {
    let estimator = self::estimator(estimator)?;
    let value = values::json_of(value)?.unwrap_or(Value::Null);
    let estimate = py
        .detach(|| tollgate::estimators::estimate(&*estimator, &value))
        .map_err(|e| value_error(e.to_string()))?;
    Ok((estimate.input_tokens, estimate.reserved_output))
}
