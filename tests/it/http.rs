//! `cairn mcp --listen`: MCP over Streamable HTTP and JSON-RPC at `/rpc`, end to end against a
//! real sshd, with clients the project did not write (the official Python SDK, rmcp's HTTP
//! client) and hand-written HTTP requests. Every test counts how many times the command ran.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{json, Value};

use crate::support::host::*;
use crate::support::Proxy;

pub(crate) const T: Duration = Duration::from_secs(60);

/// A `cairn mcp --listen` process.
pub(crate) struct Server {
    child: Child,
    pub(crate) port: u16,
    log: Arc<Mutex<Vec<String>>>,
}

impl Server {
    pub(crate) fn start(h: &Host, port: u16, extra: &[&str]) -> Server {
        Server::start_env(h, port, extra, &[])
    }

    /// [`Server::start`] with these variables in the server's environment.
    pub(crate) fn start_env(h: &Host, port: u16, extra: &[&str], env: &[(&str, &str)]) -> Server {
        Server::start_reconnect(h, port, extra, env, "60s")
    }

    /// [`Server::start_env`] with this `--reconnect-for` (the window of each of its calls).
    pub(crate) fn start_reconnect(
        h: &Host,
        port: u16,
        extra: &[&str],
        env: &[(&str, &str)],
        reconnect_for: &str,
    ) -> Server {
        let mut c = Command::new(BIN);
        c.arg("mcp");
        h.conn_args(&mut c, reconnect_for);
        c.envs(env.iter().copied());
        c.arg("--remote-dir")
            .arg(&h.remote_dir)
            .args(["--listen", &format!("127.0.0.1:{port}")])
            .args(extra)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        let mut child = c.spawn().expect("spawn cairn mcp --listen");
        let err = child.stderr.take().unwrap();
        let log = Arc::new(Mutex::new(Vec::new()));
        let (tx, rx) = std::sync::mpsc::channel();
        let l2 = log.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(err).lines().map_while(Result::ok) {
                // The line is in the log before the port is announced, so a test that reads the
                // log right after `start` returns sees it.
                l2.lock().unwrap().push(line.clone());
                if let Some(rest) = line
                    .split("listening on http://")
                    .nth(1)
                    .or_else(|| line.split("listening on https://").nth(1))
                {
                    let addr = rest.split_whitespace().next().unwrap_or_default();
                    let p: u16 = addr.rsplit(':').next().unwrap().parse().unwrap();
                    let _ = tx.send(p);
                }
            }
        });
        let port = rx
            .recv_timeout(T)
            .unwrap_or_else(|_| panic!("the server did not say where it listens: {log:?}"));
        Server { child, port, log }
    }

    pub(crate) fn url(&self) -> String {
        format!("http://127.0.0.1:{}/mcp", self.port)
    }

    pub(crate) fn log(&self) -> String {
        self.log.lock().unwrap().join("\n")
    }

    pub(crate) fn pid(&self) -> u32 {
        self.child.id()
    }

    pub(crate) fn kill9(&mut self) {
        assert!(sigkill(self.child.id() as i32, false));
        let _ = self.child.wait();
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub(crate) fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// `cairn token ARGS --journal J`.
fn token_cmd(h: &Host, args: &[&str]) -> std::process::Output {
    let mut c = Command::new(BIN);
    c.arg("token").args(args).arg("--journal").arg(&h.journal);
    c.env_remove("CAIRN_JOURNAL");
    c.output().expect("cairn token")
}

pub(crate) fn token(h: &Host, actor: &str, extra: &[&str]) -> String {
    let mut args = vec!["add", actor];
    args.extend_from_slice(extra);
    let out = token_cmd(h, &args);
    assert!(out.status.success(), "{out:?}");
    String::from_utf8(out.stdout).unwrap().trim().to_owned()
}

/// One HTTP/1.1 request on a fresh connection: (status, body as text).
pub(crate) fn request(
    port: u16,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> (u16, String) {
    let (status, _, body) = exchange(port, method, path, headers, body);
    (status, body)
}

/// One HTTP/1.1 request on a fresh connection: (status, the head in lower case, the body as
/// text, dechunked).
pub(crate) fn exchange(
    port: u16,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> (u16, String, String) {
    let mut s = TcpStream::connect(("127.0.0.1", port)).expect("connect");
    let mut req = format!(
        "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\nContent-Length: {}\r\n",
        body.len()
    );
    for (k, v) in headers {
        req += &format!("{k}: {v}\r\n");
    }
    req += "\r\n";
    req += body;
    s.write_all(req.as_bytes()).unwrap();
    let mut out = Vec::new();
    s.read_to_end(&mut out).unwrap();
    let out = String::from_utf8_lossy(&out).into_owned();
    let status = out
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or_else(|| panic!("no status line: {out:?}"));
    let (head, body) = out.split_once("\r\n\r\n").unwrap_or((&out, ""));
    let head = head.to_ascii_lowercase();
    let body = if head.contains("transfer-encoding: chunked") {
        dechunk(body)
    } else {
        body.to_owned()
    };
    (status, head, body)
}

/// The payload of an HTTP/1.1 chunked body.
fn dechunk(mut s: &str) -> String {
    let mut out = String::new();
    while let Some((size, rest)) = s.split_once("\r\n") {
        let n = usize::from_str_radix(size.trim(), 16).unwrap_or(0);
        if n == 0 || rest.len() < n {
            break;
        }
        out.push_str(&rest[..n]);
        s = rest[n..].trim_start_matches("\r\n");
    }
    out
}

const MCP_ACCEPT: (&str, &str) = ("Accept", "application/json, text/event-stream");
pub(crate) const JSON: (&str, &str) = ("Content-Type", "application/json");

fn initialize_body() -> String {
    json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {},
        "clientInfo": {"name": "hand-written", "version": "0"}}})
    .to_string()
}

/// `/metrics` with a token: the value of each sample line, by its name and labels.
pub(crate) fn metrics(port: u16, token: &str) -> std::collections::BTreeMap<String, f64> {
    let auth = format!("Bearer {token}");
    let (status, text) = request(port, "GET", "/metrics", &[("Authorization", &auth)], "");
    assert_eq!(status, 200, "{text}");
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .filter_map(|l| l.rsplit_once(' '))
        .map(|(k, v)| (k.to_owned(), v.parse().unwrap()))
        .collect()
}

/// The server's session events of `kind` (refusals are events of the server's session).
fn session_events(h: &Host, kind: &str) -> Vec<Value> {
    let c = rusqlite::Connection::open(&h.journal).unwrap();
    let mut st = c
        .prepare("SELECT evidence FROM session_events WHERE kind = ?1 ORDER BY seq")
        .unwrap();
    st.query_map([kind], |r| r.get::<_, String>(0))
        .unwrap()
        .map(|e| serde_json::from_str(&e.unwrap()).unwrap())
        .collect()
}

