//! The Redis store against real servers on loopback: one server, a cluster, a sentinel. With
//! `TOLLGATE_REDIS_CLUSTER` set, the tests written for one server run against a cluster.

mod cancel;
mod cluster;
mod differential;
mod differential_edges;
mod failover;
mod faults;
mod hardening;
mod macro_on_redis;
mod processes;
#[cfg(feature = "http")]
mod queue;
#[cfg(feature = "http")]
mod round_trips;
mod sentinel;
mod store;
mod support;
