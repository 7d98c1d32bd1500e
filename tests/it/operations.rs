//! Named operations end to end against a real sshd: the seed's `deploy_release` through
//! `cairn serve --stdio` (`call`, `operations`), hostile values through `cairn op`, the official
//! Python MCP SDK against `cairn mcp --operations`, and `cairn ops check|doc`. Every test counts
//! how many times the operation's program really ran on the host.

use std::fs;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use cairn::ExecutionId;
use serde_json::{json, Value};

use crate::support::host::*;

const T: Duration = Duration::from_secs(60);

/// A program standing in for `/opt/deploy/bin/deploy`: counts its run, waits for the gate file
/// if there is one to wait for, then prints its arguments one a line.
fn deploy_program(h: &Host, gate: &Path) -> PathBuf {
    let p = h.sshd.dir().join("deploy");
    fs::write(
        &p,
        format!(
            "#!/bin/sh\necho ran >> '{}'\nwhile [ -e '{}.closed' ]; do sleep 0.05; done\nprintf '%s\\n' \"$@\"\n",
            h.counter.display(),
            gate.display()
        ),
    )
    .unwrap();
    let mut perm = fs::metadata(&p).unwrap().permissions();
    std::os::unix::fs::PermissionsExt::set_mode(&mut perm, 0o755);
    fs::set_permissions(&p, perm).unwrap();
    p
}

/// The seed's example (the issue's own `deploy_release`), with the program above, and an
/// `echo_note` whose note may hold anything (for the byte-for-byte check).
fn operations_file(h: &Host, gate: &Path) -> PathBuf {
    let program = deploy_program(h, gate);
    let text = format!(
        r#"
[operations.deploy_release]
description = "Deploy one release of a service"
class = "idempotent"
retention = "24h"
hosts = ["127.0.0.1"]
argv = ["{program}", "--service", "{{service}}", "--version", "{{version}}",
        "--region", "{{region}}", "--idempotency-key", "{{execution_id}}"]

[operations.deploy_release.args]
service = {{ type = "string", pattern = "^[a-z][a-z0-9-]{{0,40}}$" }}
version = {{ type = "string", pattern = "^[0-9]{{4}}[.][0-9]{{2}}[.][0-9]{{2}}$" }}
region  = {{ type = "string", enum = ["us-east-1", "eu-west-1"], default = "us-east-1" }}
reason  = {{ type = "string", required = false, fingerprint = false }}

[operations.echo_note]
description = "Print a note"
class = "read-only"
hosts = ["127.0.0.1"]
argv = ["sh", "-c", "echo ran >> '{counter}'; printf '%s|' \"$#\"; printf '%s' \"$1\"", "echo_note", "{{note}}"]

[operations.echo_note.args]
note = {{ type = "string", pattern = '^[\s\S]*$', max_len = 200000 }}
"#,
        program = program.display(),
        counter = h.counter.display(),
    );
    let p = h.sshd.dir().join("operations.toml");
    fs::write(&p, text).unwrap();
    p
}

struct Rpc {
    child: Child,
    stdin: Option<ChildStdin>,
    lines: mpsc::Receiver<String>,
    kept: Vec<Value>,
}

impl Rpc {
    fn start(h: &Host, extra: &[&str]) -> Rpc {
        let mut c = Command::new(BIN);
        c.arg("serve");
        h.conn_args(&mut c, "60s");
        c.arg("--stdio").arg("--remote-dir").arg(&h.remote_dir);
        c.args(extra);
        let mut child = c
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn cairn serve");
        let stdout = child.stdout.take().unwrap();
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Rpc {
            stdin: child.stdin.take(),
            child,
            lines: rx,
            kept: Vec::new(),
        }
    }

    fn send(&mut self, line: &str) {
        let s = self.stdin.as_mut().unwrap();
        s.write_all(line.as_bytes()).unwrap();
        s.write_all(b"\n").unwrap();
        s.flush().unwrap();
    }

