//! Fault tests against real SSH hosts in Docker containers (`docker/hosts.sh`), on both host
//! flavours (`ash`: busybox; `debian`: dash/bash/GNU), and a randomized fault campaign.
//!
//! Every test counts how many times the command really ran (a line appended to a counter file
//! on the host, read back with `docker exec`), checks the journal's final state and the bytes
//! cairn returned. Each test brings up its own hosts (a unique `--prefix`) and takes them down
//! when it ends, also when it fails.
//!
//! Needs a Docker engine and root (loop mounts, veth links). `CAIRN_DOCKER_TESTS=0` skips these
//! tests; without Docker they fail. Run: `cargo test --test it docker::`
//! Campaign knobs: `CAMPAIGN_TRIALS` (default 200), `CAMPAIGN_SEED` (default: from the clock,
//! printed).

use std::collections::BTreeMap;
use std::process::{Child, Output};
use std::thread::sleep;
use std::time::{Duration, Instant};

use cairn::State;

use crate::support::docker::{
    docker_enabled, json, marker, output_within, say, spawn, wait_within, Client, Flavour, Hosts,
};

// ------------------------------------------------------------------------------ helpers

const BIN: &str = env!("CARGO_BIN_EXE_cairn");

/// One test: its hosts, a temp dir for the journal, and its timing (printed when it ends).
struct Case {
    name: String,
    t0: Instant,
    hosts: Hosts,
    dir: tempfile::TempDir,
}

impl Case {
    fn start(name: &str, flavour: Flavour, n: usize) -> Option<Case> {
        let full = format!("docker::{}::{name}", flavour.as_str());
        if !docker_enabled(&full) {
            return None;
        }
        let t0 = Instant::now();
        let short: String = name.split('_').take(3).collect::<Vec<_>>().join("");
        let group = format!("{}-{}", &short[..short.len().min(14)], flavour.as_str());
        let hosts = Hosts::up(&group, flavour, n);
        Some(Case {
            name: full,
            t0,
            hosts,
            dir: tempfile::tempdir().expect("tempdir"),
        })
    }

    fn client(&self) -> Client {
        self.hosts
            .client(BIN.as_ref(), self.dir.path().join("journal.db"))
    }
}

impl Drop for Case {
    fn drop(&mut self) {
        say(&format!(
            "docker test {}: {} in {:.1}s",
            self.name,
            if std::thread::panicking() {
                "FAILED"
            } else {
                "ok"
            },
            self.t0.elapsed().as_secs_f64()
        ));
    }
}

/// Numbered lines as the test commands print them.
fn numbered(prefix: &str, n: usize) -> String {
    (0..n).map(|i| format!("{prefix} {i}\n")).collect()
}

/// A command that appends to `counter` first, then prints `n` numbered lines on stdout and on
/// stderr, `delay` seconds apart, then exits `code`.
fn lines_cmd(counter: &str, n: usize, delay: &str, code: u64) -> String {
    format!(
        "echo ran >> {counter}; i=0; while [ $i -lt {n} ]; do echo \"line $i\"; \
         echo \"err $i\" >&2; i=$((i+1)); sleep {delay}; done; exit {code}"
    )
}

fn finish(child: Child, limit: Duration) -> Output {
    wait_within(child, limit).unwrap_or_else(|o| {
        panic!(
            "cairn did not finish within {limit:?}\nstdout: {}\nstderr: {}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        )
    })
}

fn run_to_end(c: std::process::Command, limit: Duration) -> Output {
    output_within(c, limit).unwrap_or_else(|e| panic!("{e}"))
}

fn unique_id(tag: &str) -> String {
    let n = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() % 1_000_000_000_000)
        .unwrap_or(0);
    format!("{tag}-{n}")
}

fn s(v: &serde_json::Value) -> &str {
    v.as_str().unwrap_or_default()
}

/// `key=value` from a one-line record.
fn field<'a>(record: &'a str, key: &str) -> Option<&'a str> {
    record
        .split_whitespace()
        .find_map(|kv| kv.strip_prefix(key)?.strip_prefix('='))
}

