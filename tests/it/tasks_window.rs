//! MCP `tasks/cancel` inside the window of issue 35: the server's worker has decided to
//! dispatch a task's execution and is paused (test hook) before its `dispatched` append; the
//! cancel lands there. The journal refuses the late `dispatched`: nothing runs on the host,
//! the task and the execution say cancelled. Against a real `cairn mcp --listen` and sshd.

use serde_json::{json, Value};

use crate::http::{request, token, Server, JSON};
use crate::support::host::*;

const LIMIT: std::time::Duration = std::time::Duration::from_secs(90);

/// One MCP request of the 2026-07-28 revision declaring the tasks extension (as the HTTP
/// tests send them by hand); the JSON-RPC response.
fn mcp(port: u16, token: &str, id: u64, method: &str, mut params: Value) -> Value {
    params["_meta"] = json!({
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientInfo": {"name": "hand-written", "version": "0"},
        "io.modelcontextprotocol/clientCapabilities":
            {"extensions": {"io.modelcontextprotocol/tasks": {}}}
    });
    let name = params["name"]
        .as_str()
        .or(params["taskId"].as_str())
        .unwrap_or_default()
        .to_owned();
    let body = json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params});
    let auth = format!("Bearer {token}");
    let mut headers = vec![
        ("Accept", "application/json, text/event-stream"),
        JSON,
        ("Authorization", auth.as_str()),
        ("MCP-Protocol-Version", "2026-07-28"),
        ("Mcp-Method", method),
    ];
    if !name.is_empty() {
        headers.push(("Mcp-Name", &name));
    }
    let (status, text) = request(port, "POST", "/mcp", &headers, &body.to_string());
    assert_eq!(status, 200, "{method}: {text}");
    if let Ok(v) = serde_json::from_str::<Value>(&text) {
        return v;
    }
    text.lines()
        .filter_map(|l| l.strip_prefix("data:"))
        .filter_map(|d| serde_json::from_str::<Value>(d.trim()).ok())
        .find(|m| m["id"] == id)
        .unwrap_or_else(|| panic!("{method}: no response in {text:?}"))
}

#[test]
fn tasks_cancel_inside_the_pause_before_the_dispatched_append_means_nothing_runs() {
    let h = Host::new();
    let tok = token(&h, "agent:tasks", &[]);
    let pause = tempfile::tempdir().unwrap();
    let armed = format!("before-dispatched:{}", pause.path().display());
    let s = Server::start_env(&h, 0, &[], &[("CAIRN_TEST_PAUSE", &armed)]);
    let cmd = format!("{}echo never", h.count());
    let r = mcp(
        s.port,
        &tok,
        1,
        "tools/call",
        json!({"name": "run_command", "arguments": {"destination": "127.0.0.1", "command": cmd}}),
    );
    let task = r["result"]["taskId"]
        .as_str()
        .unwrap_or_else(|| panic!("a task: {r}"))
        .to_owned();
    let reached = pause.path().join("before-dispatched.reached");
    wait_for(
        "the worker paused before its dispatched append",
        LIMIT,
        || reached.exists().then_some(()),
    );
    let ack = mcp(s.port, &tok, 2, "tasks/cancel", json!({"taskId": task}));
    assert!(ack.get("result").is_some(), "{ack}\n{}", s.log());
    assert_eq!(
        h.state(&task),
        cairn::State::Cancelled,
        "{:?}",
        h.kinds(&task)
    );
    std::fs::write(pause.path().join("before-dispatched.go"), "").unwrap();
    let t = wait_for("the task settled", LIMIT, || {
        let r = mcp(s.port, &tok, 3, "tasks/get", json!({"taskId": task}));
        let t = r["result"].clone();
        (t["status"] != "working").then_some(t)
    });
    assert_eq!(t["status"], "cancelled", "{t}");
    // The worker went on and was refused: give a late send every chance to show.
    wait_for("the worker recorded what it withheld", LIMIT, || {
        h.kinds(&task)
            .iter()
            .any(|k| k == "dispatch-withheld")
            .then_some(())
    });
    std::thread::sleep(std::time::Duration::from_millis(500));
    assert_eq!(h.runs(), 0, "a cancelled task's command never runs");
    let kinds = h.kinds(&task);
    assert!(!kinds.iter().any(|k| k == "dispatched"), "{kinds:?}");
    assert_eq!(h.state(&task), cairn::State::Cancelled, "{kinds:?}");
    assert_eq!(h.executions(), 1);
}
