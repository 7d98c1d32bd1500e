//! Fleet runs (issue 5): `cairn run --hosts/--inventory`, batches, `cairn batch …`.
//!
//! The loopback test drives several private sshds (one per alias, each its own host key) from
//! one ssh_config; the Docker test runs 20 ash hosts through a cut link, a reboot and a
//! `kill -9` of the client, then `cairn batch resume`.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::support::host::{output, spawn, wait_child, wait_for, BIN};
use crate::support::sshd::Server;
use crate::support::TestSshd;

/// N loopback hosts named a1..aN in one ssh_config.
struct Loop {
    sshds: Vec<TestSshd>,
    dir: tempfile::TempDir,
}

impl Loop {
    fn new(n: usize) -> Loop {
        Loop::with(&vec![Server::OpenSsh; n])
    }

    /// One host per entry of `servers`, of that kind.
    fn with(servers: &[Server]) -> Loop {
        let sshds: Vec<TestSshd> = servers
            .iter()
            .map(|&s| TestSshd::start_server(s, None))
            .collect();
        let dir = tempfile::tempdir().unwrap();
        let mut cfg = String::new();
        for (i, s) in sshds.iter().enumerate() {
            cfg.push_str(&format!(
                "Host a{}\n  HostName 127.0.0.1\n  Port {}\n  User {}\n  IdentityFile {}\n  UserKnownHostsFile {}\n  IdentityAgent none\n",
                i + 1,
                s.port(),
                s.user(),
                s.client_key().display(),
                s.known_hosts().display()
            ));
        }
        fs::write(dir.path().join("ssh_config"), cfg).unwrap();
        Loop { sshds, dir }
    }
    fn journal(&self) -> PathBuf {
        self.dir.path().join("state/journal.db")
    }
    fn cairn(&self, sub: &[&str]) -> Command {
        let mut c = Command::new(BIN);
        c.args(sub)
            .env_remove("SSH_AUTH_SOCK")
            .env_remove("CAIRN_JOURNAL")
            .env_remove("CAIRN_INTENT_KEY")
            .env_remove("CAIRN_ACTOR")
            .env_remove("CAIRN_SCOPE")
            .env_remove("CAIRN_POLICY")
            .arg("--journal")
            .arg(self.journal())
            .arg("-F")
            .arg(self.dir.path().join("ssh_config"))
            .args(["--connect-timeout", "5s", "--reconnect-for", "20s"]);
        c
    }
    fn run(&self, extra: &[&str], command: &str) -> Command {
        let mut c = self.cairn(&["run"]);
        c.arg("--remote-dir")
            .arg(self.dir.path().join("cairn-home"))
            .args(extra)
            .arg("--")
            .arg(command);
        c
    }
    /// How many times the counting command ran on host i (0-based).
    fn runs(&self, i: usize) -> usize {
        fs::read_to_string(self.sshds[i].dir().join("ran.count"))
            .map(|s| s.lines().count())
            .unwrap_or(0)
    }
}

/// Appends to a file private to each test sshd (its boot-ID file's directory).
const COUNT: &str = "echo ran >> \"$(dirname \"$CAIRN_BOOT_ID_FILE\")/ran.count\"; ";

fn lines(out: &[u8]) -> Vec<String> {
    String::from_utf8_lossy(out)
        .lines()
        .map(str::to_owned)
        .collect()
}

/// Every descendant of process `pid` (children first, then theirs).
pub(crate) fn descendants(pid: u32) -> Vec<u32> {
    let mut out = Vec::new();
    let mut todo = vec![pid];
    while let Some(p) = todo.pop() {
        let kids = fs::read_to_string(format!("/proc/{p}/task/{p}/children")).unwrap_or_default();
        for k in kids.split_whitespace().filter_map(|k| k.parse().ok()) {
            out.push(k);
            todo.push(k);
        }
    }
    out
}

fn json_lines(out: &[u8]) -> Vec<Value> {
    lines(out)
        .iter()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect()
}

const LIMIT: Duration = Duration::from_secs(90);

