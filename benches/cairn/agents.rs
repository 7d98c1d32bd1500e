//! Section 9: one gateway, a thousand agents.
//!
//! One `cairn mcp --listen` process is given N concurrent `tools/call`s of `run_command` (default
//! 1,000), each on a client connection of its own, from A actors (default 20, each under the
//! default cap of 64 calls in flight per actor, so no cap is raised), each call a
//! `sleep 10` on the bench's loopback sshd. The calls declare the MCP tasks extension, so each
//! is answered with a task as soon as its execution is accepted; the bench then polls
//! `tasks/get` (at most 32 at once) until every task is settled. The same N as `execute`
//! requests on one `cairn serve --stdio`. Each with the SQLite journal and with PostgreSQL, one
//! after the other in the same run; with `CAIRN_BENCH_COMPARE_BIN=PATH`, every case is run with
//! that other build of `cairn` too, interleaved (before/after a change, on the same machine;
//! `CAIRN_BENCH_COMPARE_FRONTS=stdio` limits that to the fronts named).
//!
//! What it reports for each case: the server's peak RSS (`VmHWM` of `/proc/PID/status` read
//! just before the server is stopped), the latency of each call (HTTP: from the client's
//! connect to the end of the response that carries the created task; stdio: from the request
//! line written to its response line read, so it includes the command's 10 seconds), the time
//! from each request to its command starting on the host (the command writes its start time
//! into a file on the host, same clock), failures (a call not answered with a task, or a task or
//! response that did not end completed with exit 0), how many commands ran on the host (each
//! must run once), and the most that ran at once there.
//!
//! `CAIRN_BENCH_AGENTS` (N), `CAIRN_BENCH_AGENT_SECS` (the sleep), `CAIRN_BENCH_AGENT_ACTORS`
//! (A). Every wait is bounded; a case that does not finish in time is reported with what it
//! reached.

use std::io::BufRead as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde_json::{json, Value};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

use super::{proc_status, section, support, yes, Table};

fn env_num(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.trim().parse().ok())
        .filter(|n| *n > 0)
        .unwrap_or(default)
}

/// What one case measured.
#[derive(Default)]
struct Load {
    /// `VmHWM` of the server, KiB.
    peak_rss: u64,
    max_threads: u64,
    max_sockets: usize,
    /// Per call: request to task created (HTTP) or to response (stdio).
    latency: Vec<Duration>,
    /// Per command: request to its start on the host.
    start: Vec<Duration>,
    /// Calls answered as a task (HTTP) or with a response (stdio).
    answered: usize,
    /// Ended completed with exit 0.
    completed: usize,
    /// Why some did not (the first few).
    failures: Vec<String>,
    failed: usize,
    /// Commands that started on the host, distinct, and the most that ran at once.
    ran: usize,
    ran_twice: usize,
    most_at_once: usize,
    wall: Duration,
}

fn pct(v: &mut [Duration], p: f64) -> Duration {
    if v.is_empty() {
        return Duration::ZERO;
    }
    v.sort();
    let i = ((p * v.len() as f64).ceil() as usize).clamp(1, v.len()) - 1;
    v[i]
}

fn now_ns() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0)
}

/// The command of call `i`: its start (with the host's clock) and end go into `log`.
fn command(i: usize, secs: usize, log: &Path) -> String {
    format!(
        "echo S {i} $(date +%s%N) >> {l}; sleep {secs}; echo E {i} >> {l}",
        l = log.display()
    )
}

/// The host's log: (start ns by call, calls seen started, ended).
fn host_log(log: &Path) -> (std::collections::HashMap<usize, Vec<u128>>, usize, usize) {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let mut starts: std::collections::HashMap<usize, Vec<u128>> = Default::default();
    let (mut s, mut e) = (0, 0);
    for l in text.lines() {
        let f: Vec<&str> = l.split_whitespace().collect();
        match f.as_slice() {
            ["S", i, t] => {
                s += 1;
                if let (Ok(i), Ok(t)) = (i.parse(), t.parse()) {
                    starts.entry(i).or_default().push(t);
                }
            }
            ["E", _] => e += 1,
            _ => {}
        }
    }
    (starts, s, e)
}