// ------------------------------------------------------------------------------ the tests

/// `cairn serve --stdio --host-session` for `c`: the child, its stdin, and its JSON-RPC
/// responses as they arrive.
fn serve_host_session(
    c: &Client,
) -> (
    Child,
    std::process::ChildStdin,
    std::sync::mpsc::Receiver<serde_json::Value>,
) {
    use std::io::{BufRead, BufReader};
    let mut serve = c.cmd("serve");
    serve
        .args(["--stdio", "--host-session"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null());
    let mut child = serve.spawn().expect("spawn cairn serve");
    let stdin = child.stdin.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let stdout = child.stdout.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            let v: serde_json::Value = serde_json::from_str(&line).expect("JSON-RPC line");
            if tx.send(v).is_err() {
                break;
            }
        }
    });
    (child, stdin, rx)
}

/// The link goes down for 10 s while the command runs; cairn notices, keeps trying, reattaches
/// after the repair while the command still runs, and returns every byte once.
fn link_cut_for_10s_mid_run_reattaches_ran_once_full_output(fl: Flavour) {
    let Some(t) = Case::start("link_cut_for_10s", fl, 1) else {
        return;
    };
    let (h, c) = (&t.hosts, t.client());
    let id = unique_id("cut");
    let counter = format!("/root/count-{id}");
    let child = spawn(c.run(
        &["--json", "--id", &id],
        "h1",
        &lines_cmd(&counter, 75, "0.2", 7),
    ));
    h.wait_file("h1", &marker(&id, ".start"), Duration::from_secs(20));
    sleep(Duration::from_millis(1500));
    h.fault(&["cut", "h1"]);
    sleep(Duration::from_secs(10));
    let still_running = !h.exists("h1", &marker(&id, ".done"));
    h.fault(&["restore", "h1"]);
    let out = finish(child, Duration::from_secs(90));
    let v = json(&out);
    assert!(still_running, "the command should outlast the cut");
    assert_eq!(out.status.code(), Some(7), "{v}");
    assert_eq!(v["state"], "completed", "{v}");
    assert_eq!(v["exit_code"], 7);
    assert_eq!(s(&v["stdout"]), numbered("line", 75), "stdout");
    assert_eq!(s(&v["stderr"]), numbered("err", 75), "stderr");
    assert_eq!(v["stdout_bytes"], numbered("line", 75).len());
    assert!(v["reconnects"].as_u64().unwrap_or(0) >= 1, "{v}");
    assert_eq!(
        h.count("h1", &counter),
        1,
        "the command must run exactly once"
    );
    assert_eq!(c.state(&id), Some(State::Delivered));
    assert!(
        c.kinds(&id).iter().any(|k| k == "connection-lost"),
        "{:?}",
        c.kinds(&id)
    );
}

/// The host reboots while the command runs: `interrupted`, never `running`, never run again.
fn reboot_mid_run_is_interrupted_never_rerun(fl: Flavour) {
    let Some(t) = Case::start("reboot_mid_run", fl, 1) else {
        return;
    };
    let (h, c) = (&t.hosts, t.client());
    let id = unique_id("rb");
    let counter = format!("/root/count-{id}");
    let child = spawn(c.run(
        &["--json", "--id", &id],
        "h1",
        &lines_cmd(&counter, 40, "0.1", 3),
    ));
    h.wait_file("h1", &marker(&id, ".start"), Duration::from_secs(20));
    sleep(Duration::from_millis(1000));
    h.fault(&["reboot", "h1"]);
    let out = finish(child, Duration::from_secs(90));
    let v = json(&out);
    assert_eq!(out.status.code(), Some(254), "{v}");
    assert_eq!(v["state"], "interrupted", "{v}");
    assert!(v["exit_code"].is_null(), "{v}");
    assert!(
        s(&v["reason"]).contains("reboot"),
        "reason should say the host rebooted: {v}"
    );
    // What was returned is what the host had written before it went down: a prefix.
    let so = s(&v["stdout"]);
    assert!(
        !so.is_empty() && numbered("line", 40).starts_with(so),
        "stdout: {so:?}"
    );
    assert_eq!(c.state(&id), Some(State::Interrupted));
    assert!(!h.exists("h1", &marker(&id, ".done")));
    // Nothing runs it again: not the run, not status, not recover, not attach.
    let st = run_to_end(
        {
            let mut x = c.cmd("status");
            x.args([&id, "--json"]);
            x
        },
        Duration::from_secs(60),
    );
    assert_eq!(json(&st)["state"], "interrupted", "{st:?}");
    let rec = run_to_end(
        {
            let mut x = c.cmd("recover");
            x.arg("--json");
            x
        },
        Duration::from_secs(60),
    );
    assert_eq!(String::from_utf8_lossy(&rec.stdout).trim(), "[]", "{rec:?}");
    let at = run_to_end(
        {
            let mut x = c.cmd("attach");
            x.arg(&id);
            x
        },
        Duration::from_secs(60),
    );
    assert_eq!(at.status.code(), Some(254), "{at:?}");
    sleep(Duration::from_secs(1));
    assert_eq!(h.count("h1", &counter), 1, "never run again");
    assert_eq!(c.state(&id), Some(State::Interrupted));
}