#[test]
fn loopback_hosts_inventory_prefix_json_fail_fast_batches() {
    let l = Loop::new(4);

    // --hosts, prefixing, summary, exit 0, every host once.
    let out = output(
        l.run(
            &["--hosts", "a1,a2", "--parallel", "2"],
            &format!("{COUNT}echo hello; echo warn >&2"),
        ),
        LIMIT,
    );
    let so = String::from_utf8_lossy(&out.stdout).into_owned();
    let se = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(0), "{so}\n{se}");
    assert!(so.contains("a1   | hello"), "{so}");
    assert!(so.contains("a2   | hello"), "{so}");
    assert!(se.contains("a1   | warn"), "{se}");
    assert!(so.contains("HOST") && so.contains("RECONNECTS"), "{so}");
    assert!(so.contains("2 host(s), 2 ok"), "{so}");
    assert_eq!((l.runs(0), l.runs(1), l.runs(2)), (1, 1, 0));

    // No destination at all: a clear error, exit 255.
    let out = output(l.run(&[], "true"), LIMIT);
    assert_eq!(out.status.code(), Some(255));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--hosts"));

    // --inventory with comments, --json: one object per host and a summary; exit 1 when a
    // host exits non-zero.
    let inv = l.dir.path().join("inventory");
    fs::write(&inv, "# fleet\na1\n\n a3  # third\na4\n").unwrap();
    let out = output(
        l.run(
            &["--inventory", inv.to_str().unwrap(), "--json"],
            &format!(
                "{COUNT}echo out-$(basename \"$(dirname \"$CAIRN_BOOT_ID_FILE\")\"); case \"$CAIRN_BOOT_ID_FILE\" in {}*) exit 3;; esac",
                l.sshds[3].dir().display()
            ),
        ),
        LIMIT,
    );
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let v = json_lines(&out.stdout);
    assert_eq!(v.len(), 4, "{v:?}");
    let summary = &v[3];
    assert_eq!(summary["type"], "summary");
    assert_eq!(summary["hosts"], 3);
    assert_eq!(summary["ok"], 2);
    assert_eq!(summary["exit_code"], 1);
    let by_host = |h: &str| v.iter().find(|o| o["host"] == h).unwrap().clone();
    assert_eq!(by_host("a4")["exit_code"], 3);
    assert_eq!(by_host("a3")["state"], "completed");
    assert!(by_host("a1")["stdout"]
        .as_str()
        .unwrap()
        .starts_with("out-"));
    assert_eq!((l.runs(0), l.runs(2), l.runs(3)), (2, 1, 1));
    let batch = summary["batch_id"].as_str().unwrap().to_owned();
    assert!(batch.starts_with("bt_"));

    // batch status / ls know it.
    let out = output(l.cairn(&["batch", "status", &batch, "--json"]), LIMIT);
    let st: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(st["hosts"].as_array().unwrap().len(), 3);
    assert_eq!(st["states"]["completed"], 3, "{st}");
    let out = output(l.cairn(&["batch", "ls"]), LIMIT);
    assert!(String::from_utf8_lossy(&out.stdout).contains(&batch));

    // --fail-fast with --parallel 1: the first failure stops the rest (skipped, not run).
    let before: Vec<usize> = (0..4).map(|i| l.runs(i)).collect();
    let out = output(
        l.run(
            &[
                "--hosts",
                "a1,a2,a3,a4",
                "--parallel",
                "1",
                "--fail-fast",
                "--json",
            ],
            &format!("{COUNT}exit 5"),
        ),
        LIMIT,
    );
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let v = json_lines(&out.stdout);
    let states: Vec<&str> = v[..4]
        .iter()
        .map(|o| o["state"].as_str().unwrap())
        .collect();
    assert_eq!(
        states.iter().filter(|s| **s == "skipped").count(),
        3,
        "{v:?}"
    );
    let after: Vec<usize> = (0..4).map(|i| l.runs(i)).collect();
    let ran: usize = after.iter().zip(&before).map(|(a, b)| a - b).sum();
    assert_eq!(ran, 1);

    // --batch-size 2: a failure in the first rolling batch keeps the second from starting;
    // --output-dir gets the files.
    let dir = l.dir.path().join("outdir");
    let before: Vec<usize> = (0..4).map(|i| l.runs(i)).collect();
    let out = output(
        l.run(
            &[
                "--hosts",
                "a1,a2,a3,a4",
                "--batch-size",
                "2",
                "--output-dir",
                dir.to_str().unwrap(),
            ],
            &format!(
                "{COUNT}echo to-file; case \"$CAIRN_BOOT_ID_FILE\" in {}*) exit 7;; esac",
                l.sshds[1].dir().display()
            ),
        ),
        LIMIT,
    );
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let after: Vec<usize> = (0..4).map(|i| l.runs(i)).collect();
    let delta: Vec<usize> = after.iter().zip(&before).map(|(a, b)| a - b).collect();
    assert_eq!(delta, vec![1, 1, 0, 0]);
    assert_eq!(fs::read_to_string(dir.join("a1.out")).unwrap(), "to-file\n");
    assert!(!String::from_utf8_lossy(&out.stdout).contains("| to-file"));
    let so = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(so.contains("skipped"), "{so}");
    let batch2 = so
        .split_whitespace()
        .find(|w| w.starts_with("bt_"))
        .unwrap()
        .trim_end_matches(':')
        .to_owned();

    // Resume: the skipped hosts never got an execution, so they start now; the finished ones
    // are collected, not run again. The failed rolling batch stops it again only if a host of
    // the resumed set fails: here a2 is still failed, so a3/a4 stay skipped.
    let out = output(l.cairn(&["batch", "resume", &batch2, "--json"]), LIMIT);
    let v = json_lines(&out.stdout);
    let after2: Vec<usize> = (0..4).map(|i| l.runs(i)).collect();
    assert_eq!(after2[0], after[0], "a1 collected, not re-run: {v:?}");
    assert_eq!(after2[1], after[1], "a2 collected, not re-run: {v:?}");
    assert_eq!(out.status.code(), Some(1), "{v:?}");
}