/// Sample the server's threads and sockets until `stop`; (most threads, most sockets).
fn sampler(pid: u32, stop: Arc<AtomicBool>) -> std::thread::JoinHandle<(u64, usize)> {
    std::thread::spawn(move || {
        let (mut th, mut so) = (0, 0);
        let t0 = Instant::now();
        while !stop.load(Ordering::Relaxed) && t0.elapsed() < Duration::from_secs(900) {
            th = th.max(proc_status(&pid.to_string(), "Threads:").unwrap_or(0));
            let sockets = std::fs::read_dir(format!("/proc/{pid}/fd"))
                .map(|d| {
                    d.filter_map(Result::ok)
                        .filter(|e| {
                            std::fs::read_link(e.path())
                                .is_ok_and(|l| l.to_string_lossy().starts_with("socket:"))
                        })
                        .count()
                })
                .unwrap_or(0);
            so = so.max(sockets);
            std::thread::sleep(Duration::from_millis(500));
        }
        (th, so)
    })
}

/// Fill in what the host's log says, and the start latencies from the send times.
fn host_side(load: &mut Load, log: &Path, sent: &[u128]) {
    let (starts, _, _) = host_log(log);
    load.ran = starts.len();
    load.ran_twice = starts.values().filter(|v| v.len() > 1).count();
    for (i, ts) in &starts {
        if let (Some(t), Some(s)) = (ts.first(), sent.get(*i)) {
            if *s > 0 {
                load.start
                    .push(Duration::from_nanos(t.saturating_sub(*s) as u64));
            }
        }
    }
}

/// Follow the host's log until every started command ended or `limit`; the most at once.
fn watch_host(log: &Path, expect: usize, limit: Duration) -> usize {
    let t0 = Instant::now();
    let mut most = 0;
    while t0.elapsed() < limit {
        let (_, s, e) = host_log(log);
        most = most.max(s.saturating_sub(e));
        if s >= expect && e >= s {
            break;
        }
        std::thread::sleep(Duration::from_millis(250));
    }
    most
}

fn stop(mut child: Child) {
    let _ = child.kill();
    let _ = child.wait();
}

/// Where the journal of a case lives: a SQLite file, or a new PostgreSQL database.
fn journal(pg: Option<&support::postgres::PgServer>, dir: &Path, kind: &str) -> Option<String> {
    match kind {
        "SQLite" => Some(dir.join("journal.db").display().to_string()),
        _ => pg.map(|s| s.database(&format!("bench_agents_{}", dir_name(dir)))),
    }
}

fn dir_name(dir: &Path) -> String {
    dir.file_name()
        .map(|n| n.to_string_lossy().replace('-', "_"))
        .unwrap_or_default()
}

// ---------------------------------------------------------------- HTTP

/// One HTTP/1.1 POST to `/mcp` on a fresh connection, read to its end.
async fn post(port: u16, headers: &[(&str, String)], body: String) -> Result<Vec<u8>, String> {
    let mut s = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .map_err(|e| format!("connect: {e}"))?;
    let mut req = format!(
        "POST /mcp HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n\
         Content-Length: {}\r\n",
        body.len()
    );
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str("\r\n");
    req.push_str(&body);
    s.write_all(req.as_bytes())
        .await
        .map_err(|e| format!("write: {e}"))?;
    let mut out = Vec::new();
    s.read_to_end(&mut out)
        .await
        .map_err(|e| format!("read: {e}"))?;
    Ok(out)
}

/// The JSON-RPC response with `id` in a raw HTTP response (JSON or server-sent events, chunked
/// or not).
fn response_of(raw: &[u8], id: u64) -> Result<Value, String> {
    let text = String::from_utf8_lossy(raw);
    let status = text.split_whitespace().nth(1).unwrap_or("none").to_owned();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let body = if head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        let (mut s, mut out) = (body, String::new());
        while let Some((size, rest)) = s.split_once("\r\n") {
            let n = usize::from_str_radix(size.trim(), 16).unwrap_or(0);
            if n == 0 || rest.len() < n {
                break;
            }
            out.push_str(&rest[..n]);
            s = rest[n..].trim_start_matches("\r\n");
        }
        out
    } else {
        body.to_owned()
    };
    if status != "200" {
        return Err(format!(
            "HTTP {status}: {}",
            body.chars().take(200).collect::<String>()
        ));
    }
    if let Ok(v) = serde_json::from_str::<Value>(&body) {
        return Ok(v);
    }
    body.lines()
        .filter_map(|l| l.strip_prefix("data:"))
        .filter_map(|d| serde_json::from_str::<Value>(d.trim()).ok())
        .find(|m| m["id"] == id)
        .ok_or_else(|| {
            format!(
                "no response in {:?}",
                body.chars().take(200).collect::<String>()
            )
        })
}

