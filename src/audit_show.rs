//! `cairn audit show ID`: one execution's timeline, answering in order the questions an
//! investigator asks after an incident.

use std::fmt::Write as _;

use crate::event::EventKind;
use crate::journal::{Event, ExecutionRecord};
use crate::state::State;

#[derive(Clone, Debug, serde::Serialize)]
pub struct Answer {
    pub question: &'static str,
    pub answer: String,
}

#[derive(Clone, Debug, serde::Serialize)]
pub struct Timeline {
    pub execution_id: String,
    /// Client processes that appended events, in order of first appearance.
    pub clients: Vec<String>,
    pub answers: Vec<Answer>,
}

// Long: one answer per question, in the order `audit show` prints them; each is a few lines.
pub fn timeline(rec: &ExecutionRecord, events: &[Event]) -> Timeline {
    let mut clients: Vec<String> = Vec::new();
    for e in events {
        if !clients.contains(&e.client) {
            clients.push(e.client.clone());
        }
    }
    fn find<'a>(events: &'a [Event], kind: &'a str) -> impl Iterator<Item = &'a Event> + 'a {
        events.iter().filter(move |e| e.kind == kind)
    }
    let mut answers = Vec::new();

    answers.push(Answer {
        question: "one client process or more?",
        answer: match clients.len() {
            1 => format!("one: {}", clients[0]),
            n => format!("{n}: {}", clients.join(", ")),
        },
    });

    let authorized = find(events, "authorized").next();
    let dispatches: Vec<&Event> = find(events, "dispatched").collect();
    answers.push(Answer {
        question: "was it authorized, and did it reach dispatch?",
        answer: match (authorized, dispatches.first()) {
            (None, _) => "not authorized: nothing was sent to the host".into(),
            (Some(a), None) => format!(
                "authorized at {} by {}, never dispatched: nothing was sent to the host",
                a.at,
                a.evidence["by"].as_str().unwrap_or("?")
            ),
            (Some(a), Some(d)) => format!(
                "authorized at {} by {}; dispatched at {}{}",
                a.at,
                a.evidence["by"].as_str().unwrap_or("?"),
                d.at,
                if dispatches.len() > 1 {
                    format!(
                        ", and {} more time(s) under the same ID after the host proved the first never crossed the start guard",
                        dispatches.len() - 1
                    )
                } else {
                    String::new()
                }
            ),
        },
    });

    let result = events
        .iter()
        .find(|e| matches!(e.state, Some(State::Completed) | Some(State::Cancelled)));
    let settled_without = events.iter().rev().find(|e| {
        matches!(
            e.state,
            Some(State::Interrupted) | Some(State::Unknown) | Some(State::Failed)
        )
    });
    answers.push(Answer {
        question: "was a result observed from the host?",
        answer: match (result, settled_without) {
            (Some(r), _) => format!(
                "yes, at {}: {} ({}){}",
                r.at,
                r.state.map(|s| s.as_str()).unwrap_or(""),
                r.evidence["finish_record"].as_str().unwrap_or("no record"),
                if r.evidence["recovered"] == true {
                    "; read back from the host's records after a lost connection or restart"
                } else {
                    ""
                }
            ),
            (None, Some(e)) => format!(
                "no: {} at {}: {}",
                e.state.map(|s| s.as_str()).unwrap_or(""),
                e.at,
                e.evidence["reason"].as_str().unwrap_or("")
            ),
            (None, None) => "not yet: the journal has no outcome".into(),
        },
    });

    let delivered: Vec<&Event> = find(events, "delivered").collect();
    answers.push(Answer {
        question: "did only delivery fail?",
        answer: match (result, delivered.first()) {
            (Some(_), None) => {
                "yes: the result was observed but never delivered to a caller; it stays retrievable (`cairn attach`)".into()
            }
            (Some(_), Some(d)) => format!("no: delivered at {} to {}", d.at, d.evidence["to"].as_str().unwrap_or("?")),
            (None, _) => "no result was observed, so delivery was never attempted".into(),
        },
    });

    answers.push(Answer {
        question: "did a later request reuse this execution or create a new one?",
        answer: later_requests(events),
    });

    Timeline {
        execution_id: rec.id.to_string(),
        clients,
        answers,
    }
}

/// The human-readable report.
pub fn render(rec: &ExecutionRecord, events: &[Event], t: &Timeline) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "execution {}", rec.id);
    let _ = writeln!(
        s,
        "target    {}@{}:{} (as {:?})",
        rec.user, rec.host, rec.port, rec.destination
    );
    let _ = writeln!(
        s,
        "command   {}",
        rec.command_display().replace('\n', "\\n")
    );
    let _ = writeln!(s, "accepted  {}", rec.created_at);
    let _ = writeln!(s);
    for a in &t.answers {
        let _ = writeln!(s, "{}\n    {}", a.question, a.answer);
    }
    let _ = writeln!(s, "\ntimeline");
    for e in events {
        let client = t
            .clients
            .iter()
            .position(|c| *c == e.client)
            .map(|i| format!("client#{}", i + 1))
            .unwrap_or_default();
        let mut ev = e.evidence.to_string();
        if ev.len() > 160 {
            ev.truncate(157);
            ev.push_str("...");
        }
        let _ = writeln!(
            s,
            "  #{:<5} {} {:<9} {:<16} {}",
            e.seq, e.at, client, e.kind, ev
        );
    }
    s
}

/// Every later request that attached to the execution: by ID (the same execution ID again, or
/// an attach naming it) or by intent (the same fingerprint, actor and scope), with its
/// correlation, actor and time. None of them ran the command again.
fn later_requests(events: &[Event]) -> String {
    let owner = events
        .iter()
        .find(|e| e.kind == EventKind::Accepted)
        .and_then(|e| e.evidence["actor"].as_str())
        .map(str::to_owned);
    let mut lines = Vec::new();
    for e in events {
        let how = match e.kind {
            EventKind::RequestReused => "by ID (the same execution ID)",
            EventKind::IntentMatched => "by intent (same fingerprint, actor and scope)",
            // The first correlation is the request that created the execution; later ones
            // with `method: attach` named it by ID.
            EventKind::Correlation if e.evidence["method"] == "attach" => "by ID (an attach)",
            _ => continue,
        };
        let corr = e.evidence["correlation_id"].as_str();
        // Over HTTP the correlation names the actor; a match by intent is the owner's actor.
        let actor = corr
            .and_then(|c| c.strip_prefix("actor="))
            .and_then(|c| c.split(' ').next())
            .map(str::to_owned)
            .or_else(|| {
                (e.kind == EventKind::IntentMatched)
                    .then(|| owner.clone())
                    .flatten()
            });
        lines.push(format!(
            "{} {how}: actor {}, correlation {}, session {}",
            e.at,
            actor.as_deref().unwrap_or("-"),
            corr.unwrap_or("-"),
            e.evidence["session_id"].as_str().unwrap_or("-"),
        ));
    }
    if lines.is_empty() {
        "no later request attached to it, by ID or by intent".into()
    } else {
        format!(
            "{} later request(s) attached to it, and none ran it again: {}",
            lines.len(),
            lines.join("; ")
        )
    }
}
