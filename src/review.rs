//! Review: executions whose outcome cairn cannot settle alone, and the human decisions about
//! them.
//!
//! An execution needs review when its outcome is `interrupted` (it started and cannot finish)
//! or `unknown` (cairn cannot prove what happened), and no human has resolved it. A matching
//! retry never starts it again and never asks for a second approval: it gets this record
//! (docs/DESIGN.md, intent matching). `cairn resolve ID --as completed|failed|retry --reason TEXT`
//! records a decision as evidence: a `resolved` event with who, when and why.

use serde::Serialize;

use crate::error::ExecError;
use crate::event::EventKind;
use crate::id::ExecutionId;
use crate::journal::Journal;
use crate::state::State;

/// What a reviewer needs to decide, from the journal alone.
#[derive(Clone, Debug, Serialize)]
pub struct ReviewRecord {
    pub execution_id: String,
    pub destination: String,
    /// `user@host:port`.
    pub target: String,
    pub host_key: Option<String>,
    pub command: String,
    pub class: String,
    pub actor: Option<String>,
    pub scope: Option<String>,
    pub fingerprint: Option<String>,
    pub accepted_at: String,
    pub first_dispatched_at: Option<String>,
    pub dispatches: usize,
    pub state: State,
    /// For `unknown`: the last state known before.
    pub state_before: Option<State>,
    /// The known outcome, in words.
    pub known_outcome: String,
    /// The last evidence recorded.
    pub evidence: Option<String>,
    /// Why cairn did not send it again.
    pub why_not_resent: String,
    /// Requests (by correlation ID) that attached to it.
    pub correlation_ids: Vec<String>,
    /// Whether a human already resolved it, and how.
    pub resolution: Option<serde_json::Value>,
}

impl ReviewRecord {
    /// Still waiting for a human.
    pub fn pending(&self) -> bool {
        self.resolution.is_none() && matches!(self.state, State::Unknown | State::Interrupted)
    }
}

/// The review record of one execution.
// Long: gathers the review record's fields from one read of the events, in the record's order;
// each is a few lines.
pub fn record(j: &Journal, id: &ExecutionId) -> Result<ReviewRecord, ExecError> {
    let rec = j
        .execution(id)?
        .ok_or_else(|| ExecError::NoSuchExecution(id.to_string(), j.location()))?;
    let events = j.events(id)?;
    let status = crate::journal::status_from_events(&events);
    let intent = j.intent_of(id)?;
    let state = status.as_ref().map(|s| s.state).unwrap_or(State::Accepted);
    let before = status.as_ref().and_then(|s| s.before_unknown);
    let dispatched: Vec<_> = events
        .iter()
        .filter(|e| e.kind == EventKind::Dispatched)
        .collect();
    let host_key = events
        .iter()
        .rev()
        .find_map(|e| e.evidence.get("host_key").and_then(|v| v.as_str()))
        .map(str::to_owned);
    let evidence = events.iter().rev().find_map(|e| {
        e.evidence
            .get("reason")
            .and_then(|r| r.as_str())
            .map(str::to_owned)
    });
    let started = events.iter().any(|e| e.kind == EventKind::Running);
    let resolution = events
        .iter()
        .rev()
        .find(|e| e.kind == EventKind::Resolved)
        .map(|e| {
            let mut v = e.evidence.clone();
            v["at"] = e.at.clone().into();
            v
        });
    let class = intent
        .as_ref()
        .map(|i| i.class.clone())
        .unwrap_or_else(|| "remote-command".into());
    let known_outcome = match state {
        State::Interrupted => {
            "interrupted: it started on the host and cannot finish (no finish record)".to_string()
        }
        State::Unknown => format!(
            "unknown: last known state {}{}",
            before.map(|b| b.as_str()).unwrap_or("dispatched"),
            if started {
                " (the host's started record was seen)"
            } else {
                " (no started record was ever seen)"
            }
        ),
        s => format!("{s}"),
    };
    let why_not_resent = match (state, class.as_str()) {
        (State::Interrupted, _) => "it started: running it again could repeat its effect, and the start guard for this ID is spent".to_string(),
        (State::Unknown, "irreversible") => "class irreversible: cairn never resends an irreversible operation whose outcome is unknown".into(),
        (State::Unknown, "read-only") => format!(
            "class read-only, but {} attempts already ended unknown within the window",
            crate::intent::READ_ONLY_RETRY_LIMIT
        ),
        (State::Unknown, "idempotent") => "class idempotent, but the host could not be reached to retry under the same execution ID".into(),
        (State::Unknown, _) => "the marker could not prove whether it ran (the host's marker home changed, was unreadable, or the host was unreachable); sending it again could run it twice".into(),
        _ => "nothing needed resending".into(),
    };
    let correlation_ids = events
        .iter()
        .filter_map(|e| e.evidence.get("correlation_id"))
        .filter_map(|v| match v {
            serde_json::Value::Null => None,
            serde_json::Value::String(s) => Some(s.clone()),
            other => Some(other.to_string()),
        })
        .collect();
    Ok(ReviewRecord {
        execution_id: id.to_string(),
        destination: rec.destination.clone(),
        target: format!("{}@{}:{}", rec.user, rec.host, rec.port),
        host_key,
        command: rec.command_display(),
        class,
        actor: intent.as_ref().map(|i| i.actor.clone()),
        scope: intent.as_ref().map(|i| i.scope.clone()),
        fingerprint: intent.as_ref().map(|i| i.fingerprint.clone()),
        accepted_at: rec.created_at.clone(),
        first_dispatched_at: dispatched.first().map(|e| e.at.clone()),
        dispatches: dispatched.len(),
        state,
        state_before: before,
        known_outcome,
        evidence,
        why_not_resent,
        correlation_ids,
        resolution,
    })
}

/// Every execution waiting for review, newest first.
pub fn pending(j: &Journal) -> Result<Vec<ReviewRecord>, ExecError> {
    let mut out = Vec::new();
    for (rec, st) in j.list()? {
        if matches!(st.state, State::Unknown | State::Interrupted) {
            let r = record(j, &rec.id)?;
            if r.pending() {
                out.push(r);
            }
        }
    }
    Ok(out)
}

/// A human's decision about an execution under review.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Resolution {
    /// It ran and finished (the reviewer checked the host).
    Completed,
    /// It did not run, or failed without effect.
    Failed,
    /// Dispatch again under the same ID, only if the marker proves it never started.
    Retry,
}

impl std::str::FromStr for Resolution {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "completed" => Ok(Resolution::Completed),
            "failed" => Ok(Resolution::Failed),
            "retry" => Ok(Resolution::Retry),
            _ => Err(format!("{s:?}: expected completed, failed or retry")),
        }
    }
}