/// The host reboots after the command finished but before cairn read the result: the stored
/// result is still returned, for a running client (it was cut off) and for a detached one.
fn reboot_after_the_finish_still_returns_the_stored_result(fl: Flavour) {
    let Some(t) = Case::start("reboot_after_finish", fl, 1) else {
        return;
    };
    let (h, c) = (&t.hosts, t.client());

    // A: the client is attached, the link is cut, the command finishes, the host reboots.
    let id = unique_id("rbf");
    let counter = format!("/root/count-{id}");
    let child = spawn(c.run(
        &["--json", "--id", &id],
        "h1",
        &lines_cmd(&counter, 10, "0.1", 4),
    ));
    h.wait_file("h1", &marker(&id, ".start"), Duration::from_secs(20));
    h.fault(&["cut", "h1"]);
    h.wait_file("h1", &marker(&id, ".done"), Duration::from_secs(30));
    h.fault(&["reboot", "h1"]); // also brings the link back
    let out = finish(child, Duration::from_secs(90));
    let v = json(&out);
    assert_eq!(out.status.code(), Some(4), "{v}");
    assert_eq!(v["state"], "completed", "{v}");
    assert_eq!(s(&v["stdout"]), numbered("line", 10));
    assert_eq!(s(&v["stderr"]), numbered("err", 10));
    assert_eq!(h.count("h1", &counter), 1);
    assert_eq!(c.state(&id), Some(State::Delivered));

    // B: detached; finished; rebooted; then attach.
    let id = unique_id("rbd");
    let counter = format!("/root/count-{id}");
    let out = run_to_end(
        c.run(
            &["--detach", "--id", &id],
            "h1",
            &lines_cmd(&counter, 5, "0.1", 6),
        ),
        Duration::from_secs(60),
    );
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), id);
    h.wait_file("h1", &marker(&id, ".done"), Duration::from_secs(30));
    h.fault(&["reboot", "h1"]);
    let out = run_to_end(
        {
            let mut x = c.cmd("attach");
            x.args([&id, "--json"]);
            x
        },
        Duration::from_secs(60),
    );
    let v = json(&out);
    assert_eq!(out.status.code(), Some(6), "{v}");
    assert_eq!(v["state"], "completed", "{v}");
    assert_eq!(v["exit_code"], 6);
    assert_eq!(s(&v["stdout"]), numbered("line", 5));
    assert_eq!(s(&v["stderr"]), numbered("err", 5));
    assert_eq!(h.count("h1", &counter), 1);
    assert_eq!(c.state(&id), Some(State::Delivered), "attach delivered it");
}

