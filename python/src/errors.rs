//! tollgate's errors as Python exceptions, with the Rust message.
//!
//! The classes live in `tollgate/_errors.py` (a Python class can have two bases:
//! `Timeout` is also a `TimeoutError`, `TooLarge` also a `ValueError`); they are looked up
//! once.

use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::PyType;

static ERRORS: PyOnceLock<Py<PyAny>> = PyOnceLock::new();

fn class<'py>(py: Python<'py>, name: &str) -> PyResult<Bound<'py, PyType>> {
    let module = ERRORS.get_or_try_init(py, || {
        Ok::<_, PyErr>(py.import("tollgate._errors")?.into_any().unbind())
    })?;
    Ok(module.bind(py).getattr(name)?.cast_into::<PyType>()?)
}

/// The Python exception for a tollgate error, on a thread that holds the GIL (in a future on
/// the runtime, return the error as a `runtime::Failure` instead).
pub(crate) fn to_py(err: tollgate::Error) -> PyErr {
    Python::attach(|py| convert(py, err))
}

pub(crate) fn convert(py: Python<'_>, err: tollgate::Error) -> PyErr {
    use tollgate::Error as E;
    let message = err.to_string();
    let raised = match &err {
        E::Timeout {
            key,
            waited,
            needed,
        } => class(py, "Timeout").map(|cls| {
            PyErr::from_type(
                cls,
                (
                    message.clone(),
                    key.clone(),
                    waited.as_secs_f64(),
                    needed.map(|n| n.as_secs_f64()),
                ),
            )
        }),
        E::CostExceedsCapacity {
            key,
            cost,
            capacity,
            ..
        } => class(py, "TooLarge")
            .map(|cls| PyErr::from_type(cls, (message.clone(), key.clone(), *cost, *capacity))),
        E::Unavailable { .. } | E::Store { .. } | E::UnsupportedLimits { .. } => {
            class(py, "StoreError").map(|cls| PyErr::from_type(cls, (message.clone(),)))
        }
        E::QueueFull { .. } => {
            class(py, "QueueFull").map(|cls| PyErr::from_type(cls, (message.clone(),)))
        }
        E::Rate(_)
        | E::InvalidCost { .. }
        | E::ConflictingLimits { .. }
        | E::NoLimits { .. }
        | E::Estimator { .. }
        | E::Body(_)
        | E::Config { .. }
        | E::Unpriced { .. }
        | E::ClockWentBackwards { .. } => Ok(PyValueError::new_err(message.clone())),
        _ => class(py, "TollgateError").map(|cls| PyErr::from_type(cls, (message.clone(),))),
    };
    raised.unwrap_or_else(|_| PyRuntimeError::new_err(message))
}

/// A `ValueError` with `message`.
pub(crate) fn value_error(message: impl Into<String>) -> PyErr {
    PyValueError::new_err(message.into())
}
