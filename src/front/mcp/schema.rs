//! The tools' output schemas: what a client may rely on in each result's `structuredContent`,
//! so it reads a result by schema instead of by prose. Each is the JSON the gateway answers
//! ([`crate::outcome::outcome_json`], [`crate::front::gateway::status`], [`crate::front::gateway::output`]);
//! the tests check real results against them with the official Python SDK, which validates
//! structured content against the tool's schema.
//!
//! A tool's error result (`isError`) carries `{"error", "code"}` instead; clients do not check
//! error results against the schema.

use std::sync::Arc;

use rmcp::model::JsonObject;
use serde_json::{json, Value};

use crate::state::State;

fn object(v: Value) -> Arc<JsonObject> {
    match v {
        Value::Object(m) => Arc::new(m),
        _ => Arc::new(JsonObject::new()),
    }
}

fn states() -> Vec<&'static str> {
    State::ALL.iter().map(|s| s.as_str()).collect()
}

/// The fields of one execution's outcome (every front answers them).
fn outcome_properties() -> Value {
    let opt_str = json!({"type": ["string", "null"]});
    json!({
        "execution_id": {"type": "string", "description":
            "The execution this result is about. When `attached` is true it is the earlier execution \
             this call attached to, not a new one."},
        "state": {"type": "string", "enum": states(), "description":
            "The journal's state of the execution (docs: lifecycle)."},
        "certainty": {"type": "string", "enum": ["settled", "pending", "unknown"], "description":
            "settled: a final record (an exit status, proven never started, nothing sent, or \
             cancelled); pending: not concluded yet; unknown: cairn cannot prove whether the \
             command ran (do not assume either)."},
        "exit_code": {"type": ["integer", "null"], "minimum": 0, "maximum": 255, "description":
            "The remote exit status, when the host reported one."},
        "signal": opt_str,
        "attached": {"type": "boolean", "description":
            "True when this call matched an earlier execution's intent and attached to it: the \
             command was not run again for this call."},
        "recovered": {"type": "boolean", "description":
            "True when the result was read back from the host's records after a lost connection."},
        "needs_review": {"type": "boolean", "description":
            "True when the outcome is unknown or interrupted and waits for a human."},
        "reason": {"type": ["string", "null"], "description": "The evidence behind the state, in words."},
        "summary": {"type": "string", "description": "One plain sentence of what is known."},
        "stdout": {"type": "string", "description": "Output kept inline (see output_truncated)."},
        "stderr": {"type": "string"},
        "output_truncated": {"type": "boolean", "description":
            "True when more output exists than is inline: read it with read_output."},
        "stdout_bytes": {"type": "integer", "minimum": 0},
        "stderr_bytes": {"type": "integer", "minimum": 0},
        "destination": {"type": "string"},
        "host": {"type": "string"},
        "host_key_fingerprint": opt_str,
        "started_at": opt_str,
        "finished_at": opt_str,
        "reconnects": {"type": "integer", "minimum": 0},
        "timed_out": {"type": "boolean"},
        "fingerprint": opt_str,
        "class": opt_str,
        "held_by": {"type": "string", "description":
            "The live process that holds an execution it has not concluded: attach, do not resend."}
    })
}

/// The fields every outcome carries.
const OUTCOME_REQUIRED: [&str; 8] = [
    "execution_id",
    "state",
    "certainty",
    "exit_code",
    "attached",
    "needs_review",
    "reason",
    "summary",
];

/// `run_command`: the execution's outcome with its output kept inline.
pub fn run_command() -> Arc<JsonObject> {
    object(json!({
        "type": "object",
        "properties": outcome_properties(),
        "required": OUTCOME_REQUIRED.iter().chain(&["stdout", "stderr", "output_truncated"]).collect::<Vec<_>>(),
    }))
}