// Every refusal on one server, then the one request that gets through: one function.
// Long: one scenario, its phases in order.
#[test]
fn requests_without_a_valid_token_or_from_a_foreign_origin_are_refused_and_only_the_refusal_is_recorded(
) {
    let h = Host::new();
    let good = token(&h, "agent:alice", &[]);
    let revoked = token(&h, "agent:mallory", &[]);
    let revoked_id = token_id(&h, "agent:mallory");
    let out = token_cmd(&h, &["revoke", &revoked_id]);
    assert!(out.status.success(), "{out:?}");
    let s = Server::start(&h, 0, &[]);
    let p = s.port;
    let execute = json!({"jsonrpc": "2.0", "id": 7, "method": "execute", "params": {
        "destination": "127.0.0.1", "command": format!("{}echo no", h.count())}})
    .to_string();
    let call = json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {
        "name": "run_command", "arguments": {"destination": "127.0.0.1", "command": "echo no"}}})
    .to_string();
    let bearer = |t: &str| format!("Bearer {t}");
    let (b_good, b_revoked) = (bearer(&good), bearer(&revoked));
    let wrong = bearer("cairn_AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA");
    // (path, headers, body, the status it gets)
    type Case<'a> = (&'a str, Vec<(&'a str, &'a str)>, &'a str, u16);
    let cases: Vec<Case<'_>> = vec![
        ("/mcp", vec![MCP_ACCEPT, JSON], &call, 401),
        (
            "/mcp",
            vec![MCP_ACCEPT, JSON, ("Authorization", &wrong)],
            &call,
            401,
        ),
        (
            "/mcp",
            vec![MCP_ACCEPT, JSON, ("Authorization", &b_revoked)],
            &call,
            401,
        ),
        (
            "/mcp",
            vec![
                MCP_ACCEPT,
                JSON,
                ("Authorization", &b_good),
                ("Origin", "http://evil.example"),
            ],
            &call,
            403,
        ),
        ("/rpc", vec![JSON], &execute, 401),
        (
            "/rpc",
            vec![JSON, ("Authorization", &b_revoked)],
            &execute,
            401,
        ),
        (
            "/rpc",
            vec![JSON, ("Authorization", &b_good), ("Origin", "null")],
            &execute,
            403,
        ),
    ];
    for (path, headers, body, want) in &cases {
        let (status, text) = request(p, "POST", path, headers, body);
        assert_eq!(status, *want, "{path} {headers:?}: {text}");
    }
    // A Host that is not this server's name (DNS rebinding): refused before the token counts.
    let mut st = TcpStream::connect(("127.0.0.1", p)).unwrap();
    write!(
        st,
        "POST /rpc HTTP/1.1\r\nHost: evil.example\r\nConnection: close\r\nAuthorization: {b_good}\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{execute}",
        execute.len()
    )
    .unwrap();
    let mut resp = String::new();
    st.read_to_string(&mut resp).unwrap();
    assert!(resp.starts_with("HTTP/1.1 403"), "{resp}");

    assert_eq!(h.runs(), 0, "nothing ran");
    assert_eq!(h.executions(), 0, "no execution was even accepted");
    let refused = session_events(&h, "refused");
    assert_eq!(refused.len(), cases.len() + 1, "{refused:?}");
    let reasons: Vec<&str> = refused
        .iter()
        .map(|r| r["reason"].as_str().unwrap())
        .collect();
    assert!(reasons[0].contains("no bearer token"), "{reasons:?}");
    assert_eq!(reasons[1], "unknown token");
    assert!(reasons[2].contains(&revoked_id) && reasons[2].contains("revoked"));
    assert!(reasons[3].contains("evil.example") && reasons[3].contains("Origin"));
    assert!(reasons[7].contains("Host"), "{reasons:?}");
    // No token, not even a wrong one, is written anywhere.
    let journal_bytes = std::fs::read(&h.journal).unwrap();
    for t in [&good, &revoked, "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA"] {
        let secret = &t.as_bytes()[6..];
        assert!(!journal_bytes.windows(secret.len()).any(|w| w == secret));
        assert!(
            !s.log().contains(&t[6..]),
            "a token in the log: {}",
            s.log()
        );
    }

    // The good token, with no Origin, gets through.
    let (status, text) = request(
        p,
        "POST",
        "/mcp",
        &[MCP_ACCEPT, JSON, ("Authorization", &b_good)],
        &initialize_body(),
    );
    assert_eq!(status, 200, "{text}");
    assert!(text.contains("\"serverInfo\""), "{text}");
    let (status, text) = request(p, "GET", "/healthz", &[], "");
    assert_eq!((status, text.trim()), (200, "ok"));
}

