//! Shared test harness: a private sshd and a fault-injecting TCP proxy.
#![allow(dead_code, unused_imports)]

pub mod agent;
pub mod docker;
#[cfg(test)] // (the demo example includes this harness, but not the test fixture)
pub mod host;
pub mod postgres;
pub mod proxy;
pub mod sshd;

pub use postgres::ci;
pub use proxy::Proxy;
pub use sshd::{KeyKind, TestSshd};
