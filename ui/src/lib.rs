//! Nothing here: the compile-time tests of `#[tollgate::limit]` are in `tests/`.