// One story on one server (the actor, its scope, another actor's view): one function.
// Long: one scenario, its phases in order.
#[test]
fn json_rpc_over_http_acts_as_the_token_actor_who_alone_sees_its_executions() {
    let h = Host::new();
    let alice = format!(
        "Bearer {}",
        token(&h, "agent:alice", &["--scope-prefix", "t-"])
    );
    let bob = format!("Bearer {}", token(&h, "agent:bob", &[]));
    let s = Server::start(&h, 0, &[]);
    let cmd = format!("{}echo over-http", h.count());
    let execute = |id: u64, scope: Option<&str>| {
        let mut p = json!({"destination": "127.0.0.1", "command": cmd});
        if let Some(sc) = scope {
            p["scope"] = sc.into();
        }
        json!({"jsonrpc": "2.0", "id": id, "method": "execute", "params": p}).to_string()
    };
    let (status, text) = request(
        s.port,
        "POST",
        "/rpc",
        &[JSON, ("Authorization", &alice)],
        &execute(1, None),
    );
    assert_eq!(status, 200, "{text}");
    let r: Value = serde_json::from_str(&text).unwrap();
    let v = &r["result"];
    assert_eq!(r["id"], 1);
    assert_eq!(v["state"], "completed", "{r}");
    assert_eq!(v["stdout"], "over-http\n");
    let id = v["execution_id"].as_str().unwrap().to_owned();
    let intent = h
        .journal()
        .intent_of(&cairn::ExecutionId::parse(&id).unwrap())
        .unwrap()
        .unwrap();
    assert_eq!(
        intent.actor, "agent:alice",
        "the token's actor, not the server's"
    );
    assert_eq!(intent.scope, "t-", "no scope given: the token's prefix");
    // The correlation names the actor and the request, not a bare JSON-RPC id.
    let corr: Vec<String> = h
        .journal()
        .events(&cairn::ExecutionId::parse(&id).unwrap())
        .unwrap()
        .into_iter()
        .filter(|e| e.kind == "correlation")
        .map(|e| e.evidence["correlation_id"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(corr, vec!["actor=agent:alice request=1".to_owned()]);

    // A scope outside the prefix is refused, and nothing runs.
    let (_, text) = request(
        s.port,
        "POST",
        "/rpc",
        &[JSON, ("Authorization", &alice)],
        &execute(2, Some("prod")),
    );
    assert!(text.contains("starting with \\\"t-\\\""), "{text}");
    // Bob cannot read Alice's execution: to him it does not exist.
    let status_of = |who: &str| {
        let body =
            json!({"jsonrpc": "2.0", "id": 3, "method": "status", "params": {"execution_id": id}});
        let (_, text) = request(
            s.port,
            "POST",
            "/rpc",
            &[JSON, ("Authorization", who)],
            &body.to_string(),
        );
        serde_json::from_str::<Value>(&text).unwrap()
    };
    assert_eq!(status_of(&bob)["error"]["code"], -32004, "bob");
    // The response was handed over whole: recorded delivered (after it, so waited for).
    wait_for("delivered", T, || {
        (h.state(&id) == cairn::State::Delivered).then_some(())
    });
    let mine = status_of(&alice);
    assert_eq!(mine["result"]["state"], "completed", "alice: {mine}");
    // Bob's identical request is his own execution (another actor never attaches).
    let (_, text) = request(
        s.port,
        "POST",
        "/rpc",
        &[JSON, ("Authorization", &bob)],
        &execute(4, Some("t-")),
    );
    let r: Value = serde_json::from_str(&text).unwrap();
    assert_ne!(r["result"]["execution_id"], id.as_str(), "{r}");
    assert_eq!(h.runs(), 2);

    // /metrics, from the journal: two executions, each dispatched once, no attach.
    let m = metrics(s.port, bob.trim_start_matches("Bearer "));
    let executions: f64 = m
        .iter()
        .filter(|(k, _)| k.starts_with("cairn_executions{"))
        .map(|(_, v)| v)
        .sum();
    assert_eq!(executions, 2.0, "{m:?}");
    assert_eq!(m["cairn_dispatch_latency_seconds_count"], 2.0, "{m:?}");
    assert_eq!(m["cairn_attaches_total{by=\"intent\"}"], 0.0, "{m:?}");
    assert_eq!(m["cairn_http_refused_total"], 0.0, "{m:?}");
    let (status, _) = request(s.port, "GET", "/metrics", &[], "");
    assert_eq!(status, 401, "metrics need a token too");
}

/// The shared Python environment with the MCP clients the project did not write, at the
/// versions pinned in `tests/it/py/requirements.txt` (the official SDK, FastMCP and its tasks
/// extension): `target/mcp-venv`, or `CAIRN_PY_VENV`. Missing: created here, except in CI,
/// where that is a failure.
pub(crate) fn python() -> PathBuf {
    let venv = std::env::var_os("CAIRN_PY_VENV")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/mcp-venv"));
    let py = venv.join("bin/python");
    let has_clients = |py: &PathBuf| {
        Command::new(py)
            .args(["-c", "import mcp, fastmcp, fastmcp_tasks"])
            .status()
            .is_ok_and(|s| s.success())
    };
    if has_clients(&py) {
        return py;
    }
    let reqs = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/it/py/requirements.txt");
    assert!(
        !crate::support::ci::is_ci(),
        "CI: the Python MCP clients are missing at {} (python3 -m venv target/mcp-venv && \
         target/mcp-venv/bin/pip install -r {})",
        venv.display(),
        reqs.display()
    );
    let ok = (py.exists()
        || Command::new("python3")
            .arg("-m")
            .arg("venv")
            .arg(&venv)
            .status()
            .unwrap()
            .success())
        && Command::new(venv.join("bin/pip"))
            .args(["install", "-q", "-r"])
            .arg(&reqs)
            .status()
            .unwrap()
            .success();
    assert!(
        ok && has_clients(&py),
        "could not create {}",
        venv.display()
    );
    py
}

pub(crate) fn script(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/it/py")
        .join(name)
}

#[test]
fn python_sdk_cut_mid_call_resumes_with_last_event_id_and_the_command_runs_once() {
    let py = python();
    let h = Host::new();
    let tok = token(&h, "agent:py", &[]);
    let s = Server::start(&h, 0, &[]);
    // The client reaches the server through a proxy the test cuts.
    let front = Proxy::start(s.port);
    let go = h.sshd.dir().join("go");
    let cmd = format!(
        "{}while [ ! -e '{}' ]; do sleep 0.1; done; echo py-once",
        h.count(),
        go.display()
    );
    let url = format!("http://127.0.0.1:{}/mcp", front.port());
    let args = json!({"destination": "127.0.0.1", "command": cmd}).to_string();
    let mut child = Command::new(py)
        .arg(script("mcp_http_call.py"))
        .args([&url, &tok, "run_command", &args])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let first: Value = serde_json::from_str(&lines.next().unwrap().unwrap()).unwrap();
    assert_eq!(first["event"], "initialized");
    let id = h.wait_started();
    // Mid-call: the command runs on the host, the client waits on its response stream. Cut.
    let before = front.connections();
    front.cut();
    std::fs::write(&go, "").unwrap();
    let last: Value = serde_json::from_str(&lines.next().expect("a result line").unwrap()).unwrap();
    let out = child.wait_with_output().unwrap();
    assert_eq!(
        last["event"],
        "result",
        "{last}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v = &last["structured"];
    assert_eq!(v["execution_id"], id.as_str(), "{last}");
    assert_eq!(v["state"], "completed", "{last}");
    assert_eq!(v["stdout"], "py-once\n");
    assert_eq!(
        last["sent"]["tools_call_posts"], 1,
        "no second tools/call: {last}"
    );
    assert!(
        last["sent"]["resumes"].as_u64().unwrap() >= 1,
        "resumed with Last-Event-ID: {last}"
    );
    assert!(
        front.connections() > before,
        "the client came back on a new connection"
    );
    assert_eq!(h.runs(), 1, "the command ran once");
    assert_eq!(h.executions(), 1);
    assert!(
        !h.kinds(&id).contains(&"intent-matched".to_owned()),
        "{:?}",
        h.kinds(&id)
    );
}

/// A Python SDK client making one call; its JSON lines.
struct PyCall {
    child: Child,
    lines: std::io::Lines<BufReader<std::process::ChildStdout>>,
}

impl PyCall {
    fn start(url: &str, token: &str, tool: &str, args: &Value) -> PyCall {
        PyCall::start_with_ca(url, token, tool, args, None)
    }

    fn start_with_ca(
        url: &str,
        token: &str,
        tool: &str,
        args: &Value,
        ca: Option<&std::path::Path>,
    ) -> PyCall {
        let mut c = Command::new(python());
        if let Some(ca) = ca {
            c.env("CAIRN_TEST_CA", ca);
        }
        let mut child = c
            .arg(script("mcp_http_call.py"))
            .args([url, token, tool, &args.to_string()])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let lines = BufReader::new(child.stdout.take().unwrap()).lines();
        PyCall { child, lines }
    }

    fn next(&mut self) -> Value {
        let line = self.lines.next().expect("a line from the client").unwrap();
        serde_json::from_str(&line).unwrap()
    }

    fn finish(mut self) -> Value {
        let last = self.next();
        let out = self.child.wait_with_output().unwrap();
        assert_eq!(
            last["event"],
            "result",
            "{last}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        last
    }
}

#[test]
fn python_sdk_resumes_after_the_server_is_killed_and_restarted_and_the_command_runs_once() {
    let h = Host::new();
    let tok = token(&h, "agent:py", &[]);
    let port = free_port();
    let mut s = Server::start(&h, port, &[]);
    let go = h.sshd.dir().join("go");
    let cmd = format!(
        "{}while [ ! -e '{}' ]; do sleep 0.1; done; echo survived",
        h.count(),
        go.display()
    );
    let mut call = PyCall::start(
        &s.url(),
        &tok,
        "run_command",
        &json!({"destination": "127.0.0.1", "command": cmd}),
    );
    assert_eq!(call.next()["event"], "initialized");
    let id = h.wait_started();
    s.kill9();
    // A new server on the same journal and port, before the client's reconnect.
    let s2 = Server::start(&h, port, &[]);
    std::fs::write(&go, "").unwrap();
    let last = call.finish();
    let v = &last["structured"];
    assert_eq!(v["execution_id"], id.as_str(), "{last}\n{}", s2.log());
    assert_eq!(v["state"], "completed", "{last}");
    assert_eq!(v["stdout"], "survived\n");
    assert_eq!(
        last["sent"]["tools_call_posts"], 1,
        "no second tools/call: {last}"
    );
    assert_eq!(h.runs(), 1, "the command ran once");
    assert_eq!(h.executions(), 1);
    // The restarted server answered from the journal: an attach by ID, correlated to the
    // original request.
    let corr: Vec<Value> = h
        .journal()
        .events(&cairn::ExecutionId::parse(&id).unwrap())
        .unwrap()
        .into_iter()
        .filter(|e| e.kind == "correlation")
        .map(|e| e.evidence)
        .collect();
    assert_eq!(corr.len(), 2, "{corr:?}");
    assert_eq!(corr[1]["method"], "attach");
    assert_eq!(corr[0]["correlation_id"], corr[1]["correlation_id"]);
}

/// An rmcp HTTP client's call in flight across `kill -9` and a restart of the server.
async fn rmcp_across_a_restart() -> (Host, String) {
    use rmcp::model::CallToolRequestParams;
    use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
    use rmcp::transport::StreamableHttpClientTransport;
    use rmcp::ServiceExt;
    let h = Host::new();
    let tok = token(&h, "agent:rs", &[]);
    let port = free_port();
    let mut s = tokio::task::block_in_place(|| Server::start(&h, port, &[]));
    let cfg = StreamableHttpClientTransportConfig::with_uri(s.url()).auth_header(tok);
    assert!(cfg.reinit_on_expired_session, "the client's default");
    let client = ().serve(StreamableHttpClientTransport::from_config(cfg)).await.unwrap();
    let go = h.sshd.dir().join("go");
    let cmd = format!(
        "{}while [ ! -e '{}' ]; do sleep 0.1; done; echo rmcp-once",
        h.count(),
        go.display()
    );
    let call = CallToolRequestParams::new("run_command").with_arguments(
        json!({"destination": "127.0.0.1", "command": cmd})
            .as_object()
            .unwrap()
            .clone(),
    );
    let pending = tokio::spawn(async move {
        let r = tokio::time::timeout(T, client.call_tool(call)).await;
        (r, client)
    });
    let hh = &h;
    let id = tokio::task::block_in_place(|| hh.wait_started());
    s.kill9();
    let s2 = tokio::task::block_in_place(|| Server::start(&h, port, &[]));
    std::fs::write(&go, "").unwrap();
    let (r, client) = pending.await.unwrap();
    let r = r.expect("answered in time").expect("tools/call");
    let v = r.structured_content.clone().expect("structured content");
    assert_eq!(v["execution_id"], id.as_str(), "{v}\n{}", s2.log());
    assert_eq!(v["state"], "completed", "{v}");
    assert_eq!(v["stdout"], "rmcp-once\n");
    assert_eq!(h.runs(), 1, "the command ran once");
    assert_eq!(h.executions(), 1);
    let _ = client.cancel().await;
    (h, id)
}

fn correlations(h: &Host, id: &str) -> Vec<Value> {
    h.journal()
        .events(&cairn::ExecutionId::parse(id).unwrap())
        .unwrap()
        .into_iter()
        .filter(|e| e.kind == "correlation" || e.kind == "intent-matched")
        .map(|e| json!({"kind": e.kind, "evidence": e.evidence}))
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn rmcp_http_client_resumes_across_a_server_kill_and_restart_and_gets_the_one_result() {
    let (h, id) = rmcp_across_a_restart().await;
    let c = correlations(&h, &id);
    // The session was restored: the client resumed its stream, the new server answered it
    // from the journal by attaching to the execution by ID. No second tools/call.
    assert_eq!(c.len(), 2, "{c:?}");
    assert_eq!(c[1]["evidence"]["method"], "attach", "{c:?}");
}

// ----- 2026-07-28 with the tasks extension, by hand-written requests --------------------------

/// One MCP request of the 2026-07-28 revision (no session; protocol version, client info and
/// capabilities in `_meta`), declaring the tasks extension; the JSON-RPC response.
pub(crate) fn mcp_2026(port: u16, token: &str, id: u64, method: &str, params: Value) -> Value {
    let (headers, body) = request_2026(token, id, method, params, true);
    let h: Vec<(&str, &str)> = headers.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let (status, text) = request(port, "POST", "/mcp", &h, &body);
    // JSON (an error may come with a 4xx status), or SSE whose data lines carry the messages:
    // the one with our id.
    assert!(status == 200 || status == 400, "{method}: {status} {text}");
    if let Ok(v) = serde_json::from_str::<Value>(&text) {
        return v;
    }
    text.lines()
        .filter_map(|l| l.strip_prefix("data:"))
        .filter_map(|d| serde_json::from_str::<Value>(d.trim()).ok())
        .find(|m| m["id"] == id)
        .unwrap_or_else(|| panic!("{method}: no response in {text:?}"))
}

/// The headers and body of a 2026-07-28 request (`tasks`: declare the tasks extension).
pub(crate) fn request_2026(
    token: &str,
    id: u64,
    method: &str,
    mut params: Value,
    tasks: bool,
) -> (Vec<(&'static str, String)>, String) {
    let caps = if tasks {
        json!({"extensions": {"io.modelcontextprotocol/tasks": {}}})
    } else {
        json!({})
    };
    params["_meta"] = json!({
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientInfo": {"name": "hand-written", "version": "0"},
        "io.modelcontextprotocol/clientCapabilities": caps
    });
    // Mcp-Name: the tool's name, or the task's ID.
    let name = params["name"]
        .as_str()
        .or(params["taskId"].as_str())
        .unwrap_or_default()
        .to_owned();
    let body = json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params});
    let mut headers = vec![
        (MCP_ACCEPT.0, MCP_ACCEPT.1.to_owned()),
        (JSON.0, JSON.1.to_owned()),
        ("Authorization", format!("Bearer {token}")),
        ("MCP-Protocol-Version", "2026-07-28".to_owned()),
        ("Mcp-Method", method.to_owned()),
    ];
    if !name.is_empty() {
        headers.push(("Mcp-Name", name));
    }
    (headers, body.to_string())
}

pub(crate) fn task_of(port: u16, token: &str, task: &str) -> Value {
    let r = mcp_2026(port, token, 90, "tasks/get", json!({"taskId": task}));
    assert!(r.get("result").is_some(), "{r}");
    r["result"].clone()
}

// Create, poll, kill -9, restart, poll, complete; then create and cancel: one story.
#[test]
fn tasks_are_executions_durable_across_kill_and_restart_and_cancelled_as_cairn_cancel() {
    let h = Host::new();
    let tok = token(&h, "agent:tasks", &[]);
    let other = token(&h, "agent:other", &[]);
    let port = free_port();
    let mut s = Server::start(&h, port, &[]);
    let go = h.sshd.dir().join("go");
    let cmd = format!(
        "{}while [ ! -e '{}' ]; do sleep 0.1; done; echo task-done",
        h.count(),
        go.display()
    );
    let r = mcp_2026(
        port,
        &tok,
        1,
        "tools/call",
        json!({"name": "run_command", "arguments": {"destination": "127.0.0.1", "command": cmd}}),
    );
    let created = &r["result"];
    assert_eq!(created["resultType"], "task", "{r}");
    assert_eq!(created["status"], "working", "{r}");
    let task = created["taskId"].as_str().unwrap().to_owned();
    // The task ID is the execution ID, accepted durably before it was returned.
    assert!(task.starts_with("ex_"), "{task}");
    assert!(h.kinds(&task).contains(&"accepted".to_owned()));
    assert_eq!(
        created["ttlMs"], 86_400_000,
        "remote-command retention: {r}"
    );
    let id = h.wait_started();
    assert_eq!(id, task);
    assert_eq!(task_of(port, &tok, &task)["status"], "working");
    // Another actor's task does not exist for it.
    let r = mcp_2026(port, &other, 91, "tasks/get", json!({"taskId": task}));
    assert!(r.get("error").is_some(), "{r}");

    s.kill9();
    let _s2 = Server::start(&h, port, &[]);
    let t = task_of(port, &tok, &task);
    assert_eq!(t["status"], "working", "still running on the host: {t}");
    std::fs::write(&go, "").unwrap();
    let t = wait_for("the task completed", T, || {
        let t = task_of(port, &tok, &task);
        (t["status"] != "working").then_some(t)
    });
    assert_eq!(t["status"], "completed", "{t}");
    let v = &t["result"]["structuredContent"];
    assert_eq!(v["execution_id"], task.as_str(), "{t}");
    assert_eq!(v["exit_code"], 0, "{t}");
    assert_eq!(v["stdout"], "task-done\n", "{t}");
    assert_eq!(h.runs(), 1, "ran once");

    // Cancel: the remote process group is stopped and the task says cancelled.
    let cmd2 = format!("{}sleep 300; echo never", h.count());
    let r = mcp_2026(
        port,
        &tok,
        2,
        "tools/call",
        json!({"name": "run_command", "arguments": {"destination": "127.0.0.1", "command": cmd2}}),
    );
    let task2 = r["result"]["taskId"].as_str().unwrap().to_owned();
    wait_for("the second started", T, || (h.runs() == 2).then_some(()));
    let ack = mcp_2026(port, &tok, 3, "tasks/cancel", json!({"taskId": task2}));
    assert!(ack.get("result").is_some(), "{ack}");
    let t = wait_for("the task cancelled", T, || {
        let t = task_of(port, &tok, &task2);
        (t["status"] != "working").then_some(t)
    });
    assert_eq!(t["status"], "cancelled", "{t}");
    assert_eq!(h.state(&task2), cairn::State::Cancelled);
    assert_eq!(h.runs(), 2);
    assert_eq!(h.executions(), 2);
}

/// Send a 2026-07-28 `tools/call` without the tasks extension; the connection its response
/// comes on.
fn send_2026(s: &Server, tok: &str, id: u64, call: &Value) -> TcpStream {
    let (headers, body) = request_2026(tok, id, "tools/call", call.clone(), false);
    let mut st = TcpStream::connect(("127.0.0.1", s.port)).unwrap();
    let mut req = format!(
        "POST /mcp HTTP/1.1\r\nHost: 127.0.0.1:{}\r\nConnection: close\r\nContent-Length: {}\r\n",
        s.port,
        body.len()
    );
    for (k, v) in &headers {
        req += &format!("{k}: {v}\r\n");
    }
    req += "\r\n";
    req += &body;
    st.write_all(req.as_bytes()).unwrap();
    st.set_read_timeout(Some(T)).unwrap();
    st
}

/// The response to a 2026-07-28 request sent with `send_2026` (`id`): JSON or SSE.
fn response_2026(mut st: TcpStream, id: u64) -> Value {
    let mut text = String::new();
    let _ = st.read_to_string(&mut text);
    let (_, body) = text.split_once("\r\n\r\n").unwrap_or(("", &text));
    let body = if text
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        dechunk(body)
    } else {
        body.to_owned()
    };
    body.lines()
        .filter_map(|l| l.strip_prefix("data:"))
        .filter_map(|d| serde_json::from_str::<Value>(d.trim()).ok())
        .find(|m| m["id"] == id)
        .or_else(|| serde_json::from_str(&body).ok())
        .unwrap_or_else(|| panic!("no response: {text}"))
}

#[test]
fn a_stream_closed_before_the_dispatch_sends_nothing_and_the_same_call_again_runs_once() {
    let h = Host::new();
    let tok = token(&h, "agent:early", &[]);
    let s = Server::start(&h, 0, &[]);
    // A first call leaves the server a pooled connection to the host.
    let warm = json!({"name": "run_command",
                      "arguments": {"destination": "127.0.0.1", "command": "echo warm"}});
    let r = response_2026(send_2026(&s, &tok, 1, &warm), 1);
    assert_eq!(r["result"]["structuredContent"]["stdout"], "warm\n", "{r}");
    // A call to a marker home this server has not seen yet: before its dispatch, its first
    // contact with that home (the host's epoch there) is slow, as the host holds its bytes.
    let home = format!("{}-other", h.remote_dir.display());
    let cmd = format!("{}echo late", h.count());
    let call = json!({"name": "run_command",
                      "arguments": {"destination": "127.0.0.1", "command": cmd, "remote_dir": home}});
    h.proxy.pause_downstream(true);
    let st = send_2026(&s, &tok, 2, &call);
    wait_for("the call accepted", T, || {
        (h.executions() == 2).then_some(())
    });
    // The client gives up before anything was dispatched: its stream closes.
    drop(st);
    wait_for("the server seeing the stream closed", T, || {
        s.log().contains("closed before any dispatch").then_some(())
    });
    h.proxy.pause_downstream(false);
    // The execution reaches its dispatch boundary, finds its caller gone, and sends nothing.
    let (id, state) = wait_for("the execution concluded", T, || {
        let l = h.journal().list().unwrap();
        l.into_iter()
            .find(|(r, st)| st.state.is_settled() && r.remote_dir == home)
            .map(|(r, st)| (r.id.to_string(), st.state))
    });
    assert_eq!(state, cairn::State::Failed, "{}", s.log());
    let events = h
        .journal()
        .events(&cairn::ExecutionId::parse(&id).unwrap())
        .unwrap();
    let kinds: Vec<&str> = events.iter().map(|e| e.kind.as_str()).collect();
    assert!(!kinds.contains(&"dispatched"), "{kinds:?}");
    let reason = events.last().unwrap().evidence["reason"].to_string();
    assert!(
        reason.contains("response stream closed before the dispatch; nothing was sent"),
        "{reason}"
    );
    assert_eq!(h.runs(), 0, "nothing ran");
    // Proven never started: the same call sent again is a new execution, and runs once.
    let r = response_2026(send_2026(&s, &tok, 3, &call), 3);
    let v = &r["result"]["structuredContent"];
    assert_eq!(v["state"], "completed", "{r}");
    assert_eq!(v["stdout"], "late\n", "{r}");
    assert_ne!(v["execution_id"], id.as_str(), "{r}");
    assert_eq!(h.runs(), 1, "ran once");
    assert_eq!(h.executions(), 3);
}

#[test]
fn a_served_call_s_log_lines_carry_its_execution_id_and_never_a_token() {
    let h = Host::new();
    let tok = token(&h, "agent:logs", &[]);
    let s = Server::start(&h, 0, &[]);
    let go = h.sshd.dir().join("go");
    let cmd = format!(
        "{}while [ ! -e '{}' ]; do sleep 0.1; done; echo logged",
        h.count(),
        go.display()
    );
    let call = json!({"name": "run_command",
                      "arguments": {"destination": "127.0.0.1", "command": cmd}});
    let st = send_2026(&s, &tok, 1, &call);
    let id = h.wait_started();
    // The connection to the host is lost mid-run: the executor reconnects, and says so.
    h.proxy.cut();
    wait_for("the reconnect in the log", T, || {
        s.log().contains("reconnected to").then_some(())
    });
    std::fs::write(&go, "").unwrap();
    let r = response_2026(st, 1);
    assert_eq!(
        r["result"]["structuredContent"]["stdout"], "logged\n",
        "{r}"
    );
    assert_eq!(h.runs(), 1);
    let log = s.log();
    let about: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("reconnect") || l.contains("unreachable"))
        .collect();
    assert!(!about.is_empty(), "{log}");
    for l in about {
        assert!(
            l.contains(&format!("execution_id={id}")) && l.contains("call{actor=agent:logs"),
            "a line about the execution without its ID or caller: {l}"
        );
    }
    assert!(!log.contains(&tok[6..]), "a token in the log: {log}");
}

// Create, poll to completed; create, cancel: a named operation's call is a task too.
#[test]
fn a_named_operation_called_as_a_task_is_its_execution_polled_and_cancelled_by_hand() {
    let h = Host::new();
    let tok = token(&h, "agent:ops", &[]);
    let go = h.sshd.dir().join("go");
    let ops = h.sshd.dir().join("operations.toml");
    std::fs::write(
        &ops,
        format!(
            r#"
[operations.wait_note]
description = "Wait for the go file, then print a note"
class = "read-only"
hosts = ["127.0.0.1"]
argv = ["sh", "-c", "echo ran >> '{counter}'; while [ ! -e \"$2\" ]; do sleep 0.1; done; printf '%s' \"$1\"", "wait_note", "{{note}}", "{{gate}}"]

[operations.wait_note.args]
note = {{ type = "string", pattern = "^[a-z-]+$" }}
gate = {{ type = "string", pattern = "^/[a-zA-Z0-9/._-]+$" }}
"#,
            counter = h.counter.display()
        ),
    )
    .unwrap();
    let s = Server::start(&h, 0, &["--operations", ops.to_str().unwrap()]);
    let call = |id: u64, note: &str, gate: &str| {
        mcp_2026(
            s.port,
            &tok,
            id,
            "tools/call",
            json!({"name": "wait_note", "arguments": {"note": note, "gate": gate}}),
        )
    };
    let r = call(1, "op-task-done", go.to_str().unwrap());
    let created = &r["result"];
    assert_eq!(created["resultType"], "task", "{r}");
    assert_eq!(created["status"], "working", "{r}");
    let task = created["taskId"].as_str().unwrap().to_owned();
    assert!(
        task.starts_with("ex_"),
        "the task ID is the execution ID: {task}"
    );
    let id = h.wait_started();
    assert_eq!(id, task);
    assert_eq!(task_of(s.port, &tok, &task)["status"], "working");
    std::fs::write(&go, "").unwrap();
    let t = wait_for("the task completed", T, || {
        let t = task_of(s.port, &tok, &task);
        (t["status"] != "working").then_some(t)
    });
    assert_eq!(t["status"], "completed", "{t}");
    let v = &t["result"]["structuredContent"];
    assert_eq!(v["execution_id"], task.as_str(), "{t}");
    assert_eq!(v["stdout"], "op-task-done", "{t}");
    assert_eq!(h.runs(), 1);

    let never = h.sshd.dir().join("never");
    let r = call(2, "cancelled", never.to_str().unwrap());
    let task2 = r["result"]["taskId"].as_str().unwrap().to_owned();
    wait_for("the second started", T, || (h.runs() == 2).then_some(()));
    let ack = mcp_2026(s.port, &tok, 3, "tasks/cancel", json!({"taskId": task2}));
    assert!(ack.get("result").is_some(), "{ack}");
    let t = wait_for("the task cancelled", T, || {
        let t = task_of(s.port, &tok, &task2);
        (t["status"] != "working").then_some(t)
    });
    assert_eq!(t["status"], "cancelled", "{t}");
    assert_eq!(h.state(&task2), cairn::State::Cancelled);
    assert_eq!((h.runs(), h.executions()), (2, 2));
}

/// A 2026-07-28 call without the tasks extension whose stream is closed once the command has
/// started; its execution ID, once `delivery-abandoned` is recorded.
fn close_mid_call(h: &Host, s: &Server, tok: &str, call: &Value) -> String {
    let st = send_2026(s, tok, 1, call);
    let id = h.wait_started();
    drop(st);
    wait_for("delivery-abandoned", T, || {
        h.kinds(&id)
            .contains(&"delivery-abandoned".to_owned())
            .then_some(())
    });
    id
}

#[test]
fn a_class_set_to_cancel_on_a_closed_stream_is_cancelled_as_cairn_cancel() {
    let h = Host::new();
    let tok = token(&h, "agent:closer", &[]);
    let s = Server::start(&h, 0, &["--cancel-on-closed-stream", "read-only"]);
    let cmd = format!("{}sleep 300; echo never", h.count());
    let call = json!({"name": "run_command",
                      "arguments": {"destination": "127.0.0.1", "command": cmd, "class": "read-only"}});
    let id = close_mid_call(&h, &s, &tok, &call);
    wait_for("cancelled", T, || {
        (h.state(&id) == cairn::State::Cancelled).then_some(())
    });
    assert_eq!(h.runs(), 1);
}

#[test]
fn a_closed_stream_cancels_the_request_not_the_dispatched_command_and_a_resend_attaches() {
    let h = Host::new();
    let tok = token(&h, "agent:closer", &[]);
    let s = Server::start(&h, 0, &[]);
    let go = h.sshd.dir().join("go");
    let cmd = format!(
        "{}while [ ! -e '{}' ]; do sleep 0.1; done; echo kept",
        h.count(),
        go.display()
    );
    let call = json!({"name": "run_command",
                      "arguments": {"destination": "127.0.0.1", "command": cmd}});
    let id = close_mid_call(&h, &s, &tok, &call);
    // The command was not killed: it finishes when released, and its result is recorded.
    std::fs::write(&go, "").unwrap();
    h.wait_done(&id);
    // The same call again attaches to it and gets its result: it ran once.
    let (headers, body) = request_2026(&tok, 2, "tools/call", call, false);
    let hv: Vec<(&str, &str)> = headers.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let (status, text) = request(s.port, "POST", "/mcp", &hv, &body);
    assert_eq!(status, 200, "{text}");
    let r: Value = text
        .lines()
        .filter_map(|l| l.strip_prefix("data:"))
        .filter_map(|d| serde_json::from_str::<Value>(d.trim()).ok())
        .find(|m| m["id"] == 2)
        .or_else(|| serde_json::from_str(&text).ok())
        .unwrap_or_else(|| panic!("no response: {text}"));
    let v = &r["result"]["structuredContent"];
    assert_eq!(v["execution_id"], id.as_str(), "{r}");
    assert_eq!(v["attached"], true, "{r}");
    assert_eq!(v["stdout"], "kept\n", "{r}");
    assert_eq!(h.runs(), 1, "ran once");
    let kinds = h.kinds(&id);
    assert!(!kinds.contains(&"cancelled".to_owned()), "{kinds:?}");
    // The investigator sees the later request, by intent, with its actor and correlation.
    let out = Command::new(BIN)
        .args(["audit", "show", &id, "--json", "--journal"])
        .arg(&h.journal)
        .output()
        .unwrap();
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    let fifth = v["answers"][4]["answer"].as_str().unwrap().to_owned();
    assert!(
        fifth.starts_with("1 later request(s) attached")
            && fifth.contains("by intent")
            && fifth.contains("actor agent:closer, correlation actor=agent:closer request=2"),
        "{fifth}"
    );
    let m = metrics(s.port, &tok);
    assert_eq!(m["cairn_delivery_abandoned_total"], 1.0, "{m:?}");
    assert_eq!(m["cairn_attaches_total{by=\"intent\"}"], 1.0, "{m:?}");
}

#[test]
fn over_tls_the_python_sdk_gets_the_same_tools_and_plain_http_is_not_answered() {
    let h = Host::new();
    let tok = token(&h, "agent:tls", &[]);
    let dir = h.sshd.dir();
    let (cert, key) = (dir.join("cert.pem"), dir.join("key.pem"));
    let out = Command::new("openssl")
        .args([
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
        ])
        .args(["-nodes", "-days", "1", "-subj", "/CN=localhost"])
        .args(["-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1"])
        .arg("-keyout")
        .arg(&key)
        .arg("-out")
        .arg(&cert)
        .output()
        .expect("openssl");
    assert!(out.status.success(), "{out:?}");
    let (c, k) = (cert.display().to_string(), key.display().to_string());
    let s = Server::start(&h, 0, &["--tls-cert", &c, "--tls-key", &k]);
    assert!(s.log().contains("https://"), "{}", s.log());
    let url = format!("https://127.0.0.1:{}/mcp", s.port);
    let cmd = format!("{}echo over-tls", h.count());
    let mut call = PyCall::start_with_ca(
        &url,
        &tok,
        "run_command",
        &json!({"destination": "127.0.0.1", "command": cmd}),
        Some(&cert),
    );
    assert_eq!(call.next()["event"], "initialized");
    let last = call.finish();
    assert_eq!(last["structured"]["stdout"], "over-tls\n", "{last}");
    assert_eq!(h.runs(), 1);
    // Plain HTTP to the TLS port gets no HTTP answer.
    let mut st = TcpStream::connect(("127.0.0.1", s.port)).unwrap();
    st.write_all(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
        .unwrap();
    let mut resp = Vec::new();
    let _ = st.read_to_end(&mut resp);
    assert!(
        !resp.starts_with(b"HTTP/1.1 200"),
        "{:?}",
        String::from_utf8_lossy(&resp)
    );
}

#[test]
fn after_kill_and_restart_a_new_python_client_sending_the_same_call_attaches_and_it_runs_once() {
    let h = Host::new();
    let tok = token(&h, "agent:py", &[]);
    let port = free_port();
    let mut s = Server::start(&h, port, &[]);
    let go = h.sshd.dir().join("go");
    let cmd = format!(
        "{}while [ ! -e '{}' ]; do sleep 0.1; done; echo once",
        h.count(),
        go.display()
    );
    let args = json!({"destination": "127.0.0.1", "command": cmd});
    let mut first = PyCall::start(&s.url(), &tok, "run_command", &args);
    assert_eq!(first.next()["event"], "initialized");
    let id = h.wait_started();
    // The server dies, and so does its client (a gateway restart).
    s.kill9();
    let _ = first.child.kill();
    let _ = first.child.wait();
    let s2 = Server::start(&h, port, &[]);
    let mut again = PyCall::start(&s2.url(), &tok, "run_command", &args);
    assert_eq!(again.next()["event"], "initialized");
    std::fs::write(&go, "").unwrap();
    let last = again.finish();
    let v = &last["structured"];
    assert_eq!(v["execution_id"], id.as_str(), "{last}");
    assert_eq!(v["attached"], true, "{last}");
    assert_eq!(v["stdout"], "once\n", "{last}");
    assert_eq!(h.runs(), 1, "the command ran once");
    assert_eq!(h.executions(), 1);
}

#[tokio::test(flavor = "multi_thread")]
async fn rmcp_client_reinitialising_after_its_session_is_gone_resends_and_attaches() {
    use rmcp::model::CallToolRequestParams;
    use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
    use rmcp::transport::StreamableHttpClientTransport;
    use rmcp::ServiceExt;
    let h = Host::new();
    let tok = token(&h, "agent:rs", &[]);
    let port = free_port();
    let mut s = tokio::task::block_in_place(|| Server::start(&h, port, &[]));
    let cfg = StreamableHttpClientTransportConfig::with_uri(s.url()).auth_header(tok);
    let client = ().serve(StreamableHttpClientTransport::from_config(cfg)).await.unwrap();
    let go = h.sshd.dir().join("go");
    let cmd = format!(
        "{}while [ ! -e '{}' ]; do sleep 0.1; done; echo reinit-once",
        h.count(),
        go.display()
    );
    let call = || {
        CallToolRequestParams::new("run_command").with_arguments(
            json!({"destination": "127.0.0.1", "command": cmd})
                .as_object()
                .unwrap()
                .clone(),
        )
    };
    // The agent gives up waiting on its first call once it runs (the command runs on; not after
    // a fixed time: on a loaded machine the dispatch may take longer than any guess).
    let id = tokio::select! {
        r = client.call_tool(call()) => panic!("the first call should still be running: {r:?}"),
        id = h.started() => id,
    };
    // The server is killed, and comes back without the client's session (as when it expired).
    s.kill9();
    let c = rusqlite::Connection::open(&h.journal).unwrap();
    c.execute("DELETE FROM http_sessions", []).unwrap();
    let _s2 = tokio::task::block_in_place(|| Server::start(&h, port, &[]));
    std::fs::write(&go, "").unwrap();
    // The agent tries again: its POST gets 404, the client initialises a new session and sends
    // the call again by itself; the same intent attaches.
    let r = tokio::time::timeout(T, client.call_tool(call()))
        .await
        .expect("answered in time")
        .expect("tools/call after re-initialisation");
    let v = r.structured_content.clone().expect("structured content");
    assert_eq!(v["execution_id"], id.as_str(), "{v}");
    assert_eq!(v["attached"], true, "{v}");
    assert_eq!(v["stdout"], "reinit-once\n", "{v}");
    assert_eq!(h.runs(), 1, "the command ran once");
    assert_eq!(h.executions(), 1);
    let sessions: i64 = c
        .query_row("SELECT COUNT(*) FROM http_sessions", [], |r| r.get(0))
        .unwrap();
    assert_eq!(
        sessions, 1,
        "a new session, made by the client's re-initialisation"
    );
    let _ = client.cancel().await;
}

#[test]
fn past_its_cap_of_calls_in_flight_an_actor_is_refused_and_nothing_starts() {
    let h = Host::new();
    let alice = token(&h, "agent:alice", &[]);
    let bob = token(&h, "agent:bob", &[]);
    let s = Server::start(&h, 0, &["--max-in-flight", "1"]);
    let go = h.sshd.dir().join("go");
    let waiting = format!(
        "{}while [ ! -e '{}' ]; do sleep 0.1; done; echo first",
        h.count(),
        go.display()
    );
    let execute = |id: u64, cmd: &str| {
        json!({"jsonrpc": "2.0", "id": id, "method": "execute",
               "params": {"destination": "127.0.0.1", "command": cmd}})
        .to_string()
    };
    let port = s.port;
    let (a1, body1) = (format!("Bearer {alice}"), execute(1, &waiting));
    let first = std::thread::spawn(move || {
        request(
            port,
            "POST",
            "/rpc",
            &[JSON, ("Authorization", &a1)],
            &body1,
        )
    });
    h.wait_started();
    // Alice's second call, while her first runs: refused, with the reason, and not started.
    let a2 = format!("Bearer {alice}");
    let other = format!("{}echo second", h.count());
    let (_, text) = request(
        port,
        "POST",
        "/rpc",
        &[JSON, ("Authorization", &a2)],
        &execute(2, &other),
    );
    let r: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(r["error"]["code"], -32005, "{r}");
    let msg = r["error"]["message"].as_str().unwrap();
    assert!(
        msg.contains("agent:alice") && msg.contains("1 calls in flight"),
        "{msg}"
    );
    assert_eq!(h.executions(), 1, "the refused call was not even accepted");
    // Bob has a cap of his own.
    let b = format!("Bearer {bob}");
    let (_, text) = request(
        port,
        "POST",
        "/rpc",
        &[JSON, ("Authorization", &b)],
        &execute(3, &other),
    );
    let r: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(r["result"]["stdout"], "second\n", "{r}");
    std::fs::write(&go, "").unwrap();
    let (_, text) = first.join().unwrap();
    let r: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(r["result"]["stdout"], "first\n", "{r}");
    assert_eq!(h.runs(), 2);
}

// ----- Bad input over HTTP: a clear JSON-RPC error, nothing left behind -----------------------

fn token_id(h: &Host, actor: &str) -> String {
    let ls = token_cmd(h, &["ls", "--json"]);
    let tokens: Value = serde_json::from_slice(&ls.stdout).unwrap();
    tokens
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["actor"] == actor)
        .unwrap()["id"]
        .as_str()
        .unwrap()
        .to_owned()
}

/// The error of a JSON-RPC response, checked to be one.
fn rpc_error_of(v: &Value) -> (i64, String) {
    let e = v
        .get("error")
        .unwrap_or_else(|| panic!("an error, not {v}"));
    (
        e["code"].as_i64().unwrap(),
        e["message"].as_str().unwrap().to_owned(),
    )
}

// One server, every kind of bad input in turn; after each, the journal holds no new event
// (refusals of a token excepted: they are recorded in the server's session, by design).
#[test]
fn bad_input_over_http_gets_a_clear_json_rpc_error_and_leaves_nothing_behind() {
    let h = Host::new();
    let tok = token(&h, "agent:bad", &[]);
    let other = token(&h, "agent:other", &[]);
    let s = Server::start(&h, 0, &["--max-body", "4096"]);
    let port = s.port;
    let j = h.journal();
    // A real task of agent:bad, to ask about.
    let r = mcp_2026(
        port,
        &tok,
        1,
        "tools/call",
        json!({"name": "run_command", "arguments":
               {"destination": "127.0.0.1", "command": format!("{}echo mine", h.count())}}),
    );
    let task = r["result"]["taskId"].as_str().unwrap().to_owned();
    wait_for("the task completed", T, || {
        (task_of(port, &tok, &task)["status"] == "completed").then_some(())
    });
    let quiet = || j.last_event_seq().unwrap();
    let before = quiet();

    // An unknown task ID, another actor's task, and malformed IDs: -32602, as the tasks
    // extension reserves for task IDs a caller may not see. Another actor's task reads as
    // unknown: the answer does not tell that it exists.
    let unknown = "ex_01a25099000000000000000000000000";
    for (who, id) in [
        (&tok, json!(unknown)),
        (&other, json!(task)),
        (&tok, json!("../../etc/passwd")),
        (&tok, json!("")),
        (&tok, json!(42)),
    ] {
        let r = mcp_2026(port, who, 5, "tasks/get", json!({"taskId": id}));
        let (code, msg) = rpc_error_of(&r);
        assert_eq!(code, -32602, "{id}: {r}");
        assert!(
            !msg.contains("/tmp/"),
            "no server paths in an answer: {msg}"
        );
        let r = mcp_2026(port, who, 6, "tasks/cancel", json!({"taskId": id}));
        assert_eq!(rpc_error_of(&r).0, -32602, "{id}: {r}");
    }
    let (_, m_other) = rpc_error_of(&mcp_2026(
        port,
        &other,
        7,
        "tasks/get",
        json!({"taskId": task}),
    ));
    let (_, m_unknown) = rpc_error_of(&mcp_2026(
        port,
        &other,
        8,
        "tasks/get",
        json!({"taskId": unknown}),
    ));
    assert_eq!(
        m_other.replace(&task, "ID"),
        m_unknown.replace(unknown, "ID"),
        "another actor's task and an unknown one read the same"
    );
    assert_eq!(quiet(), before, "nothing recorded");

    // A routing header that disagrees with the body: -32020, HTTP 400, nothing runs.
    let (mut headers, body) = request_2026(
        &tok,
        9,
        "tools/call",
        json!({"name": "run_command", "arguments":
               {"destination": "127.0.0.1", "command": format!("{}echo never", h.count())}}),
        false,
    );
    for (k, v) in headers.iter_mut() {
        if *k == "Mcp-Name" {
            *v = "read_output".into();
        }
    }
    let hs: Vec<(&str, &str)> = headers.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let (status, text) = request(port, "POST", "/mcp", &hs, &body);
    assert_eq!(status, 400, "{text}");
    let v: Value = serde_json::from_str(&text).unwrap();
    let (code, msg) = rpc_error_of(&v);
    assert_eq!(code, -32020, "{v}");
    assert!(msg.contains("Mcp-Name"), "{msg}");
    assert_eq!(v["id"], 9, "{v}");

    // A body over the limit: 413 with a JSON-RPC error that says the limit.
    let big = json!({"jsonrpc": "2.0", "id": 10, "method": "tools/call", "params": {
        "name": "run_command", "arguments": {"destination": "127.0.0.1",
        "command": format!("echo {}", "x".repeat(8192))}}})
    .to_string();
    let bearer = format!("Bearer {tok}");
    let hs = [MCP_ACCEPT, JSON, ("Authorization", bearer.as_str())];
    let (status, text) = request(port, "POST", "/mcp", &hs, &big);
    assert_eq!(status, 413, "{text}");
    let v: Value = serde_json::from_str(&text).unwrap();
    let (code, msg) = rpc_error_of(&v);
    assert_eq!(code, -32600, "{v}");
    assert!(msg.contains("4096"), "{msg}");
    // The same on /rpc.
    let (status, text) = request(port, "POST", "/rpc", &hs, &big);
    assert_eq!(status, 413, "{text}");
    let v: Value = serde_json::from_str(&text).unwrap();
    assert!(rpc_error_of(&v).1.contains("4096"), "{v}");
    // A body that is not JSON: 400, parse error.
    let (status, text) = request(port, "POST", "/mcp", &hs, "{not json");
    assert_eq!(status, 400, "{text}");
    assert_eq!(
        rpc_error_of(&serde_json::from_str(&text).unwrap()).0,
        -32700
    );
    assert_eq!(quiet(), before, "nothing recorded");
    assert_eq!(h.runs(), 1, "only the first task ran");
    assert_eq!(h.executions(), 1);

    // The token of a revoked actor, on the task it created: 401, the task untouched.
    token_cmd(&h, &["revoke", &token_id(&h, "agent:bad")]);
    let (headers, body) = request_2026(&tok, 11, "tasks/get", json!({"taskId": task}), true);
    let hs: Vec<(&str, &str)> = headers.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let (status, text) = request(port, "POST", "/mcp", &hs, &body);
    assert_eq!(status, 401, "{text}");
    assert!(text.contains("revoked"), "{text}");
    assert_eq!(h.state(&task), cairn::State::Delivered);
    assert_eq!(h.executions(), 1);
}

// Two agents behind one token send their first tools/call with the same JSON-RPC id at the same
// time (2026-07-28: no session, each its own connection): each gets its own task, whose result
// is its own command's.
#[test]
fn two_calls_of_one_actor_with_the_same_request_id_each_get_their_own_task() {
    let h = Host::new();
    let tok = token(&h, "agent:twins", &[]);
    let s = Server::start(&h, 0, &[]);
    let go = h.sshd.dir().join("go");
    let port = s.port;
    let calls: Vec<_> = ["left", "right"]
        .into_iter()
        .map(|word| {
            let cmd = format!(
                "{}while [ ! -e '{}' ]; do sleep 0.1; done; echo {word}",
                h.count(),
                go.display()
            );
            let tok = tok.clone();
            std::thread::spawn(move || {
                let r = mcp_2026(
                    port,
                    &tok,
                    1,
                    "tools/call",
                    json!({"name": "run_command",
                           "arguments": {"destination": "127.0.0.1", "command": cmd}}),
                );
                (word, r["result"]["taskId"].as_str().map(str::to_owned), r)
            })
        })
        .collect();
    let tasks: Vec<_> = calls.into_iter().map(|c| c.join().unwrap()).collect();
    std::fs::write(&go, "").unwrap();
    let mut ids = Vec::new();
    for (word, task, r) in tasks {
        let task = task.unwrap_or_else(|| panic!("{r}"));
        let t = wait_for("the task completed", T, || {
            let t = task_of(port, &tok, &task);
            (t["status"] != "working").then_some(t)
        });
        assert_eq!(
            t["result"]["structuredContent"]["stdout"],
            format!("{word}\n"),
            "{word}'s task is its own command's: {t}"
        );
        ids.push(task);
    }
    assert_ne!(ids[0], ids[1]);
    assert_eq!(h.runs(), 2);
    assert_eq!(h.executions(), 2);
}
