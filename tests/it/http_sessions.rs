//! The HTTP front fails closed on MCP session ownership: a session whose owner cannot be read
//! from the journal is refused, to every token; a session whose owner cannot be recorded is not
//! handed out. The journal operation is made to fail by the test hook `CAIRN_TEST_FAIL` (the
//! rest of the server works), against a real `cairn mcp --listen`.

use serde_json::json;

use crate::http::{exchange, token, Server};
use crate::support::host::*;

/// One MCP `POST` (JSON, accepting JSON and SSE): (status, the head in lower case, the body).
fn raw(port: u16, headers: &[(&str, &str)], body: &str) -> (u16, String, String) {
    let mut all = vec![
        ("Content-Type", "application/json"),
        ("Accept", "application/json, text/event-stream"),
    ];
    all.extend_from_slice(headers);
    exchange(port, "POST", "/mcp", &all, body)
}

fn initialize() -> String {
    json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {},
        "clientInfo": {"name": "hand-written", "version": "0"}}})
    .to_string()
}

fn tools_list() -> String {
    json!({"jsonrpc": "2.0", "id": 2, "method": "tools/list", "params": {}}).to_string()
}

fn session_of(head: &str) -> Option<String> {
    head.lines()
        .find_map(|l| l.strip_prefix("mcp-session-id:"))
        .map(|v| v.trim().to_owned())
}

/// Session `S` opened by actor A on one server; another server (a restart, or another
/// replica), to which the journal cannot say who owns `S`: every request naming `S` is
/// refused, by B's token and by A's own, until it can.
#[test]
fn a_session_whose_owner_cannot_be_read_is_refused_to_every_token() {
    let h = Host::new();
    let a = format!("Bearer {}", token(&h, "agent:a", &[]));
    let b = format!("Bearer {}", token(&h, "agent:b", &[]));
    let first = Server::start(&h, 0, &[]);
    let (status, head, body) = raw(first.port, &[("Authorization", &a)], &initialize());
    assert_eq!(status, 200, "{body}");
    let s = session_of(&head).expect("a session id");
    drop(first);

    let fail = [("CAIRN_TEST_FAIL", "session-lookup")];
    let second = Server::start_env(&h, 0, &[], &fail);
    for who in [&b, &a] {
        let (status, _, body) = raw(
            second.port,
            &[("Authorization", who), ("Mcp-Session-Id", &s)],
            &tools_list(),
        );
        assert_eq!(status, 503, "{body}\n{}", second.log());
        assert!(body.contains("cannot be checked"), "{body}");
    }
    drop(second);

    // Readable again: B is told the session does not exist, A's own goes past the guard.
    let third = Server::start(&h, 0, &[]);
    let (status, _, body) = raw(
        third.port,
        &[("Authorization", &b), ("Mcp-Session-Id", &s)],
        &tools_list(),
    );
    assert_eq!(status, 404, "{body}");
    assert!(body.contains("not a session of actor agent:b"), "{body}");
    let (status, _, body) = raw(
        third.port,
        &[("Authorization", &a), ("Mcp-Session-Id", &s)],
        &tools_list(),
    );
    assert_ne!(status, 503, "{body}");
    assert_ne!(status, 401, "{body}");
}

/// The journal cannot record who opened a new session: the session is not handed out (its
/// owner would be unknown after a restart, and any token could use it).
#[test]
fn a_session_whose_owner_cannot_be_recorded_is_not_handed_out() {
    let h = Host::new();
    let a = format!("Bearer {}", token(&h, "agent:a", &[]));
    let s = Server::start_env(&h, 0, &[], &[("CAIRN_TEST_FAIL", "session-bind*1")]);
    let (status, head, body) = raw(s.port, &[("Authorization", &a)], &initialize());
    assert_eq!(status, 503, "{body}");
    assert_eq!(session_of(&head), None, "{head}");
    assert!(body.contains("initialize again"), "{body}");
    // The next attempt is recorded, and gets its session.
    let (status, head, body) = raw(s.port, &[("Authorization", &a)], &initialize());
    assert_eq!(status, 200, "{body}");
    let id = session_of(&head).expect("a session id");
    let (owner, _) = h.journal().http_session(&id).unwrap().expect("recorded");
    assert_eq!(owner.as_deref(), Some("agent:a"));
}
