//! A private PostgreSQL server for the tests: `initdb` in a temporary directory, `postgres`
//! started as an unprivileged user (the `postgres` account when the tests run as root, which
//! `initdb` refuses), listening on a loopback port with trust authentication, one server per
//! test binary, a fresh database per test.
//!
//! The server is started from a thread that lives as long as the test process and is told to
//! quit (`SIGQUIT`, PostgreSQL's immediate shutdown) when that thread dies, so a test binary
//! that exits or is killed leaves no server behind. Directories left by earlier processes that
//! died are removed on the next start.
//!
//! Without PostgreSQL a test that needs it fails, saying what to install; a developer who
//! cannot install it skips those tests on purpose with `CAIRN_PG_TESTS=0` (said loudly, and
//! refused under CI: `ci.rs`).
//!
//! This file is shared: the integration tests include it as `support::postgres`, the library's
//! unit tests through `#[path]`.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{mpsc, Mutex, OnceLock};
use std::time::{Duration, Instant};

/// The running server of this test process.
pub struct PgServer {
    pub port: u16,
    pub dir: PathBuf,
    bin: PathBuf,
    control: Mutex<mpsc::Sender<Order>>,
}

/// An order to the keeper thread, with where to answer.
type Order = (Control, mpsc::Sender<Result<(), String>>);

enum Control {
    /// Stop with `-m immediate` semantics (SIGQUIT: no checkpoint, as after a crash) and
    /// start again on the same port and data.
    Restart,
    /// Stop for good (the server is dropped).
    Stop,
}

static NEXT_DB: AtomicU32 = AtomicU32::new(0);

#[path = "ci.rs"]
pub mod ci;

/// The server shared by this test binary, started on first use; `None` (after a loud line)
/// when the developer opted out with `CAIRN_PG_TESTS=0`; a failing test when PostgreSQL cannot
/// be started. `test` names the caller.
pub fn server(test: &str) -> Option<&'static PgServer> {
    if ci::opted_out("CAIRN_PG_TESTS", test, "PostgreSQL") {
        return None;
    }
    static SERVER: OnceLock<Result<PgServer, String>> = OnceLock::new();
    missing(test, SERVER.get_or_init(start).as_ref())
}

/// A server of the caller's own, stopped when dropped: for a test that crashes and restarts
/// it, so that the tests sharing [`server`] are not disturbed.
pub fn own_server(test: &str) -> Option<PgServer> {
    if ci::opted_out("CAIRN_PG_TESTS", test, "PostgreSQL") {
        return None;
    }
    match start() {
        Ok(s) => Some(s),
        Err(e) => {
            missing(test, Err(&e));
            None
        }
    }
}

fn missing<'a>(test: &str, r: Result<&'a PgServer, &String>) -> Option<&'a PgServer> {
    match r {
        Ok(s) => Some(s),
        Err(e) => panic!(
            "{test}: PostgreSQL is needed but could not be started: {e}. Install the Debian \
             `postgresql` package (.ci/run does; or point CAIRN_PG_BIN at its bin directory), \
             or set CAIRN_PG_TESTS=0 to skip the PostgreSQL tests (refused in CI)"
        ),
    }
}

