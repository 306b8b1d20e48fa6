//! `tollgate._native`: the Rust crate's limiter, estimators and HTTP gate for Python.
//!
//! The Python package `tollgate` (beside this crate) is the API; this module is what it
//! stands on. Nothing here decides anything the Rust crate doesn't: rates parse with its
//! grammar, windows are its windows, and the HTTP rules are its `Gate`'s.

#![forbid(unsafe_code)]

use pyo3::prelude::*;

mod count;
mod errors;
mod gate;
mod limiter;
mod runtime;
mod values;

/// At exit: the extension's threads stop asking for the GIL.
#[pyfunction]
fn _at_exit(py: Python<'_>) {
    runtime::at_exit(py);
}

/// Forgets the parent's runtime and connections in a child after `fork`.
#[pyfunction]
fn _after_fork() {
    runtime::after_fork();
    limiter::after_fork();
}

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<limiter::PyLimiter>()?;
    m.add_class::<limiter::PyPermit>()?;
    m.add_class::<limiter::NotYet>()?;
    m.add_class::<limiter::Acquire>()?;
    m.add_class::<limiter::PyManualClock>()?;
    m.add_class::<gate::PyGate>()?;
    m.add_class::<gate::PyAttempts>()?;
    m.add_class::<gate::PyCall>()?;
    m.add_class::<gate::PyNext>()?;
    m.add_class::<gate::PyMetered>()?;
    m.add_function(wrap_pyfunction!(count::count_tokens, m)?)?;
    m.add_function(wrap_pyfunction!(count::estimate, m)?)?;
    m.add_function(wrap_pyfunction!(_after_fork, m)?)?;
    m.add_function(wrap_pyfunction!(_at_exit, m)?)?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