/// sshd restarts while the command runs: the session and the job go on; the result comes back.
fn sshd_restart_mid_run_leaves_the_job_alone(fl: Flavour) {
    let Some(t) = Case::start("sshd_restart_mid_run", fl, 1) else {
        return;
    };
    let (h, c) = (&t.hosts, t.client());
    let id = unique_id("sshd");
    let counter = format!("/root/count-{id}");
    let child = spawn(c.run(
        &["--json", "--id", &id],
        "h1",
        &lines_cmd(&counter, 30, "0.1", 9),
    ));
    h.wait_file("h1", &marker(&id, ".start"), Duration::from_secs(20));
    sleep(Duration::from_millis(1000));
    h.fault(&["restart-sshd", "h1"]);
    let out = finish(child, Duration::from_secs(60));
    let v = json(&out);
    assert_eq!(out.status.code(), Some(9), "{v}");
    assert_eq!(v["state"], "completed", "{v}");
    assert_eq!(s(&v["stdout"]), numbered("line", 30));
    assert_eq!(s(&v["stderr"]), numbered("err", 30));
    assert_eq!(h.count("h1", &counter), 1);
    assert_eq!(c.state(&id), Some(State::Delivered));
}

/// The host hangs (every process frozen): cairn gives up at its deadline with `unknown` (exit
/// 254), never a guess; after the host thaws, `cairn recover` finds the truth.
fn hung_host_is_unknown_at_the_deadline_then_recover_finds_the_truth(fl: Flavour) {
    let Some(t) = Case::start("hung_host", fl, 1) else {
        return;
    };
    let h = &t.hosts;
    let mut c = t.client();
    c.reconnect_for = "8s".into();
    c.connect_timeout = "3s".into();
    c.keepalive = "1s".into();
    let id = unique_id("hang");
    let counter = format!("/root/count-{id}");
    let child = spawn(c.run(
        &["--json", "--id", &id],
        "h1",
        &lines_cmd(&counter, 30, "0.1", 5),
    ));
    h.wait_file("h1", &marker(&id, ".start"), Duration::from_secs(20));
    sleep(Duration::from_millis(1000));
    h.fault(&["hang", "h1"]);
    let hung = Instant::now();
    let out = wait_within(child, Duration::from_secs(60));
    let gave_up_after = hung.elapsed();
    h.fault(&["unhang", "h1"]);
    let out = out.unwrap_or_else(|o| panic!("cairn did not give up within 60 s: {o:?}"));
    let v = json(&out);
    say(&format!(
        "docker test {}: cairn gave up {:.1}s after the hang",
        t.name,
        gave_up_after.as_secs_f64()
    ));
    assert_eq!(out.status.code(), Some(254), "{v}");
    assert_eq!(v["state"], "unknown", "{v}");
    assert!(v["exit_code"].is_null(), "a missing status is never 0: {v}");
    // Order, not speed: it kept trying for its whole --reconnect-for (8 s) before it gave up.
    assert!(
        gave_up_after >= Duration::from_secs(8),
        "gave up before its deadline: {gave_up_after:?}"
    );
    assert!(numbered("line", 30).starts_with(s(&v["stdout"])));
    assert_eq!(c.state(&id), Some(State::Unknown));

    let rec = run_to_end(
        {
            let mut x = c.cmd("recover");
            x.args(["--wait", "--json"]);
            x
        },
        Duration::from_secs(90),
    );
    let rv: serde_json::Value = serde_json::from_slice(&rec.stdout)
        .unwrap_or_else(|e| panic!("recover output is not JSON ({e}): {rec:?}"));
    let one = rv
        .as_array()
        .and_then(|a| a.iter().find(|x| x["execution_id"] == id.as_str()))
        .unwrap_or_else(|| panic!("{id} not in recover output: {rv}"));
    assert_eq!(one["state"], "completed", "{one}");
    assert_eq!(one["exit_code"], 5, "{one}");
    assert_eq!(c.state(&id), Some(State::Completed));
    let o = run_to_end(
        {
            let mut x = c.cmd("output");
            x.arg(&id);
            x
        },
        Duration::from_secs(60),
    );
    assert_eq!(String::from_utf8_lossy(&o.stdout), numbered("line", 30));
    let e = run_to_end(
        {
            let mut x = c.cmd("output");
            x.args([&id, "--stderr"]);
            x
        },
        Duration::from_secs(60),
    );
    assert_eq!(String::from_utf8_lossy(&e.stdout), numbered("err", 30));
    assert_eq!(h.count("h1", &counter), 1);
}