/// Headers and body of an MCP request of the 2026-07-28 revision declaring the tasks extension.
fn mcp_request(
    token: &str,
    id: u64,
    method: &str,
    mut params: Value,
) -> (Vec<(&'static str, String)>, String) {
    params["_meta"] = json!({
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientInfo": {"name": "cairn-bench", "version": "0"},
        "io.modelcontextprotocol/clientCapabilities":
            {"extensions": {"io.modelcontextprotocol/tasks": {}}}
    });
    let name = params["name"]
        .as_str()
        .or(params["taskId"].as_str())
        .unwrap_or_default()
        .to_owned();
    let body = json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params});
    let headers = vec![
        ("Accept", "application/json, text/event-stream".to_owned()),
        ("Content-Type", "application/json".to_owned()),
        ("Authorization", format!("Bearer {token}")),
        ("MCP-Protocol-Version", "2026-07-28".to_owned()),
        ("Mcp-Method", method.to_owned()),
        ("Mcp-Name", name),
    ];
    (headers, body.to_string())
}

/// `cairn mcp --listen` on an ephemeral port; the child and its port.
fn start_http(bin: &Path, sshd: &support::TestSshd, journal: &str, dir: &Path) -> (Child, u16) {
    let mut child = Command::new(bin)
        .args(["mcp", "--listen", "127.0.0.1:0", "--journal", journal])
        .arg("--intent-key")
        .arg(dir.join("intent.key"))
        .arg("-F")
        .arg(sshd.ssh_config())
        .arg("--remote-dir")
        .arg(dir.join("home"))
        .env_remove("SSH_AUTH_SOCK")
        .env_remove("RUST_LOG")
        .env_remove("CAIRN_JOURNAL")
        .env("CAIRN_LOG", "cairn=info")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn cairn mcp --listen");
    let port = super::listening_port(&mut child, "cairn mcp --listen");
    (child, port)
}

