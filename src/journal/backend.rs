//! One journal, two stores: what a store does for [`Journal`], as a trait implemented by the
//! SQLite file (`journal/sqlite.rs`) and by the PostgreSQL database (`journal/postgres/backend.rs`),
//! as sqlx's backends implement one `Executor`. [`Journal`] holds one of them and each of its
//! methods asks it once; what both stores do alike (the kind as its name, listing, the
//! host-epoch procedure, the evidence checks) stays in [`Journal`], written once.
//!
//! Batches and the HTTP records are sub-traits ([`BatchStore`], [`HttpStore`]) that each store
//! implements where that SQL lives, beside its schema, so no method of theirs is a forwarder.
//!
//! The defaults are a store that no other replica shares (a SQLite file): no ownership, nothing
//! to take over, nothing to watch.
//!
//! This is the seam for a new store: the executor ([`crate::Executor`]) holds a [`Journal`] and
//! knows nothing of which store is behind it. The contract every store keeps
//! (docs/DESIGN.md, "The journal is evidence"):
//! - an append returns only once its event is durable: the driver acts on an event (sends the
//!   dispatch, tells the caller) only after the call that stored it returned;
//! - events of one execution are totally ordered and never change once stored;
//! - a transition the lifecycle does not allow from the state recorded at that moment
//!   (`crate::lifecycle`) is refused in the same transaction as its append, with
//!   [`JournalError::Refused`], and nothing of that append is written;
//! - [`Backend::accept_or_match_with`] is atomic: two identical requests racing make one
//!   execution;
//! - nothing here stores a secret: the executor hands in evidence already free of them.
//!
//! [`Journal`]: super::Journal

use std::collections::HashMap;

use super::{
    AcceptOrMatch, Candidate, Event, ExecutionRecord, GroupCommitStats, IntentColumns,
    JournalError, LegacyIntent, Ownership, SessionRecord, SessionView, Status, TakeOver, Watch,
};
use super::{BatchRecord, JournalMetrics, StoredEvent, StreamRecord, TokenRecord};
use crate::epoch::{Announced, HostPlace};
use crate::id::ExecutionId;
use crate::state::State;

type Result<T> = std::result::Result<T, JournalError>;

/// One event to append as a store keeps it: its kind's name, the state it moves to, its
/// evidence.
pub(super) type Named = (String, Option<State>, serde_json::Value);

/// Intent matching's choice among the candidates (see [`super::Journal::accept_or_match`]).
pub(super) type Choose<'a> = Box<dyn FnOnce(&[Candidate]) -> Option<usize> + 'a>;

/// What a store does for [`super::Journal`]; each method means what the same-named method of
/// [`super::Journal`] documents.
pub(super) trait Backend: Send + Sync + BatchStore + HttpStore {
    /// Run one SQL statement as the journal's own connection (tests).
    #[cfg(test)]
    fn raw_execute(&self, sql: &str) -> Result<u64>;

    fn accept(&self, rec: &ExecutionRecord, evidence: serde_json::Value) -> Result<Event>;
    fn append(
        &self,
        id: &ExecutionId,
        kind: &str,
        state: Option<State>,
        evidence: serde_json::Value,
    ) -> Result<Event>;
    fn append_all(&self, id: &ExecutionId, events: Vec<Named>) -> Result<Option<Event>>;
    fn append_all_if(
        &self,
        id: &ExecutionId,
        expect: &[State],
        events: Vec<Named>,
    ) -> Result<Event>;
    fn group_commit_stats(&self) -> GroupCommitStats;

    fn execution(&self, id: &ExecutionId) -> Result<Option<ExecutionRecord>>;
    fn events(&self, id: &ExecutionId) -> Result<Vec<Event>>;
    fn status(&self, id: &ExecutionId) -> Result<Option<Status>>;
    /// Every execution's ID, newest first.
    fn execution_ids(&self) -> Result<Vec<String>>;

    fn cursor(&self, id: &ExecutionId) -> Result<(u64, u64)>;
    fn set_cursor(&self, id: &ExecutionId, out_off: u64, err_off: u64) -> Result<()>;
    fn prune_cursors(&self) -> Result<usize>;

