//! `cairn mcp --listen` against the server scenarios of the MCP conformance suite
//! (github.com/modelcontextprotocol/conformance, `src/scenarios/server/`): the tasks extension
//! (`tasks/*.ts`, SEP-2663) and the Streamable HTTP transport of the 2026-07-28 revision
//! (`http-standard-headers.ts` SEP-2243, `stateless.ts` SEP-2575, `dns-rebinding.ts`,
//! `sse-multiple-streams.ts`), by hand-written HTTP requests against a real sshd. Each
//! assertion names the scenario file and check id it stands for. cairn's fixtures for the
//! suite's: `run_command` is the task-supporting tool (a command that waits for a file is
//! `slow_compute`), `execution_status` the sync-only one (`greet`). Where a command may run,
//! the test counts how many times it ran on the host.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use serde_json::{json, Value};

use crate::http::{free_port, mcp_2026, request, request_2026, task_of, token, Server};
use crate::support::host::*;

const T: Duration = Duration::from_secs(60);
const TASKS: &str = "io.modelcontextprotocol/tasks";
/// An execution ID that names no execution.
const NO_SUCH_EX: &str = "ex_00000000000000000000000000000000";

/// One 2026-07-28 request on a fresh connection (`tasks`: declare the tasks extension), its
/// standard headers replaced (`Some`) or removed (`None`) by name: (HTTP status, the JSON-RPC
/// response, the raw body).
fn rpc(
    port: u16,
    tok: &str,
    id: u64,
    method: &str,
    params: Value,
    tasks: bool,
    over: &[(&'static str, Option<&str>)],
) -> (u16, Value, String) {
    let (mut headers, body) = request_2026(tok, id, method, params, tasks);
    for (k, v) in over {
        headers.retain(|(h, _)| !h.eq_ignore_ascii_case(k));
        if let Some(v) = v {
            headers.push((k, (*v).to_owned()));
        }
    }
    send(port, &headers, &body, id)
}

/// POST `body` to `/mcp` with `headers`: (HTTP status, the response with `id`, the raw body).
fn send(port: u16, headers: &[(&str, String)], body: &str, id: u64) -> (u16, Value, String) {
    let h: Vec<(&str, &str)> = headers.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let (status, text) = request(port, "POST", "/mcp", &h, body);
    let v = serde_json::from_str::<Value>(&text)
        .ok()
        .or_else(|| sse_messages(&text).into_iter().find(|m| m["id"] == id))
        .unwrap_or(Value::Null);
    (status, v, text)
}

/// The JSON-RPC messages of an SSE body.
fn sse_messages(text: &str) -> Vec<Value> {
    text.lines()
        .filter_map(|l| l.strip_prefix("data:"))
        .filter_map(|d| serde_json::from_str::<Value>(d.trim()).ok())
        .collect()
}

/// A 2026-07-28 request whose `params._meta` is exactly `meta` (`None`: no `_meta`), with the
/// standard headers (and `MCP-Protocol-Version: header_version`).
fn with_meta(
    port: u16,
    tok: &str,
    id: u64,
    method: &str,
    meta: Option<Value>,
    header_version: &str,
) -> (u16, Value, String) {
    let (mut headers, _) = request_2026(tok, id, method, json!({}), false);
    for (k, v) in headers.iter_mut() {
        if k.eq_ignore_ascii_case("MCP-Protocol-Version") {
            *v = header_version.to_owned();
        }
    }
    let params = match meta {
        Some(m) => json!({"_meta": m}),
        None => json!({}),
    };
    let body = json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params});
    send(port, &headers, &body.to_string(), id)
}

fn run_command(command: &str) -> Value {
    json!({"name": "run_command", "arguments": {"destination": "127.0.0.1", "command": command}})
}

/// `tasks/get` until the task leaves `working`.
fn settled(port: u16, tok: &str, task: &str) -> Value {
    wait_for("the task to settle", T, || {
        let t = task_of(port, tok, task);
        if t["status"] == "working" {
            std::thread::sleep(Duration::from_millis(100));
            return None;
        }
        Some(t)
    })
}

/// An RFC 3339 / ISO-8601 UTC or offset timestamp (`2026-07-28T10:00:00.000Z`).
fn iso8601(v: &Value) -> bool {
    let Some(s) = v.as_str() else { return false };
    let b = s.as_bytes();
    b.len() >= 20
        && b[4] == b'-'
        && b[7] == b'-'
        && b[10] == b'T'
        && b[13] == b':'
        && (s.ends_with('Z') || s[19..].contains(['+', '-']))
}

