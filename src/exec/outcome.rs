//! An execution's outcome as the journal holds it, and the marks a delivery leaves.

use crate::evidence::Evidence;
use crate::id::ExecutionId;
use crate::journal::rfc3339_from_unix;
use crate::recovery::Prior;
use crate::state::State;

use super::*;

impl Executor {
    pub(super) fn mark_attached(&self, mut o: Outcome) -> Outcome {
        o.attached = true;
        o
    }

    /// The journal's record of an execution that needs review, without touching the host.
    pub fn review_outcome(&mut self, id: &ExecutionId) -> Result<Outcome, ExecError> {
        let run = self.load(id)?;
        let mut o = self.outcome_from_journal(&run)?;
        let r = crate::review::record(&self.journal, id)?;
        o.needs_review = true;
        o.reason = Some(format!(
            "needs review: {}; first dispatched {}; {}",
            r.known_outcome,
            r.first_dispatched_at.as_deref().unwrap_or("never"),
            r.why_not_resent
        ));
        Ok(o)
    }

    /// The journal's view of an execution, without contacting the host.
    pub fn journal_outcome(&mut self, id: &ExecutionId) -> Result<Outcome, ExecError> {
        let run = self.load(id)?;
        if run.m.prior() == Prior::Held {
            return self.held_outcome(&run);
        }
        self.outcome_from_journal(&run)
    }

    /// Record `delivered` for an execution whose result the caller now holds. The journal
    /// takes it only after a result (`completed`, `cancelled`), once: a refusal means there is
    /// nothing (more) to record.
    pub fn mark_delivered(&mut self, id: &ExecutionId, how: &str) -> Result<(), ExecError> {
        match self
            .journal
            .append_evidence(id, Evidence::Delivered { to: how })
        {
            Err(e) if e.refused().is_none() => Err(e.into()),
            _ => Ok(()),
        }
    }

    pub(super) fn outcome_from_journal(&self, run: &Run) -> Result<Outcome, ExecError> {
        let status = self.journal.status(&run.rec.id)?;
        let events = self.journal.events(&run.rec.id)?;
        // The reason of the current state only: a reason recorded for an earlier state (an
        // `unknown` that a later recover resolved) no longer describes the outcome.
        let reason = events
            .iter()
            .rev()
            .find(|e| e.state.is_some())
            .and_then(|e| {
                e.evidence
                    .get("reason")
                    .and_then(|r| r.as_str())
                    .map(str::to_owned)
            });
        let mut state = status.map(|s| s.state).unwrap_or(State::Accepted);
        let delivered = state == State::Delivered;
        if delivered {
            // Report the outcome the delivery was of.
            state = events
                .iter()
                .rev()
                .filter_map(|e| e.state)
                .find(|s| *s != State::Delivered)
                .unwrap_or(State::Completed);
        }
        let done = run.done.as_ref();
        let intent = self.journal.intent_of(&run.rec.id)?;
        Ok(Outcome {
            execution_id: run.rec.id.to_string(),
            destination: run.rec.destination.clone(),
            host: format!("{}@{}:{}", run.rec.user, run.rec.host, run.rec.port),
            host_key_fingerprint: run.host_key.clone(),
            state,
            exit_code: done.map(|d| d.status),
            signal: done.and_then(|d| d.signal()),
            started_at: run
                .start
                .as_ref()
                .map(|s| rfc3339_from_unix(s.started_at as i64, 0)),
            finished_at: done.map(|d| rfc3339_from_unix(d.finished_at as i64, 0)),
            stdout_bytes: done.map(|d| d.out).unwrap_or(if run.out_off < NO_BYTES {
                run.out_off
            } else {
                0
            }),
            stderr_bytes: done.map(|d| d.err).unwrap_or(if run.err_off < NO_BYTES {
                run.err_off
            } else {
                0
            }),
            reconnects: run.reconnects,
            timed_out: done.map(|d| d.timed_out).unwrap_or(false),
            recovered: false,
            reason,
            attached: false,
            needs_review: matches!(state, State::Unknown | State::Interrupted),
            fingerprint: intent.as_ref().map(|i| i.fingerprint.clone()),
            class: intent.map(|i| i.class),
            held_by: None,
        })
    }
}
