//! One test host for the loopback integration tests: a private sshd, a cuttable proxy in front
//! of it, a journal and a marker home, and the helpers the tests share to drive the real
//! `cairn` binary and read back what happened.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use cairn::journal::Journal;
use cairn::{ExecutionId, State};
use serde_json::Value;

use super::{Proxy, TestSshd};

pub const BIN: &str = env!("CARGO_BIN_EXE_cairn");

/// SIGKILL to the process `pid`, or with `group` to its process group; true if it was sent.
///
/// Tests never run a `kill` program for this: procps-ng 4.0.2 reads `kill -KILL -12870` as
/// options and calls kill(-1, SIGKILL), every process on the machine (the CI run and the
/// Docker engine with it). PIDs 0 and 1, which would name this test's own group or everything,
/// are refused.
pub fn sigkill(pid: i32, group: bool) -> bool {
    assert!(pid > 1, "refusing to signal PID {pid}");
    let target = if group { -pid } else { pid };
    // SAFETY: kill touches no memory; the PID (or group) was checked above to be one of ours.
    unsafe { libc::kill(target, libc::SIGKILL) == 0 }
}

pub struct Host {
    pub sshd: TestSshd,
    pub proxy: Proxy,
    pub known_hosts: PathBuf,
    pub journal: PathBuf,
    pub remote_dir: PathBuf,
    pub counter: PathBuf,
    /// Environment for every `cairn` this host's helpers start (`CAIRN_HOST_HELPER=never`, say).
    pub env: Vec<(String, String)>,
}

impl Host {
    pub fn new() -> Host {
        Host::with_path(None)
    }

    /// A host whose sessions find the tools in `first` before the usual ones (see
    /// `TestSshd::start_with_path`).
    pub fn with_path(first: Option<&Path>) -> Host {
        Host::on(TestSshd::start_with_path(first))
    }

    /// A host whose server is Dropbear (see `Server::Dropbear`).
    pub fn dropbear() -> Host {
        Host::on(TestSshd::start_dropbear())
    }

    /// A host on this server, with a proxy in front of it.
    pub fn on(sshd: TestSshd) -> Host {
        let proxy = Proxy::start(sshd.port());
        let known_hosts = sshd.known_hosts_for_port(proxy.port());
        let journal = sshd.dir().join("state").join("journal.db");
        let remote_dir = sshd.dir().join("cairn-home");
        let counter = sshd.dir().join("ran.count");
        Host {
            sshd,
            proxy,
            known_hosts,
            journal,
            remote_dir,
            counter,
            env: Vec::new(),
        }
    }

    /// The connection options reaching this host through the proxy.
    pub fn conn_args(&self, c: &mut Command, reconnect_for: &str) {
        c.env_remove("SSH_AUTH_SOCK")
            .env_remove("CAIRN_JOURNAL")
            .env_remove("CAIRN_INTENT_KEY")
            .env_remove("CAIRN_ACTOR")
            .env_remove("CAIRN_SCOPE")
            .env_remove("CAIRN_POLICY")
            .env("CAIRN_LOG", "cairn=info")
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .arg("--journal")
            .arg(&self.journal)
            .args(["-F", "/dev/null", "-p", &self.proxy.port().to_string()])
            .arg("-i")
            .arg(self.sshd.client_key())
            .arg("--known-hosts")
            .arg(&self.known_hosts)
            .args([
                "--connect-timeout",
                "5s",
                "--keepalive",
                "1s",
                "--reconnect-for",
                reconnect_for,
            ]);
    }

    pub fn cairn(&self, sub: &str) -> Command {
        let mut c = Command::new(BIN);
        c.arg(sub);
        self.conn_args(&mut c, "60s");
        c
    }

    pub fn run_cmd(&self, extra: &[&str], command: &str) -> Command {
        let mut c = self.cairn("run");
        c.arg("--remote-dir").arg(&self.remote_dir);
        c.args(extra);
        c.arg("127.0.0.1").arg("--").arg(command);
        c
    }

    /// A plain journal command (no connection options).
    pub fn local(&self, sub: &str) -> Command {
        let mut c = Command::new(BIN);
        c.arg(sub).arg("--journal").arg(&self.journal);
        c.env_remove("CAIRN_JOURNAL");
        c
    }

    pub fn count(&self) -> String {
        format!("echo ran >> '{}'; ", self.counter.display())
    }