/// The home (holding ~/.cairn) is full before the dispatch: `failed` (proven never started),
/// with the host's own error text in the reason.
fn disk_full_before_the_start_is_failed_with_the_hosts_error(fl: Flavour) {
    let Some(t) = Case::start("disk_full_before", fl, 1) else {
        return;
    };
    let (h, c) = (&t.hosts, t.client());
    let id = unique_id("full");
    // The counter lives outside the full filesystem, so a run would be seen.
    let counter = format!("/var/log/count-{id}");
    h.fault(&["fill-disk", "h1"]);
    let out = run_to_end(
        c.run(
            &["--json", "--id", &id],
            "h1",
            &format!("echo ran >> {counter}; echo should-not-run"),
        ),
        Duration::from_secs(60),
    );
    h.fault(&["unfill-disk", "h1"]);
    let v = json(&out);
    assert_eq!(out.status.code(), Some(255), "{v}");
    assert_eq!(v["state"], "failed", "{v}");
    assert!(
        s(&v["reason"]).contains("No space left on device"),
        "the host's error text belongs in the reason: {v}"
    );
    assert_eq!(s(&v["stdout"]), "");
    assert_eq!(c.state(&id), Some(State::Failed));
    assert_eq!(h.count("h1", &counter), 0);
    assert!(!h.exists("h1", &marker(&id, ".start")));
}

/// The home fills up while the command writes its output: cairn reports what happened (the
/// command's own status and exactly the bytes the host stored), nothing more.
fn disk_full_during_the_run_reports_only_what_was_seen(fl: Flavour) {
    let Some(t) = Case::start("disk_full_during", fl, 1) else {
        return;
    };
    let (h, c) = (&t.hosts, t.client());
    let id = unique_id("fulld");
    let counter = format!("/var/log/count-{id}");
    // ~300 KB of 100-byte lines over ~30 s; exits 41 at the first failed write.
    let cmd = format!(
        "echo ran >> {counter}; i=0; while [ $i -lt 3000 ]; do \
         printf '%-99s\\n' \"line $i\" || exit 41; i=$((i+1)); sleep 0.01; done; exit 0"
    );
    let child = spawn(c.run(&["--json", "--id", &id], "h1", &cmd));
    h.wait_file("h1", &marker(&id, ".start"), Duration::from_secs(20));
    sleep(Duration::from_millis(500));
    h.fault(&["fill-disk", "h1"]);
    let out = wait_within(child, Duration::from_secs(90));
    h.fault(&["unfill-disk", "h1"]);
    let out = out.unwrap_or_else(|o| panic!("cairn did not finish: {o:?}"));
    let v = json(&out);
    assert_eq!(h.count("h1", &counter), 1, "ran once");
    let done = h
        .read("h1", &marker(&id, ".done"))
        .map(|b| String::from_utf8_lossy(&b).trim().to_owned())
        .expect("the finish record fits in its reserved space");
    let status: u64 = field(&done, "status").unwrap().parse().unwrap();
    assert_eq!(status, 41, "fill-disk should have hit the command: {done}");
    let host_out = h.read("h1", &marker(&id, "/out")).unwrap_or_default();
    let host_err = h.read("h1", &marker(&id, "/err")).unwrap_or_default();
    // Not a false success, and exactly what the host has.
    assert_eq!(v["state"], "completed", "{v}");
    assert_eq!(v["exit_code"], status, "{v}");
    assert_eq!(out.status.code(), Some(41));
    assert_eq!(
        v["stdout_bytes"],
        host_out.len(),
        "stdout_bytes vs the host's out file"
    );
    let so = s(&v["stdout"]);
    assert!(
        so.as_bytes() == host_out.as_slice(),
        "returned stdout ({} bytes) is not the host's out file ({} bytes); returned starts {:?}",
        so.len(),
        host_out.len(),
        &so[..so.len().min(300)]
    );
    assert_eq!(
        s(&v["stderr"]).as_bytes(),
        host_err.as_slice(),
        "returned stderr is not the command's stderr"
    );
    assert_eq!(
        c.state(&id),
        Some(State::Delivered),
        "run --json delivered it"
    );
}

