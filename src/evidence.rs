//! The evidence of the events the executor appends, as typed values: one variant per event the
//! driver records, naming its kind, the state it moves the execution to, and its fields.
//!
//! The journal stores evidence as JSON text, and that text is in every event's chain hash: it is
//! the journal's format. [`Evidence::to_value`] gives exactly the object the executor built with
//! `json!` before these types existed (the same keys, the same kinds of value; serde_json keeps
//! an object's keys sorted, so field order here does not matter). The golden journal
//! (`src/journal/golden.rs`, `tests/fixtures/journal/`) builds its history with these variants
//! and compares the text byte for byte with the committed fixture, so a change here that would
//! change what the journal stores fails that test.
//!
//! Fixed sentences (a `decision`, a `reason` that is always the same) are part of the variant,
//! not of its caller: [`Evidence::to_value`] writes them.

use serde::Serialize;
use serde_json::Value;

use crate::event::EventKind;
use crate::intent::OpClass;
use crate::reach::Reach;
use crate::state::State;

/// The evidence of one event the executor appends.
#[derive(Clone, Debug, Serialize)]
#[serde(untagged)]
#[non_exhaustive]
pub enum Evidence<'a> {
    /// `accepted`: the execution's record (see [`crate::journal::accepted_evidence`]), how it
    /// reaches its host, and its intent when it has one.
    Accepted {
        #[serde(flatten)]
        record: Value,
        #[serde(skip_serializing_if = "Option::is_none")]
        connection: Option<&'a Reach>,
        #[serde(flatten, skip_serializing_if = "Option::is_none")]
        intent: Option<AcceptedIntent<'a>>,
        /// Who asked, for an execution whose host was never identified (no intent, so no
        /// `actor` from it): the HTTP front shows an execution only to its actor. Set only
        /// when `intent` is `None`.
        #[serde(rename = "actor", skip_serializing_if = "Option::is_none")]
        asked_by: Option<&'a str>,
    },
    /// `request-reused`: the same ID with the same operation again; attach, never a second run.
    RequestReused {
        by: &'a str,
        correlation_id: Option<&'a str>,
        session_id: Option<&'a str>,
        #[serde(serialize_with = "request_reused_decision")]
        decision: (),
    },
    /// `intent-matched`: another request with the same intent attached to this execution.
    IntentMatched {
        by: &'a str,
        session_id: Option<&'a str>,
        correlation_id: Option<&'a str>,
        fingerprint: &'a str,
        #[serde(serialize_with = "intent_matched_decision")]
        decision: (),
    },
    /// `resumed`: accepted, never authorized or dispatched; asking for authorization now.
    Resumed {
        by: &'a str,
        #[serde(serialize_with = "resumed_why")]
        why: (),
    },
    /// `authorized` or `rejected`: the approver's decision.
    Decided {
        #[serde(skip)]
        allow: bool,
        by: &'a str,
        rule: Option<&'a str>,
        reason: &'a str,
        at: &'a str,
        host_key: &'a str,
        actor: &'a str,
    },
    /// `correlation`: which request of which session this execution answers.
    Correlation {
        correlation_id: &'a str,
        session_id: Option<&'a str>,
        new_execution: bool,
    },
    /// `retry-same-id`: an idempotent operation with an unknown outcome, dispatched again.
    RetrySameId {
        class: OpClass,
        #[serde(serialize_with = "retry_same_id_reason")]
        reason: (),
    },
    /// `retry`: a retry of an execution that never started, and why.
    Retry { why: &'a str, by: &'a str },
    /// `resolved`: a person's verdict on an execution that needed review; `state` is the state
    /// it settles in (none for a retry, which dispatches again).
    Resolved {
        #[serde(skip)]
        state: Option<State>,
        decision: &'a str,
        by: &'a str,
        reason: &'a str,
        client: &'a str,
        state_before: State,
        detail: Option<ResolvedDetail>,
    },
    /// `redrive`: the owner picked up an execution no call drives any more.
    Redrive {
        by: &'a str,
        replica: &'a str,
        state: State,
        redrive: usize,
        max_redrives: usize,
        undriven_ms: u64,
        #[serde(serialize_with = "redrive_reason")]
        reason: (),
    },
    /// `cancel-requested`.
    CancelRequested { grace_secs: u64 },
    /// `dispatched`: durable before any byte of the dispatch leaves.
    Dispatched {
        epoch: Option<&'a str>,
        host_key: Option<&'a str>,
        attempt: u32,
        detach: bool,
        timeout_secs: u64,
    },
    /// `dispatch-withheld`: settled by another process before this one sent it.
    DispatchWithheld {
        by: &'a str,
        state: Option<State>,
        withheld: Vec<&'a str>,
        #[serde(serialize_with = "withheld_reason")]
        reason: (),
    },
    /// `dispatch-epoch`: the epoch the host announced in its reply to the dispatch.
    DispatchEpoch {
        epoch: &'a str,
        recorded_before: Option<&'a str>,
        #[serde(serialize_with = "dispatch_epoch_evidence")]
        evidence: (),
    },
    /// `running`: the host's start record, seen.
    Running {
        start_record: String,
        host_key: Option<&'a str>,
        host_side: Option<&'a str>,
        helper_sha256: Option<&'a str>,
    },
    /// `reconnected`.
    Reconnected { reconnects: u32 },
    /// `connection-lost`, with the offsets streamed so far.
    ConnectionLost {
        error: &'a str,
        out_off: u64,
        err_off: u64,
    },
    /// `guard-exists`: a dispatch found the start guard already crossed.
    GuardExists { start_record: Option<String> },
    /// `probe`: the marker is absent under the same epoch; dispatch again under the same ID.
    ProbeAbsent {
        #[serde(serialize_with = "probe_absent_result")]
        result: (),
        #[serde(serialize_with = "probe_absent_decision")]
        decision: (),
    },
    /// `completed` or `failed` (by `state`): the host's finish record.
    Finished {
        #[serde(skip)]
        state: State,
        finish_record: String,
        recovered: bool,
        reconnects: u32,
    },
    /// A conclusion without a finish record (`unknown`, `interrupted`, `failed`, ...), and why.
    Concluded {
        #[serde(skip)]
        state: State,
        reason: &'a str,
        reconnects: u32,
        start_record: Option<String>,
    },
    /// `delivered`: the caller holds the result; `to` says how it got it.
    Delivered { to: &'a str },
    /// `correlation` of an `attach`: which request of which session attached to this execution.
    Attached {
        correlation_id: &'a str,
        session_id: Option<&'a str>,
        #[serde(serialize_with = "attach_method")]
        method: (),
    },
    /// `delivery-abandoned`: the caller's response stream closed before the result; `cancel`
    /// says whether the execution's class cancels it then (otherwise it keeps running).
    DeliveryAbandoned {
        correlation_id: &'a str,
        session_id: Option<&'a str>,
        #[serde(serialize_with = "abandoned_reason")]
        reason: (),
        #[serde(rename = "decision", serialize_with = "abandoned_decision")]
        cancel: bool,
    },
    /// `takeover`: a replica took over an execution whose owner's lease expired.
    Takeover {
        from: &'a str,
        from_client: &'a str,
        to: &'a str,
        to_client: &'a str,
        epoch: i64,
        takeover: i32,
        max_takeovers: i32,
        lease_ms: i64,
        #[serde(serialize_with = "takeover_reason")]
        reason: (),
    },
    /// `host-epoch-changed`: the host's marker home is not the one this journal last saw.
    HostEpochChanged {
        destination: &'a str,
        host_key: &'a str,
        remote_dir: &'a str,
        old: &'a str,
        new: &'a str,
        at: &'a str,
        #[serde(serialize_with = "epoch_changed_meaning")]
        meaning: (),
    },
    /// `host-key-shared`: two destinations present one host key with different epochs.
    HostKeyShared {
        host_key: &'a str,
        remote_dir: &'a str,
        destination: &'a str,
        epoch: &'a str,
        other_destination: &'a str,
        other_epoch: &'a str,
        at: &'a str,
        #[serde(serialize_with = "key_shared_meaning")]
        meaning: (),
    },
}