    fn response(&mut self, id: &Value) -> Value {
        if let Some(i) = self.kept.iter().position(|v| &v["id"] == id) {
            return self.kept.remove(i);
        }
        let t0 = Instant::now();
        loop {
            let left = T.checked_sub(t0.elapsed()).expect("a response in time");
            let line = self.lines.recv_timeout(left).expect("a response line");
            let v: Value = serde_json::from_str(&line).expect("JSON");
            if &v["id"] == id {
                return v;
            }
            self.kept.push(v);
        }
    }

    fn call(&mut self, id: i64, method: &str, params: Value) -> Value {
        self.send(
            &json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}).to_string(),
        );
        self.response(&json!(id))
    }
}

impl Drop for Rpc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn intent_matches(h: &Host, id: &str) -> usize {
    h.kinds(id)
        .iter()
        .filter(|k| *k == "intent-matched")
        .count()
}

// Long: one scenario, its phases in order.
#[test]
fn deploy_release_spelled_four_ways_is_one_execution_that_ran_once() {
    let h = Host::new();
    let gate = h.sshd.dir().join("gate");
    fs::write(gate.with_extension("closed"), "").unwrap();
    let ops = operations_file(&h, &gate);
    let mut rpc = Rpc::start(&h, &["--operations", ops.to_str().unwrap()]);

    // The list names both operations, each with its contract.
    let list = rpc.call(1, "operations", json!({}));
    let names: Vec<&str> = list["result"]["operations"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| o["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["deploy_release", "echo_note"], "{list}");
    let deploy = &list["result"]["operations"][0];
    assert_eq!(deploy["contract"]["class"], "idempotent");
    assert_eq!(deploy["contract"]["retention_secs"], 86_400);
    assert_eq!(deploy["contract"]["other_arguments"], json!(["reason"]));

    // The first call waits at the gate; three more, spelled otherwise, arrive meanwhile.
    rpc.send(r#"{"jsonrpc":"2.0","id":10,"method":"call","params":{"operation":"deploy_release","arguments":{"service":"web","version":"2026.01.02"}}}"#);
    let id = h.wait_started();
    rpc.send("{ \"params\" : { \"arguments\" : { \"version\" : \"2026.01.02\" ,\t \"service\":\"web\" }, \"operation\" : \"deploy_release\" } , \"method\":\"call\",\"id\":11,\"jsonrpc\":\"2.0\" }");
    rpc.send(r#"{"jsonrpc":"2.0","id":12,"method":"call","params":{"operation":"deploy_release","arguments":{"service":"web","version":"2026.01.02","region":"us-east-1"}}}"#);
    rpc.send(r#"{"jsonrpc":"2.0","id":13,"method":"call","params":{"operation":"deploy_release","arguments":{"region":"US-East-1","service":"web","version":"2026.01.02","reason":"retry after a timeout"}}}"#);
    wait_for("three calls attached", T, || {
        (intent_matches(&h, &id) == 3).then_some(())
    });
    fs::remove_file(gate.with_extension("closed")).unwrap();
    for rid in 10..14 {
        let r = rpc.response(&json!(rid));
        let v = &r["result"];
        assert_eq!(v["execution_id"], id.as_str(), "{r}");
        assert_eq!(v["state"], "completed", "{r}");
        assert_eq!(v["attached"], rid != 10, "{r}");
        assert_eq!(v["operation"], "deploy_release");
        assert!(v["contract"].as_str().unwrap().starts_with("sha256:"));
        assert_eq!(
            v["stdout"],
            format!("--service\nweb\n--version\n2026.01.02\n--region\nus-east-1\n--idempotency-key\n{id}\n"),
            "the execution ID reached the program as its idempotency key: {r}"
        );
    }
    assert_eq!(h.runs(), 1, "four spellings, one run");
    assert_eq!(h.executions(), 1);

    // The record names the operation, its contract and the canonical arguments.
    let intent = h
        .journal()
        .intent_of(&ExecutionId::parse(&id).unwrap())
        .unwrap()
        .unwrap();
    let op = &intent.intent["operation"];
    assert_eq!(op["name"], "deploy_release");
    assert_eq!(op["contract"], deploy["contract"]["contract"]);
    assert_eq!(
        op["arguments"],
        json!({"region": "us-east-1", "service": "web", "version": "2026.01.02"})
    );
    assert_eq!(intent.class, "idempotent");
    assert_eq!(intent.retention_secs, 86_400);

    // Another version is another execution.
    let r = rpc.call(
        20,
        "call",
        json!({"operation": "deploy_release", "arguments": {"service": "web", "version": "2026.01.03"}}),
    );
    assert_eq!(r["result"]["state"], "completed", "{r}");
    assert_ne!(r["result"]["execution_id"], id.as_str());
    assert_eq!(h.runs(), 2);

    // Unknown arguments and unknown operations are refused; nothing runs.
    let r = rpc.call(
        30,
        "call",
        json!({"operation": "deploy_release", "arguments": {"service": "web", "version": "2026.01.04", "host": "evil"}}),
    );
    assert_eq!(r["error"]["code"], -32602, "{r}");
    assert!(r["error"]["message"]
        .as_str()
        .unwrap()
        .contains("unknown argument host"));
    let r = rpc.call(31, "call", json!({"operation": "rm_rf", "arguments": {}}));
    assert!(
        r["error"]["message"]
            .as_str()
            .unwrap()
            .contains("no operation \"rm_rf\""),
        "{r}"
    );
    assert_eq!(h.runs(), 2);
}

#[test]
fn operations_only_refuses_execute() {
    let h = Host::new();
    let gate = h.sshd.dir().join("gate");
    let ops = operations_file(&h, &gate);
    let mut rpc = Rpc::start(
        &h,
        &["--operations", ops.to_str().unwrap(), "--operations-only"],
    );
    let r = rpc.call(
        1,
        "execute",
        json!({"destination": "127.0.0.1", "command": h.count()}),
    );
    assert_eq!(r["error"]["code"], -32601, "{r}");
    assert!(r["error"]["message"]
        .as_str()
        .unwrap()
        .contains("--operations-only"));
    let r = rpc.call(
        2,
        "call",
        json!({"operation": "echo_note", "arguments": {"note": "hi"}}),
    );
    assert_eq!(r["result"]["stdout"], "1|hi", "{r}");
    assert_eq!(h.runs(), 1);
    // Without a file, --operations-only is refused at start.
    let mut c = h.cairn("serve");
    c.args(["--stdio", "--operations-only"]);
    let out = output(c, T);
    assert_eq!(out.status.code(), Some(255));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--operations-only needs --operations"));
}

fn op_cmd(h: &Host, ops: &Path, args: &[&str]) -> Command {
    let mut c = h.cairn("op");
    c.arg("--operations")
        .arg(ops)
        .arg("--remote-dir")
        .arg(&h.remote_dir);
    c.args(args);
    c
}

// Long: one scenario, its phases in order.
#[test]
fn hostile_values_are_refused_before_any_connection_or_arrive_as_one_word() {
    let h = Host::new();
    let gate = h.sshd.dir().join("gate");
    let ops = operations_file(&h, &gate);
    let big = "x".repeat(100 * 1024);
    for bad in ["; rm -rf /", "$(id)", "web\nid", big.as_str()] {
        let service = format!("service={bad}");
        let out = output(
            op_cmd(
                &h,
                &ops,
                &["deploy_release", &service, "version=2026.01.02"],
            ),
            T,
        );
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(255), "{err}");
        assert!(err.contains("argument service: "), "{err}");
        assert!(
            err.contains("does not match") || err.contains("longer than"),
            "{err}"
        );
        assert!(err.len() < 400, "the refusal does not echo the value");
    }
    assert_eq!(h.proxy.connections(), 0, "refused before any connection");
    assert_eq!(h.executions(), 0);
    assert_eq!(h.runs(), 0);

    // Where the type allows them, they reach the program as one argv word, byte for byte.
    let values = [
        "; rm -rf /",
        "$(id)",
        "a\nb\n",
        "it's \"quoted\" `id` $HOME \\",
        "ü\t*?[",
        big.as_str(),
    ];
    for (i, v) in values.iter().enumerate() {
        let note = format!("note={v}");
        // Output into a file: 100 KB would fill a pipe nobody reads until the end.
        let got = h.sshd.dir().join("note.out");
        let mut c = op_cmd(&h, &ops, &["echo_note", &note]);
        c.stdout(fs::File::create(&got).unwrap());
        let child = c
            .stdin(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let out = wait_child(child, T);
        assert_eq!(
            out.status.code(),
            Some(0),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let got = fs::read(&got).unwrap();
        let want = format!("1|{v}").into_bytes();
        assert!(
            got == want,
            "value {i}: {} bytes came back for {}",
            got.len(),
            want.len()
        );
    }
    assert_eq!(h.runs(), values.len());

    // A host outside the contract is refused before any connection too.
    let before = h.proxy.connections();
    let out = output(
        op_cmd(&h, &ops, &["echo_note", "note=x", "--hosts", "10.0.0.1"]),
        T,
    );
    assert_eq!(out.status.code(), Some(255));
    assert!(String::from_utf8_lossy(&out.stderr).contains("not a destination it may run on"));
    assert_eq!(h.proxy.connections(), before);

    // --json: the outcome names the operation; a second identical call (delivered) is new.
    let out = output(
        op_cmd(
            &h,
            &ops,
            &[
                "deploy_release",
                "service=web",
                "version=2026.02.01",
                "--json",
            ],
        ),
        T,
    );
    let v = json_of(&out);
    assert_eq!(v["operation"], "deploy_release", "{v}");
    assert_eq!(v["exit_code"], 0);
}

// ----- cairn ops check / doc ----------------------------------------------------------------

#[test]
fn ops_check_refuses_each_unsafe_contract_with_its_line_and_ops_doc_writes_markdown() {
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("bad.toml");
    fs::write(
        &bad,
        r#"[operations.pay]
description = "Send a payment"
class = "irreversible"
retention = "1h"
hosts = ["pay-1"]
argv = ["/opt/pay", "--to", "{to}", "--amount", "{amonut}"]
secrets = { PAY_TOKEN = "s3cr3t" }

[operations.pay.args]
to = { type = "string" }
amount = { type = "integer", min = 1 }

[operations.wipe]
description = "No class"
hosts = ["h"]
argv = ["true"]
"#,
    )
    .unwrap();
    let mut c = Command::new(BIN);
    c.args(["ops", "check"]).arg(&bad);
    let out = output(c, T);
    assert_eq!(out.status.code(), Some(1));
    let text = String::from_utf8_lossy(&out.stdout);
    let shown = bad.display().to_string();
    for (line, words) in [
        (3, "operation pay: irreversible without an approval rule"),
        (4, "operation pay: retention 1h is outside what class irreversible allows"),
        (6, "operation pay: placeholder {amonut} is not an argument"),
        (7, "operation pay: a secret given by value"),
        (10, "operation pay: argument to is a free string (no pattern, no enum) that reaches the command"),
        (11, "operation pay: argument amount is never used"),
        (13, "operation wipe: no class"),
    ] {
        let want = format!("{shown}:{line}: {words}");
        assert!(text.contains(&want), "{want:?} not in:\n{text}");
    }
    assert_eq!(text.matches("    fix: ").count(), 7, "{text}");
    assert!(
        !text.contains("s3cr3t"),
        "a secret's value is never printed"
    );
    // The servers refuse the file too.
    let mut c = Command::new(BIN);
    c.args(["serve", "--stdio", "--operations"]).arg(&bad);
    let out = output(c, T);
    assert_eq!(out.status.code(), Some(255));

    let fixture = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/operations/web-fleet"
    );
    let mut c = Command::new(BIN);
    c.args(["ops", "check", &format!("{fixture}.toml")]);
    let out = output(c, T);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    let mut c = Command::new(BIN);
    c.current_dir(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/operations"
    ));
    c.args(["ops", "doc", "web-fleet.toml"]);
    let out = output(c, T);
    assert_eq!(out.status.code(), Some(0));
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        fs::read_to_string(format!("{fixture}.md")).unwrap()
    );
}

// ----- the official Python MCP SDK ------------------------------------------------------------

/// The Python of the shared virtual environment with the `mcp` SDK: `$CAIRN_PY_VENV`, else
/// `target/mcp-venv`. In CI (`CI` set) a missing one is a failure; elsewhere it is created.
fn mcp_python() -> PathBuf {
    let venv = std::env::var_os("CAIRN_PY_VENV")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/target/mcp-venv")));
    let py = venv.join("bin").join("python");
    let has_mcp = || {
        Command::new(&py)
            .args(["-c", "import mcp"])
            .status()
            .is_ok_and(|s| s.success())
    };
    if has_mcp() {
        return py;
    }
    assert!(
        std::env::var_os("CI").is_none(),
        "no Python MCP SDK in {}: .ci/run creates it with `python3 -m venv target/mcp-venv && \
         target/mcp-venv/bin/pip install mcp` (or point CAIRN_PY_VENV at one)",
        venv.display()
    );
    let ok = Command::new("python3")
        .arg("-m")
        .arg("venv")
        .arg(&venv)
        .status()
        .unwrap()
        .success()
        && Command::new(venv.join("bin").join("pip"))
            .args(["install", "-q", "mcp"])
            .status()
            .unwrap()
            .success();
    assert!(ok && has_mcp(), "could not create {}", venv.display());
    py
}

/// `python mcp_operations.py MODE ARGS -- cairn mcp …` (with this host's connection options).
fn python_client(h: &Host, ops: &Path, mode: &str, arguments: Value) -> Command {
    let mut server = Command::new(BIN);
    server.arg("mcp");
    h.conn_args(&mut server, "60s");
    server
        .arg("--remote-dir")
        .arg(&h.remote_dir)
        .arg("--operations")
        .arg(ops)
        .arg("--operations-only");
    let mut c = Command::new(mcp_python());
    c.arg(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/python/mcp_operations.py"
    ))
    .arg(mode)
    .arg(arguments.to_string())
    .arg("--")
    .arg(server.get_program())
    .args(server.get_args());
    c
}

// Long: one scenario, its phases in order.
#[test]
fn the_python_mcp_sdk_sees_the_contract_calls_and_a_retried_call_attaches() {
    let h = Host::new();
    let gate = h.sshd.dir().join("gate");
    let ops = operations_file(&h, &gate);

    let out = output(python_client(&h, &ops, "list", json!({})), T);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v = json_of(&out);
    let tools = v["tools"].as_array().unwrap();
    let names: Vec<&str> = tools.iter().map(|t| t["name"].as_str().unwrap()).collect();
    assert!(
        names.contains(&"deploy_release") && names.contains(&"echo_note"),
        "{names:?}"
    );
    assert!(
        !names.contains(&"run_command"),
        "--operations-only hides run_command: {names:?}"
    );
    let deploy = tools
        .iter()
        .find(|t| t["name"] == "deploy_release")
        .unwrap();
    let desc = deploy["description"].as_str().unwrap();
    assert!(desc.starts_with("Deploy one release of a service. Replay contract: If you lose the response, call again with the same arguments within 24 h"), "{desc}");
    assert!(desc.contains("Not part of it: reason"), "{desc}");
    assert!(
        desc.ends_with("the same call starts a new execution."),
        "{desc}"
    );
    let contract = &deploy["meta"]["cairn/contract"];
    assert_eq!(contract["class"], "idempotent", "{deploy}");
    assert_eq!(contract["retention_secs"], 86_400);
    assert_eq!(contract["after_unknown"], "retry-same-execution-id");
    assert_eq!(
        contract["fingerprint_arguments"],
        json!(["service", "version", "region"])
    );
    assert_eq!(
        contract["text"].as_str().unwrap(),
        desc.trim_start_matches("Deploy one release of a service. ")
    );
    let schema = &deploy["input_schema"];
    assert_eq!(
        schema["required"],
        json!(["service", "version"]),
        "{schema}"
    );
    assert_eq!(
        schema["properties"]["region"]["enum"],
        json!(["us-east-1", "eu-west-1"])
    );
    assert_eq!(schema["properties"]["region"]["default"], "us-east-1");
    assert_eq!(schema["additionalProperties"], false);
    assert_eq!(deploy["annotations"]["idempotentHint"], true, "{deploy}");

    // A call waits at the gate; its client is killed (with its `cairn mcp`); a new client
    // calls again with the same arguments, spelled otherwise: it attaches, the program ran once.
    fs::write(gate.with_extension("closed"), "").unwrap();
    let mut first = python_client(
        &h,
        &ops,
        "call",
        json!({"service": "web", "version": "2026.03.01"}),
    );
    first
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .stdin(Stdio::null());
    // SAFETY: the closure runs between fork and exec and makes only async-signal-safe calls.
    unsafe {
        std::os::unix::process::CommandExt::pre_exec(&mut first, || {
            libc::setpgid(0, 0);
            Ok(())
        });
    }
    let mut first = first.spawn().unwrap();
    let id = h.wait_started();
    assert!(
        sigkill(first.id() as i32, true),
        "kill the first client and its server"
    );
    let _ = first.wait();
    let second = spawn(python_client(
        &h,
        &ops,
        "call",
        json!({"version": "2026.03.01", "region": "us-east-1", "service": "web", "reason": "retry"}),
    ));
    wait_for("the retry attached", T, || {
        (intent_matches(&h, &id) == 1).then_some(())
    });
    fs::remove_file(gate.with_extension("closed")).unwrap();
    let out = wait_child(second, T);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let r = json_of(&out);
    let s = &r["structured"];
    assert_eq!(r["is_error"], false, "{r}");
    assert_eq!(s["execution_id"], id.as_str(), "{r}");
    assert_eq!(s["attached"], true, "{r}");
    assert_eq!(s["state"], "completed", "{r}");
    assert_eq!(s["operation"], "deploy_release");
    assert!(
        s["stdout"]
            .as_str()
            .unwrap()
            .ends_with(&format!("--idempotency-key\n{id}\n")),
        "{r}"
    );
    assert!(
        r["text"][0].as_str().unwrap().contains("attached to it"),
        "{r}"
    );
    assert_eq!(h.runs(), 1, "the program ran once");
    assert_eq!(h.executions(), 1);

    // A hostile value is refused as a tool error; nothing runs.
    let out = output(
        python_client(
            &h,
            &ops,
            "call",
            json!({"service": "$(id)", "version": "2026.03.01"}),
        ),
        T,
    );
    let r = json_of(&out);
    assert_eq!(r["is_error"], true, "{r}");
    assert!(
        r["structured"]["error"]
            .as_str()
            .unwrap()
            .contains("does not match"),
        "{r}"
    );
    assert_eq!(h.runs(), 1);
}

#[test]
fn an_operation_on_two_destinations_is_one_execution_each_and_both_are_delivered() {
    let h = Host::new();
    // A second name for the same sshd: two destinations, two intents.
    let key = fs::read_to_string(&h.known_hosts).unwrap();
    let other = key.replacen("[127.0.0.1]", "[localhost]", 1);
    fs::write(&h.known_hosts, format!("{key}{other}")).unwrap();
    let ops = h.sshd.dir().join("fleet.toml");
    fs::write(
        &ops,
        format!(
            r#"
[operations.touch_note]
description = "Record a note on every host"
class = "idempotent"
hosts = ["127.0.0.1", "localhost"]
argv = ["sh", "-c", "echo ran >> '{}'; printf '%s' \"$1\"", "touch_note", "{{note}}"]
[operations.touch_note.args]
note = {{ type = "string", pattern = "^[a-z]+$" }}
"#,
            h.counter.display()
        ),
    )
    .unwrap();
    let mut rpc = Rpc::start(&h, &["--operations", ops.to_str().unwrap()]);
    let r = rpc.call(
        1,
        "call",
        json!({"operation": "touch_note", "arguments": {"note": "hi"}}),
    );
    let results = r["result"]["results"]
        .as_array()
        .unwrap_or_else(|| panic!("{r}"));
    assert_eq!(results.len(), 2, "{r}");
    let mut ids = std::collections::BTreeSet::new();
    for v in results {
        assert_eq!(v["state"], "completed", "{r}");
        assert_eq!(v["stdout"], "hi", "{r}");
        ids.insert(v["execution_id"].as_str().unwrap().to_owned());
    }
    assert_eq!(ids.len(), 2, "one execution per destination: {r}");
    assert_eq!(h.runs(), 2);
    // The response delivered both (recorded once the line was written).
    for id in &ids {
        wait_for("delivered", T, || {
            h.kinds(id).contains(&"delivered".to_string()).then_some(())
        });
    }
}