impl Drop for PgServer {
    fn drop(&mut self) {
        let (tx, rx) = mpsc::channel();
        if let Ok(c) = self.control.lock() {
            if c.send((Control::Stop, tx)).is_ok() {
                let _ = rx.recv_timeout(Duration::from_secs(30));
            }
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

impl PgServer {
    /// A new empty database: its connection URL.
    pub fn database(&self, hint: &str) -> String {
        let n = NEXT_DB.fetch_add(1, Ordering::Relaxed);
        let clean: String = hint
            .chars()
            .filter(|c| c.is_ascii_alphanumeric() || *c == '_')
            .take(40)
            .collect::<String>()
            .to_ascii_lowercase();
        let name = format!("t{n}_{clean}");
        let out = Command::new(self.bin.join("createdb"))
            .args([
                "-h",
                "127.0.0.1",
                "-p",
                &self.port.to_string(),
                "-U",
                "postgres",
            ])
            .arg(&name)
            .output()
            .expect("run createdb");
        assert!(
            out.status.success(),
            "createdb {name}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        self.url(&name)
    }

    pub fn url(&self, db: &str) -> String {
        format!("postgres://postgres@127.0.0.1:{}/{db}", self.port)
    }

    /// Run SQL with psql against `db` as the superuser; its stdout (`-At`: unaligned, tuples
    /// only).
    pub fn psql(&self, db: &str, sql: &str) -> Result<String, String> {
        let out = Command::new(self.bin.join("psql"))
            .args([
                "-h",
                "127.0.0.1",
                "-p",
                &self.port.to_string(),
                "-U",
                "postgres",
            ])
            .args(["-X", "-At", "-v", "ON_ERROR_STOP=1", "-d", db, "-c", sql])
            .output()
            .map_err(|e| e.to_string())?;
        if out.status.success() {
            Ok(String::from_utf8_lossy(&out.stdout).into_owned())
        } else {
            Err(String::from_utf8_lossy(&out.stderr).into_owned())
        }
    }

    /// Crash the server (immediate shutdown) and start it again on the same data and port.
    pub fn restart(&self) {
        let (tx, rx) = mpsc::channel();
        self.control
            .lock()
            .unwrap()
            .send((Control::Restart, tx))
            .expect("the PostgreSQL keeper thread is gone");
        rx.recv_timeout(Duration::from_secs(60))
            .expect("the PostgreSQL keeper thread did not answer")
            .expect("restart PostgreSQL");
    }
}

/// The directory holding `initdb`, `postgres`, `createdb`: `$CAIRN_PG_BIN`, else the newest
/// `/usr/lib/postgresql/*/bin`, else wherever `initdb` is on `PATH`.
fn bin_dir() -> Result<PathBuf, String> {
    if let Some(p) = std::env::var_os("CAIRN_PG_BIN").filter(|p| !p.is_empty()) {
        return Ok(PathBuf::from(p));
    }
    let mut versions: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            let v: u32 = e.file_name().to_str()?.parse().ok()?;
            let bin = e.path().join("bin");
            bin.join("initdb").exists().then_some((v, bin))
        })
        .collect();
    versions.sort();
    if let Some((_, b)) = versions.pop() {
        return Ok(b);
    }
    std::env::var_os("PATH")
        .into_iter()
        .flat_map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .find(|d| d.join("initdb").exists() && d.join("postgres").exists())
        .ok_or_else(|| "no initdb and postgres found (/usr/lib/postgresql/*/bin, PATH)".into())
}

/// The uid and gid to run the server as: ours, unless we are root (then `postgres`'s).
fn account() -> Result<Option<(u32, u32)>, String> {
    // SAFETY: geteuid takes nothing, touches no memory and cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        return Ok(None);
    }
    let id = |flag: &str| -> Result<u32, String> {
        let out = Command::new("id")
            .args([flag, "postgres"])
            .output()
            .map_err(|e| e.to_string())?;
        String::from_utf8_lossy(&out.stdout)
            .trim()
            .parse()
            .map_err(|_| {
                "running as root, and there is no `postgres` account to run initdb as".into()
            })
    };
    Ok(Some((id("-u")?, id("-g")?)))
}

fn chown(path: &Path, who: Option<(u32, u32)>) {
    if let Some((u, g)) = who {
        let _ = std::os::unix::fs::chown(path, Some(u), Some(g));
    }
}

fn as_account(c: &mut Command, who: Option<(u32, u32)>) {
    use std::os::unix::process::CommandExt;
    if let Some((u, g)) = who {
        c.uid(u).gid(g);
    }
}

/// Remove the directories of earlier test processes that are gone.
fn remove_stale(base: &Path) {
    for e in std::fs::read_dir(base).into_iter().flatten().flatten() {
        let name = e.file_name();
        let Some(pid) = name
            .to_str()
            .and_then(|n| n.strip_prefix("cairn-pg-"))
            .and_then(|p| p.split('-').next()?.parse::<i32>().ok())
        else {
            continue;
        };
        if pid != std::process::id() as i32 && !Path::new(&format!("/proc/{pid}")).exists() {
            let _ = std::fs::remove_dir_all(e.path());
        }
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .unwrap_or(55432)
}

// Long: initdb, then the keeper thread that owns the server (its restart and stop orders
// inline, so it holds the only handle), then the wait until it is ready.
fn start() -> Result<PgServer, String> {
    let bin = bin_dir()?;
    let who = account()?;
    let base = std::env::temp_dir();
    remove_stale(&base);
    // (one directory per server: a test may start one of its own beside the shared one)
    static SERVERS: AtomicU32 = AtomicU32::new(0);
    let n = SERVERS.fetch_add(1, Ordering::Relaxed);
    let dir = base.join(format!("cairn-pg-{}-{n}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    chown(&dir, who);
    let data = dir.join("data");
    let mut init = Command::new(bin.join("initdb"));
    init.arg("-D")
        .arg(&data)
        .args([
            "-A",
            "trust",
            "-U",
            "postgres",
            "-N",
            "-E",
            "UTF8",
            "--locale=C",
        ])
        .stdout(Stdio::null());
    as_account(&mut init, who);
    let out = init.output().map_err(|e| format!("initdb: {e}"))?;
    if !out.status.success() {
        return Err(format!("initdb: {}", String::from_utf8_lossy(&out.stderr)));
    }
    let port = free_port();
    let (ctl_tx, ctl_rx) = mpsc::channel::<Order>();
    let (ready_tx, ready_rx) = mpsc::channel();
    let (b2, d2) = (bin.clone(), dir.clone());
    // The keeper: spawns the server and lives as long as the process, so that the parent-death
    // signal (set per thread by the kernel) reaches the server only when the process ends.
    std::thread::Builder::new()
        .name("postgres-keeper".into())
        .spawn(move || {
            let spawn = || spawn_server(&b2, &d2, port, who);
            let mut child = match spawn() {
                Ok(c) => c,
                Err(e) => {
                    let _ = ready_tx.send(Err(e));
                    return;
                }
            };
            let _ = ready_tx.send(wait_ready(&b2, port));
            for (cmd, reply) in ctl_rx {
                match cmd {
                    Control::Restart => {
                        // SAFETY: a signal to our own child, which we have not reaped yet.
                        unsafe { libc::kill(child.id() as i32, libc::SIGQUIT) };
                        let _ = child.wait();
                        let r = spawn().and_then(|c| {
                            child = c;
                            wait_ready(&b2, port)
                        });
                        let _ = reply.send(r);
                    }
                    Control::Stop => {
                        // SAFETY: a signal to our own child, which we have not reaped yet.
                        unsafe { libc::kill(child.id() as i32, libc::SIGQUIT) };
                        let _ = child.wait();
                        let _ = reply.send(Ok(()));
                        return;
                    }
                }
            }
            // every sender gone: the process is ending; the death signal does the rest
            std::thread::park();
        })
        .map_err(|e| e.to_string())?;
    ready_rx
        .recv_timeout(Duration::from_secs(90))
        .map_err(|_| "PostgreSQL did not start within 90 s".to_string())??;
    Ok(PgServer {
        port,
        dir,
        bin,
        control: Mutex::new(ctl_tx),
    })
}

fn spawn_server(
    bin: &Path,
    dir: &Path,
    port: u16,
    who: Option<(u32, u32)>,
) -> Result<Child, String> {
    use std::os::unix::process::CommandExt;
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(dir.join("log"))
        .map_err(|e| e.to_string())?;
    chown(&dir.join("log"), who);
    let mut c = Command::new(bin.join("postgres"));
    c.arg("-D")
        .arg(dir.join("data"))
        .arg("-k")
        .arg(dir)
        .args(["-p", &port.to_string()])
        .args([
            "-c",
            "listen_addresses=127.0.0.1",
            "-c",
            "max_connections=300",
        ])
        .args(["-c", "fsync=on", "-c", "synchronous_commit=on"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log);
    as_account(&mut c, who);
    // SAFETY: the closure runs in the child between fork and exec and calls only prctl, which
    // is async-signal-safe.
    unsafe {
        // after the uid change (which clears it): tell the server to quit when its keeper dies
        c.pre_exec(|| {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGQUIT) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    c.spawn().map_err(|e| format!("postgres: {e}"))
}

fn wait_ready(bin: &Path, port: u16) -> Result<(), String> {
    let t0 = Instant::now();
    while t0.elapsed() < Duration::from_secs(60) {
        let ok = Command::new(bin.join("pg_isready"))
            .args([
                "-q",
                "-h",
                "127.0.0.1",
                "-p",
                &port.to_string(),
                "-U",
                "postgres",
            ])
            .status()
            .is_ok_and(|s| s.success());
        if ok {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Err("PostgreSQL did not accept connections within 60 s".into())
}
