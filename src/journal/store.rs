//! What the executor needs from a journal, as a trait: the driver ([`crate::Executor`]) is
//! generic over it, so a store slots in beside [`Journal`] (its SQLite file and its PostgreSQL
//! database) without touching the machine or the driver. See ARCHITECTURE.md, "Layers".
//!
//! The contract every implementation keeps (docs/DESIGN.md, "The journal is evidence"):
//! - an append returns only once its event is durable: the driver acts on an event (sends the
//!   dispatch, tells the caller) only after the call that stored it returned;
//! - events of one execution are totally ordered and never change once stored;
//! - a transition the lifecycle does not allow from the state recorded at that moment
//!   (`crate::lifecycle`) is refused in the same transaction as its append, with
//!   [`JournalError::Refused`], and nothing of that append is written;
//! - [`ExecutionJournal::accept_or_match_with`] is atomic: two identical requests racing make
//!   one execution;
//! - nothing here stores a secret: the executor hands in evidence already free of them.

use std::path::Path;

use super::{
    AcceptOrMatch, Candidate, Event, ExecutionRecord, IntentColumns, Journal, JournalError,
    LegacyIntent, Ownership, Status, TakeOver, Watch,
};
use crate::epoch::{Announced, HostPlace};
use crate::event::EventKind;
use crate::evidence::Evidence;
use crate::id::ExecutionId;
use crate::state::State;

type Result<T> = std::result::Result<T, JournalError>;

/// One event to append: its kind, the state it moves the execution to (if any), its evidence.
pub type NewEvent = (EventKind, Option<State>, serde_json::Value);

/// The journal as the executor uses it. [`Journal`] is the implementation cairn ships; the
/// methods mean what the same-named methods of [`Journal`] document.
pub trait ExecutionJournal: Send {
    /// The path or URL this journal was opened at (the intent key lives next to a file).
    fn path(&self) -> &Path;
    /// Where this journal is, fit for a message or a log line (no password).
    fn location(&self) -> String;
    /// Whether other replicas may share this journal (then ownership and take-over apply).
    fn is_shared(&self) -> bool;

    /// Insert `rec` with its `accepted` event; durable on return.
    fn accept(&mut self, rec: &ExecutionRecord, evidence: serde_json::Value) -> Result<Event>;
    /// Insert `rec`, or attach to an equal intent still in its window: atomic.
    fn accept_or_match_with(
        &mut self,
        rec: &ExecutionRecord,
        cols: &IntentColumns,
        legacy: Option<LegacyIntent<'_>>,
        evidence: serde_json::Value,
        match_evidence: serde_json::Value,
        choose: impl FnOnce(&[Candidate]) -> Option<usize>,
    ) -> Result<AcceptOrMatch>;
    /// Append one event; durable on return.
    fn append(
        &mut self,
        id: &ExecutionId,
        kind: EventKind,
        state: Option<State>,
        evidence: serde_json::Value,
    ) -> Result<Event>;
    /// Append several events of one execution, in order, in one transaction; returns the last.
    fn append_all(&mut self, id: &ExecutionId, events: Vec<NewEvent>) -> Result<Option<Event>>;
    /// Append several events of one execution only while it holds one of the states `expect`,
    /// checked in the same transaction; returns the last.
    fn append_all_if(
        &mut self,
        id: &ExecutionId,
        expect: &[State],
        events: Vec<NewEvent>,
    ) -> Result<Event>;
    /// Append one event from its typed evidence (its kind and state follow from it).
    fn append_evidence(&mut self, id: &ExecutionId, evidence: Evidence<'_>) -> Result<Event> {
        let (kind, state, value) = evidence.into_event();
        self.append(id, kind, state, value)
    }

    /// The execution's row, if the journal has it.
    fn execution(&self, id: &ExecutionId) -> Result<Option<ExecutionRecord>>;
    /// The execution's events, in order.
    fn events(&self, id: &ExecutionId) -> Result<Vec<Event>>;
    /// The execution's current state, from its events.
    fn status(&self, id: &ExecutionId) -> Result<Option<Status>>;
    /// The intent columns of an execution accepted with a fingerprint.
    fn intent_of(&self, id: &ExecutionId) -> Result<Option<IntentColumns>>;

    /// How far the output of `id` was delivered (stdout, stderr offsets).
    fn cursor(&self, id: &ExecutionId) -> Result<(u64, u64)>;
    /// Record delivered output offsets: progress, not evidence.
    fn set_cursor(&self, id: &ExecutionId, out_off: u64, err_off: u64) -> Result<()>;