    fn accept_or_match_with(
        &self,
        rec: &ExecutionRecord,
        cols: &IntentColumns,
        legacy: Option<LegacyIntent<'_>>,
        evidence: serde_json::Value,
        match_evidence: serde_json::Value,
        choose: Choose<'_>,
    ) -> Result<AcceptOrMatch>;
    fn intent_of(&self, id: &ExecutionId) -> Result<Option<IntentColumns>>;
    fn executions_of_session(&self, session: &str) -> Result<Vec<String>>;
    fn start_session(&self, s: &SessionRecord) -> Result<()>;
    fn session_event(&self, session: &str, kind: &str, evidence: serde_json::Value) -> Result<()>;
    fn sessions(&self) -> Result<Vec<SessionView>>;

    fn host_epoch_at(&self, place: &HostPlace) -> Result<Option<String>>;
    fn observe_host_epoch(
        &self,
        id: &ExecutionId,
        place: &HostPlace,
        epoch: &str,
    ) -> Result<Announced>;
    fn last_event_seq(&self) -> Result<i64>;
    fn metrics(&self) -> Result<JournalMetrics>;
    /// Whether other replicas share this store.
    fn is_shared(&self) -> bool {
        false
    }
    fn ownership(&self, _id: &ExecutionId) -> Result<Option<Ownership>> {
        Ok(None)
    }
    fn take_over(
        &self,
        _id: Option<&ExecutionId>,
        _limit: i64,
    ) -> Result<Vec<(ExecutionId, TakeOver)>> {
        Ok(Vec::new())
    }
    fn owned_unsettled(&self) -> Result<Vec<ExecutionId>> {
        Ok(Vec::new())
    }
    fn takeover_counts(&self) -> Result<HashMap<String, i32>> {
        Ok(HashMap::new())
    }
    fn taken_over_here(&self, _id: &ExecutionId) -> bool {
        false
    }
    fn watch(&self, _id: &ExecutionId) -> Option<Watch> {
        None
    }
}

/// Batches, as a store keeps them: each store implements this next to its batch schema
/// (`batch.rs`, `postgres/sessions.rs`), so the SQL and its trait methods are one block.
pub(super) trait BatchStore {
    fn create_batch(
        &self,
        id: &str,
        command: &[u8],
        options: &serde_json::Value,
        members: &[(String, ExecutionId)],
    ) -> Result<()>;
    fn batch(&self, id: &str) -> Result<Option<BatchRecord>>;
    fn batch_ids(&self) -> Result<Vec<String>>;
}

/// API tokens and the HTTP gateway's streams, stored events and sessions, as a store keeps
/// them: each store implements this next to its HTTP schema (`http.rs`, `postgres/http.rs`).
pub(super) trait HttpStore {
    fn add_token(&self, t: &TokenRecord) -> Result<()>;
    fn token_by_hash(&self, hash: &str) -> Result<Option<TokenRecord>>;
    fn tokens(&self) -> Result<Vec<TokenRecord>>;
    fn revoke_token(&self, id: &str) -> Result<bool>;
    fn store_http_event(
        &self,
        stream_id: &str,
        retry_ms: Option<i64>,
        message: Option<&str>,
    ) -> Result<i64>;
    fn http_event_stream(&self, seq: i64) -> Result<Option<String>>;
    fn http_events_after(&self, stream_id: &str, seq: i64) -> Result<Vec<StoredEvent>>;
    fn record_http_stream(&self, s: &StreamRecord) -> Result<()>;
    fn http_stream(&self, stream_id: &str) -> Result<Option<StreamRecord>>;
    fn store_http_session(&self, id: &str, state: &str) -> Result<()>;
    fn bind_http_session(&self, id: &str, actor: &str) -> Result<()>;
    fn http_session(&self, id: &str) -> Result<Option<(Option<String>, Option<String>)>>;
    fn delete_http_session(&self, id: &str) -> Result<()>;
    fn execution_by_correlation(&self, correlation: &str) -> Result<Option<String>>;
    fn prune_http_events(&self, before_ms: i64) -> Result<usize>;
    fn execution_by_correlation_after(
        &self,
        correlation: &str,
        after_seq: i64,
    ) -> Result<Option<String>>;
}