/// The evidence of an entry a front appends to its session (the sessions chain), typed as
/// [`Evidence`] is for executions: the kind of entry follows from the variant.
#[derive(Clone, Debug, Serialize)]
#[serde(untagged)]
#[non_exhaustive]
pub enum SessionEvidence<'a> {
    /// `batch-resume`: the session resumes a batch.
    BatchResume { batch_id: &'a str },
    /// `refused`: an HTTP request refused before it reached a tool (the token is named by its
    /// ID alone, never by its secret).
    Refused {
        status: u16,
        reason: &'a str,
        method: &'a str,
        path: &'a str,
        peer: String,
        origin: Option<&'a str>,
        token_id: Option<&'a str>,
    },
    /// `ended` of a batch: the exit code the batch ended with.
    EndedWithExit { exit: i32 },
    /// `ended` of a named operation's run.
    EndedOperation { operation: &'a str },
    /// `ended` of `cairn run`: the execution it made, if it made one.
    EndedExecution { execution_id: Option<&'a str> },
    /// `ended` of a server: why it stopped.
    Ended { reason: &'a str },
    /// `ended` of `cairn serve` on stdio: how many requests it answered before stdin closed.
    EndedStdin {
        requests: u64,
        #[serde(serialize_with = "stdin_closed")]
        reason: (),
    },
}

impl SessionEvidence<'_> {
    /// The kind of session entry this evidence belongs to.
    pub fn kind(&self) -> &'static str {
        match self {
            SessionEvidence::BatchResume { .. } => "batch-resume",
            SessionEvidence::Refused { .. } => "refused",
            SessionEvidence::EndedWithExit { .. }
            | SessionEvidence::EndedOperation { .. }
            | SessionEvidence::EndedExecution { .. }
            | SessionEvidence::Ended { .. }
            | SessionEvidence::EndedStdin { .. } => "ended",
        }
    }

    /// The evidence as the journal stores it.
    pub fn to_value(&self) -> Value {
        serde_json::to_value(self).expect("session evidence serializes to JSON")
    }
}

/// The intent fields of an `accepted` event (an execution accepted with a fingerprint).
#[derive(Clone, Debug, Serialize)]
pub struct AcceptedIntent<'a> {
    pub fingerprint: &'a str,
    pub actor: &'a str,
    pub scope: &'a str,
    pub class: &'a str,
    pub retention_secs: u64,
    pub session_id: Option<&'a str>,
    pub intent: &'a Value,
}

