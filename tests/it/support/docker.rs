//! Docker test hosts (`docker/hosts.sh`) for the fault tests: bring a set up, inject faults,
//! read files on a host, tear the set down on drop (also when the test panics).
//!
//! Every set gets its own prefix (`cit<pid>-<group>`), so test threads, and other test processes
//! in the same tree, never share containers, networks or state directories. Sets left behind by
//! a test process that died (its PID is gone) are taken down by the next one.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use cairn::journal::Journal;
use cairn::{ExecutionId, State};

const REPO: &str = env!("CARGO_MANIFEST_DIR");

/// Bound of one `hosts.sh` call (its own waits are bounded by 60 s).
const HOSTS_SH_LIMIT: Duration = Duration::from_secs(120);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Flavour {
    /// busybox ash, this machine's sshd.
    Ash,
    /// Debian bookworm minbase: dash, bash login shell, GNU userland.
    Debian,
}

impl Flavour {
    pub fn as_str(self) -> &'static str {
        match self {
            Flavour::Ash => "ash",
            Flavour::Debian => "debian",
        }
    }
}

/// Print a line that the test harness does not capture (timings, the campaign line).
pub fn say(line: &str) {
    let mut e = std::io::stderr().lock();
    let _ = writeln!(e, "{line}");
}

/// Whether the Docker tests can run. `CAIRN_DOCKER_TESTS=0` skips them loudly (and is refused
/// when `CI` is set: there a skipped fault test must not count as passed); otherwise a missing
/// or unreachable Docker engine fails the test with a message saying how to skip.
pub fn docker_enabled(test: &str) -> bool {
    if super::ci::opted_out("CAIRN_DOCKER_TESTS", test, "Docker (the fault tests)") {
        return false;
    }
    static CHECK: OnceLock<Result<(), String>> = OnceLock::new();
    let check = CHECK.get_or_init(|| {
        let mut c = Command::new("docker");
        c.args(["info", "--format", "{{.ServerVersion}}"]);
        match output_within(c, Duration::from_secs(30)) {
            Err(e) => Err(format!("cannot run docker: {e}")),
            Ok(o) if !o.status.success() => Err(format!(
                "docker info failed: {}",
                String::from_utf8_lossy(&o.stderr).trim()
            )),
            Ok(_) => Ok(()),
        }
    });
    if let Err(e) = check {
        panic!(
            "{test}: the Docker fault tests need a reachable Docker engine ({e}). \
             Start dockerd, or set CAIRN_DOCKER_TESTS=0 to skip these tests."
        );
    }
    true
}

/// Run a command to completion within `limit`; kill it and return an error if it overruns.
pub fn output_within(mut c: Command, limit: Duration) -> Result<Output, String> {
    let child = c
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("spawn {c:?}: {e}"))?;
    wait_within(child, limit).map_err(|o| {
        format!(
            "{c:?} did not finish within {limit:?}\nstdout: {}\nstderr: {}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        )
    })
}