/// `cairn serve --host-session` on this host flavour: a dozen executions through the host's
/// session shell each run once with their own bytes and status; the host then reboots under
/// two that are still running: both `interrupted`, neither run again.
fn host_session_runs_each_once_and_a_reboot_leaves_its_runs_interrupted(fl: Flavour) {
    use std::io::Write;
    let Some(t) = Case::start("host_session", fl, 1) else {
        return;
    };
    let (h, c) = (&t.hosts, t.client());
    let (child, mut stdin, rx) = serve_host_session(&c);
    let tag = unique_id("hs");
    let quick = format!("/root/count-{tag}");
    let long = format!("/root/long-{tag}");
    let mut send = |id: usize, cmd: String| {
        let req = serde_json::json!({"jsonrpc": "2.0", "id": id, "method": "execute",
            "params": {"destination": "h1", "command": cmd}});
        writeln!(stdin, "{req}").unwrap();
    };
    for i in 0..10 {
        send(
            i,
            format!(
                "echo x >> {quick}; printf '%s\\n' \"q{i} 'ü'\"; echo e{i} >&2; exit {}",
                i % 3
            ),
        );
    }
    let mut got = BTreeMap::new();
    while got.len() < 10 {
        let v = rx
            .recv_timeout(Duration::from_secs(90))
            .expect("a response");
        got.insert(v["id"].as_u64().unwrap() as usize, v);
    }
    for (i, v) in &got {
        let r = &v["result"];
        assert_eq!(r["state"], "completed", "{v}");
        assert_eq!(r["exit_code"], (i % 3) as u64, "{v}");
        assert_eq!(s(&r["stdout"]), format!("q{i} 'ü'\n"), "{v}");
        assert_eq!(s(&r["stderr"]), format!("e{i}\n"), "{v}");
        // through the session: its command file is x/ID.cmd
        assert!(
            h.exists("h1", &marker(s(&r["execution_id"]), ".cmd")),
            "{v}"
        );
    }
    assert_eq!(h.count("h1", &quick), 10);
    for i in 10..12 {
        send(i, format!("echo x >> {long}; sleep 60; echo {i}"));
    }
    h.wait_file("h1", &long, Duration::from_secs(30));
    sleep(Duration::from_millis(1500));
    assert_eq!(h.count("h1", &long), 2);
    h.fault(&["reboot", "h1"]);
    for _ in 10..12 {
        let v = rx
            .recv_timeout(Duration::from_secs(120))
            .expect("a response");
        let r = &v["result"];
        assert_eq!(r["state"], "interrupted", "{v}");
        assert!(r["exit_code"].is_null(), "{v}");
        assert!(s(&r["reason"]).contains("reboot"), "{v}");
    }
    drop(stdin);
    let _ = wait_within(child, Duration::from_secs(30));
    assert_eq!(h.count("h1", &long), 2, "never run again");
}

