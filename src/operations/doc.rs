//! An operation's replay contract, in plain words and as data, and the Markdown of
//! `cairn ops doc FILE` for the people who approve an agent's access.
//!
//! The words are derived from the same fields the executor acts on (class, retention, the
//! fingerprint arguments, the approval rule), so what a tool's description promises is what a
//! retry does.

use serde_json::{json, Value};

use super::check::human;
use super::contract::{value_text, Approval, ArgType, Destination, Operation, OperationsFile};
use crate::intent::{OpClass, READ_ONLY_RETRY_LIMIT};

/// A duration for a sentence: `24 h`, `5 min`, `7 d`, `90 s`.
pub fn spoken(d: std::time::Duration) -> String {
    let h = human(d);
    let split = h.find(|c: char| !c.is_ascii_digit()).unwrap_or(h.len());
    let (n, unit) = h.split_at(split);
    format!("{n} {}", if unit == "m" { "min" } else { unit })
}

/// What a matching retry does after an unknown outcome, as a token (for `_meta`).
pub fn after_unknown_token(c: OpClass) -> &'static str {
    match c {
        OpClass::ReadOnly => "run-again-within-limits",
        OpClass::Idempotent => "retry-same-execution-id",
        OpClass::Conditional | OpClass::RemoteCommand => "probe-host-record-else-review",
        OpClass::Irreversible => "stop-for-review",
    }
}

fn after_unknown_words(c: OpClass) -> String {
    match c {
        OpClass::ReadOnly => format!(
            "It only reads: after an unknown outcome a retry runs it again, and after \
             {READ_ONLY_RETRY_LIMIT} unknown outcomes it stops for human review."
        ),
        OpClass::Idempotent => "After an unknown outcome a retry drives the same execution again \
             under the same execution ID; the host's start guard lets that ID start at most once."
            .into(),
        OpClass::Conditional => {
            "After an unknown outcome a retry asks the host's record; anything \
             that record does not settle stops for human review."
                .into()
        }
        OpClass::Irreversible => {
            "After an unknown outcome it stops for human review; it is never sent again.".into()
        }
        OpClass::RemoteCommand => "After an unknown outcome a retry asks the host's record \
             (finished: the stored result; running: reattach; never started: start it under the \
             same ID); anything else stops for human review."
            .into(),
    }
}

fn list(v: &[String]) -> String {
    if v.is_empty() {
        "(none)".into()
    } else {
        v.join(", ")
    }
}

/// The replay contract in plain words (the end of each MCP tool's description).
pub fn plain(op: &Operation) -> String {
    let r = spoken(op.retention());
    let fp: Vec<String> = op
        .args
        .iter()
        .filter(|a| a.fingerprint)
        .map(|a| a.name.clone())
        .collect();
    let defaults: Vec<String> = op
        .args
        .iter()
        .filter(|a| a.fingerprint)
        .filter_map(|a| {
            a.default
                .as_ref()
                .map(|d| format!("{} = {}", a.name, value_text(d)))
        })
        .collect();
    let other: Vec<String> = op
        .args
        .iter()
        .filter(|a| !a.fingerprint)
        .map(|a| a.name.clone())
        .collect();
    let mut s = format!(
        "Replay contract: If you lose the response, call again with the same arguments within \
         {r}: you get the first execution (its result, or its output while it runs); it does not \
         run again. "
    );
    s.push_str(&after_unknown_words(op.class()));
    s.push_str(&format!(" Same arguments means the same {}", list(&fp)));
    if !defaults.is_empty() {
        s.push_str(&format!(
            " (an omitted one takes its default: {})",
            defaults.join(", ")
        ));
    }
    s.push('.');
    if !other.is_empty() {
        s.push_str(&format!(
            " Not part of it: {} (a call that differs only there attaches to the earlier execution).",
            other.join(", ")
        ));
    }
    match op.approval {
        Approval::Caller => {}
        Approval::Policy => s.push_str(" A new execution needs the server's policy to allow it."),
        Approval::Prompt => s.push_str(" A new execution needs a person to confirm it."),
    }
    s.push_str(&format!(
        " After {r}, or once a result was delivered, the same call starts a new execution."
    ));
    s
}