fn positive_integer(v: &Value) -> bool {
    v.as_u64().is_some_and(|n| n > 0)
}

/// Task-envelope fields an ack must not carry.
fn envelope_fields(v: &Value) -> Vec<&'static str> {
    ["taskId", "status", "result", "error", "inputRequests"]
        .into_iter()
        .filter(|f| v.get(*f).is_some())
        .collect()
}

// One server, one client that declares the extension: a sync call, a task from creation to its
// inlined result, the routing headers on the tasks surface, a non-zero exit, and a cancel.
// Long: one scenario, its phases in order.
#[test]
fn a_command_called_as_a_task_is_created_durably_polled_to_its_inlined_result_and_cancelled() {
    let h = Host::new();
    let tok = token(&h, "agent:conformance", &[]);
    let s = Server::start(&h, 0, &[]);
    let port = s.port;

    // capability.ts `tasks-extension-advertised`: under capabilities.extensions, no v1 slot.
    let d = mcp_2026(port, &tok, 1, "server/discover", json!({}));
    let caps = &d["result"]["capabilities"];
    assert!(caps["extensions"][TASKS].is_object(), "{d}");
    assert!(caps.get("tasks").is_none(), "no v1 capabilities.tasks: {d}");

    // lifecycle.ts `tasks-sync-tool-call`, dispatch.ts `sep-2663-legacy-task-param-ignored`
    // and `tasks-result-type-complete-on-non-task-responses` (sync tools/call): a sync-only
    // tool with the v1 `task` hint is answered inline, never promoted to a task.
    let r = mcp_2026(
        port,
        &tok,
        2,
        "tools/call",
        json!({"name": "execution_status", "arguments": {"execution_id": NO_SUCH_EX},
               "task": {"ttl": 60_000, "pollInterval": 100}}),
    );
    assert!(r.get("error").is_none(), "tolerated: {r}");
    let sync = &r["result"];
    assert_eq!(sync["resultType"], "complete", "{r}");
    assert!(
        sync.get("taskId").is_none() && sync.get("task").is_none(),
        "{r}"
    );
    assert!(!sync["content"].as_array().unwrap().is_empty(), "{r}");

    // dispatch.ts `tasks-server-directed-creation-no-hint`, lifecycle.ts
    // `sep-2663-result-type-task-on-create`, wire-fields.ts `tasks-wire-field-renames`,
    // request-state.ts `tasks-create-result-no-request-state`: no client hint, a flat
    // CreateTaskResult.
    let go = h.sshd.dir().join("go");
    let slow = format!(
        "{}while [ ! -e '{}' ]; do sleep 0.1; done; echo task-done",
        h.count(),
        go.display()
    );
    let r = mcp_2026(port, &tok, 3, "tools/call", run_command(&slow));
    let created = &r["result"];
    assert_eq!(created["resultType"], "task", "{r}");
    let task = created["taskId"]
        .as_str()
        .expect("top-level taskId")
        .to_owned();
    assert_eq!(created["status"], "working", "{r}");
    for absent in [
        "task",
        "result",
        "error",
        "inputRequests",
        "requestState",
        "ttl",
        "pollInterval",
    ] {
        assert!(created.get(absent).is_none(), "no `{absent}`: {r}");
    }
    assert!(iso8601(&created["createdAt"]), "{r}");
    assert!(iso8601(&created["lastUpdatedAt"]), "{r}");
    assert!(
        created["ttlMs"].is_null() || positive_integer(&created["ttlMs"]),
        "ttlMs: null or integer milliseconds: {r}"
    );
    assert!(created.get("ttlMs").is_some(), "{r}");
    if let Some(p) = created.get("pollIntervalMs") {
        assert!(positive_integer(p), "{r}");
    }

    // dispatch.ts `sep-2663-durable-create-strong-consistency` (no pause between create and
    // get), headers.ts `sep-2663-routing-headers-accepted-on-tasks-get` (matched Mcp-Method and
    // Mcp-Name), lifecycle.ts `sep-2663-tasks-get-status-working`, request-state.ts
    // `tasks-get-detailed-no-request-state`, dispatch.ts
    // `tasks-result-type-complete-on-non-task-responses` (tasks/get).
    let (status, g, _) = rpc(
        port,
        &tok,
        4,
        "tasks/get",
        json!({"taskId": task}),
        true,
        &[
            ("Mcp-Method", Some("tasks/get")),
            ("Mcp-Name", Some(task.as_str())),
        ],
    );
    assert_eq!(status, 200, "{g}");
    let got = &g["result"];
    assert_eq!(got["taskId"], task.as_str(), "{g}");
    assert_eq!(got["status"], "working", "{g}");
    assert_eq!(got["resultType"], "complete", "{g}");
    assert!(
        got.get("result").is_none() && got.get("error").is_none(),
        "{g}"
    );
    assert!(got.get("requestState").is_none(), "{g}");

    // headers.ts `sep-2663-server-rejects-mismatched-mcp-name-on-tasks-get`.
    let (status, e, _) = rpc(
        port,
        &tok,
        5,
        "tasks/get",
        json!({"taskId": task}),
        true,
        &[(
            "Mcp-Name",
            Some("sep-2663-wrong-task-id-for-routing-header-mismatch"),
        )],
    );
    assert_eq!((status, &e["error"]["code"]), (400, &json!(-32020)), "{e}");
    assert_eq!(e["id"], 5, "{e}");

    // headers.ts `tasks-headers-tolerate-mcp-method-on-tools-call` (sync dispatch with the
    // header unaffected) and `tasks-headers-reject-mismatched-method`: a tools/call whose
    // Mcp-Method says tasks/get is refused, and its command never runs.
    let (status, r, _) = rpc(
        port,
        &tok,
        6,
        "tools/call",
        json!({"name": "execution_status", "arguments": {"execution_id": task}}),
        true,
        &[("Mcp-Method", Some("tools/call"))],
    );
    assert_eq!(status, 200, "{r}");
    assert_eq!(r["result"]["resultType"], "complete", "{r}");
    assert_eq!(
        r["result"]["structuredContent"]["execution_id"],
        task.as_str(),
        "{r}"
    );
    let refused = format!("{}echo refused", h.count());
    let (status, e, _) = rpc(
        port,
        &tok,
        7,
        "tools/call",
        run_command(&refused),
        true,
        &[("Mcp-Method", Some("tasks/get"))],
    );
    assert_eq!((status, &e["error"]["code"]), (400, &json!(-32020)), "{e}");

    // lifecycle.ts `sep-2663-tasks-get-status-completed`, wire-fields.ts
    // `tasks-no-related-task-meta-on-inlined-result`: the tool result inlined on tasks/get.
    wait_for("the slow command started", T, || {
        (h.runs() == 1).then_some(())
    });
    std::fs::write(&go, "").unwrap();
    let t = settled(port, &tok, &task);
    assert_eq!(t["status"], "completed", "{t}");
    assert_eq!(t["resultType"], "complete", "{t}");
    let result = &t["result"];
    assert!(!result["content"].as_array().unwrap().is_empty(), "{t}");
    assert_eq!(result["structuredContent"]["stdout"], "task-done\n", "{t}");
    assert!(
        result["_meta"]
            .get("io.modelcontextprotocol/related-task")
            .is_none(),
        "{t}"
    );
    assert!(
        t.get("error").is_none() && t.get("requestState").is_none(),
        "{t}"
    );

    // wire-fields.ts `tasks-no-early-ttl-expiry`: still there well inside its ttlMs.
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(task_of(port, &tok, &task)["taskId"], task.as_str());

    // lifecycle.ts `tasks-cancel-terminal-idempotent-ack`: the same empty ack on a terminal
    // task, which stays completed.
    let ack = mcp_2026(port, &tok, 8, "tasks/cancel", json!({"taskId": task}));
    assert_eq!(ack["result"]["resultType"], "complete", "{ack}");
    assert!(envelope_fields(&ack["result"]).is_empty(), "{ack}");
    assert_eq!(task_of(port, &tok, &task)["status"], "completed");

    // lifecycle.ts `sep-2663-tool-error-uses-completed-status`: a command that ran and exited
    // non-zero is a completed run (`failed` is for what is not one), its exit status inline.
    let exit3 = format!("{}exit 3", h.count());
    let r = mcp_2026(port, &tok, 9, "tools/call", run_command(&exit3));
    let t3 = r["result"]["taskId"].as_str().expect("a task").to_owned();
    let t = settled(port, &tok, &t3);
    assert_eq!(t["status"], "completed", "{t}");
    assert_eq!(t["result"]["structuredContent"]["exit_code"], 3, "{t}");
    assert!(t.get("error").is_none(), "{t}");

    // lifecycle.ts `sep-2663-cancel-ack-empty-result`, dispatch.ts
    // `tasks-result-type-complete-on-non-task-responses` (tasks/cancel): an empty ack, then
    // the task reads cancelled (cairn cancel stopped the remote process group).
    let long = format!("{}sleep 300; echo never", h.count());
    let r = mcp_2026(port, &tok, 10, "tools/call", run_command(&long));
    let t4 = r["result"]["taskId"].as_str().expect("a task").to_owned();
    wait_for("the long command started", T, || {
        (h.runs() == 3).then_some(())
    });
    let ack = mcp_2026(port, &tok, 11, "tasks/cancel", json!({"taskId": t4}));
    assert_eq!(ack["result"]["resultType"], "complete", "{ack}");
    assert!(envelope_fields(&ack["result"]).is_empty(), "{ack}");
    let t = settled(port, &tok, &t4);
    assert_eq!(t["status"], "cancelled", "{t}");
    assert_eq!(h.state(&t4), cairn::State::Cancelled);

    // The refused call never ran; each of the others ran once.
    assert_eq!((h.runs(), h.executions()), (3, 3));
}

