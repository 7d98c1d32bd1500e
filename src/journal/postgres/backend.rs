//! PostgreSQL as one of the journal's two stores: [`Backend`] by `Pg`'s own methods of the
//! same names (its SQL is in `journal/postgres.rs` and its submodules).

use std::collections::HashMap;

use super::Pg;
use crate::epoch::{Announced, HostPlace};
use crate::id::ExecutionId;
use crate::journal::backend::{Backend, Choose, Named};
use crate::journal::{
    AcceptOrMatch, Event, ExecutionRecord, GroupCommitStats, IntentColumns, JournalError,
    JournalMetrics, LegacyIntent, Ownership, SessionRecord, SessionView, Status, TakeOver, Watch,
};
use crate::state::State;

type Result<T> = std::result::Result<T, JournalError>;

/// PostgreSQL: its own methods, of the same names (src/journal/postgres.rs).
impl Backend for Pg {
    #[cfg(test)]
    fn raw_execute(&self, sql: &str) -> Result<u64> {
        Pg::raw_execute(self, sql)
    }

    fn accept(&self, rec: &ExecutionRecord, evidence: serde_json::Value) -> Result<Event> {
        Pg::accept(self, rec, &evidence)
    }
    fn append(
        &self,
        id: &ExecutionId,
        kind: &str,
        state: Option<State>,
        evidence: serde_json::Value,
    ) -> Result<Event> {
        Pg::append_all(self, id, &[(kind.to_owned(), state, evidence)])
            .and_then(|e| e.ok_or_else(|| crate::journal::pg_missing_event(self)))
    }
    fn append_all(&self, id: &ExecutionId, events: Vec<Named>) -> Result<Option<Event>> {
        Pg::append_all(self, id, &events)
    }
    fn append_all_if(
        &self,
        id: &ExecutionId,
        expect: &[State],
        events: Vec<Named>,
    ) -> Result<Event> {
        Pg::append_all_if(self, id, expect, &events)
    }
    fn group_commit_stats(&self) -> GroupCommitStats {
        Pg::group_commit_stats(self)
    }

    fn execution(&self, id: &ExecutionId) -> Result<Option<ExecutionRecord>> {
        Pg::execution(self, id)
    }
    fn events(&self, id: &ExecutionId) -> Result<Vec<Event>> {
        Pg::events(self, id)
    }
    fn status(&self, id: &ExecutionId) -> Result<Option<Status>> {
        Pg::status(self, id)
    }
    fn execution_ids(&self) -> Result<Vec<String>> {
        Pg::execution_ids(self)
    }

    fn cursor(&self, id: &ExecutionId) -> Result<(u64, u64)> {
        Pg::cursor(self, id)
    }
    fn set_cursor(&self, id: &ExecutionId, out_off: u64, err_off: u64) -> Result<()> {
        Pg::set_cursor(self, id, out_off, err_off)
    }
    fn prune_cursors(&self) -> Result<usize> {
        Pg::prune_cursors(self)
    }

    /// PostgreSQL journals began after the fingerprint changed: none holds an execution
    /// accepted under the earlier one, so `legacy` matches nothing there.
    fn accept_or_match_with(
        &self,
        rec: &ExecutionRecord,
        cols: &IntentColumns,
        _legacy: Option<LegacyIntent<'_>>,
        evidence: serde_json::Value,
        match_evidence: serde_json::Value,
        choose: Choose<'_>,
    ) -> Result<AcceptOrMatch> {
        Pg::accept_or_match(self, rec, cols, &evidence, &match_evidence, choose)
    }
    fn intent_of(&self, id: &ExecutionId) -> Result<Option<IntentColumns>> {
        Pg::intent_of(self, id)
    }
    fn executions_of_session(&self, session: &str) -> Result<Vec<String>> {
        Pg::executions_of_session(self, session)
    }
    fn start_session(&self, s: &SessionRecord) -> Result<()> {
        Pg::start_session(self, s)
    }
    fn session_event(&self, session: &str, kind: &str, evidence: serde_json::Value) -> Result<()> {
        Pg::session_event(self, session, kind, &evidence)
    }
    fn sessions(&self) -> Result<Vec<SessionView>> {
        Pg::sessions(self)
    }

    fn host_epoch_at(&self, place: &HostPlace) -> Result<Option<String>> {
        Pg::host_epoch_at(self, place)
    }
    fn observe_host_epoch(
        &self,
        id: &ExecutionId,
        place: &HostPlace,
        epoch: &str,
    ) -> Result<Announced> {
        Pg::observe_host_epoch(self, id, place, epoch)
    }
    fn last_event_seq(&self) -> Result<i64> {
        Pg::last_event_seq(self)
    }
    fn metrics(&self) -> Result<JournalMetrics> {
        Pg::metrics(self)
    }
    fn is_shared(&self) -> bool {
        true
    }
    fn ownership(&self, id: &ExecutionId) -> Result<Option<Ownership>> {
        Pg::ownership(self, id)
    }
    fn take_over(
        &self,
        id: Option<&ExecutionId>,
        limit: i64,
    ) -> Result<Vec<(ExecutionId, TakeOver)>> {
        Pg::take_over(self, id, limit)
    }
    fn owned_unsettled(&self) -> Result<Vec<ExecutionId>> {
        Pg::owned_unsettled(self)
    }
    fn takeover_counts(&self) -> Result<HashMap<String, i32>> {
        Pg::takeover_counts(self)
    }
    fn taken_over_here(&self, id: &ExecutionId) -> bool {
        Pg::taken_over_here(self, id)
    }
    fn watch(&self, id: &ExecutionId) -> Option<Watch> {
        Some(Pg::watch(self, id))
    }
}