/// Wait for a child (stdout/stderr piped) within `limit`. On overrun it is killed and its
/// partial output comes back as the error.
pub fn wait_within(mut child: Child, limit: Duration) -> Result<Output, Output> {
    // Drain the pipes on threads so a chatty child never blocks on a full pipe.
    let mut so = child.stdout.take();
    let mut se = child.stderr.take();
    let to = std::thread::spawn(move || {
        let mut b = Vec::new();
        if let Some(s) = so.as_mut() {
            let _ = std::io::Read::read_to_end(s, &mut b);
        }
        b
    });
    let te = std::thread::spawn(move || {
        let mut b = Vec::new();
        if let Some(s) = se.as_mut() {
            let _ = std::io::Read::read_to_end(s, &mut b);
        }
        b
    });
    let t0 = Instant::now();
    let mut overran = false;
    let status = loop {
        if let Some(st) = child.try_wait().expect("try_wait") {
            break st;
        }
        if t0.elapsed() > limit {
            overran = true;
            let _ = child.kill();
            break child.wait().expect("wait");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let out = Output {
        status,
        stdout: to.join().unwrap_or_default(),
        stderr: te.join().unwrap_or_default(),
    };
    if overran {
        Err(out)
    } else {
        Ok(out)
    }
}

/// Spawn with piped stdout/stderr and no stdin.
pub fn spawn(mut c: Command) -> Child {
    c.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn")
}

fn hosts_sh() -> PathBuf {
    Path::new(REPO).join("docker/hosts.sh")
}

fn state_root() -> PathBuf {
    match std::env::var_os("CAIRN_TESTHOST_STATE_ROOT") {
        Some(p) => PathBuf::from(p),
        None => Path::new(REPO).join("docker/.state"),
    }
}

/// `up` calls are serialized within this process: images are built once, subnets are picked
/// one at a time.
static UP_LOCK: Mutex<()> = Mutex::new(());

/// Take down sets whose test process is gone (a killed `cargo test` cannot run its drops).
fn reap_stale_sets() {
    static ONCE: OnceLock<()> = OnceLock::new();
    ONCE.get_or_init(|| {
        let Ok(rd) = std::fs::read_dir(state_root()) else {
            return;
        };
        for e in rd.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            let Some(rest) = name.strip_prefix("cit") else {
                continue;
            };
            let Some(pid) = rest.split('-').next().and_then(|p| p.parse::<u32>().ok()) else {
                continue;
            };
            if pid != std::process::id() && !Path::new(&format!("/proc/{pid}")).exists() {
                say(&format!("docker: taking down stale test hosts '{name}'"));
                let mut c = Command::new(hosts_sh());
                c.args(["--prefix", &name, "down"]);
                let _ = output_within(c, HOSTS_SH_LIMIT);
            }
        }
    });
}

fn build_image(flavour: Flavour) {
    static BUILT: Mutex<Vec<Flavour>> = Mutex::new(Vec::new());
    let mut built = BUILT.lock().unwrap_or_else(|p| p.into_inner());
    if built.contains(&flavour) {
        return;
    }
    let t0 = Instant::now();
    let mut c = Command::new(Path::new(REPO).join("docker/build-images.sh"));
    c.arg(flavour.as_str());
    let o = output_within(c, Duration::from_secs(600)).unwrap_or_else(|e| panic!("{e}"));
    assert!(
        o.status.success(),
        "docker/build-images.sh {} failed: {}",
        flavour.as_str(),
        String::from_utf8_lossy(&o.stderr)
    );
    if t0.elapsed() > Duration::from_secs(2) {
        say(&format!(
            "docker: image cairn-testhost:{} built in {:.1}s",
            flavour.as_str(),
            t0.elapsed().as_secs_f64()
        ));
    }
    built.push(flavour);
}

/// A set of test hosts h1…hN of one flavour, taken down on drop.
pub struct Hosts {
    pub prefix: String,
    pub flavour: Flavour,
    pub n: usize,
    dir: PathBuf,
    up: bool,
}

impl Hosts {
    /// Bring up `n` hosts of `flavour` for the test group `group` (a short name).
    pub fn up(group: &str, flavour: Flavour, n: usize) -> Hosts {
        Hosts::up_with(group, flavour, n, &[])
    }

    /// [`Hosts::up`] with further options of `hosts.sh up` (`--shared-host-key`).
    pub fn up_with(group: &str, flavour: Flavour, n: usize, options: &[&str]) -> Hosts {
        reap_stale_sets();
        let prefix = format!("cit{}-{group}", std::process::id());
        let dir = state_root().join(&prefix);
        let mut hosts = Hosts {
            prefix,
            flavour,
            n,
            dir,
            up: false,
        };
        let _g = UP_LOCK.lock().unwrap_or_else(|p| p.into_inner());
        build_image(flavour);
        let t0 = Instant::now();
        let mut last = String::new();
        for attempt in 0..6u32 {
            let mut c = Command::new(hosts_sh());
            c.args(["--prefix", &hosts.prefix, "up", &n.to_string()])
                .args(["--flavour", flavour.as_str()])
                .args(options);
            if attempt > 0 {
                // The default subnet (derived from the prefix) was taken: pick another.
                let nanos = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map(|d| d.subsec_nanos() as u64)
                    .unwrap_or(0);
                let x = 20 + splitmix64(u64::from(std::process::id()) ^ nanos) % 200;
                c.args(["--subnet", &format!("172.29.{x}.0/24")]);
            }
            hosts.up = true; // from here on, a partial set must be taken down
            match output_within(c, HOSTS_SH_LIMIT) {
                Ok(o) if o.status.success() => {
                    say(&format!(
                        "docker: {n} {} host(s) '{}' up in {:.1}s",
                        flavour.as_str(),
                        hosts.prefix,
                        t0.elapsed().as_secs_f64()
                    ));
                    return hosts;
                }
                Ok(o) => last = String::from_utf8_lossy(&o.stderr).into_owned(),
                Err(e) => last = e,
            }
            hosts.down();
            hosts.up = true;
            if !(last.contains("overlaps") || last.contains("cannot create network")) {
                break;
            }
        }
        panic!(
            "docker/hosts.sh up {n} --flavour {} failed: {last}",
            flavour.as_str()
        );
    }

    fn down(&mut self) {
        if !self.up {
            return;
        }
        self.up = false;
        let mut c = Command::new(hosts_sh());
        c.args(["--prefix", &self.prefix, "down"]);
        match output_within(c, HOSTS_SH_LIMIT) {
            Ok(o) if o.status.success() => {}
            Ok(o) => say(&format!(
                "docker: down of '{}' failed: {}",
                self.prefix,
                String::from_utf8_lossy(&o.stderr)
            )),
            Err(e) => say(&format!("docker: down of '{}' failed: {e}", self.prefix)),
        }
    }

    pub fn ssh_config(&self) -> PathBuf {
        self.dir.join("ssh_config")
    }

    pub fn known_hosts(&self) -> PathBuf {
        self.dir.join("known_hosts")
    }

    /// A host's home (/root, holding ~/.cairn) as mounted on this machine: its marker files
    /// read here directly, with the host's own modification times.
    pub fn home(&self, host: &str) -> PathBuf {
        self.dir.join(host).join("home")
    }

    /// `hosts.sh --prefix P ARGS…`, bounded; panics with its message on failure.
    pub fn fault(&self, args: &[&str]) {
        if let Err(e) = self.try_fault(args) {
            panic!("{e}");
        }
    }

    pub fn try_fault(&self, args: &[&str]) -> Result<(), String> {
        let mut c = Command::new(hosts_sh());
        c.args(["--prefix", &self.prefix]).args(args);
        let o = output_within(c, HOSTS_SH_LIMIT)?;
        if o.status.success() {
            Ok(())
        } else {
            Err(format!(
                "hosts.sh {args:?} failed ({}): {}",
                o.status,
                String::from_utf8_lossy(&o.stderr)
            ))
        }
    }

    /// `docker exec` on a host (through hosts.sh), bounded.
    pub fn exec(&self, host: &str, args: &[&str]) -> Output {
        let mut c = Command::new(hosts_sh());
        c.args(["--prefix", &self.prefix, "exec", host]).args(args);
        output_within(c, Duration::from_secs(60)).unwrap_or_else(|e| panic!("{e}"))
    }

    /// A file's bytes on the host, or None when it does not exist.
    pub fn read(&self, host: &str, path: &str) -> Option<Vec<u8>> {
        let o = self.exec(
            host,
            &[
                "sh",
                "-c",
                "[ -e \"$1\" ] || exit 3; cat \"$1\"",
                "sh",
                path,
            ],
        );
        match o.status.code() {
            Some(0) => Some(o.stdout),
            Some(3) => None,
            _ => panic!(
                "reading {path} on {host} failed: {}",
                String::from_utf8_lossy(&o.stderr)
            ),
        }
    }

    pub fn exists(&self, host: &str, path: &str) -> bool {
        self.exec(host, &["test", "-e", path]).status.success()
    }

    /// Lines in a counter file on the host (0 when it does not exist).
    pub fn count(&self, host: &str, path: &str) -> usize {
        self.read(host, path)
            .map(|b| b.iter().filter(|&&c| c == b'\n').count())
            .unwrap_or(0)
    }

    /// Wait (bounded) until a file exists on the host.
    pub fn wait_file(&self, host: &str, path: &str, limit: Duration) {
        let t0 = Instant::now();
        while !self.exists(host, path) {
            assert!(
                t0.elapsed() < limit,
                "{path} did not appear on {host} within {limit:?}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// A client (the `cairn` binary `bin`) for these hosts with its own journal.
    pub fn client(&self, bin: &Path, journal: PathBuf) -> Client {
        Client {
            bin: bin.to_owned(),
            ssh_config: self.ssh_config(),
            known_hosts: self.known_hosts(),
            journal,
            keepalive: "1s".into(),
            connect_timeout: "3s".into(),
            reconnect_for: "60s".into(),
            host_helper: None,
        }
    }
}

impl Drop for Hosts {
    fn drop(&mut self) {
        self.down();
    }
}

/// Path of an execution's marker files on a host (default remote dir `~/.cairn`, home /root).
pub fn marker(id: &str, suffix: &str) -> String {
    format!("/root/.cairn/x/{id}{suffix}")
}

/// Builds `cairn` command lines for one journal and one set of hosts.
#[derive(Clone)]
pub struct Client {
    pub bin: PathBuf,
    pub ssh_config: PathBuf,
    pub known_hosts: PathBuf,
    pub journal: PathBuf,
    pub keepalive: String,
    pub connect_timeout: String,
    pub reconnect_for: String,
    /// `--host-helper` for every command (`None`: cairn's default).
    pub host_helper: Option<String>,
}

impl Client {
    /// `cairn SUB` with the connection options.
    pub fn cmd(&self, sub: &str) -> Command {
        let mut c = Command::new(&self.bin);
        c.arg(sub)
            .env_remove("SSH_AUTH_SOCK")
            .env_remove("CAIRN_JOURNAL")
            .env_remove("CAIRN_REMOTE_DIR")
            .env("CAIRN_LOG", "cairn=info")
            .arg("--journal")
            .arg(&self.journal)
            .arg("-F")
            .arg(&self.ssh_config)
            .arg("--known-hosts")
            .arg(&self.known_hosts)
            .args(["--keepalive", &self.keepalive])
            .args(["--connect-timeout", &self.connect_timeout])
            .args(["--reconnect-for", &self.reconnect_for]);
        if let Some(h) = &self.host_helper {
            c.args(["--host-helper", h]);
        }
        c
    }

    /// `cairn SUB` with the journal and no connection options at all (no `-F`, `-i`,
    /// `--known-hosts`, no agent, an empty HOME): what the journal recorded for each execution
    /// is all it has to reach the hosts.
    pub fn bare(&self, sub: &str, home: &Path) -> Command {
        let mut c = Command::new(&self.bin);
        c.arg(sub)
            .env_remove("SSH_AUTH_SOCK")
            .env_remove("CAIRN_JOURNAL")
            .env_remove("CAIRN_REMOTE_DIR")
            .env("HOME", home)
            .env("CAIRN_LOG", "cairn=info")
            .arg("--journal")
            .arg(&self.journal)
            .args(["--keepalive", &self.keepalive])
            .args(["--connect-timeout", &self.connect_timeout])
            .args(["--reconnect-for", &self.reconnect_for]);
        if let Some(h) = &self.host_helper {
            c.args(["--host-helper", h]);
        }
        c
    }

    /// `cairn run [EXTRA…] HOST -- COMMAND`.
    pub fn run(&self, extra: &[&str], host: &str, command: &str) -> Command {
        let mut c = self.cmd("run");
        c.args(extra).arg(host).arg("--").arg(command);
        c
    }

    pub fn state(&self, id: &str) -> Option<State> {
        let j = Journal::open(&self.journal).ok()?;
        j.status(&ExecutionId::parse(id).ok()?)
            .ok()?
            .map(|s| s.state)
    }

    pub fn kinds(&self, id: &str) -> Vec<String> {
        let j = Journal::open(&self.journal).expect("open journal");
        j.events(&ExecutionId::parse(id).expect("id"))
            .expect("events")
            .into_iter()
            .map(|e| e.kind.to_string())
            .collect()
    }
}

/// The last line of stdout as JSON.
pub fn json(out: &Output) -> serde_json::Value {
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text.lines().last().unwrap_or_default();
    serde_json::from_str(line).unwrap_or_else(|e| {
        panic!(
            "not JSON ({e}): {text}\nstderr: {}",
            String::from_utf8_lossy(&out.stderr)
        )
    })
}

/// A small seeded PRNG (splitmix64 seeding, xorshift64*).
#[derive(Clone, Debug)]
pub struct Rng(u64);

pub fn splitmix64(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(splitmix64(seed) | 1)
    }

    pub fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// Uniform in lo..=hi.
    pub fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.next_u64() % (hi - lo + 1)
    }

    /// Uniform in [lo, hi) as a Duration, in milliseconds.
    pub fn millis(&mut self, lo: u64, hi: u64) -> Duration {
        Duration::from_millis(self.range(lo, hi))
    }
}
