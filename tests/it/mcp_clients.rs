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
        let mut child = Command::new(python())
            .arg(script("fastmcp_client.py"))
            .args([url, token])
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
