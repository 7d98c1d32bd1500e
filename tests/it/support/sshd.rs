//! A private OpenSSH sshd on 127.0.0.1, run as the current user, in its own temp dir.

use std::fs;
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use cairn::ssh::{AgentSetting, ConnectOptions, Target};

const SSHD: &str = "/usr/sbin/sshd";
const READY_TIMEOUT: Duration = Duration::from_secs(10);

pub struct TestSshd {
    dir: tempfile::TempDir,
    port: u16,
    user: String,
    child: Mutex<Option<Child>>,
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
        let dir = tempfile::Builder::new()
            .prefix("cairn-sshd-")
            .tempdir()
            .expect("tempdir");
        let d = dir.path();
        if unsafe { libc::geteuid() } == 0 && !Path::new("/run/sshd").exists() {
            // sshd as root insists on its privilege separation directory.
            let _ = fs::create_dir_all("/run/sshd");
        }
        keygen(&d.join("ssh_host_ed25519_key"), KeyKind::Ed25519, "");
        keygen(&d.join("id_ed25519"), KeyKind::Ed25519, "");
        fs::write(
            d.join("authorized_keys"),
            format!("{}\n", pub_key_text(&d.join("id_ed25519.pub"))),
        )
        .unwrap();
        let path = match first {
            Some(p) => format!(" PATH={}:/usr/local/bin:/usr/bin:/bin", p.display()),
            None => String::new(),
        };
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
                 SetEnv SHLVL=1 CAIRN_BOOT_ID_FILE={d}/boot_id{path}\n",
                d = d.display()
            ),
        )
        .unwrap();
        let user = current_user();
        let mut s = TestSshd {
            dir,
            port: 0,
            user,
            child: Mutex::new(None),
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
        let log = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.path().join("sshd.log"))
            .map_err(|e| e.to_string())?;
        let mut child = Command::new(SSHD)
            .arg("-D")
            .arg("-e")
            .arg("-f")
            .arg(self.dir.path().join("sshd_config"))
            .arg("-p")
            .arg(self.port.to_string())
            .stdin(Stdio::null())
            .stdout(log.try_clone().map_err(|e| e.to_string())?)
            .stderr(log)
            .spawn()
            .map_err(|e| format!("spawn {SSHD}: {e}"))?;
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
        self.dir.path().join("authorized_keys")
    }
    pub fn log(&self) -> String {
        fs::read_to_string(self.dir.path().join("sshd.log")).unwrap_or_default()
    }
}

impl Drop for TestSshd {
    fn drop(&mut self) {
        self.stop_sshd();
    }
}