    /// The host epoch last seen at `place`.
    fn host_epoch_at(&self, place: &HostPlace) -> Result<Option<String>>;
    /// Record the epoch `id`'s reply announced at `place`; appends the evidence to `id`.
    fn observe_host_epoch(
        &mut self,
        id: &ExecutionId,
        place: &HostPlace,
        epoch: &str,
    ) -> Result<Announced>;

    /// Which replica drives `id` (shared journals only).
    fn ownership(&self, id: &ExecutionId) -> Result<Option<Ownership>>;
    /// Take over `id` (or up to `limit` executions) whose lease expired.
    fn take_over(
        &mut self,
        id: Option<&ExecutionId>,
        limit: i64,
    ) -> Result<Vec<(ExecutionId, TakeOver)>>;
    /// Whether this replica took `id` over from another.
    fn taken_over_here(&self, id: &ExecutionId) -> bool;
    /// A wake-up for when `id` settles elsewhere (shared journals only).
    fn watch(&self, id: &ExecutionId) -> Option<Watch>;
}

impl ExecutionJournal for Journal {
    fn path(&self) -> &Path {
        Journal::path(self)
    }
    fn location(&self) -> String {
        Journal::location(self)
    }
    fn is_shared(&self) -> bool {
        Journal::is_shared(self)
    }
    fn accept(&mut self, rec: &ExecutionRecord, evidence: serde_json::Value) -> Result<Event> {
        Journal::accept(self, rec, evidence)
    }
    fn accept_or_match_with(
        &mut self,
        rec: &ExecutionRecord,
        cols: &IntentColumns,
        legacy: Option<LegacyIntent<'_>>,
        evidence: serde_json::Value,
        match_evidence: serde_json::Value,
        choose: impl FnOnce(&[Candidate]) -> Option<usize>,
    ) -> Result<AcceptOrMatch> {
        Journal::accept_or_match_with(self, rec, cols, legacy, evidence, match_evidence, choose)
    }
    fn append(
        &mut self,
        id: &ExecutionId,
        kind: EventKind,
        state: Option<State>,
        evidence: serde_json::Value,
    ) -> Result<Event> {
        Journal::append(self, id, kind, state, evidence)
    }
    fn append_all(&mut self, id: &ExecutionId, events: Vec<NewEvent>) -> Result<Option<Event>> {
        Journal::append_all(self, id, events)
    }
    fn append_all_if(
        &mut self,
        id: &ExecutionId,
        expect: &[State],
        events: Vec<NewEvent>,
    ) -> Result<Event> {
        Journal::append_all_if(self, id, expect, events)
    }
    fn execution(&self, id: &ExecutionId) -> Result<Option<ExecutionRecord>> {
        Journal::execution(self, id)
    }
    fn events(&self, id: &ExecutionId) -> Result<Vec<Event>> {
        Journal::events(self, id)
    }
    fn status(&self, id: &ExecutionId) -> Result<Option<Status>> {
        Journal::status(self, id)
    }
    fn intent_of(&self, id: &ExecutionId) -> Result<Option<IntentColumns>> {
        Journal::intent_of(self, id)
    }
    fn cursor(&self, id: &ExecutionId) -> Result<(u64, u64)> {
        Journal::cursor(self, id)
    }
    fn set_cursor(&self, id: &ExecutionId, out_off: u64, err_off: u64) -> Result<()> {
        Journal::set_cursor(self, id, out_off, err_off)
    }
    fn host_epoch_at(&self, place: &HostPlace) -> Result<Option<String>> {
        Journal::host_epoch_at(self, place)
    }
    fn observe_host_epoch(
        &mut self,
        id: &ExecutionId,
        place: &HostPlace,
        epoch: &str,
    ) -> Result<Announced> {
        Journal::observe_host_epoch(self, id, place, epoch)
    }
    fn ownership(&self, id: &ExecutionId) -> Result<Option<Ownership>> {
        Journal::ownership(self, id)
    }
    fn take_over(
        &mut self,
        id: Option<&ExecutionId>,
        limit: i64,
    ) -> Result<Vec<(ExecutionId, TakeOver)>> {
        Journal::take_over(self, id, limit)
    }
    fn taken_over_here(&self, id: &ExecutionId) -> bool {
        Journal::taken_over_here(self, id)
    }
    fn watch(&self, id: &ExecutionId) -> Option<Watch> {
        Journal::watch(self, id)
    }
}