/// A batch on a1 and a2 in which a2's sshd was down, so a2's execution failed at first
/// contact (nothing sent, nobody asked); a2's sshd is back up afterwards. Returns the batch ID
/// and a2's execution ID.
#[test]
fn a_fleet_of_openssh_and_dropbear_hosts_runs_once_on_each() {
    let l = Loop::with(&[Server::OpenSsh, Server::Dropbear, Server::Dropbear]);
    let out = output(
        l.run(
            &["--hosts", "a1,a2,a3", "--parallel", "3", "--json"],
            &format!("{COUNT}echo on-$(basename \"$(dirname \"$CAIRN_BOOT_ID_FILE\")\")"),
        ),
        LIMIT,
    );
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let v = json_lines(&out.stdout);
    assert_eq!(v.len(), 4, "{v:?}");
    for (i, s) in l.sshds.iter().enumerate() {
        let o = v
            .iter()
            .find(|o| o["host"] == format!("a{}", i + 1))
            .unwrap_or_else(|| panic!("a{}: {v:?}", i + 1));
        let name = s.dir().file_name().unwrap().to_string_lossy().into_owned();
        assert_eq!(o["stdout"], format!("on-{name}\n"), "{o}");
        assert_eq!(o["exit_code"], 0, "{o}");
        assert_eq!(l.runs(i), 1, "a{}", i + 1);
    }
    assert_eq!(v[3]["ok"], 3, "{}", v[3]);
}

fn batch_with_a2_unreachable(l: &Loop) -> (String, Value) {
    l.sshds[1].stop_sshd();
    let out = output(
        l.run(&["--hosts", "a1,a2", "--json"], &format!("{COUNT}echo hi")),
        LIMIT,
    );
    let v = json_lines(&out.stdout);
    let batch = v
        .iter()
        .find_map(|o| o["batch_id"].as_str().map(str::to_owned))
        .unwrap_or_else(|| panic!("no batch id: {v:?}"));
    let a2 = v.iter().find(|o| o["host"] == "a2").unwrap();
    assert_eq!(a2["state"], "failed", "{v:?}");
    assert_eq!((l.runs(0), l.runs(1)), (1, 0));
    l.sshds[1].restart_sshd();
    (batch, a2["execution_id"].clone())
}

