//! MCP clients the project did not write, against `cairn mcp --listen` and a real sshd: FastMCP
//! with its tasks extension (`fastmcp-tasks`, which advertises `io.modelcontextprotocol/tasks`
//! by itself and polls `tasks/get` under the hood), the official Python SDK, and rmcp. Every
//! test counts how many times the command ran on the host.

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, Command, Stdio};

use serde_json::{json, Value};

use crate::http::{python, script, token, Server};
use crate::support::host::*;

/// A FastMCP client process (`tests/it/py/fastmcp_client.py`) driven by JSON lines.
struct FastMcp {
    child: Child,
    stdin: ChildStdin,
    lines: std::io::Lines<BufReader<std::process::ChildStdout>>,
}

impl FastMcp {
    fn start(url: &str, token: &str) -> FastMcp {
        FastMcp::spawn(&[url, token], &[])
    }

    /// A client that starts this `cairn mcp` command as its server over stdio.
    fn stdio(server: &Command) -> FastMcp {
        let mut argv = vec![server.get_program().to_string_lossy().into_owned()];
        argv.extend(server.get_args().map(|a| a.to_string_lossy().into_owned()));
        let env: Vec<_> = server.get_envs().collect();
        FastMcp::spawn(&["stdio", &json!(argv).to_string()], &env)
    }

    fn spawn(args: &[&str], env: &[(&std::ffi::OsStr, Option<&std::ffi::OsStr>)]) -> FastMcp {
        let mut c = Command::new(python());
        for (k, v) in env {
            match v {
                Some(v) => c.env(k, v),
                None => c.env_remove(k),
            };
        }
        let mut child = c
            .arg(script("fastmcp_client.py"))
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start the FastMCP client");
        let stdin = child.stdin.take().unwrap();
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let first = lines.next().map(|l| l.unwrap_or_default());
        let mut c = FastMcp {
            child,
            stdin,
            lines,
        };
        if first.as_deref() != Some(r#"{"event": "initialized"}"#) {
            let err = c.stderr();
            panic!("FastMCP client did not initialize: {first:?}\n{err}");
        }
        c
    }

    fn stderr(&mut self) -> String {
        let _ = self.child.kill();
        let mut s = String::new();
        if let Some(mut e) = self.child.stderr.take() {
            let _ = std::io::Read::read_to_string(&mut e, &mut s);
        }
        s
    }

    /// Send one command; its answer.
    fn ask(&mut self, cmd: Value) -> Value {
        writeln!(self.stdin, "{cmd}").unwrap();
        self.stdin.flush().unwrap();
        match self.lines.next() {
            Some(Ok(l)) => serde_json::from_str(&l).unwrap(),
            other => {
                let err = self.stderr();
                panic!("no answer to {cmd}: {other:?}\n{err}")
            }
        }
    }
}