fn token(bin: &Path, journal: &str, actor: &str) -> String {
    let out = Command::new(bin)
        .args(["token", "add", actor, "--journal", journal])
        .env_remove("CAIRN_JOURNAL")
        .output()
        .expect("cairn token add");
    assert!(out.status.success(), "cairn token add: {out:?}");
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

// Long: one case, its steps in order (tokens, server, the N calls at once, the host, the
// polling, the server's peak).
fn http_case(bin: &Path, sshd: &support::TestSshd, journal: &str, dir: &Path) -> Load {
    let n = env_num("CAIRN_BENCH_AGENTS", 1000);
    let secs = env_num("CAIRN_BENCH_AGENT_SECS", 10);
    let actors = env_num("CAIRN_BENCH_AGENT_ACTORS", 20);
    let log = dir.join("host.log");
    let tokens: Vec<String> = (0..actors)
        .map(|k| token(bin, journal, &format!("agent:bench-{k}")))
        .collect();
    let (child, port) = start_http(bin, sshd, journal, dir);
    let pid = child.id();
    let stop_sampling = Arc::new(AtomicBool::new(false));
    let sampling = sampler(pid, stop_sampling.clone());
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let t0 = Instant::now();
    let sent: Arc<Vec<AtomicU64>> = Arc::new((0..n).map(|_| AtomicU64::new(0)).collect());
    // All N at once, each on its own connection.
    let calls: Vec<Result<(String, usize, Duration), String>> = rt.block_on(async {
        let mut set = tokio::task::JoinSet::new();
        for i in 0..n {
            let tok = tokens[i % actors].clone();
            let cmd = command(i, secs, &log);
            let sent = sent.clone();
            set.spawn(async move {
                let (h, body) = mcp_request(
                    &tok,
                    i as u64,
                    "tools/call",
                    json!({"name": "run_command",
                           "arguments": {"destination": "testhost", "command": cmd}}),
                );
                let began = Instant::now();
                sent[i].store(now_ns() as u64, Ordering::Relaxed);
                let r = tokio::time::timeout(Duration::from_secs(120), post(port, &h, body)).await;
                let took = began.elapsed();
                let raw = r.map_err(|_| "no answer within 120 s".to_owned())??;
                let v = response_of(&raw, i as u64)?;
                let res = &v["result"];
                match (res["resultType"].as_str(), res["taskId"].as_str()) {
                    (Some("task"), Some(task)) => Ok((task.to_owned(), i, took)),
                    _ => Err(format!(
                        "not a task: {}",
                        v.to_string().chars().take(300).collect::<String>()
                    )),
                }
            });
        }
        let mut all = Vec::new();
        while let Some(r) = set.join_next().await {
            all.push(r.unwrap_or_else(|e| Err(format!("client task: {e}"))));
        }
        all
    });
    let mut load = Load::default();
    let mut tasks = Vec::new();
    for c in calls {
        match c {
            Ok((task, i, took)) => {
                load.latency.push(took);
                tasks.push((task, i));
            }
            Err(e) => {
                load.failed += 1;
                if load.failures.len() < 3 {
                    load.failures.push(e);
                }
            }
        }
    }
    load.answered = tasks.len();
    load.most_at_once = watch_host(&log, tasks.len(), Duration::from_secs(secs as u64 + 300));
    // Poll every task until settled (bounded rounds), at most 32 requests at once.
    let mut open: Vec<(String, usize)> = tasks;
    for round in 0..60 {
        if open.is_empty() {
            break;
        }
        if round > 0 {
            std::thread::sleep(Duration::from_secs(1));
        }
        let polled: Vec<(String, usize, Result<Value, String>)> = rt.block_on(async {
            let gate = Arc::new(tokio::sync::Semaphore::new(32));
            let mut set = tokio::task::JoinSet::new();
            for (task, i) in open.drain(..) {
                let tok = tokens[i % actors].clone();
                let gate = gate.clone();
                set.spawn(async move {
                    let _permit = gate.acquire().await;
                    let id = 100_000 + i as u64;
                    let (h, body) = mcp_request(&tok, id, "tasks/get", json!({"taskId": task}));
                    let r = tokio::time::timeout(Duration::from_secs(60), post(port, &h, body))
                        .await
                        .map_err(|_| "tasks/get: no answer within 60 s".to_owned())
                        .and_then(|r| r)
                        .and_then(|raw| response_of(&raw, id));
                    (task, i, r)
                });
            }
            let mut all = Vec::new();
            while let Some(Ok(r)) = set.join_next().await {
                all.push(r);
            }
            all
        });
        for (task, i, r) in polled {
            let status = r
                .as_ref()
                .ok()
                .and_then(|v| v["result"]["status"].as_str().map(str::to_owned));
            match status.as_deref() {
                Some("working") => open.push((task, i)),
                Some("completed")
                    if r.as_ref().is_ok_and(|v| {
                        v["result"]["result"]["structuredContent"]["exit_code"] == 0
                    }) =>
                {
                    load.completed += 1
                }
                _ if round < 59 && r.is_err() => open.push((task, i)),
                _ => {
                    load.failed += 1;
                    if load.failures.len() < 3 {
                        load.failures
                            .push(format!("task {task}: {r:?}").chars().take(300).collect());
                    }
                }
            }
        }
    }
    load.failed += open.len();
    if !open.is_empty() && load.failures.len() < 3 {
        load.failures.push(format!(
            "{} tasks still working after 60 rounds",
            open.len()
        ));
    }
    load.wall = t0.elapsed();
    load.peak_rss = proc_status(&pid.to_string(), "VmHWM:").unwrap_or(0);
    stop_sampling.store(true, Ordering::Relaxed);
    (load.max_threads, load.max_sockets) = sampling.join().unwrap_or((0, 0));
    stop(child);
    let sent: Vec<u128> = sent
        .iter()
        .map(|s| s.load(Ordering::Relaxed) as u128)
        .collect();
    host_side(&mut load, &log, &sent);
    load
}

// ---------------------------------------------------------------- stdio

// Long: one case, its steps in order (server, the N requests at once, the responses as they
// come, the host, the server's peak).
fn stdio_case(bin: &Path, sshd: &support::TestSshd, journal: &str, dir: &Path) -> Load {
    use std::io::Write as _;
    let n = env_num("CAIRN_BENCH_AGENTS", 1000);
    let secs = env_num("CAIRN_BENCH_AGENT_SECS", 10);
    let log = dir.join("host.log");
    let mut child = Command::new(bin)
        .args(["serve", "--stdio", "--journal", journal])
        .arg("--intent-key")
        .arg(dir.join("intent.key"))
        .arg("-F")
        .arg(sshd.ssh_config())
        .arg("--remote-dir")
        .arg(dir.join("home"))
        .env_remove("SSH_AUTH_SOCK")
        .env_remove("RUST_LOG")
        .env_remove("CAIRN_JOURNAL")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn cairn serve --stdio");
    let pid = child.id();
    let stop_sampling = Arc::new(AtomicBool::new(false));
    let sampling = sampler(pid, stop_sampling.clone());
    let t0 = Instant::now();
    let sent: Arc<Vec<AtomicU64>> = Arc::new((0..n).map(|_| AtomicU64::new(0)).collect());
    let sent_at: Arc<std::sync::Mutex<Vec<Option<Instant>>>> =
        Arc::new(std::sync::Mutex::new(vec![None; n]));
    let stdout = child.stdout.take().expect("stdout");
    let sa = sent_at.clone();
    let lines = Arc::new(AtomicU64::new(0));
    let seen = lines.clone();
    let reader = std::thread::spawn(move || {
        let mut got: Vec<(usize, Duration, bool, String)> = Vec::new();
        for line in std::io::BufReader::new(stdout)
            .lines()
            .map_while(Result::ok)
        {
            seen.fetch_add(1, Ordering::Relaxed);
            let at = Instant::now();
            let v: Value = serde_json::from_str(&line).unwrap_or_default();
            let i = v["id"].as_u64().unwrap_or(u64::MAX) as usize;
            let began = sa.lock().ok().and_then(|s| s.get(i).copied().flatten());
            let ok = v["result"]["state"] == "completed" && v["result"]["exit_code"] == 0;
            got.push((
                i,
                began.map_or(Duration::ZERO, |b| at - b),
                ok,
                line.chars().take(300).collect(),
            ));
        }
        got
    });
    let mut stdin = child.stdin.take().expect("stdin");
    for i in 0..n {
        let req = json!({"jsonrpc": "2.0", "id": i, "method": "execute",
                         "params": {"destination": "testhost", "command": command(i, secs, &log)}});
        if let Ok(mut s) = sent_at.lock() {
            s[i] = Some(Instant::now());
        }
        sent[i].store(now_ns() as u64, Ordering::Relaxed);
        if writeln!(stdin, "{req}").is_err() {
            break;
        }
    }
    let _ = stdin.flush();
    let mut load = Load {
        most_at_once: watch_host(&log, n, Duration::from_secs(secs as u64 + 300)),
        ..Load::default()
    };
    // Every response in (bounded), the peak read while the server still runs; then stdin
    // closed, and serve exits.
    let t_wait = Instant::now();
    while (lines.load(Ordering::Relaxed) as usize) < n
        && t_wait.elapsed() < Duration::from_secs(300)
        && !reader.is_finished()
    {
        std::thread::sleep(Duration::from_millis(100));
    }
    load.wall = t0.elapsed();
    load.peak_rss = proc_status(&pid.to_string(), "VmHWM:").unwrap_or(0);
    drop(stdin);
    let t_wait = Instant::now();
    while !reader.is_finished() && t_wait.elapsed() < Duration::from_secs(60) {
        std::thread::sleep(Duration::from_millis(100));
    }
    stop_sampling.store(true, Ordering::Relaxed);
    (load.max_threads, load.max_sockets) = sampling.join().unwrap_or((0, 0));
    if !reader.is_finished() {
        // the server is stuck: its peak is read; stop it so that the reader ends
        let _ = child.kill();
    }
    let _ = child.wait();
    let got = reader.join().unwrap_or_default();
    load.answered = got.len();
    for (_, took, ok, line) in got {
        load.latency.push(took);
        if ok {
            load.completed += 1;
        } else {
            load.failed += 1;
            if load.failures.len() < 3 {
                load.failures.push(line);
            }
        }
    }
    load.failed += n.saturating_sub(load.answered);
    let sent: Vec<u128> = sent
        .iter()
        .map(|s| s.load(Ordering::Relaxed) as u128)
        .collect();
    host_side(&mut load, &log, &sent);
    load
}

// ---------------------------------------------------------------- the section

fn report(t: &mut Table, front: &str, build: &str, journal: &str, n: usize, mut l: Load) {
    let p = |v: &mut Vec<Duration>, q| format!("{:.0} ms", pct(v, q).as_secs_f64() * 1e3);
    let (l50, l99) = (p(&mut l.latency, 0.5), p(&mut l.latency, 0.99));
    let (s50, s99) = (p(&mut l.start, 0.5), p(&mut l.start, 0.99));
    let what = match front {
        "http" => format!(
            "9 {n} concurrent `tools/call`s of `run_command` (tasks) over HTTP, one connection \
             each, into one `cairn mcp --listen`, {journal} journal{build}: peak RSS; accept \
             latency p50/p99 (connect to the end of the response carrying the task); failures"
        ),
        _ => format!(
            "9 {n} `execute` requests in flight in one `cairn serve --stdio`, {journal} \
             journal{build}: peak RSS; response latency p50/p99 (request line written to \
             response line read, the command's sleep included); failures"
        ),
    };
    let ok = l.peak_rss <= 100 * 1024 && l.failed == 0 && l.completed == n;
    t.row(
        &what,
        format!(
            "{:.1} MiB ({:.0} KiB per call); {l50} / {l99}; {} failed",
            l.peak_rss as f64 / 1024.0,
            l.peak_rss as f64 / n as f64,
            l.failed
        ),
        "—".into(),
        "—".into(),
        "≤ 100 MiB, 0 failures",
        yes(ok),
    );
    t.note(format!(
        "9 {front} {journal}{build}: {} of {n} answered, {} completed with exit 0, {} failed{}; \
         on the host {} commands ran ({} more than once), at most {} at once; request → command \
         started on the host p50 {s50}, p99 {s99}; server at most {} threads and {} sockets; \
         case {:.0} s",
        l.answered,
        l.completed,
        l.failed,
        if l.failures.is_empty() {
            String::new()
        } else {
            format!(" (first: {})", l.failures.join(" | "))
        },
        l.ran,
        l.ran_twice,
        l.most_at_once,
        l.max_threads,
        l.max_sockets,
        l.wall.as_secs_f64()
    ));
}

/// Section 9 (see the module doc).
pub fn agents(t: &mut Table, bin: &Path, sshd: &support::TestSshd, work: &Path) {
    let n = env_num("CAIRN_BENCH_AGENTS", 1000);
    section(&format!(
        "9. one gateway, {n} agents: `cairn mcp --listen` and `cairn serve --stdio`, SQLite and \
         PostgreSQL"
    ));
    let pg = support::postgres::server("bench section 9");
    if pg.is_none() {
        t.note("9 PostgreSQL cases not measured: no PostgreSQL server".into());
    }
    let mut builds: Vec<(String, PathBuf)> = vec![(String::new(), bin.to_owned())];
    if let Some(other) = std::env::var_os("CAIRN_BENCH_COMPARE_BIN") {
        let other = PathBuf::from(other);
        assert!(
            other.exists(),
            "CAIRN_BENCH_COMPARE_BIN: no {}",
            other.display()
        );
        builds.insert(0, (format!(", {}", other.display()), other));
        builds[1].0 = ", this build".into();
    }
    // CAIRN_BENCH_COMPARE_FRONTS=stdio (say): the other build runs only those fronts.
    let compare_fronts =
        std::env::var("CAIRN_BENCH_COMPARE_FRONTS").unwrap_or_else(|_| "http,stdio".into());
    let mut k = 0;
    for front in ["http", "stdio"] {
        for kind in ["SQLite", "PostgreSQL"] {
            for (i, (label, b)) in builds.iter().enumerate() {
                if builds.len() > 1 && i == 0 && !compare_fronts.split(',').any(|f| f == front) {
                    continue;
                }
                k += 1;
                let dir = work.join(format!("agents-{k}-{front}"));
                std::fs::create_dir_all(&dir).expect("case dir");
                let Some(journal) = journal(pg, &dir, kind) else {
                    continue;
                };
                let load = match front {
                    "http" => http_case(b, sshd, &journal, &dir),
                    _ => stdio_case(b, sshd, &journal, &dir),
                };
                report(t, front, label, kind, n, load);
            }
        }
    }
}