// One server: what a client that did not declare the extension gets, the per-request opt-in,
// and the error codes of the tasks surface.
#[test]
fn without_the_extension_a_call_is_answered_inline_and_the_tasks_methods_are_refused_with_32021() {
    let h = Host::new();
    let tok = token(&h, "agent:conformance", &[]);
    let s = Server::start(&h, 0, &[]);
    let port = s.port;

    // capability.ts `sep-2663-tasks-methods-non-declaring`: MissingRequiredClientCapability,
    // on HTTP with 400 (stateless.ts `sep-2575-missing-capability-http-400`), naming the
    // extension (required-task-error.ts `sep-2663-server-returns-missing-capability-data-shape`).
    for (id, method, params) in [
        (1, "tasks/get", json!({"taskId": "gate-test"})),
        (
            2,
            "tasks/update",
            json!({"taskId": "gate-test", "inputResponses": {}}),
        ),
        (3, "tasks/cancel", json!({"taskId": "gate-test"})),
    ] {
        let (status, e, _) = rpc(port, &tok, id, method, params, false, &[]);
        assert_eq!(e["error"]["code"], -32021, "{method}: {e}");
        assert_eq!(status, 400, "{method}: {e}");
        assert_eq!(e["id"], id, "{method}: {e}");
        assert!(
            e["error"]["data"]["requiredCapabilities"]["extensions"][TASKS].is_object(),
            "{method}: {e}"
        );
    }

    // capability.ts `sep-2663-server-rejects-undeclared-client`: the task-supporting tool runs
    // synchronously; a plain ToolResult, resultType "complete", no taskId.
    let once = format!("{}echo inline", h.count());
    let (status, r, _) = rpc(port, &tok, 4, "tools/call", run_command(&once), false, &[]);
    assert_eq!(status, 200, "{r}");
    let res = &r["result"];
    assert_eq!(res["resultType"], "complete", "{r}");
    assert!(
        res.get("taskId").is_none() && res.get("task").is_none(),
        "{r}"
    );
    assert!(!res["content"].as_array().unwrap().is_empty(), "{r}");
    assert_eq!(res["structuredContent"]["stdout"], "inline\n", "{r}");
    assert_eq!(h.runs(), 1);

    // capability.ts `tasks-per-request-meta-opt-in`: the same client declaring the extension
    // in this one request's `_meta` gets a flat CreateTaskResult.
    let opted = format!("{}echo opted-in", h.count());
    let r = mcp_2026(port, &tok, 5, "tools/call", run_command(&opted));
    let created = &r["result"];
    assert_eq!(created["resultType"], "task", "{r}");
    assert!(created.get("task").is_none(), "{r}");
    let task = created["taskId"]
        .as_str()
        .expect("top-level taskId")
        .to_owned();
    let t = settled(port, &tok, &task);
    assert_eq!(t["status"], "completed", "{t}");
    assert_eq!(
        t["result"]["structuredContent"]["stdout"], "opted-in\n",
        "{t}"
    );

    // dispatch.ts `sep-2663-tasks-result-removed-method-not-found` and
    // `tasks-removed-tasks-list`: removed v1 methods, otherwise valid requests.
    for (id, method, params) in [
        (
            6,
            "tasks/result",
            json!({"taskId": "tasks-conformance-isolation-probe"}),
        ),
        (7, "tasks/list", json!({})),
    ] {
        let (status, e, _) = rpc(port, &tok, id, method, params, true, &[]);
        assert_eq!(e["error"]["code"], -32601, "{method}: {e}");
        // stateless.ts `sep-2575-http-server-method-not-found-404`: on HTTP, with 404.
        assert_eq!(status, 404, "{method}: {e}");
        assert_eq!(e["id"], id, "{method}: {e}");
    }

    // dispatch.ts `sep-2663-tasks-get-invalid-task-id-32602`; lifecycle.ts (description): the
    // same code for tasks/cancel of an unknown task. Neither a foreign-shaped ID nor a
    // well-formed one that names nothing.
    for (id, method, task) in [
        (8, "tasks/get", "tasks-conformance-nonexistent-12345"),
        (9, "tasks/get", NO_SUCH_EX),
        (10, "tasks/cancel", "tasks-conformance-nonexistent-12345"),
        (11, "tasks/cancel", NO_SUCH_EX),
    ] {
        let (_, e, _) = rpc(port, &tok, id, method, json!({"taskId": task}), true, &[]);
        assert_eq!(e["error"]["code"], -32602, "{method} {task}: {e}");
        assert_eq!(e["id"], id, "{method} {task}: {e}");
    }

    assert_eq!((h.runs(), h.executions()), (2, 2));
}

