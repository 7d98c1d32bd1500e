//! `GET /metrics`: the Prometheus text format (prometheus-client), behind the same tokens.
//!
//! The journal is the source: every scrape reads it, so the numbers are those of every process
//! that shares the journal, and they survive a restart (its events are append-only, so the
//! totals only grow, as counters must). Read per scrape:
//! - `cairn_executions{state}`: executions by their current state (gauge);
//! - `cairn_dispatch_latency_seconds`: from `accepted` to the first `dispatched`, per
//!   execution (histogram);
//! - `cairn_reconnects_total`: SSH reconnections recorded in finish evidence;
//! - `cairn_attaches_total{by}`: requests that attached to an earlier execution instead of
//!   running again, by `intent` (fingerprint match) or `id` (the same execution ID again);
//! - `cairn_delivery_abandoned_total`: results whose caller's stream closed first;
//! - `cairn_takeovers_total`: executions taken over from a replica whose lease expired (a
//!   shared PostgreSQL journal; each execution at most `MAX_TAKEOVERS` times);
//! - `cairn_redrives_total`: executions their owning replica picked up because none of its
//!   calls drove them any more (a `redrive` event each; at most `MAX_REDRIVES` per execution).
//!
//! And of this process: `cairn_tasks_in_flight` (tasks a job of this server watches) and
//! `cairn_http_refused_total` (requests refused by the guard).

use std::sync::atomic::{AtomicU64, Ordering};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

use crate::journal::Journal;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StateLabel {
    state: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ByLabel {
    by: String,
}

/// Counts of this process.
#[derive(Default)]
pub struct Local {
    pub refused: AtomicU64,
    /// Which refusals are recorded in the journal (the rest are counted here).
    pub refusals: super::refusals::Sampler,
}

/// The text exposition of one scrape.
pub fn scrape(
    journal: &Journal,
    local: &Local,
    tasks_in_flight: usize,
) -> Result<String, super::HttpError> {
    let m = journal.metrics()?;
    let mut reg = Registry::with_prefix("cairn");
    let states = Family::<StateLabel, Gauge>::default();
    for (state, n) in &m.by_state {
        states
            .get_or_create(&StateLabel {
                state: state.clone(),
            })
            .set(*n);
    }
    reg.register("executions", "Executions by current state", states);
    // 5 ms to about 82 s.
    let latency = Histogram::new(exponential_buckets(0.005, 2.0, 15));
    for s in &m.dispatch_latencies {
        latency.observe(*s);
    }
    reg.register(
        "dispatch_latency_seconds",
        "From accepted to the first dispatched, per execution",
        latency,
    );
    let reconnects = Counter::<u64>::default();
    reconnects.inc_by(m.reconnects);
    reg.register(
        "reconnects",
        "SSH reconnections recorded in executions' finish evidence",
        reconnects,
    );
    let attaches = Family::<ByLabel, Counter>::default();
    for (by, n) in [("intent", m.attached_by_intent), ("id", m.attached_by_id)] {
        attaches.get_or_create(&ByLabel { by: by.into() }).inc_by(n);
    }
    reg.register(
        "attaches",
        "Requests that attached to an earlier execution instead of running again",
        attaches,
    );
    let lost = Counter::<u64>::default();
    lost.inc_by(crate::journal::evidence_lost());
    reg.register(
        "evidence_lost",
        "Evidence appends this process gave up after their retries (each also logged as an error)",
        lost,
    );
    let abandoned = Counter::<u64>::default();
    abandoned.inc_by(m.delivery_abandoned);
    reg.register(
        "delivery_abandoned",
        "Results whose caller's response stream closed before them",
        abandoned,
    );
    let takeovers = Counter::<u64>::default();
    takeovers.inc_by(m.takeovers);
    reg.register(
        "takeovers",
        "Executions taken over from a replica whose lease expired",
        takeovers,
    );
    let redrives = Counter::<u64>::default();
    redrives.inc_by(m.redrives);
    reg.register(
        "redrives",
        "Executions their owning replica picked up after none of its calls drove them any more",
        redrives,
    );
    let tasks = Gauge::<i64>::default();
    tasks.set(tasks_in_flight as i64);
    reg.register(
        "tasks_in_flight",
        "MCP tasks a job of this server is watching",
        tasks,
    );
    let refused = Counter::<u64>::default();
    refused.inc_by(local.refused.load(Ordering::Relaxed));
    reg.register(
        "http_refused",
        "HTTP requests refused by this server (token, Host, Origin)",
        refused,
    );
    let unrecorded = Counter::<u64>::default();
    unrecorded.inc_by(local.refusals.unrecorded());
    reg.register(
        "http_refused_unrecorded",
        "Refused HTTP requests counted but not recorded in the journal (past the sample of each \
         source address and minute)",
        unrecorded,
    );
    let mut out = String::new();
    prometheus_client::encoding::text::encode(&mut out, &reg)?;
    Ok(out)
}