#[test]
fn resume_dispatches_again_a_host_that_provably_never_started() {
    let l = Loop::new(2);
    let (batch, a2_id) = batch_with_a2_unreachable(&l);

    // Back up: resume sends a2 again under its own ID; a1 is collected, never re-run.
    let out = output(l.cairn(&["batch", "resume", &batch, "--json"]), LIMIT);
    let v = json_lines(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{v:?}");
    assert_eq!((l.runs(0), l.runs(1)), (1, 1), "{v:?}");
    let a2 = v.iter().find(|o| o["host"] == "a2").unwrap();
    assert_eq!(a2["state"], "completed", "{v:?}");
    assert_eq!(
        a2["execution_id"], a2_id,
        "the same execution ID, sent again"
    );
}

#[test]
fn resume_without_connection_flags_connects_as_the_batch_did() {
    let l = Loop::new(2);
    let (batch, a2_id) = batch_with_a2_unreachable(&l);
    // No -F (the aliases a1, a2 exist only in the batch's ssh_config), no agent, empty HOME.
    let home = tempfile::tempdir().unwrap();
    let mut c = Command::new(BIN);
    c.args(["batch", "resume", &batch, "--json"])
        .env_remove("SSH_AUTH_SOCK")
        .env_remove("CAIRN_JOURNAL")
        .env_remove("CAIRN_INTENT_KEY")
        .env_remove("CAIRN_POLICY")
        .env("HOME", home.path())
        .arg("--journal")
        .arg(l.journal());
    let out = output(c, LIMIT);
    let v = json_lines(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{v:?} {out:?}");
    assert_eq!((l.runs(0), l.runs(1)), (1, 1), "{v:?}");
    let a2 = v.iter().find(|o| o["host"] == "a2").unwrap();
    assert_eq!(a2["state"], "completed", "{v:?}");
    assert_eq!(a2["execution_id"], a2_id);
}

// ---------------------------------------------------------------------------------------
// Docker: 20 ash hosts, a cut link, a reboot, kill -9 of the client, then resume.

use crate::support::docker::{docker_enabled, say, Flavour, Hosts};

fn docker_cairn(hosts: &Hosts, journal: &Path, sub: &[&str]) -> Command {
    let mut c = Command::new(BIN);
    c.args(sub)
        .env_remove("SSH_AUTH_SOCK")
        .env_remove("CAIRN_JOURNAL")
        .env_remove("CAIRN_ACTOR")
        .env_remove("CAIRN_SCOPE")
        .env_remove("CAIRN_POLICY")
        .arg("--journal")
        .arg(journal)
        .arg("-F")
        .arg(hosts.ssh_config())
        .arg("--known-hosts")
        .arg(hosts.known_hosts())
        .args([
            "--connect-timeout",
            "5s",
            "--keepalive",
            "1s",
            "--reconnect-for",
            "60s",
        ]);
    c
}

#[test]
fn docker_twenty_hosts_cut_reboot_kill_resume() {
    if !docker_enabled("fleet::docker_twenty_hosts_cut_reboot_kill_resume") {
        return;
    }
    let n = 20;
    let hosts = Hosts::up("fleet", Flavour::Ash, n);
    let tmp = tempfile::tempdir().unwrap();
    let journal = tmp.path().join("journal.db");
    let names: Vec<String> = (1..=n).map(|i| format!("h{i}")).collect();
    // Each host counts its runs, then works for a while (long enough for the faults).
    let cmd = "echo ran >> /root/fleet.count; sleep 6; echo done-$(hostname)";
    let mut run = docker_cairn(&hosts, &journal, &["run"]);
    run.args(["--hosts", &names.join(","), "--parallel", "10", "--json"])
        .arg("--batch")
        .arg("bt_fleet_docker")
        .arg("--")
        .arg(cmd);
    let child = spawn(run);
    // Wait until the first wave is running, then: cut h2's link, reboot h3, kill the client.
    hosts.wait_file("h2", "/root/fleet.count", Duration::from_secs(60));
    hosts.wait_file("h3", "/root/fleet.count", Duration::from_secs(60));
    say("fleet: cut h2, reboot h3");
    hosts.fault(&["cut", "h2"]);
    hosts.fault(&["reboot", "h3"]);
    std::thread::sleep(Duration::from_millis(500));
    say("fleet: kill -9 the client mid-batch");
    // SAFETY: a signal to our own child, not reaped yet.
    unsafe {
        libc::kill(child.id() as i32, libc::SIGKILL);
    }
    let killed = wait_child(child, Duration::from_secs(30));
    assert_eq!(killed.status.code(), None, "killed by a signal");
    hosts.fault(&["restore", "h2"]);

    let t0 = Instant::now();
    let resume = docker_cairn(
        &hosts,
        &journal,
        &["batch", "resume", "bt_fleet_docker", "--json"],
    );
    let out = wait_child(spawn(resume), Duration::from_secs(240));
    say(&format!("fleet: resume took {:?}", t0.elapsed()));
    let v = json_lines(&out.stdout);
    let summary = v.last().unwrap();
    assert_eq!(summary["type"], "summary", "{v:?}");
    assert_eq!(summary["hosts"], n as u64);
    let line = |h: &str| {
        v.iter()
            .find(|o| o["host"] == h)
            .unwrap_or_else(|| panic!("no line for {h}: {v:?}"))
    };
    let j = cairn::journal::Journal::open(&journal).unwrap();
    let journal_state = |h: &str| {
        let id = cairn::ExecutionId::parse(line(h)["execution_id"].as_str().unwrap()).unwrap();
        j.status(&id).unwrap().map(|s| s.state)
    };
    let h3 = line("h3");
    assert_eq!(h3["state"], "interrupted", "{v:?}");
    assert!(h3["exit_code"].is_null(), "{h3}");
    assert_eq!(journal_state("h3"), Some(cairn::State::Interrupted));
    for h in names.iter().filter(|h| *h != "h3") {
        let o = line(h);
        assert_eq!(o["state"], "completed", "{h}: {v:?}");
        assert_eq!(o["exit_code"], 0, "{h}: {o}");
        assert_eq!(o["stdout"], format!("done-{h}\n"), "{h}: {o}");
        assert!(
            matches!(
                journal_state(h),
                Some(cairn::State::Completed | cairn::State::Delivered)
            ),
            "{h}: {:?}",
            journal_state(h)
        );
    }
    // Every execution is settled now (no supervisor of this batch runs any more), so the
    // counts are final.
    for h in &names {
        assert_eq!(
            hosts.count(h, "/root/fleet.count"),
            1,
            "{h} ran exactly once: {v:?}"
        );
    }
    assert_eq!(summary["ok"], (n - 1) as u64);
    assert_eq!(out.status.code(), Some(254));
    assert_eq!(summary["needs_review"][0]["host"], "h3");
}

#[test]
fn resume_asks_for_authorization_a_host_left_accepted_by_a_killed_client() {
    let l = Loop::new(1);
    let batch = "bt_accepted_only";
    // The first run asks on a terminal (`--approve prompt`, under `script` for a pty) and is
    // killed while it waits: its execution is accepted, never authorized, nothing was sent.
    let run = l.run(
        &["--hosts", "a1", "--approve", "prompt", "--batch", batch],
        &format!("{COUNT}echo hi"),
    );
    let quote = |s: &std::ffi::OsStr| format!("'{}'", s.to_string_lossy().replace('\'', r"'\''"));
    let line = std::iter::once(quote(run.get_program()))
        .chain(run.get_args().map(quote))
        .collect::<Vec<_>>()
        .join(" ");
    let mut s = Command::new("script");
    s.args(["-qefc", &line, "/dev/null"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null());
    for (k, v) in run.get_envs() {
        match v {
            Some(v) => s.env(k, v),
            None => s.env_remove(k),
        };
    }
    let mut first = s.spawn().expect("script (util-linux)");
    let id = wait_for(
        "the execution accepted, waiting for approval",
        LIMIT,
        || {
            let out = output(l.cairn(&["batch", "status", batch, "--json"]), LIMIT);
            let st: Value = serde_json::from_slice(&out.stdout).ok()?;
            let h = &st["hosts"][0];
            (h["state"] == "accepted").then(|| h["execution_id"].as_str().unwrap().to_owned())
        },
    );
    // Kill the cairn process under `script` (by its PID, found among script's descendants).
    let bin = fs::canonicalize(BIN).unwrap();
    let cairn_pid = wait_for("the cairn process under script", LIMIT, || {
        descendants(first.id())
            .into_iter()
            .find(|p| fs::read_link(format!("/proc/{p}/exe")).is_ok_and(|e| e == bin))
    });
    assert!(crate::support::host::sigkill(cairn_pid as i32, false));
    let _ = first.kill();
    let _ = first.wait();
    assert_eq!(l.runs(0), 0);

    // Resume asks the approver now (allow), dispatches it under its own ID, once.
    let out = output(
        l.cairn(&["batch", "resume", batch, "--json", "--approve", "allow"]),
        LIMIT,
    );
    let v = json_lines(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{v:?}");
    assert_eq!(l.runs(0), 1, "{v:?}");
    let a1 = v.iter().find(|o| o["host"] == "a1").unwrap();
    assert_eq!(a1["state"], "completed", "{v:?}");
    assert_eq!(a1["execution_id"], id.as_str());
    let j = cairn::journal::Journal::open(&l.journal()).unwrap();
    let events = j.events(&cairn::ExecutionId::parse(&id).unwrap()).unwrap();
    let kinds: Vec<&str> = events.iter().map(|e| e.kind.as_str()).collect();
    let at = |k: &str| kinds.iter().position(|x| *x == k);
    assert!(
        at("resumed") < at("authorized") && at("authorized") < at("dispatched"),
        "{kinds:?}"
    );
    assert!(at("resumed").is_some(), "{kinds:?}");
}

#[test]
fn resume_asks_the_approver_before_retrying_a_host_that_failed_before_it_was_asked() {
    let l = Loop::new(2);
    let (batch, _) = batch_with_a2_unreachable(&l);
    // The resume's approver says no: a2 is rejected, never sent; a1 is collected.
    let out = output(
        l.cairn(&["batch", "resume", &batch, "--json", "--approve", "deny"]),
        LIMIT,
    );
    let v = json_lines(&out.stdout);
    let a2 = v.iter().find(|o| o["host"] == "a2").unwrap();
    assert_eq!(a2["state"], "rejected", "{v:?}");
    assert_eq!((l.runs(0), l.runs(1)), (1, 0), "{v:?}");
    assert_ne!(out.status.code(), Some(0), "{v:?}");
}
