//! A private SSH server on 127.0.0.1, run as the current user, in its own temp dir: OpenSSH's
//! sshd, or Dropbear ([`Server`]). Either one runs every command through a forced command that
//! records the length of each exec request's command string ([`write_exec_guard`]).

use std::fs;
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use cairn::ssh::{AgentSetting, ConnectOptions, Target};

const SSHD: &str = "/usr/sbin/sshd";
const DROPBEAR: &str = "/usr/sbin/dropbear";
const READY_TIMEOUT: Duration = Duration::from_secs(10);

pub struct TestSshd {
    dir: tempfile::TempDir,
    port: u16,
    user: String,
    child: Mutex<Option<Child>>,
    server: Server,
    path_first: Option<PathBuf>,
    /// The accept loop's stop flag (tinysshd).
    tiny_stop: Mutex<Option<std::sync::Arc<std::sync::atomic::AtomicBool>>>,
    /// Every command runs through the forced command that measures exec requests.
    guard: bool,
}

/// Which SSH server a [`TestSshd`] runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Server {
    OpenSsh,
    /// Debian's `dropbear-bin` (`-F -E -s`, its forced command `-c`). It reads the account's
    /// `~/.ssh/authorized_keys` only: it runs in a mount namespace of its own (`unshare -m`)
    /// where that directory is this server's temp directory, so the real one is never touched.
    Dropbear,
    /// Dropbear on a host whose /bin/sh is busybox ash.
    DropbearBusybox,
    /// Debian's `tinysshd`: a minimal server that speaks on its stdin and stdout, started per
    /// connection by an accept loop here (in the same kind of mount namespace as Dropbear). It
    /// has no forced command (its exec requests are not measured) and no port forwarding.
    TinySsh,
}

/// Key types the test harness can generate.
#[derive(Debug, Clone, Copy)]
pub enum KeyKind {
    Ed25519,
    Ecdsa,
    Rsa,
}

impl KeyKind {
    fn args(self) -> &'static [&'static str] {
        match self {
            KeyKind::Ed25519 => &["-t", "ed25519"],
            KeyKind::Ecdsa => &["-t", "ecdsa", "-b", "256"],
            KeyKind::Rsa => &["-t", "rsa", "-b", "2048"],
        }
    }
}

/// Run ssh-keygen to make a key pair at `path` (public key at `path.pub`).
pub fn keygen(path: &Path, kind: KeyKind, passphrase: &str) {
    let _ = fs::remove_file(path);
    let _ = fs::remove_file(path.with_extension("pub"));
    let st = Command::new("ssh-keygen")
        .args(kind.args())
        .args(["-q", "-N", passphrase, "-C", "cairn-test", "-f"])
        .arg(path)
        .stdin(Stdio::null())
        .status()
        .expect("run ssh-keygen");
    assert!(st.success(), "ssh-keygen failed for {}", path.display());
}

/// A Dropbear ed25519 host key at `d/dropbear_host_key`, and its public line in OpenSSH form
/// at `d/ssh_host_ed25519_key.pub` (where the known_hosts writers read it).
fn dropbear_keygen(d: &Path) {
    let key = d.join("dropbear_host_key");
    let st = Command::new("dropbearkey")
        .args(["-t", "ed25519", "-f"])
        .arg(&key)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .expect("dropbearkey is needed (apt-get install -y dropbear-bin)");
    assert!(st.success(), "dropbearkey failed");
    let out = Command::new("dropbearkey")
        .arg("-y")
        .arg("-f")
        .arg(&key)
        .output()
        .expect("dropbearkey -y");
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text
        .lines()
        .find(|l| l.starts_with("ssh-"))
        .expect("dropbearkey -y printed no public key");
    fs::write(d.join("ssh_host_ed25519_key.pub"), format!("{line}\n")).unwrap();
}

