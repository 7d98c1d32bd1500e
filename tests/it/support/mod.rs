//! Shared test harness: a private sshd and a fault-injecting TCP proxy.
#![allow(dead_code, unused_imports)]

pub mod docker;
pub mod proxy;
pub mod sshd;

pub use proxy::Proxy;
pub use sshd::{KeyKind, TestSshd};