/// What a person's `resolve --retry` found before it dispatched again.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct ResolvedDetail {
    #[serde(serialize_with = "resolved_probe")]
    pub probe: (),
}

impl ResolvedDetail {
    /// The probe found the marker absent under the same epoch.
    pub const ABSENT_SAME_EPOCH: ResolvedDetail = ResolvedDetail { probe: () };
}

impl Evidence<'_> {
    /// The kind of event this evidence belongs to.
    pub fn kind(&self) -> EventKind {
        use EventKind as K;
        match self {
            Evidence::Accepted { .. } => K::Accepted,
            Evidence::RequestReused { .. } => K::RequestReused,
            Evidence::IntentMatched { .. } => K::IntentMatched,
            Evidence::Resumed { .. } => K::Resumed,
            Evidence::Decided { allow: true, .. } => K::Authorized,
            Evidence::Decided { allow: false, .. } => K::Rejected,
            Evidence::Correlation { .. } => K::Correlation,
            Evidence::RetrySameId { .. } => K::RetrySameId,
            Evidence::Retry { .. } => K::Retry,
            Evidence::Resolved { .. } => K::Resolved,
            Evidence::Redrive { .. } => K::Redrive,
            Evidence::CancelRequested { .. } => K::CancelRequested,
            Evidence::Dispatched { .. } => K::Dispatched,
            Evidence::DispatchWithheld { .. } => K::DispatchWithheld,
            Evidence::DispatchEpoch { .. } => K::DispatchEpoch,
            Evidence::Running { .. } => K::Running,
            Evidence::Reconnected { .. } => K::Reconnected,
            Evidence::ConnectionLost { .. } => K::ConnectionLost,
            Evidence::GuardExists { .. } => K::GuardExists,
            Evidence::ProbeAbsent { .. } => K::Probe,
            Evidence::Finished { state, .. } | Evidence::Concluded { state, .. } => {
                EventKind::of_state(*state)
            }
            Evidence::Delivered { .. } => K::Delivered,
            Evidence::Attached { .. } => K::Correlation,
            Evidence::DeliveryAbandoned { .. } => K::DeliveryAbandoned,
            Evidence::Takeover { .. } => K::Takeover,
            Evidence::HostEpochChanged { .. } => K::HostEpochChanged,
            Evidence::HostKeyShared { .. } => K::HostKeyShared,
        }
    }

    /// The state this event moves the execution to, if it is a transition.
    pub fn state(&self) -> Option<State> {
        match self {
            Evidence::Accepted { .. } => Some(State::Accepted),
            Evidence::Decided { allow: true, .. } => Some(State::Authorized),
            Evidence::Decided { allow: false, .. } => Some(State::Rejected),
            Evidence::Resolved { state, .. } => *state,
            Evidence::Dispatched { .. } => Some(State::Dispatched),
            Evidence::Running { .. } => Some(State::Running),
            Evidence::Finished { state, .. } | Evidence::Concluded { state, .. } => Some(*state),
            Evidence::Delivered { .. } => Some(State::Delivered),
            _ => None,
        }
    }

    /// The evidence as the journal stores it.
    pub fn to_value(&self) -> Value {
        // Every field is a string, a number, a bool, a plain enum or a JSON value: this cannot
        // fail (a map with non-string keys is the only way serde_json refuses, and none is here).
        serde_json::to_value(self).expect("evidence serializes to JSON")
    }

    /// `(kind, state, evidence)` as the journal's append takes them (its `NewEvent`).
    pub fn into_event(self) -> (EventKind, Option<State>, Value) {
        (self.kind(), self.state(), self.to_value())
    }
}