/// `execution_status`: the outcome as the journal has it, its timeline, and with `probe`
/// what the host says now.
pub fn execution_status() -> Arc<JsonObject> {
    let mut props = outcome_properties();
    let extra = json!({
        "accepted_at": {"type": ["string", "null"]},
        "first_dispatched_at": {"type": ["string", "null"]},
        "events": {"type": "array", "items": {"type": "object", "properties": {
            "seq": {"type": "integer"}, "at": {"type": "string"},
            "kind": {"type": "string"}, "state": {"type": ["string", "null"]}}}},
        "host_says": {"type": "string", "description": "With probe: the host's answer now."},
        "review": {"type": "object", "description": "With needs_review: what a reviewer reads."}
    });
    if let (Some(p), Some(e)) = (props.as_object_mut(), extra.as_object()) {
        p.extend(e.clone());
    }
    object(json!({
        "type": "object",
        "properties": props,
        "required": OUTCOME_REQUIRED.iter().chain(&["events"]).collect::<Vec<_>>(),
    }))
}

/// `read_output`: bytes of one stream from an offset.
pub fn read_output() -> Arc<JsonObject> {
    object(json!({
        "type": "object",
        "properties": {
            "execution_id": {"type": "string"},
            "stream": {"type": "string", "enum": ["stdout", "stderr"]},
            "offset": {"type": "integer", "minimum": 0},
            "next_offset": {"type": "integer", "minimum": 0, "description":
                "The offset to ask for next."},
            "data": {"type": "string", "description": "The bytes as UTF-8 (lossy)."},
            "data_base64": {"type": "string", "description": "The bytes exactly."},
            "finished": {"type": "boolean", "description": "The command has finished."},
            "total_bytes": {"type": ["integer", "null"], "minimum": 0},
            "eof": {"type": "boolean", "description": "Finished, and everything was read."},
            "summary": {"type": "string"}
        },
        "required": ["execution_id", "stream", "offset", "next_offset", "data", "data_base64",
                     "finished", "eof"],
    }))
}

/// A named operation's tool: one destination answers one outcome (with the operation and its
/// contract); several answer `results`, one outcome (or a not-run entry) per destination.
pub fn operation() -> Arc<JsonObject> {
    let mut props = outcome_properties();
    let extra = json!({
        "operation": {"type": "string"},
        "contract": {"type": "string", "description":
            "The digest of the operation's replay contract (sha256:…), as in the tool's _meta."},
        "results": {"type": "array", "items": {"type": "object", "properties": outcome_properties()}}
    });
    if let (Some(p), Some(e)) = (props.as_object_mut(), extra.as_object()) {
        p.extend(e.clone());
    }
    object(json!({
        "type": "object",
        "properties": props,
        "required": ["operation", "summary"],
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_outcome_field_is_described_and_the_required_ones_exist() {
        // Every field of an outcome as the fronts serialize it has a schema entry.
        let o = crate::executor::Outcome {
            execution_id: "ex_1".into(),
            destination: "h".into(),
            host: "h".into(),
            host_key_fingerprint: None,
            state: State::Running,
            exit_code: None,
            signal: None,
            started_at: None,
            finished_at: None,
            stdout_bytes: 0,
            stderr_bytes: 0,
            reconnects: 0,
            timed_out: false,
            recovered: false,
            reason: None,
            attached: false,
            needs_review: false,
            fingerprint: None,
            class: None,
            held_by: Some("1@h".into()),
        };
        let mut v = crate::outcome::outcome_json(&o, Some(&crate::outcome::Capture::default()));
        v["summary"] = "s".into();
        let props = outcome_properties();
        for k in v.as_object().unwrap().keys() {
            assert!(props.get(k).is_some(), "no schema for {k}");
        }
        for k in OUTCOME_REQUIRED {
            assert!(props.get(k).is_some(), "{k}");
        }
        for s in [
            run_command(),
            execution_status(),
            read_output(),
            operation(),
        ] {
            assert_eq!(s["type"], "object");
            for r in s["required"].as_array().unwrap() {
                assert!(s["properties"].get(r.as_str().unwrap()).is_some(), "{r}");
            }
        }
    }
}