/// The replay contract as data (each MCP tool's `_meta["cairn/contract"]`, JSON-RPC
/// `operations`).
pub fn contract_json(op: &Operation) -> Value {
    let names = |fp: bool| -> Vec<&str> {
        op.args
            .iter()
            .filter(|a| a.fingerprint == fp)
            .map(|a| a.name.as_str())
            .collect()
    };
    let defaults: serde_json::Map<String, Value> = op
        .args
        .iter()
        .filter_map(|a| a.default.clone().map(|d| (a.name.clone(), d)))
        .collect();
    json!({
        "operation": op.name,
        "contract": op.digest(),
        "class": op.class(),
        "retention_secs": op.retention().as_secs(),
        "timeout_secs": op.timeout.map(|t| t.as_secs()),
        "on_lost_response": "call again with the same arguments within retention_secs: attaches to the first execution",
        "attaches_while": ["accepted", "authorized", "dispatched", "running", "unknown", "interrupted", "completed (not yet delivered)"],
        "after_unknown": after_unknown_token(op.class()),
        "fingerprint_arguments": names(true),
        "other_arguments": names(false),
        "defaults": defaults,
        "approval": op.approval.as_str(),
        "destination": op.destination_json(),
        "host_arg": op.host_arg,
        "secrets": op.secrets,
        "text": plain(op),
    })
}

/// The JSON schema of an operation's arguments (MCP `inputSchema`).
pub fn input_schema(op: &Operation) -> Value {
    let mut props = serde_json::Map::new();
    let mut required = Vec::new();
    for a in &op.args {
        let mut p = match &a.ty {
            ArgType::Str {
                pattern,
                choices,
                max_len,
                ..
            } => {
                let mut p = json!({"type": "string"});
                if let Some(c) = choices {
                    p["enum"] = json!(c);
                } else {
                    p["maxLength"] = (*max_len).into();
                    if let Some((pat, _)) = pattern {
                        p["pattern"] = pat.clone().into();
                    }
                }
                p
            }
            ArgType::Int { min, max } => {
                let mut p = json!({"type": "integer"});
                if let Some(m) = min {
                    p["minimum"] = (*m).into();
                }
                if let Some(m) = max {
                    p["maximum"] = (*m).into();
                }
                p
            }
            ArgType::Bool => json!({"type": "boolean"}),
        };
        let mut desc = a.description.clone().unwrap_or_default();
        if !a.fingerprint {
            desc = format!("{desc} (not part of the intent: recorded, never compared)")
                .trim()
                .to_owned();
        }
        if !desc.is_empty() {
            p["description"] = desc.into();
        }
        if let Some(d) = &a.default {
            p["default"] = d.clone();
        }
        if a.required {
            required.push(a.name.clone());
        }
        props.insert(a.name.clone(), p);
    }
    json!({"type": "object", "properties": props, "required": required, "additionalProperties": false})
}

/// An MCP tool's description: the operation's own, then its replay contract.
pub fn tool_description(op: &Operation) -> String {
    let d = op.description.trim();
    let d = if d.ends_with('.') {
        d.to_owned()
    } else {
        format!("{d}.")
    };
    format!("{d} {}", plain(op))
}

fn cell(s: &str) -> String {
    s.replace('|', "\\|").replace('\n', " ")
}

fn rule(a: &super::contract::Arg) -> String {
    match &a.ty {
        ArgType::Str {
            pattern,
            choices,
            aliases,
            max_len,
        } => {
            let mut r = match (choices, pattern) {
                (Some(c), _) => format!("one of {}", c.join(", ")),
                (None, Some((p, _))) => format!("pattern `{p}`"),
                (None, None) => "any text".into(),
            };
            if !aliases.is_empty() {
                let al: Vec<String> = aliases.iter().map(|(k, v)| format!("{k} → {v}")).collect();
                r.push_str(&format!("; also {}", al.join(", ")));
            }
            if choices.is_none() {
                r.push_str(&format!("; at most {max_len} bytes"));
            }
            r
        }
        ArgType::Int { min, max } => match (min, max) {
            (None, None) => "any whole number".into(),
            (a, b) => format!(
                "{}..={}",
                a.map(|x| x.to_string()).unwrap_or_default(),
                b.map(|x| x.to_string()).unwrap_or_default()
            ),
        },
        ArgType::Bool => "true or false".into(),
    }
}