/// A fixed sentence serialized in place of a unit field.
macro_rules! sentence {
    ($($name:ident => $text:expr;)*) => {
        $(fn $name<S: serde::Serializer>(_: &(), s: S) -> Result<S::Ok, S::Error> {
            s.serialize_str($text)
        })*
    };
}

sentence! {
    request_reused_decision => "same ID, same operation: attach to the existing execution";
    intent_matched_decision =>
        "same intent (fingerprint, actor, scope) as this execution: attach, do not run again";
    resumed_why => "accepted, never authorized or dispatched: its client stopped; asking for \
                    authorization now";
    retry_same_id_reason => "idempotent operation with an unknown outcome: dispatching again \
                             under the same execution ID";
    redrive_reason => "this replica owns the execution and no call of it drives it any more (a \
                       call that failed, say with a journal error): it applies the recovery \
                       table, as after a takeover";
    withheld_reason => "settled by another process before this one dispatched it; nothing was \
                        sent";
    dispatch_epoch_evidence =>
        "announced by the host in its reply to the dispatch, before the start guard";
    probe_absent_result => "absent";
    probe_absent_decision => "dispatch again under the same ID";
    resolved_probe => "absent, same epoch: the start guard was never crossed";
    attach_method => "attach";
    stdin_closed => "stdin closed";
    abandoned_reason => "the caller's response stream closed before the result";
    takeover_reason => "the owner's lease expired (no heartbeat in database time): this \
                        replica owns the execution now and recovers it; the old owner's \
                        appends are refused";
    epoch_changed_meaning => "the host's marker home was wiped or replaced since this journal \
                              last saw it; executions dispatched into the old epoch keep its rule \
                              (a missing marker proves nothing)";
    key_shared_meaning => "two destinations present one host key with different epochs (a \
                           cloned image?); cairn keeps their bookkeeping and executions apart";
}

fn abandoned_decision<S: serde::Serializer>(cancel: &bool, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(if *cancel {
        "cancel the execution (its class's setting)"
    } else {
        "keep running: a transport event never kills a dispatched command"
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn unit_sentences_and_skipped_fields_serialize_as_the_old_json() {
        let e = Evidence::ProbeAbsent {
            result: (),
            decision: (),
        };
        assert_eq!(e.kind(), EventKind::Probe);
        assert_eq!(e.state(), None);
        assert_eq!(
            e.to_value(),
            json!({"result": "absent", "decision": "dispatch again under the same ID"})
        );
        let f = Evidence::Finished {
            state: State::Failed,
            finish_record: "F".into(),
            recovered: false,
            reconnects: 2,
        };
        assert_eq!(f.kind(), EventKind::Failed);
        assert_eq!(f.state(), Some(State::Failed));
        assert_eq!(
            f.to_value(),
            json!({"finish_record": "F", "recovered": false, "reconnects": 2u32})
        );
        let r = Evidence::Resolved {
            state: None,
            decision: "retry",
            by: "alice",
            reason: "checked",
            client: "1@h",
            state_before: State::Unknown,
            detail: Some(ResolvedDetail::ABSENT_SAME_EPOCH),
        };
        assert_eq!(
            r.to_value(),
            json!({"decision": "retry", "by": "alice", "reason": "checked", "client": "1@h",
                   "state_before": "unknown",
                   "detail": {"probe": "absent, same epoch: the start guard was never crossed"}})
        );
    }

    #[test]
    fn fronts_evidence_serializes_as_the_old_json() {
        let e = SessionEvidence::EndedStdin {
            requests: 3,
            reason: (),
        };
        assert_eq!(e.kind(), "ended");
        assert_eq!(
            e.to_value(),
            json!({"requests": 3u64, "reason": "stdin closed"})
        );
        let d = Evidence::DeliveryAbandoned {
            correlation_id: "c",
            session_id: None,
            reason: (),
            cancel: true,
        };
        assert_eq!(d.kind(), EventKind::DeliveryAbandoned);
        assert_eq!(
            d.to_value(),
            json!({"correlation_id": "c", "session_id": null,
                   "reason": "the caller's response stream closed before the result",
                   "decision": "cancel the execution (its class's setting)"})
        );
    }

    #[test]
    fn accepted_without_connection_or_intent_is_the_record_alone() {
        let record = json!({"destination": "db-1", "port": 22});
        let e = Evidence::Accepted {
            record: record.clone(),
            connection: None,
            intent: None,
            asked_by: None,
        };
        assert_eq!(e.to_value(), record);
        assert_eq!(e.kind(), EventKind::Accepted);
    }
}