    pub fn runs(&self) -> usize {
        fs::read_to_string(&self.counter)
            .map(|s| s.lines().count())
            .unwrap_or(0)
    }

    pub fn journal(&self) -> Journal {
        Journal::open(&self.journal).expect("open journal")
    }

    pub fn executions(&self) -> usize {
        self.journal().list().expect("list").len()
    }

    pub fn kinds(&self, id: &str) -> Vec<String> {
        self.journal()
            .events(&ExecutionId::parse(id).unwrap())
            .expect("events")
            .into_iter()
            .map(|e| e.kind.to_string())
            .collect()
    }

    pub fn state(&self, id: &str) -> State {
        self.journal()
            .status(&ExecutionId::parse(id).unwrap())
            .unwrap()
            .unwrap()
            .state
    }

    /// Wait until the journal records the execution `delivered` (a server records it after
    /// writing the response the test has just read).
    pub fn wait_delivered(&self, id: &str) {
        let mut last = None;
        let t0 = Instant::now();
        while t0.elapsed() < Duration::from_secs(30) {
            last = Some(self.state(id));
            if last == Some(State::Delivered) {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        panic!("{id} was not recorded delivered within 30 s (last state {last:?})");
    }

    pub fn x(&self) -> PathBuf {
        self.remote_dir.join("x")
    }

    /// [`Host::wait_started`] for async tests: waits without holding a runtime thread, so a
    /// call in flight can be raced against it (`tokio::select!`).
    pub async fn started(&self) -> String {
        for _ in 0..400 {
            if let Some(id) = self.started_id() {
                return id;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("no started record within 20 s");
    }

    pub fn wait_started(&self) -> String {
        wait_for("a started record", Duration::from_secs(20), || {
            let rd = fs::read_dir(self.x()).ok()?;
            rd.filter_map(|e| e.ok())
                .filter_map(|e| e.file_name().into_string().ok())
                .find_map(|n| n.strip_suffix(".start").map(str::to_owned))
        })
    }

    pub fn wait_done(&self, id: &str) {
        let p = self.x().join(format!("{id}.done"));
        wait_for("the finish record", Duration::from_secs(30), || {
            p.exists().then_some(())
        });
    }
}

pub fn wait_for<T>(what: &str, limit: Duration, mut f: impl FnMut() -> Option<T>) -> T {
    let t0 = Instant::now();
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(
            t0.elapsed() < limit,
            "timed out after {limit:?} waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

pub fn spawn(mut c: Command) -> Child {
    c.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn cairn")
}

pub fn wait_child(mut child: Child, limit: Duration) -> Output {
    let t0 = Instant::now();
    loop {
        if child.try_wait().expect("try_wait").is_some() {
            return child.wait_with_output().expect("output");
        }
        if t0.elapsed() > limit {
            let _ = child.kill();
            let out = child.wait_with_output().expect("output");
            panic!(
                "cairn did not finish within {limit:?}\nstdout: {}\nstderr: {}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

pub fn output(c: Command, limit: Duration) -> Output {
    wait_child(spawn(c), limit)
}

pub fn json_of(out: &Output) -> Value {
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text.lines().last().unwrap_or_default();
    serde_json::from_str(line).unwrap_or_else(|e| {
        panic!(
            "not JSON ({e}): {text}\nstderr: {}",
            String::from_utf8_lossy(&out.stderr)
        )
    })
}

impl Host {
    /// `cairn run --json` of a one-megabyte command that counts its run and ends with `tail`.
    /// (argv caps one argument at 128 KiB, so the megabyte comes as ten words.)
    pub fn megabyte_run(&self, tail: &str) -> Command {
        let filler = "x".repeat(100_000);
        let mut c = self.cairn("run");
        c.arg("--remote-dir")
            .arg(&self.remote_dir)
            .args(["--json", "127.0.0.1", "--"]);
        c.arg(format!("{}:", self.count()));
        for _ in 0..10 {
            c.arg(&filler);
        }
        c.arg(tail);
        c
    }

    /// The one execution ID whose started record exists on the host.
    pub fn started_id(&self) -> Option<String> {
        let rd = fs::read_dir(self.x()).ok()?;
        rd.filter_map(|e| e.ok())
            .filter_map(|e| e.file_name().into_string().ok())
            .find_map(|n| n.strip_suffix(".start").map(str::to_owned))
    }

    pub fn start_record(&self, id: &str) -> String {
        fs::read_to_string(self.x().join(format!("{id}.start"))).expect("start record")
    }
}