/// A tinysshd key directory at `d/tinykeys`, and its ed25519 public line at
/// `d/ssh_host_ed25519_key.pub`.
fn tinyssh_keygen(d: &Path) {
    let keys = d.join("tinykeys");
    let st = Command::new("tinysshd-makekey")
        .arg(&keys)
        .status()
        .expect("tinysshd-makekey is needed (apt-get install -y tinysshd)");
    assert!(st.success(), "tinysshd-makekey failed");
    let out = Command::new("tinysshd-printkey")
        .arg(&keys)
        .output()
        .expect("tinysshd-printkey");
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text
        .lines()
        .find(|l| l.starts_with("ssh-ed25519 "))
        .expect("tinysshd-printkey printed no ed25519 key");
    fs::write(d.join("ssh_host_ed25519_key.pub"), format!("{line}\n")).unwrap();
}

/// "type base64" of a .pub file (comment dropped).
pub fn pub_key_text(pub_path: &Path) -> String {
    let s = fs::read_to_string(pub_path).expect("read public key");
    let mut it = s.split_whitespace();
    format!("{} {}", it.next().unwrap(), it.next().unwrap())
}

pub fn current_user() -> String {
    cairn::ssh::resolve(
        "x",
        &ConnectOptions {
            ssh_config: Some(PathBuf::from("/dev/null")),
            ..Default::default()
        },
    )
    .expect("resolve")
    .user
}

/// The longest command string an SSH server may be sent (`cairn::testing::marker::MAX_EXEC_LEN`).
pub const MAX_EXEC_LEN: usize = cairn::testing::marker::MAX_EXEC_LEN;

/// Write `DIR/exec-guard`, the server's forced command: it records the length of every exec
/// request's command (`${#SSH_ORIGINAL_COMMAND}`, bytes under dash) in `DIR/exec-lengths`, and
/// the head of any longer than [`MAX_EXEC_LEN`] in `DIR/exec-too-long`, reads
/// `DIR/session-env` if there is one (a host shaped by [`TestSshd::hide_tools`]), then runs it through
/// the login shell as the server would have (a shell request gets the login shell). The
/// server's owner fails the test when `exec-too-long` exists ([`check_exec_lengths`]).
pub fn write_exec_guard(d: &Path) {
    let p = d.join("exec-guard");
    fs::write(
        &p,
        format!(
            "#!/bin/sh\n\
             c=$SSH_ORIGINAL_COMMAND\n\
             unset SSH_ORIGINAL_COMMAND\n\
             printf '%s\\n' \"${{#c}}\" >>'{d}/exec-lengths'\n\
             if [ \"${{#c}}\" -gt {MAX_EXEC_LEN} ]; then\n\
             \x20 printf '%s bytes: %.300s\\n' \"${{#c}}\" \"$c\" >>'{d}/exec-too-long'\n\
             fi\n\
             if [ -r '{d}/session-env' ]; then . '{d}/session-env'; fi\n\
             [ -n \"$c\" ] || exec \"${{SHELL:-/bin/sh}}\" -l\n\
             exec \"${{SHELL:-/bin/sh}}\" -c \"$c\"\n",
            d = d.display()
        ),
    )
    .unwrap();
    use std::os::unix::fs::PermissionsExt;
    fs::set_permissions(&p, fs::Permissions::from_mode(0o755)).unwrap();
}