fn destination_words(file: &OperationsFile, op: &Operation) -> String {
    let d = match &op.destination {
        Destination::Hosts(h) => format!("hosts {}", h.join(", ")),
        Destination::Pattern(p, _) => format!("a host matching `{p}`"),
        Destination::Group(g) => format!(
            "group {g} ({})",
            file.groups.get(g).map(|l| l.join(", ")).unwrap_or_default()
        ),
        Destination::Missing => "(none)".into(),
    };
    match &op.host_arg {
        Some(a) => format!("{d}; the argument {a} picks one"),
        None => format!("{d}; every one of them"),
    }
}

fn approval_words(a: Approval) -> &'static str {
    match a {
        Approval::Caller => {
            "caller: the request is the approval (within the server's --approve / --policy)"
        }
        Approval::Policy => "policy: the server's --policy file must allow each new execution",
        Approval::Prompt => "prompt: a person confirms each new execution on the terminal",
    }
}

/// `cairn ops doc FILE`: one section per operation.
pub fn markdown(file: &OperationsFile) -> String {
    let mut out = format!(
        "# Operations in {}\n\n{} operation{}. Each section is a contract: what the operation \
         runs, where, with which arguments, and what happens when a caller loses the response.\n",
        file.source,
        file.operations.len(),
        if file.operations.len() == 1 { "" } else { "s" }
    );
    for op in file.operations.values() {
        out.push_str(&section(file, op));
    }
    out
}

fn section(file: &OperationsFile, op: &Operation) -> String {
    let mut s = format!("\n## {}\n\n{}\n\n", op.name, op.description.trim());
    s.push_str("| | |\n|---|---|\n");
    let timeout = op.timeout.map(human).unwrap_or_else(|| "none".into());
    for (k, v) in [
        ("class", op.class().to_string()),
        ("retention", human(op.retention())),
        ("timeout", timeout),
        ("approval", approval_words(op.approval).to_owned()),
        ("runs on", destination_words(file, op)),
        (
            "working directory",
            op.cwd
                .clone()
                .unwrap_or_else(|| "the account's home".into()),
        ),
        ("contract", format!("`{}`", op.digest())),
    ] {
        s.push_str(&format!("| {k} | {} |\n", cell(&v)));
    }
    s.push_str("\nCommand (each placeholder is one whole argv word):\n\n    ");
    s.push_str(&op.argv_raw.join(" "));
    s.push_str("\n\n");
    if !op.args.is_empty() {
        s.push_str(
            "| argument | type | accepts | default | in the fingerprint |\n|---|---|---|---|---|\n",
        );
        for a in &op.args {
            let default = match (&a.default, a.required) {
                (Some(d), _) => format!("`{}`", value_text(d)),
                (None, true) => "required".into(),
                (None, false) => "optional".into(),
            };
            s.push_str(&format!(
                "| {} | {} | {} | {} | {} |\n",
                a.name,
                a.ty.name(),
                cell(&rule(a)),
                cell(&default),
                if a.fingerprint {
                    "yes"
                } else {
                    "no (recorded only)"
                }
            ));
        }
        s.push('\n');
    }
    if !op.env_raw.is_empty() {
        let e: Vec<String> = op
            .env_raw
            .iter()
            .map(|(k, v)| format!("`{k}={v}`"))
            .collect();
        s.push_str(&format!("Environment: {}\n\n", e.join(", ")));
    }
    if !op.secrets.is_empty() {
        s.push_str(&format!(
            "Secrets (names; values from cairn's environment, never journaled): {}\n\n",
            op.secrets.join(", ")
        ));
    }
    let words = plain(op);
    s.push_str(&format!(
        "**Replay contract.** {}\n",
        words.trim_start_matches("Replay contract: ")
    ));
    s
}
