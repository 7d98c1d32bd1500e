//! An outcome as the fronts show it: the bounded copy of output kept for a JSON answer, the
//! outcome as JSON, and the one plain sentence that says what is known.

use serde_json::Value;

use crate::executor::{Outcome, OutputSink};
use crate::state::State;

/// Collects output up to a cap per stream.
#[derive(Debug, Default)]
pub struct Capture {
    pub out: Vec<u8>,
    pub err: Vec<u8>,
    pub cap: usize,
    pub truncated: bool,
}

impl OutputSink for Capture {
    fn stdout(&mut self, d: &[u8]) -> std::io::Result<()> {
        keep(&mut self.out, d, self.cap, &mut self.truncated);
        Ok(())
    }
    fn stderr(&mut self, d: &[u8]) -> std::io::Result<()> {
        keep(&mut self.err, d, self.cap, &mut self.truncated);
        Ok(())
    }
}

/// Append what fits of `d` under `cap` bytes; note in `truncated` when something did not.
fn keep(buf: &mut Vec<u8>, d: &[u8], cap: usize, truncated: &mut bool) {
    let room = cap.saturating_sub(buf.len());
    if d.len() > room {
        *truncated = true;
    }
    buf.extend_from_slice(&d[..d.len().min(room)]);
}

/// How much the journal's record settles, in one word an agent can branch on:
/// - `settled`: a final record: an exit status (completed, delivered), proven never started
///   (failed), nothing sent (rejected), or stopped on request (cancelled);
/// - `pending`: not concluded yet (accepted, authorized, dispatched, running);
/// - `unknown`: cairn cannot prove what happened (unknown, interrupted, or a completion with no
///   recorded exit status). Never reported as settled.
pub fn certainty(o: &Outcome) -> &'static str {
    match o.state {
        State::Completed | State::Delivered if o.exit_code.is_some() => "settled",
        State::Completed | State::Delivered | State::Unknown | State::Interrupted => "unknown",
        State::Failed | State::Rejected | State::Cancelled => "settled",
        State::Accepted | State::Authorized | State::Dispatched | State::Running => "pending",
    }
}

/// The outcome as JSON: every [`Outcome`] field, its [`certainty`], and with `cap` the output
/// kept for it (`stdout`, `stderr`, `output_truncated`).
pub fn outcome_json(o: &Outcome, cap: Option<&Capture>) -> Value {
    let mut v = serde_json::to_value(o).unwrap_or_default();
    v["certainty"] = certainty(o).into();
    if let Some(c) = cap {
        with_output(&mut v, c);
    }
    v
}

/// Add the output kept in `cap` to a JSON object (`stdout`, `stderr`, `output_truncated`).
pub fn with_output(v: &mut Value, cap: &Capture) {
    if let Some(m) = v.as_object_mut() {
        m.insert("stdout".into(), String::from_utf8_lossy(&cap.out).into());
        m.insert("stderr".into(), String::from_utf8_lossy(&cap.err).into());
        m.insert("output_truncated".into(), cap.truncated.into());
    }
}

/// One plain sentence: what is known, whether it was recovered or attached, and whether a
/// human is needed. Never says "success" for an unknown outcome.
pub fn summary(o: &Outcome) -> String {
    let how = match (o.attached, o.recovered) {
        (true, _) => format!(
            " This request matched the intent of the earlier execution {} and attached to it: the command was not run again.",
            o.execution_id
        ),
        (false, true) => " The result was recovered from the host's records after a lost connection, not watched live.".into(),
        _ => String::new(),
    };
    let what = match o.state {
        State::Completed | State::Delivered => match (o.exit_code, &o.signal) {
            (Some(c), Some(s)) => format!("Completed: killed by signal {s} (exit status {c})."),
            (Some(c), None) => format!("Completed with exit status {c}."),
            _ => "Completed, but no exit status was recorded: treat the outcome as unknown.".into(),
        },
        State::Running | State::Dispatched => match &o.held_by {
            Some(owner) => format!(
                "Running on the host, held by its live owner {owner}; nothing is concluded. \
                 Do not send it again: attach to it (`cairn attach {}`) or poll its status.",
                o.execution_id
            ),
            None => "Running on the host; poll status or read output from an offset.".into(),
        },
        State::Unknown => format!(
            "OUTCOME UNKNOWN: cairn cannot prove whether the command ran. It was not run again. {}",
            o.reason.as_deref().unwrap_or("")
        ),
        State::Interrupted => format!(
            "INTERRUPTED: the command started and cannot finish (host rebooted or supervisor died); it was not run again. {}",
            o.reason.as_deref().unwrap_or("")
        ),
        State::Failed => format!(
            "Failed before it started (proven never run): {}",
            o.reason.as_deref().unwrap_or("")
        ),
        State::Rejected => format!(
            "Not authorized; nothing was sent. {}",
            o.reason.as_deref().unwrap_or("")
        ),
        State::Cancelled => {
            "Cancelled on request; a command that had started may have run in part.".into()
        }
        State::Accepted | State::Authorized => match &o.held_by {
            Some(owner) => format!(
                "NOT CONCLUDED: accepted by {owner}, which is still alive and has not dispatched it yet; \
                 it may still send it. Do not send it again: attach to it (`cairn attach {}`).",
                o.execution_id
            ),
            None => "Accepted, not yet dispatched.".into(),
        },
    };
    let review = if o.needs_review {
        " It needs human review (cairn review / cairn resolve)."
    } else {
        ""
    };
    format!("{} {what}{how}{review}", o.execution_id)
        .trim()
        .to_owned()
}