// lifecycle.ts `sep-2663-tasks-get-status-failed` (a protocol-level failure is `failed` with an
// inlined JSON-RPC error and no result) and dispatch.ts
// `sep-2663-durable-create-strong-consistency`, on a task whose execution is proven never to
// have run: the host key of `localhost` is not known, so cairn refuses to connect and sends
// nothing.
#[test]
fn a_task_that_failed_before_it_started_reads_as_failed_with_an_inlined_error() {
    let h = Host::new();
    let tok = token(&h, "agent:conformance", &[]);
    let s = Server::start(&h, 0, &[]);
    let port = s.port;
    // A call that fails at once may be answered inline (dispatch.ts
    // `tasks-immediate-result-shortcut`): call until one is answered as a task, a few times.
    let task = (0..10)
        .find_map(|i| {
            let never = format!("{}echo never-{i}", h.count());
            let call = json!({"name": "run_command",
                              "arguments": {"destination": "localhost", "command": never}});
            let r = mcp_2026(port, &tok, 1 + i, "tools/call", call);
            assert!(r.get("error").is_none(), "{r}");
            r["result"]["taskId"].as_str().map(str::to_owned)
        })
        .expect("one of ten calls answered as a task");
    // Strong consistency: the task exists as soon as it is returned.
    let (_, g, _) = rpc(
        port,
        &tok,
        20,
        "tasks/get",
        json!({"taskId": task}),
        true,
        &[],
    );
    assert_eq!(g["result"]["taskId"], task.as_str(), "{g}");
    let t = settled(port, &tok, &task);
    assert_eq!(t["status"], "failed", "{t}");
    assert!(t["error"]["code"].is_i64(), "{t}");
    assert!(t["error"]["message"].is_string(), "{t}");
    assert!(t.get("result").is_none(), "{t}");
    assert_eq!(h.state(&task), cairn::State::Failed);
    // lifecycle.ts `tasks-cancel-terminal-idempotent-ack`, on this terminal task too.
    let ack = mcp_2026(port, &tok, 21, "tasks/cancel", json!({"taskId": task}));
    assert_eq!(ack["result"]["resultType"], "complete", "{ack}");
    assert_eq!(h.runs(), 0, "never ran");
}