/// The marker home turns read-only (`chattr +i` on it and everything in it) after the command
/// printed its output and before it ends, then writable again 4 s after it ended. The finish
/// record cannot be written meanwhile: cairn must not report a result the host does not hold.
/// It waits, and once the home is writable the record is written and the one result returned,
/// the same exit status as the host's durable record. Directly and through a host session.
fn readonly_markers_at_the_finish_hold_the_result_until_it_is_recorded(fl: Flavour) {
    use std::io::Write;
    let Some(t) = Case::start("readonly_markers_finish", fl, 1) else {
        return;
    };
    let (h, c) = (&t.hosts, t.client());
    let cmd = |counter: &str| {
        format!("echo ran >> {counter}; echo out-1; echo err-1 >&2; sleep 3; exit 7")
    };
    // the one result, as the host's durable finish record has it
    let recorded_once = |v: &serde_json::Value, id: &str, counter: &str| {
        assert_eq!(v["state"], "completed", "{v}");
        assert_eq!(v["exit_code"], 7, "{v}");
        assert_eq!(s(&v["stdout"]), "out-1\n", "{v}");
        let rec = h.read("h1", &marker(id, ".done")).unwrap_or_default();
        let rec = String::from_utf8_lossy(&rec);
        assert_eq!(
            field(&rec, "status"),
            Some("7"),
            "the host's record: {rec:?}"
        );
        assert_eq!(h.count("h1", counter), 1);
    };

    // 1. cairn run: the supervisor writes the record.
    let id = unique_id("ro");
    let counter = format!("/root/count-{id}");
    let child = spawn(c.run(&["--json", "--id", &id], "h1", &cmd(&counter)));
    h.wait_file("h1", &counter, Duration::from_secs(30));
    sleep(Duration::from_millis(800));
    h.fault(&["readonly-markers", "h1"]);
    sleep(Duration::from_secs(6));
    let recorded_early = h.exists("h1", &marker(&id, ".done"));
    let answered_early = c.state(&id).is_some_and(|s| s.is_settled());
    h.fault(&["writable-markers", "h1"]);
    let out = finish(child, Duration::from_secs(120));
    let v = json(&out);
    assert!(
        !recorded_early,
        "no finish record while the home was read-only"
    );
    assert!(
        !answered_early,
        "no result before the host recorded it: {v}"
    );
    recorded_once(&v, &id, &counter);
    assert_eq!(v["stderr"], "err-1\n", "{v}");
    assert_eq!(c.state(&id), Some(State::Delivered));

    // 2. The same through a host session: its finish helper writes the record.
    let (child, mut stdin, rx) = serve_host_session(&c);
    let id = unique_id("ros");
    let counter = format!("/root/count-{id}");
    let req = serde_json::json!({"jsonrpc": "2.0", "id": 1, "method": "execute",
        "params": {"destination": "h1", "command": cmd(&counter), "execution_id": id}});
    writeln!(stdin, "{req}").unwrap();
    h.wait_file("h1", &counter, Duration::from_secs(30));
    sleep(Duration::from_millis(800));
    h.fault(&["readonly-markers", "h1"]);
    sleep(Duration::from_secs(6));
    let recorded_early = h.exists("h1", &marker(&id, ".done"));
    let answered_early = rx.try_recv().ok();
    h.fault(&["writable-markers", "h1"]);
    let v = match answered_early {
        Some(v) => v,
        None => rx
            .recv_timeout(Duration::from_secs(120))
            .expect("a response"),
    };
    drop(stdin);
    let _ = wait_within(child, Duration::from_secs(30));
    assert!(
        !recorded_early,
        "no finish record while the home was read-only"
    );
    recorded_once(&v["result"], &id, &counter);
}