impl Drop for FastMcp {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn run_args(cmd: &str) -> Value {
    json!({"destination": "127.0.0.1", "command": cmd})
}

#[test]
fn fastmcp_call_is_tasked_polled_to_its_result_and_runs_once() {
    let h = Host::new();
    let tok = token(&h, "agent:fastmcp", &[]);
    let s = Server::start(&h, 0, &[]);
    let mut c = FastMcp::start(&s.url(), &tok);
    let cmd = format!("{}echo fast-once", h.count());
    let r = c.ask(json!({"op": "call", "tool": "run_command", "args": run_args(&cmd)}));
    assert_eq!(r["is_error"], false, "{r}\n{}", s.log());
    let v = &r["structured"];
    assert_eq!(v["state"], "completed", "{r}");
    assert_eq!(v["exit_code"], 0, "{r}");
    assert_eq!(v["stdout"], "fast-once\n", "{r}");
    let id = v["execution_id"].as_str().unwrap().to_owned();
    // FastMCP took the task and polled it: one tools/call, then tasks/get until completed.
    let sent = &r["sent"]["methods"];
    assert_eq!(sent["tools/call"], 1, "{r}");
    assert!(sent["tasks/get"].as_u64().unwrap_or(0) >= 1, "polled: {r}");
    assert_eq!(h.runs(), 1, "ran once");
    assert_eq!(h.executions(), 1);
    // The result reached the client through tasks/get: recorded delivered.
    assert_eq!(h.state(&id), cairn::State::Delivered);
}

// A task outlives the server: created, the server killed with -9 and started again on the same
// port, the same client polls on to the result; then a second task cancelled by tasks/cancel.
#[test]
fn fastmcp_task_survives_kill_and_restart_and_tasks_cancel_stops_the_command() {
    let h = Host::new();
    let tok = token(&h, "agent:fastmcp", &[]);
    let port = crate::http::free_port();
    let mut s = Server::start(&h, port, &[]);
    let url = s.url();
    let mut c = FastMcp::start(&url, &tok);
    let go = h.sshd.dir().join("go");
    let cmd = format!(
        "{}while [ ! -e '{}' ]; do sleep 0.1; done; echo survived",
        h.count(),
        go.display()
    );
    let t = c.ask(json!({"op": "start", "tool": "run_command", "args": run_args(&cmd)}));
    assert_eq!(t["status"], "working", "{t}");
    let task = t["task_id"].as_str().unwrap().to_owned();
    assert!(task.starts_with("ex_"), "the task is the execution: {t}");
    assert_eq!(h.wait_started(), task);

    s.kill9();
    let _s2 = Server::start(&h, port, &[]);
    let st = c.ask(json!({"op": "status", "task_id": task}));
    assert_eq!(st["status"], "working", "still running on the host: {st}");
    std::fs::write(&go, "").unwrap();
    let r = c.ask(json!({"op": "result", "task_id": task}));
    assert_eq!(r["is_error"], false, "{r}");
    assert_eq!(r["structured"]["execution_id"], task.as_str(), "{r}");
    assert_eq!(r["structured"]["stdout"], "survived\n", "{r}");
    assert_eq!(r["structured"]["certainty"], "settled", "{r}");
    assert_eq!(h.runs(), 1, "ran once across the restart");
    assert_eq!(r["sent"]["methods"]["tools/call"], 1, "{r}");

    let cmd2 = format!("{}sleep 300; echo never", h.count());
    let t2 = c.ask(json!({"op": "start", "tool": "run_command", "args": run_args(&cmd2)}));
    let task2 = t2["task_id"].as_str().unwrap().to_owned();
    wait_for("the second started", crate::http::T, || {
        (h.runs() == 2).then_some(())
    });
    let st = c.ask(json!({"op": "cancel", "task_id": task2}));
    // tasks/cancel answers once the cancel is recorded; the status then reads cancelled.
    let st = if st["status"] == "cancelled" {
        st
    } else {
        wait_for("the task cancelled", crate::http::T, || {
            let st = c.ask(json!({"op": "status", "task_id": task2}));
            (st["status"] != "working").then_some(st)
        })
    };
    assert_eq!(st["status"], "cancelled", "{st}");
    assert_eq!(h.state(&task2), cairn::State::Cancelled);
    assert_eq!(h.runs(), 2, "nothing ran again");
    assert_eq!(h.executions(), 2);
}

// What an agent's client reads before it calls: every tool's annotations (the replay contract
// in the protocol's words) and its output schema, as FastMCP parses them.
#[test]
fn fastmcp_lists_annotations_and_output_schemas_for_every_tool() {
    let h = Host::new();
    let tok = token(&h, "agent:fastmcp", &[]);
    let s = Server::start(&h, 0, &[]);
    let mut c = FastMcp::start(&s.url(), &tok);
    let r = c.ask(json!({"op": "list"}));
    let tools = r["tools"].as_array().unwrap_or_else(|| panic!("{r}"));
    let tool = |n: &str| {
        tools
            .iter()
            .find(|t| t["name"] == n)
            .unwrap_or_else(|| panic!("{n} in {r}"))
            .clone()
    };
    let run = tool("run_command");
    let a = &run["annotations"];
    assert_eq!(a["readOnlyHint"], false, "{run}");
    assert_eq!(a["idempotentHint"], false, "{run}");
    assert_eq!(a["openWorldHint"], true, "{run}");
    assert!(
        run["description"]
            .as_str()
            .unwrap()
            .contains("attached=true"),
        "says how a retry attaches: {run}"
    );
    for n in ["execution_status", "read_output"] {
        let t = tool(n);
        assert_eq!(t["annotations"]["readOnlyHint"], true, "{t}");
        assert_eq!(t["annotations"]["idempotentHint"], true, "{t}");
    }
    for t in tools {
        let schema = &t["output_schema"];
        assert_eq!(schema["type"], "object", "{t}");
        assert!(
            schema["required"].as_array().is_some_and(|r| !r.is_empty()),
            "{t}"
        );
    }
    for f in [
        "execution_id",
        "state",
        "certainty",
        "exit_code",
        "attached",
        "needs_review",
        "reason",
    ] {
        assert!(
            run["output_schema"]["required"]
                .as_array()
                .unwrap()
                .contains(&json!(f)),
            "{f}: {run}"
        );
    }
}

// The official SDK checks every successful result against the tool's output schema: a retry in
// flight that attaches, the status and the output of that execution, all conform; an unknown
// ID is an error result. The retry says it attached, in fields; the command ran once.
#[test]
fn official_sdk_validates_every_tool_result_against_its_schema_and_a_retry_says_it_attached() {
    let h = Host::new();
    let tok = token(&h, "agent:sdk", &[]);
    let s = Server::start(&h, 0, &[]);
    let go = h.sshd.dir().join("go");
    let cmd = format!(
        "{}while [ ! -e '{}' ]; do sleep 0.1; done; echo schema-once",
        h.count(),
        go.display()
    );
    let mut child = Command::new(python())
        .arg(script("mcp_sdk_tools.py"))
        .args([&s.url(), &tok, &cmd])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let listed: Value = serde_json::from_str(&lines.next().unwrap().unwrap()).unwrap();
    assert_eq!(listed["event"], "listed", "{listed}");
    let tools = &listed["tools"];
    assert_eq!(tools["run_command"]["annotations"]["openWorldHint"], true);
    assert_eq!(tools["read_output"]["annotations"]["readOnlyHint"], true);
    let id = h.wait_started();
    writeln!(stdin, "again").unwrap();
    stdin.flush().unwrap();
    wait_for("the retry attached", crate::http::T, || {
        h.kinds(&id)
            .contains(&"intent-matched".to_owned())
            .then_some(())
    });
    std::fs::write(&go, "").unwrap();
    let last: Value = serde_json::from_str(&lines.next().expect("a result").unwrap()).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        last.get("error").is_none(),
        "{last}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let (first, again) = (&last["first"]["structured"], &last["again"]["structured"]);
    assert_eq!(first["execution_id"], id.as_str(), "{last}");
    assert_eq!(first["attached"], false, "{last}");
    assert_eq!(again["execution_id"], id.as_str(), "{last}");
    assert_eq!(again["attached"], true, "{last}");
    for v in [first, again] {
        assert_eq!(v["stdout"], "schema-once\n", "{last}");
        assert_eq!(v["certainty"], "settled", "{last}");
    }
    let status = &last["status"]["structured"];
    assert_eq!(status["state"], "completed", "{last}");
    assert!(
        status["events"]
            .as_array()
            .unwrap()
            .iter()
            .any(|e| e["kind"] == "delivered"),
        "{last}"
    );
    assert_eq!(
        last["output"]["structured"]["data"], "schema-once\n",
        "{last}"
    );
    assert_eq!(last["output"]["structured"]["eof"], true, "{last}");
    assert_eq!(last["unknown"]["is_error"], true, "{last}");
    assert_eq!(h.runs(), 1, "the command ran once");
    assert_eq!(h.executions(), 1);
}

// rmcp's Streamable HTTP client lists what the Python clients list: annotations and an output
// schema on every tool; a call's structured content has the schema's required fields.
#[tokio::test(flavor = "multi_thread")]
async fn rmcp_client_lists_annotations_and_output_schemas_and_results_carry_them() {
    use rmcp::model::CallToolRequestParams;
    use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
    use rmcp::transport::StreamableHttpClientTransport;
    use rmcp::ServiceExt;
    let h = Host::new();
    let tok = token(&h, "agent:rs", &[]);
    let s = tokio::task::block_in_place(|| Server::start(&h, 0, &[]));
    let cfg = StreamableHttpClientTransportConfig::with_uri(s.url()).auth_header(tok);
    let client = ().serve(StreamableHttpClientTransport::from_config(cfg)).await.unwrap();
    let tools = client.list_all_tools().await.unwrap();
    assert_eq!(tools.len(), 3, "{tools:?}");
    for t in &tools {
        let a = t.annotations.as_ref().unwrap_or_else(|| panic!("{t:?}"));
        let schema = t.output_schema.as_ref().unwrap_or_else(|| panic!("{t:?}"));
        assert_eq!(schema["type"], "object", "{t:?}");
        let read_only = t.name != "run_command";
        assert_eq!(a.read_only_hint, Some(read_only), "{t:?}");
        assert_eq!(a.idempotent_hint, Some(read_only), "{t:?}");
        assert_eq!(a.open_world_hint, Some(true), "{t:?}");
    }
    let run = tools.iter().find(|t| t.name == "run_command").unwrap();
    let required: Vec<String> = run.output_schema.as_ref().unwrap()["required"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap().to_owned())
        .collect();
    let call = CallToolRequestParams::new("run_command").with_arguments(
        json!({"destination": "127.0.0.1", "command": format!("{}exit 3", h.count())})
            .as_object()
            .unwrap()
            .clone(),
    );
    let r = client.call_tool(call).await.unwrap();
    let v = r.structured_content.clone().expect("structured content");
    for f in &required {
        assert!(v.get(f).is_some(), "{f} missing from {v}");
    }
    // Exit 3 is a completed run, known: settled, not an error of the tool.
    assert_eq!(v["exit_code"], 3, "{v}");
    assert_eq!(v["certainty"], "settled", "{v}");
    assert_eq!(h.runs(), 1);
    let _ = client.cancel().await;
}

// A named operation through FastMCP: its class-derived annotations and output schema listed,
// its call tasked and polled to the result like run_command's, and run once.
#[test]
fn fastmcp_calls_a_named_operation_as_a_task_and_reads_its_contract_hints() {
    let h = Host::new();
    let tok = token(&h, "agent:fastmcp", &[]);
    let ops = h.sshd.dir().join("operations.toml");
    std::fs::write(
        &ops,
        format!(
            r#"
[operations.note]
description = "Print a note"
class = "idempotent"
hosts = ["127.0.0.1"]
argv = ["sh", "-c", "echo ran >> '{counter}'; printf '%s' \"$1\"", "note", "{{note}}"]

[operations.note.args]
note = {{ type = "string", pattern = "^[a-z-]+$" }}
"#,
            counter = h.counter.display()
        ),
    )
    .unwrap();
    let s = Server::start(&h, 0, &["--operations", ops.to_str().unwrap()]);
    let mut c = FastMcp::start(&s.url(), &tok);
    let listed = c.ask(json!({"op": "list"}));
    let note = listed["tools"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["name"] == "note")
        .unwrap_or_else(|| panic!("{listed}"))
        .clone();
    assert_eq!(note["annotations"]["idempotentHint"], true, "{note}");
    assert_eq!(note["annotations"]["readOnlyHint"], false, "{note}");
    assert_eq!(note["annotations"]["openWorldHint"], true, "{note}");
    assert_eq!(note["output_schema"]["type"], "object", "{note}");
    let r = c.ask(json!({"op": "call", "tool": "note", "args": {"note": "op-via-fastmcp"}}));
    assert_eq!(r["is_error"], false, "{r}\n{}", s.log());
    assert_eq!(r["structured"]["stdout"], "op-via-fastmcp", "{r}");
    assert_eq!(r["structured"]["certainty"], "settled", "{r}");
    assert!(
        r["sent"]["methods"]["tasks/get"].as_u64().unwrap_or(0) >= 1,
        "tasked and polled: {r}"
    );
    assert_eq!(h.runs(), 1);
    assert_eq!(h.executions(), 1);
}

// Over stdio too: FastMCP starts `cairn mcp` as its child, a call is tasked and polled to its
// result, and a retry of the same call by a second client process attaches.
#[test]
fn fastmcp_over_stdio_runs_a_tasked_call_once_and_a_second_client_attaches() {
    let h = Host::new();
    let mut server = Command::new(BIN);
    server.arg("mcp").args(["--actor", "agent:stdio"]);
    h.conn_args(&mut server, "60s");
    server.arg("--remote-dir").arg(&h.remote_dir);
    let go = h.sshd.dir().join("go");
    let cmd = format!(
        "{}while [ ! -e '{}' ]; do sleep 0.1; done; echo stdio-once",
        h.count(),
        go.display()
    );
    let mut first = FastMcp::stdio(&server);
    let t = first.ask(json!({"op": "start", "tool": "run_command", "args": run_args(&cmd)}));
    let task = t["task_id"]
        .as_str()
        .unwrap_or_else(|| panic!("{t}"))
        .to_owned();
    assert_eq!(h.wait_started(), task);
    // The first client and its server go away; a second client sends the same call.
    drop(first);
    let mut second = FastMcp::stdio(&server);
    std::fs::write(&go, "").unwrap();
    let r = second.ask(json!({"op": "call", "tool": "run_command", "args": run_args(&cmd)}));
    assert_eq!(r["is_error"], false, "{r}");
    assert_eq!(r["structured"]["execution_id"], task.as_str(), "{r}");
    assert_eq!(r["structured"]["attached"], true, "{r}");
    assert_eq!(r["structured"]["stdout"], "stdio-once\n", "{r}");
    assert_eq!(h.runs(), 1, "ran once");
    assert_eq!(h.executions(), 1);
}