/// A POST to `/mcp` with this `Host` and (if any) `Origin` (dns-rebinding.ts): the HTTP status.
fn from_host(port: u16, tok: &str, host: &str, origin: Option<&str>) -> u16 {
    let (headers, body) = request_2026(tok, 1, "tools/list", json!({}), false);
    let mut req = format!(
        "POST /mcp HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\nContent-Length: {}\r\n",
        body.len()
    );
    if let Some(o) = origin {
        req += &format!("Origin: {o}\r\n");
    }
    for (k, v) in &headers {
        req += &format!("{k}: {v}\r\n");
    }
    req += "\r\n";
    req += &body;
    let mut st = TcpStream::connect(("127.0.0.1", port)).unwrap();
    st.set_read_timeout(Some(T)).unwrap();
    st.write_all(req.as_bytes()).unwrap();
    let mut out = String::new();
    let _ = st.read_to_string(&mut out);
    out.split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or_else(|| panic!("no status line: {out:?}"))
}

// One server: the transport rules of the 2026-07-28 revision on `/mcp` — routing headers,
// per-request `_meta`, protocol versions, methods, the response stream, Host/Origin, and
// concurrent streams.
// Long: one scenario, its phases in order.
#[test]
fn streamable_http_checks_headers_meta_versions_and_methods_before_anything_runs() {
    let h = Host::new();
    let tok = token(&h, "agent:conformance", &[]);
    let port = free_port();
    let local_origin = format!("http://localhost:{port}");
    let _s = Server::start(&h, port, &["--allow-origin", &local_origin]);
    let refused = format!("{}echo refused", h.count());

    // http-standard-headers.ts `sep-2243-server-reject-invalid-headers` and
    // `sep-2243-server-reject-error-code` (ServerRejectsMismatchedMethodHeader,
    // ServerRejectsMismatchedNameHeader, ServerRejectsCaseMismatchValue): 400 and -32020, the
    // request's id echoed (stateless.ts `sep-2575-http-server-error-jsonrpc-id`); the refused
    // tools/call never runs.
    for (id, method, params, over) in [
        (
            1,
            "tools/list",
            json!({}),
            ("Mcp-Method", Some("prompts/list")),
        ),
        (
            2,
            "tools/call",
            run_command(&refused),
            ("Mcp-Name", Some("wrong_tool_name")),
        ),
        (
            3,
            "tools/list",
            json!({}),
            ("Mcp-Method", Some("TOOLS/LIST")),
        ),
    ] {
        let (status, e, _) = rpc(port, &tok, id, method, params, false, &[over]);
        assert_eq!(status, 400, "{over:?}: {e}");
        assert_eq!(e["error"]["code"], -32020, "{over:?}: {e}");
        assert_eq!(e["id"], id, "{over:?}: {e}");
    }

    // http-standard-headers.ts `sep-2243-header-name-case-insensitive` (mcp-method,
    // MCP-METHOD) and `sep-2243-server-accepts-whitespace-header-value` (OWS around Mcp-Name).
    for (id, method, params, name, value) in [
        (4, "tools/list", json!({}), "mcp-method", "tools/list"),
        (5, "tools/list", json!({}), "MCP-METHOD", "tools/list"),
        (
            6,
            "tools/call",
            json!({"name": "execution_status", "arguments": {"execution_id": NO_SUCH_EX}}),
            "Mcp-Name",
            "  execution_status  ",
        ),
    ] {
        let over: &[(&'static str, Option<&str>)] = if name == "Mcp-Name" {
            &[("Mcp-Name", Some(value))]
        } else if name == "mcp-method" {
            &[("Mcp-Method", None), ("mcp-method", Some(value))]
        } else {
            &[("Mcp-Method", None), ("MCP-METHOD", Some(value))]
        };
        let (status, r, _) = rpc(port, &tok, id, method, params, false, over);
        assert_eq!(status, 200, "{name}: {r}");
        assert!(r.get("error").is_none(), "{name}: {r}");
        assert_eq!(r["result"]["resultType"], "complete", "{name}: {r}");
    }

    // stateless.ts `sep-2575-request-meta-invalid-{missing-meta,missing-protocol-version,
    // missing-client-capabilities}` and `sep-2575-http-server-meta-invalid-400`.
    let info = json!({"name": "conformance-client", "version": "1.0.0"});
    for (id, meta) in [
        (101, None),
        (
            102,
            Some(json!({"io.modelcontextprotocol/clientInfo": info,
                        "io.modelcontextprotocol/clientCapabilities": {}})),
        ),
        (
            104,
            Some(
                json!({"io.modelcontextprotocol/protocolVersion": "2026-07-28",
                        "io.modelcontextprotocol/clientInfo": info}),
            ),
        ),
    ] {
        let (status, e, _) = with_meta(port, &tok, id, "server/discover", meta, "2026-07-28");
        assert_eq!((status, &e["error"]["code"]), (400, &json!(-32602)), "{e}");
        assert_eq!(e["id"], id, "{e}");
    }

    // stateless.ts `sep-2575-request-meta-client-info-optional`,
    // `sep-2575-server-implements-discover`, `sep-2575-server-identifies-in-result-meta`.
    let (status, d, _) = with_meta(
        port,
        &tok,
        105,
        "server/discover",
        Some(
            json!({"io.modelcontextprotocol/protocolVersion": "2026-07-28",
                    "io.modelcontextprotocol/clientCapabilities": {}}),
        ),
        "2026-07-28",
    );
    assert_eq!(status, 200, "{d}");
    let discovered = &d["result"];
    let supported: Vec<&str> = discovered["supportedVersions"]
        .as_array()
        .expect("supportedVersions")
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert!(supported.contains(&"2026-07-28"), "{d}");
    assert!(discovered["capabilities"]["tools"].is_object(), "{d}");
    let server_info = &discovered["_meta"]["io.modelcontextprotocol/serverInfo"];
    assert_eq!(server_info["name"], "cairn", "{d}");
    assert!(server_info["version"].is_string(), "{d}");

    // stateless.ts `sep-2575-server-declares-prompts-in-discover` and
    // `sep-2575-discover-capabilities-match-handlers`: tools advertised and served; prompts
    // and resources neither.
    let (_, r, _) = rpc(port, &tok, 201, "tools/list", json!({}), false, &[]);
    assert!(r["result"]["tools"].is_array(), "{r}");
    for (id, method) in [(202, "prompts/list"), (203, "resources/list")] {
        let m = method.split('/').next().unwrap();
        assert!(discovered["capabilities"].get(m).is_none(), "{d}");
        let (_, e, _) = rpc(port, &tok, id, method, json!({}), false, &[]);
        assert_eq!(e["error"]["code"], -32601, "{method}: {e}");
    }

    // stateless.ts `sep-2575-server-unsupported-version-error` and
    // `sep-2575-http-server-unsupported-version-400`: a version it does not implement, in the
    // header and `_meta` alike.
    let v999 = json!({"io.modelcontextprotocol/protocolVersion": "v999.0.0",
                      "io.modelcontextprotocol/clientInfo": info,
                      "io.modelcontextprotocol/clientCapabilities": {}});
    let (status, e, _) = with_meta(
        port,
        &tok,
        301,
        "server/discover",
        Some(v999.clone()),
        "v999.0.0",
    );
    assert_eq!(status, 400, "{e}");
    assert_eq!(e["id"], 301, "{e}");
    let data = &e["error"]["data"];
    assert_eq!(data["requested"], "v999.0.0", "{e}");
    let listed = data["supported"].as_array().expect("data.supported");
    assert!(!listed.is_empty(), "{e}");
    assert!(
        listed
            .iter()
            .all(|v| supported.contains(&v.as_str().unwrap_or_default())),
        "the versions server/discover lists: {e}"
    );

    // stateless.ts `sep-2575-http-server-header-mismatch-400`: header and `_meta` disagree.
    let (status, e, _) = with_meta(port, &tok, 302, "server/discover", Some(v999), "2026-07-28");
    assert_eq!((status, &e["error"]["code"]), (400, &json!(-32020)), "{e}");

    // stateless.ts `sep-2575-http-server-method-not-found-404-*` (methods removed in
    // 2026-07-28) and `sep-2575-http-server-method-not-found-404` (unknown method).
    for (id, method) in [
        (500, "initialize"),
        (501, "ping"),
        (502, "logging/setLevel"),
        (503, "resources/subscribe"),
        (504, "resources/unsubscribe"),
        (601, "unknown/method"),
    ] {
        let (status, e, _) = rpc(port, &tok, id, method, json!({}), false, &[]);
        assert_eq!(
            (status, &e["error"]["code"]),
            (404, &json!(-32601)),
            "{method}: {e}"
        );
        assert_eq!(e["id"], id, "{method}: {e}");
    }

    // stateless.ts `sep-2575-server-sends-subscription-ack`, `sep-2575-server-tags-subscription-id`,
    // `sep-2575-server-honors-notification-filter` and the list-changed checks apply to a
    // server that advertises a subscription-delivered capability; this one advertises none,
    // and `subscriptions/listen` is a method it does not have.
    assert!(
        discovered["capabilities"]["tools"]
            .get("listChanged")
            .is_none(),
        "{d}"
    );
    let (status, e, _) = rpc(
        port,
        &tok,
        602,
        "subscriptions/listen",
        json!({"notifications": {"toolsListChanged": true}}),
        false,
        &[],
    );
    assert_eq!((status, &e["error"]["code"]), (404, &json!(-32601)), "{e}");

    // stateless.ts `sep-2575-http-server-no-independent-requests-on-stream` and
    // `sep-2575-server-no-log-without-loglevel`: a tools/call's response stream carries its
    // response and no request or log message of the server's.
    let ran = format!("{}echo streamed", h.count());
    let (status, r, raw) = rpc(port, &tok, 700, "tools/call", run_command(&ran), false, &[]);
    assert_eq!(status, 200, "{raw}");
    assert_eq!(
        r["result"]["structuredContent"]["stdout"], "streamed\n",
        "{r}"
    );
    let messages = match serde_json::from_str::<Value>(&raw) {
        Ok(v) => vec![v],
        Err(_) => sse_messages(&raw),
    };
    for m in &messages {
        assert!(
            m.get("method").is_none() || m.get("id").is_none(),
            "a request of the server's on the stream: {raw}"
        );
        assert_ne!(m["method"], "notifications/message", "{raw}");
    }

    // dns-rebinding.ts `DNSRebindingProtection` (rejected) and `LocalhostHostAccepted`: a
    // foreign Host and Origin are refused with a 4xx; localhost Host names are served, and a
    // browser Origin once it was allowed (`--allow-origin`).
    let evil = "evil.example.com";
    let refused_status = from_host(port, &tok, evil, Some(&format!("http://{evil}")));
    assert!((400..500).contains(&refused_status), "{refused_status}");
    assert!((400..500).contains(&from_host(port, &tok, evil, None)));
    for host in [format!("127.0.0.1:{port}"), format!("localhost:{port}")] {
        let served = from_host(port, &tok, &host, None);
        assert!((200..300).contains(&served), "{host}: {served}");
    }
    let host = format!("localhost:{port}");
    let served = from_host(port, &tok, &host, Some(&local_origin));
    assert!((200..300).contains(&served), "{local_origin}: {served}");

    // sse-multiple-streams.ts `server-accepts-multiple-post-streams`: three concurrent POSTs,
    // each answered on its own response.
    let answers: Vec<(u16, Value)> = std::thread::scope(|sc| {
        let hs: Vec<_> = (0..3)
            .map(|i| {
                let tok = tok.clone();
                sc.spawn(move || {
                    let (st, r, _) = rpc(port, &tok, 1000 + i, "tools/list", json!({}), false, &[]);
                    (st, r)
                })
            })
            .collect();
        hs.into_iter().map(|j| j.join().unwrap()).collect()
    });
    for (i, (status, r)) in answers.iter().enumerate() {
        assert_eq!(*status, 200, "{r}");
        assert_eq!(r["id"], 1000 + i as u64, "{r}");
        assert!(r["result"]["tools"].is_array(), "{r}");
    }

    // Only the one well-formed tools/call ran.
    assert_eq!((h.runs(), h.executions()), (1, 1));
}

// http-standard-headers.ts `sep-2243-server-reject-invalid-headers` and
// `sep-2243-server-reject-error-code` (ServerRejectsMissingMethodHeader,
// ServerRejectsMissingNameHeader) require a request without its Mcp-Method, or a tools/call
// without its Mcp-Name, to be refused with 400 and -32020. cairn departs from that on purpose
// (docs/GATEWAYS.md, "What clients send"): clients in use today leave the headers out (FastMCP's
// tasks/get has no Mcp-Name), and the body says unambiguously what the request is, so a missing
// routing header is filled in from it; only a header that disagrees is refused (the mismatch
// checks above). This test pins the departure: each such request is served as its body says,
// and the tools/call without headers runs its command once, not twice.
#[test]
fn a_request_without_its_routing_headers_is_served_from_its_body() {
    let h = Host::new();
    let tok = token(&h, "agent:conformance", &[]);
    let s = Server::start(&h, 0, &[]);
    let port = s.port;
    let once = format!("{}echo once", h.count());
    let (status, r, _) = rpc(
        port,
        &tok,
        1,
        "tools/list",
        json!({}),
        true,
        &[("Mcp-Method", None)],
    );
    assert_eq!(status, 200, "{r}");
    assert!(r["result"]["tools"].is_array(), "{r}");
    let (status, r, _) = rpc(
        port,
        &tok,
        2,
        "tools/call",
        run_command(&once),
        true,
        &[("Mcp-Method", None), ("Mcp-Name", None)],
    );
    assert_eq!(status, 200, "{r}");
    let task = r["result"]["taskId"]
        .as_str()
        .unwrap_or_else(|| panic!("{r}"))
        .to_owned();
    let (status, r, _) = rpc(
        port,
        &tok,
        3,
        "tasks/get",
        json!({"taskId": task}),
        true,
        &[("Mcp-Name", None)],
    );
    assert_eq!(status, 200, "{r}");
    assert_eq!(r["result"]["taskId"], task.as_str(), "{r}");
    // An unknown task without its Mcp-Name: the method's own answer (-32602), not -32020.
    let (_, r, _) = rpc(
        port,
        &tok,
        4,
        "tasks/get",
        json!({"taskId": NO_SUCH_EX}),
        true,
        &[("Mcp-Name", None)],
    );
    assert_eq!(r["error"]["code"], -32602, "{r}");
    wait_for("the command ran", T, || (h.runs() == 1).then_some(()));
    assert_eq!((h.runs(), h.executions()), (1, 1));
}
