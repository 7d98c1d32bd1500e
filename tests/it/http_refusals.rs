//! Refused HTTP requests are cheap: every one is counted in `/metrics`, at most
//! `PER_SOURCE_PER_MINUTE` (10) per source address and minute are recorded in the sessions
//! journal, and the rest are counted as unrecorded, never one append and flush each.

use crate::http::{metrics, request, token, Server, JSON};
use crate::support::host::*;

#[test]
fn a_flood_of_refused_requests_is_counted_and_only_a_sample_is_recorded() {
    let h = Host::new();
    let good = token(&h, "agent:alice", &[]);
    let s = Server::start(&h, 0, &[]);
    let wrong = "Bearer cairn_AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA";
    let body = r#"{"jsonrpc":"2.0","id":1,"method":"status","params":{}}"#;
    for _ in 0..60 {
        let (status, text) = request(
            s.port,
            "POST",
            "/rpc",
            &[JSON, ("Authorization", wrong)],
            body,
        );
        assert_eq!(status, 401, "{text}");
    }
    let recorded: i64 = rusqlite::Connection::open(&h.journal)
        .unwrap()
        .query_row(
            "SELECT COUNT(*) FROM session_events WHERE kind = 'refused'",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(recorded, 10, "a sample per source and minute");
    let m = metrics(s.port, &good);
    assert_eq!(m["cairn_http_refused_total"], 60.0, "{m:?}");
    assert_eq!(m["cairn_http_refused_unrecorded_total"], 50.0, "{m:?}");
}