/// The native host helper runs on this flavour, as seen from the host: the first contact puts
/// the very file the client carries into `~/.cairn/bin`, and the process that supervises the
/// command (its parent, named as `sup_pid` in the started record) is that file, for a single
/// dispatch and through a host session. With `--host-helper never` the supervisor is the shell.
// Long: one scenario, its phases in order.
fn the_native_helper_supervises_dispatches_on_the_host(fl: Flavour) {
    use std::io::Write;
    let Some(t) = Case::start("native_helper_supervises", fl, 1) else {
        return;
    };
    let h = &t.hosts;
    let helper = format!(
        "/root/.cairn/bin/cairn-host-{}",
        cairn::testing::host_helper::SHA256
    );
    let side_of = |id: &str| -> String {
        let ev = cairn::journal::Journal::open(&t.dir.path().join("journal.db"))
            .expect("journal")
            .events(&cairn::ExecutionId::parse(id).expect("id"))
            .expect("events");
        let running = ev.iter().find(|e| e.kind == "running").expect("running");
        s(&running.evidence["host_side"]).to_owned()
    };
    let tag = unique_id("nh");
    let counter = format!("/root/count-{tag}");
    // the command names its parent and the program that parent runs
    let cmd = format!("echo ran >> {counter}; echo \"ppid=$PPID exe=$(readlink /proc/$PPID/exe)\"");
    let mut runs = 0;
    for side in ["auto", "never"] {
        let mut c = t.client();
        c.host_helper = Some(side.to_owned());
        // one dispatch
        let id = format!("{tag}-{side}");
        let out = run_to_end(
            c.run(&["--json", "--id", &id], "h1", &cmd),
            Duration::from_secs(60),
        );
        let v = json(&out);
        assert_eq!(v["state"], "completed", "{v}");
        let rec = h
            .read("h1", &marker(&id, ".start"))
            .expect("the started record");
        let rec = String::from_utf8_lossy(&rec).into_owned();
        let sup = field(&rec, "sup_pid").expect("sup_pid").to_owned();
        // through a host session
        let (child, mut stdin, rx) = serve_host_session(&c);
        let req = serde_json::json!({"jsonrpc": "2.0", "id": 1, "method": "execute",
            "params": {"destination": "h1", "command": cmd}});
        writeln!(stdin, "{req}").unwrap();
        let r = rx
            .recv_timeout(Duration::from_secs(90))
            .expect("a response")["result"]
            .clone();
        drop(stdin);
        let _ = wait_within(child, Duration::from_secs(30));
        assert_eq!(r["state"], "completed", "{r}");
        let sid = s(&r["execution_id"]).to_owned();
        let srec = h
            .read("h1", &marker(&sid, ".start"))
            .expect("its started record");
        let srec = String::from_utf8_lossy(&srec).into_owned();
        let ssup = field(&srec, "sup_pid").expect("sup_pid").to_owned();
        runs += 2;
        assert_eq!(h.count("h1", &counter), runs, "each ran once");
        if side == "auto" {
            assert_eq!(
                h.read("h1", &helper).as_deref(),
                Some(cairn::testing::host_helper::BINARY),
                "the helper in the marker home is the client's"
            );
            assert_eq!(
                s(&v["stdout"]),
                format!("ppid={sup} exe={helper}\n"),
                "{rec}"
            );
            assert_eq!(
                s(&r["stdout"]),
                format!("ppid={ssup} exe={helper}\n"),
                "{srec}"
            );
            assert_eq!(side_of(&id), "helper");
            assert_eq!(side_of(&sid), "helper");
        } else {
            for (o, what) in [(&v, "dispatch"), (&r, "session")] {
                let o = s(&o["stdout"]);
                assert!(o.starts_with("ppid="), "{what}: {o}");
                assert!(!o.contains("cairn-host-"), "{what}: the helper ran: {o}");
            }
            assert_eq!(side_of(&id), "sh");
            assert_eq!(side_of(&sid), "sh");
        }
    }
}

macro_rules! on_both_flavours {
    ($($name:ident),* $(,)?) => {
        mod ash {
            $( #[test] fn $name() { super::$name(super::Flavour::Ash) } )*
        }
        mod debian {
            $( #[test] fn $name() { super::$name(super::Flavour::Debian) } )*
        }
    };
}

on_both_flavours!(
    link_cut_for_10s_mid_run_reattaches_ran_once_full_output,
    reboot_mid_run_is_interrupted_never_rerun,
    reboot_after_the_finish_still_returns_the_stored_result,
    sshd_restart_mid_run_leaves_the_job_alone,
    hung_host_is_unknown_at_the_deadline_then_recover_finds_the_truth,
    disk_full_before_the_start_is_failed_with_the_hosts_error,
    disk_full_during_the_run_reports_only_what_was_seen,
    host_session_runs_each_once_and_a_reboot_leaves_its_runs_interrupted,
    readonly_markers_at_the_finish_hold_the_result_until_it_is_recorded,
    the_native_helper_supervises_dispatches_on_the_host,
);

// ------------------------------------------------------------------------------ the campaign

mod campaign;

/// The randomized fault campaign (see `docker/campaign.rs`).
#[test]
fn all_faults_randomized_campaign() {
    campaign::run();
}
