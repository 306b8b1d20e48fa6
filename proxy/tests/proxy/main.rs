//! tollgate-proxy in-process, in front of the provider stand-in (or a scripted upstream), with
//! a Rust client here and the official Python and Node SDKs in `clients`.

mod admin;
mod bounds;
mod bypass;
mod clients;
mod common;
mod deploy;
mod fair;
mod holds;
mod hostile;
mod operations;
mod org;
mod readme;
mod reload;
mod review;
mod routes;
mod service;
mod tenants;