/// The lengths of the exec requests the guard in `d` saw, and a panic naming any longer than
/// [`MAX_EXEC_LEN`].
pub fn check_exec_lengths(d: &Path) -> Vec<usize> {
    if let Ok(long) = fs::read_to_string(d.join("exec-too-long")) {
        panic!("exec requests over {MAX_EXEC_LEN} bytes were sent:\n{long}");
    }
    fs::read_to_string(d.join("exec-lengths"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.trim().parse().ok())
        .collect()
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .expect("bind")
        .local_addr()
        .unwrap()
        .port()
}

impl TestSshd {
    pub fn start() -> TestSshd {
        TestSshd::start_with_path(None)
    }

    /// An sshd whose sessions have `first` ahead of the usual directories in PATH (tools that
    /// stand in for the host's own, to slow one down or watch it).
    pub fn start_with_path(first: Option<&Path>) -> TestSshd {
        TestSshd::start_server(Server::OpenSsh, first)
    }

    /// A Dropbear server (see [`Server::Dropbear`]).
    pub fn start_dropbear() -> TestSshd {
        TestSshd::start_server(Server::Dropbear, None)
    }

    /// A Dropbear server on a host whose /bin/sh is busybox ash: in the server's mount
    /// namespace, busybox is mounted over the file /bin/sh names.
    pub fn start_dropbear_busybox() -> TestSshd {
        TestSshd::start_server(Server::DropbearBusybox, None)
    }

    /// A server of kind `server` whose sessions have `first` ahead of the usual directories
    /// in PATH.
    pub fn start_server(server: Server, first: Option<&Path>) -> TestSshd {
        TestSshd::start_with(server, first, true)
    }

    /// An OpenSSH sshd without the forced command that measures exec requests (for the
    /// benchmarks: it would add a process to every exec they time).
    pub fn start_unguarded() -> TestSshd {
        TestSshd::start_with(Server::OpenSsh, None, false)
    }

    fn start_with(server: Server, first: Option<&Path>, guard: bool) -> TestSshd {
        let dir = tempfile::Builder::new()
            .prefix("cairn-sshd-")
            .tempdir()
            .expect("tempdir");
        let d = dir.path();
        // SAFETY: geteuid takes nothing, touches no memory and cannot fail.
        if unsafe { libc::geteuid() } == 0 && !Path::new("/run/sshd").exists() {
            // sshd as root insists on its privilege separation directory.
            let _ = fs::create_dir_all("/run/sshd");
        }
        match server {
            Server::OpenSsh => keygen(&d.join("ssh_host_ed25519_key"), KeyKind::Ed25519, ""),
            Server::Dropbear | Server::DropbearBusybox => dropbear_keygen(d),
            Server::TinySsh => tinyssh_keygen(d),
        }
        keygen(&d.join("id_ed25519"), KeyKind::Ed25519, "");
        let authorized = match server {
            Server::OpenSsh => d.join("authorized_keys"),
            Server::Dropbear | Server::DropbearBusybox | Server::TinySsh => {
                fs::create_dir(d.join("dotssh")).unwrap();
                d.join("dotssh").join("authorized_keys")
            }
        };
        fs::write(
            authorized,
            format!("{}\n", pub_key_text(&d.join("id_ed25519.pub"))),
        )
        .unwrap();
        let path = match first {
            Some(p) => format!(" PATH={}:/usr/local/bin:/usr/bin:/bin", p.display()),
            None => String::new(),
        };
        write_exec_guard(d);
        let boot_id = fs::read_to_string("/proc/sys/kernel/random/boot_id").unwrap_or_default();
        fs::write(d.join("boot_id"), boot_id).unwrap();
        fs::write(
            d.join("sshd_config"),
            format!(
                "ListenAddress 127.0.0.1\n\
                 HostKey {d}/ssh_host_ed25519_key\n\
                 AuthorizedKeysFile {d}/authorized_keys\n\
                 PubkeyAuthentication yes\n\
                 PasswordAuthentication no\n\
                 KbdInteractiveAuthentication no\n\
                 UsePAM no\n\
                 StrictModes no\n\
                 PidFile {d}/sshd.pid\n\
                 MaxStartups 1000:30:2000\n\
                 MaxSessions 100\n\
                 MaxAuthTries 20\n\
                 LogLevel VERBOSE\n\
                 {force}\
                 SetEnv SHLVL=1 CAIRN_BOOT_ID_FILE={d}/boot_id{path}\n",
                d = d.display(),
                force = if guard {
                    format!("ForceCommand {}/exec-guard\n", d.display())
                } else {
                    String::new()
                },
            ),
        )
        .unwrap();
        let user = current_user();
        let mut s = TestSshd {
            dir,
            port: 0,
            user,
            child: Mutex::new(None),
            server,
            path_first: first.map(Path::to_path_buf),
            tiny_stop: Mutex::new(None),
            guard,
        };
        // A free port can be taken between our probe and sshd's bind: retry a few times.
        let mut last_err = String::new();
        for _ in 0..5 {
            s.port = free_port();
            match s.spawn() {
                Ok(()) => {
                    s.write_client_files();
                    return s;
                }
                Err(e) => last_err = e,
            }
        }
        panic!("could not start sshd: {last_err}");
    }

    fn spawn(&self) -> Result<(), String> {
        if self.server == Server::TinySsh {
            return self.spawn_tinyssh();
        }
        let log = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.path().join("sshd.log"))
            .map_err(|e| e.to_string())?;
        let mut cmd = match self.server {
            Server::OpenSsh => {
                let mut c = Command::new(SSHD);
                c.arg("-D")
                    .arg("-e")
                    .arg("-f")
                    .arg(self.dir.path().join("sshd_config"))
                    .arg("-p")
                    .arg(self.port.to_string());
                c
            }
            Server::Dropbear | Server::DropbearBusybox => self.dropbear_command(),
            Server::TinySsh => unreachable!("started by spawn_tinyssh"),
        };
        let mut child = cmd
            .stdin(Stdio::null())
            .stdout(log.try_clone().map_err(|e| e.to_string())?)
            .stderr(log)
            .spawn()
            .map_err(|e| format!("spawn {:?}: {e}", self.server))?;
        let start = Instant::now();
        loop {
            if let Ok(Some(st)) = child.try_wait() {
                return Err(format!(
                    "sshd exited with {st}; log:\n{}",
                    fs::read_to_string(self.dir.path().join("sshd.log")).unwrap_or_default()
                ));
            }
            if TcpStream::connect_timeout(
                &([127, 0, 0, 1], self.port).into(),
                Duration::from_millis(200),
            )
            .is_ok()
            {
                break;
            }
            if start.elapsed() > READY_TIMEOUT {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!("sshd not listening after {READY_TIMEOUT:?}"));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        *self.child.lock().unwrap() = Some(child);
        Ok(())
    }

    fn write_client_files(&self) {
        let d = self.dir.path();
        fs::write(
            self.known_hosts(),
            format!(
                "[127.0.0.1]:{} {}\n",
                self.port,
                pub_key_text(&d.join("ssh_host_ed25519_key.pub"))
            ),
        )
        .unwrap();
        fs::write(
            self.ssh_config(),
            format!(
                "Host testhost\n\
                 \x20 HostName 127.0.0.1\n\
                 \x20 Port {port}\n\
                 \x20 User {user}\n\
                 \x20 IdentityFile {d}/id_ed25519\n\
                 \x20 UserKnownHostsFile {d}/known_hosts\n\
                 \x20 IdentityAgent none\n\
                 Host *\n\
                 \x20 IdentityAgent none\n",
                port = self.port,
                user = self.user,
                d = d.display()
            ),
        )
        .unwrap();
    }

    /// Dropbear in the foreground on 127.0.0.1:PORT, inside a mount namespace where
    /// `~/.ssh` is this server's `dotssh` (its authorized_keys); `-e` hands its environment
    /// (the boot ID file, `SHLVL=1`, PATH) to the sessions, as sshd's `SetEnv` does.
    fn dropbear_command(&self) -> Command {
        let d = self.dir.path();
        let home = self.home();
        let dotssh = home.join(".ssh");
        if !dotssh.exists() {
            // (the mount point: an empty directory, as `ssh-keygen` would make it)
            let _ = fs::create_dir(&dotssh);
            use std::os::unix::fs::PermissionsExt;
            let _ = fs::set_permissions(&dotssh, fs::Permissions::from_mode(0o700));
        }
        let busybox = if self.server == Server::DropbearBusybox {
            "mount --bind /bin/busybox /bin/sh && "
        } else {
            ""
        };
        let mut c = Command::new("unshare");
        c.args(["-m", "--propagation", "private", "/bin/bash", "-c"])
            .arg(format!(
                "mount --bind \"$1\" \"$2\" && {busybox}shift 2 && exec \"$@\""
            ))
            .arg("cairn-dropbear")
            .arg(d.join("dotssh"))
            .arg(&dotssh)
            .arg(DROPBEAR)
            .args(["-F", "-E", "-s", "-e", "-m", "-p"])
            .arg(format!("127.0.0.1:{}", self.port))
            .arg("-r")
            .arg(d.join("dropbear_host_key"))
            .arg("-P")
            .arg(d.join("dropbear.pid"))
            .args(if self.guard {
                vec!["-c".into(), d.join("exec-guard")]
            } else {
                vec![]
            })
            .env("SHLVL", "1")
            .env("CAIRN_BOOT_ID_FILE", d.join("boot_id"));
        if let Some(p) = &self.path_first {
            c.env(
                "PATH",
                format!("{}:/usr/local/bin:/usr/bin:/bin", p.display()),
            );
        }
        c
    }

    /// Make this host one without the tools named in `hide` (`sha256sum`, say): its sessions'
    /// PATH becomes a directory with every other program of the usual directories.
    pub fn hide_tools(&self, hide: &[&str]) {
        let bin = self.dir.path().join("path-bin");
        fs::create_dir_all(&bin).unwrap();
        for d in [
            "/usr/local/sbin",
            "/usr/local/bin",
            "/usr/sbin",
            "/usr/bin",
            "/sbin",
            "/bin",
        ] {
            let Ok(rd) = fs::read_dir(d) else { continue };
            for e in rd.flatten() {
                let name = e.file_name();
                if hide.iter().any(|h| name == std::ffi::OsStr::new(h)) {
                    continue;
                }
                // (the first directory wins, as in PATH)
                let _ = std::os::unix::fs::symlink(e.path(), bin.join(&name));
            }
        }
        fs::write(
            self.dir.path().join("session-env"),
            format!("PATH='{}'; export PATH\n", bin.display()),
        )
        .unwrap();
    }

    /// The accept loop of a tinysshd server: one `tinysshd` per connection, the socket as its
    /// stdin and stdout, in a mount namespace where `~/.ssh` is this server's `dotssh`. Stopped
    /// by `stop_sshd` (the flag, then a connection that wakes the loop).
    fn spawn_tinyssh(&self) -> Result<(), String> {
        let listener = TcpListener::bind(("127.0.0.1", self.port)).map_err(|e| e.to_string())?;
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let d = self.dir.path().to_path_buf();
        let dotssh = self.home().join(".ssh");
        if !dotssh.exists() {
            let _ = fs::create_dir(&dotssh);
            use std::os::unix::fs::PermissionsExt;
            let _ = fs::set_permissions(&dotssh, fs::Permissions::from_mode(0o700));
        }
        let flag = stop.clone();
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                if flag.load(std::sync::atomic::Ordering::SeqCst) {
                    return;
                }
                let Ok(conn) = conn else { continue };
                let log = fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(d.join("sshd.log"));
                let (Ok(input), Ok(log)) = (conn.try_clone(), log) else {
                    continue;
                };
                let child = Command::new("unshare")
                    .args(["-m", "--propagation", "private", "/bin/bash", "-c"])
                    .arg("mount --bind \"$1\" \"$2\" && shift 2 && exec \"$@\"")
                    .arg("cairn-tinysshd")
                    .arg(d.join("dotssh"))
                    .arg(&dotssh)
                    .args(["/usr/sbin/tinysshd", "-v"])
                    .arg(d.join("tinykeys"))
                    .env("SHLVL", "1")
                    .env("CAIRN_BOOT_ID_FILE", d.join("boot_id"))
                    .stdin(Stdio::from(std::os::fd::OwnedFd::from(input)))
                    .stdout(Stdio::from(std::os::fd::OwnedFd::from(conn)))
                    .stderr(log)
                    .spawn();
                if let Ok(mut c) = child {
                    std::thread::spawn(move || c.wait());
                }
            }
        });
        *self.tiny_stop.lock().unwrap() = Some(stop);
        Ok(())
    }

    /// Which server this is.
    pub fn server(&self) -> Server {
        self.server
    }

    /// Kill the listening sshd and start it again on the same port (open sessions survive).
    pub fn restart_sshd(&self) {
        self.stop_sshd();
        let start = Instant::now();
        loop {
            match self.spawn() {
                Ok(()) => return,
                Err(e) if start.elapsed() > READY_TIMEOUT => panic!("restart sshd: {e}"),
                Err(_) => std::thread::sleep(Duration::from_millis(100)),
            }
        }
    }

    /// Kill the listening sshd (new connections are refused until `restart_sshd`).
    pub fn stop_sshd(&self) {
        if let Some(mut c) = self.child.lock().unwrap().take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        if let Some(stop) = self.tiny_stop.lock().unwrap().take() {
            stop.store(true, std::sync::atomic::Ordering::SeqCst);
            let _ = TcpStream::connect(("127.0.0.1", self.port));
        }
    }

    /// Make a client key of `kind` named `name` in the temp dir, optionally authorized.
    pub fn make_key(
        &self,
        name: &str,
        kind: KeyKind,
        passphrase: &str,
        authorize: bool,
    ) -> PathBuf {
        let p = self.dir.path().join(name);
        keygen(&p, kind, passphrase);
        if authorize {
            self.authorize(&p.with_extension("pub"));
        }
        p
    }

    /// Add a public key file to authorized_keys.
    pub fn authorize(&self, pub_path: &Path) {
        let mut s = fs::read_to_string(self.authorized_keys()).unwrap_or_default();
        s.push_str(&pub_key_text(pub_path));
        s.push('\n');
        fs::write(self.authorized_keys(), s).unwrap();
    }

    /// Options pointing at this server's ssh_config and known_hosts (no agent, no ~/.ssh).
    pub fn opts(&self) -> ConnectOptions {
        ConnectOptions {
            ssh_config: Some(self.ssh_config()),
            known_hosts: Some(self.known_hosts()),
            ..Default::default()
        }
    }

    /// `testhost` resolved with [`TestSshd::opts`].
    pub fn target(&self) -> Target {
        cairn::ssh::resolve("testhost", &self.opts()).expect("resolve testhost")
    }

    /// A target for 127.0.0.1:`port` (e.g. a proxy in front of this server) with this server's
    /// user and key, checked against `known_hosts` (see [`TestSshd::known_hosts_for_port`]).
    pub fn target_via(&self, port: u16, known_hosts: &Path) -> Target {
        let mut t = self.target();
        t.port = port;
        t.known_hosts = known_hosts.to_path_buf();
        t.known_hosts_read.clear();
        t.identity_agent = AgentSetting::None;
        t
    }

    /// Write a known_hosts file that records this server's key for `[127.0.0.1]:port`.
    pub fn known_hosts_for_port(&self, port: u16) -> PathBuf {
        let p = self.dir.path().join(format!("known_hosts_{port}"));
        fs::write(
            &p,
            format!(
                "[127.0.0.1]:{port} {}\n",
                pub_key_text(&self.dir.path().join("ssh_host_ed25519_key.pub"))
            ),
        )
        .unwrap();
        p
    }

    pub fn port(&self) -> u16 {
        self.port
    }
    pub fn user(&self) -> &str {
        &self.user
    }
    /// The account's home directory ($HOME).
    pub fn home(&self) -> PathBuf {
        std::env::var_os("HOME")
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from("/"))
    }
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }
    pub fn boot_id_file(&self) -> PathBuf {
        self.dir.path().join("boot_id")
    }
    pub fn known_hosts(&self) -> PathBuf {
        self.dir.path().join("known_hosts")
    }
    pub fn ssh_config(&self) -> PathBuf {
        self.dir.path().join("ssh_config")
    }
    pub fn client_key(&self) -> PathBuf {
        self.dir.path().join("id_ed25519")
    }
    pub fn host_key_pub(&self) -> PathBuf {
        self.dir.path().join("ssh_host_ed25519_key.pub")
    }
    pub fn authorized_keys(&self) -> PathBuf {
        match self.server {
            Server::OpenSsh => self.dir.path().join("authorized_keys"),
            Server::Dropbear | Server::DropbearBusybox | Server::TinySsh => {
                self.dir.path().join("dotssh").join("authorized_keys")
            }
        }
    }
    pub fn log(&self) -> String {
        fs::read_to_string(self.dir.path().join("sshd.log")).unwrap_or_default()
    }
    /// The length of every exec request's command so far (see [`write_exec_guard`]); panics
    /// if one was longer than [`MAX_EXEC_LEN`].
    pub fn exec_lengths(&self) -> Vec<usize> {
        check_exec_lengths(self.dir.path())
    }
}

impl Drop for TestSshd {
    fn drop(&mut self) {
        self.stop_sshd();
        // every test against this server: no exec request past the limit
        if self.guard && !std::thread::panicking() {
            self.exec_lengths();
        }
    }
}
