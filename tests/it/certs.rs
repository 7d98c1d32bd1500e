//! User certificates against a real sshd that trusts a user CA (`TrustedUserCAKeys`) and has
//! an empty `authorized_keys`, so that only a certificate can log in: the `KEY-cert.pub` beside
//! an identity file, `CertificateFile`, a certificate held by ssh-agent, and certificates outside
//! their validity window, which are refused with the window named.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use crate::support::agent::start_agent;
use crate::support::sshd::TestSshd;

const BIN: &str = env!("CARGO_BIN_EXE_cairn");

/// An sshd that accepts certificates signed by a fresh user CA and no plain keys.
fn ca_only_sshd() -> (TestSshd, std::path::PathBuf) {
    let s = TestSshd::start();
    let ca = s.dir().join("user_ca");
    keygen(&ca);
    let cfg = s.dir().join("sshd_config");
    let mut text = fs::read_to_string(&cfg).unwrap();
    text.push_str(&format!("TrustedUserCAKeys {}.pub\n", ca.display()));
    fs::write(&cfg, text).unwrap();
    fs::write(s.authorized_keys(), "").unwrap();
    s.restart_sshd();
    (s, ca)
}

fn keygen(path: &Path) {
    let st = Command::new("ssh-keygen")
        .args(["-q", "-t", "ed25519", "-N", "", "-f"])
        .arg(path)
        .status()
        .unwrap();
    assert!(st.success());
}

/// Sign `key.pub` with `ca` for `user`, valid over `validity` (ssh-keygen -V), into `out`.
fn sign(ca: &Path, key: &Path, user: &str, validity: &str, out: &Path) {
    let o = Command::new("ssh-keygen")
        .arg("-q")
        .arg("-s")
        .arg(ca)
        .args(["-I", "cairn-test", "-n", user, "-V", validity])
        .arg(format!("{}.pub", key.display()))
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let made = format!("{}-cert.pub", key.display());
    if Path::new(&made) != out {
        fs::rename(&made, out).unwrap();
    }
}

fn cairn_run(s: &TestSshd, journal: &Path, config: &Path, marker: &str) -> Output {
    Command::new(BIN)
        .args(["run", "--journal"])
        .arg(journal)
        .arg("-F")
        .arg(config)
        .args(["--connect-timeout", "20s", "testhost", "--"])
        .arg(format!("echo {marker}"))
        .env("SSH_AUTH_SOCK", "")
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("cairn run against {}: {e}", s.port()))
}

/// `out` ran `echo marker` and sshd logged the login as a certificate's.
fn assert_certificate_login(s: &TestSshd, out: &Output, marker: &str) {
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(out.stdout, format!("{marker}\n").as_bytes());
    assert!(
        s.log().contains("ED25519-CERT"),
        "sshd did not log a certificate login:\n{}",
        s.log()
    );
}

#[test]
fn a_certificate_beside_the_key_logs_in_where_the_key_alone_cannot() {
    let (s, ca) = ca_only_sshd();
    let d = tempfile::tempdir().unwrap();
    let journal = d.path().join("journal.db");
    let key = s.client_key();

    // Without a certificate the plain key is refused (authorized_keys is empty).
    let out = cairn_run(&s, &journal, &s.ssh_config(), "no-cert");
    assert_eq!(out.status.code(), Some(255));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("authentication"), "{err}");

    // KEY-cert.pub beside the identity file, as OpenSSH picks it up.
    sign(
        &ca,
        &key,
        s.user(),
        "-5m:+1h",
        Path::new(&format!("{}-cert.pub", key.display())),
    );
    let ssh = Command::new("ssh")
        .arg("-F")
        .arg(s.ssh_config())
        .args(["-o", "BatchMode=yes", "testhost", "true"])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(
        ssh.status.success(),
        "ssh itself: {}",
        String::from_utf8_lossy(&ssh.stderr)
    );
    let out = cairn_run(&s, &journal, &s.ssh_config(), "cert-beside");
    assert_certificate_login(&s, &out, "cert-beside");
}

#[test]
fn certificate_file_is_used_and_an_expired_one_is_refused_with_its_window() {
    let (s, ca) = ca_only_sshd();
    let d = tempfile::tempdir().unwrap();
    let journal = d.path().join("journal.db");
    let key = s.client_key();
    let cert = d.path().join("elsewhere-cert.pub");
    let config = d.path().join("config");
    let base = fs::read_to_string(s.ssh_config()).unwrap();
    fs::write(
        &config,
        base.replacen(
            "Host testhost\n",
            &format!("Host testhost\n  CertificateFile {}\n", cert.display()),
            1,
        ),
    )
    .unwrap();

    sign(&ca, &key, s.user(), "20200101:20200102", &cert);
    let out = cairn_run(&s, &journal, &config, "expired");
    assert_eq!(out.status.code(), Some(255));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("is expired") && err.contains("2020-01-01") && err.contains("2020-01-02"),
        "{err}"
    );
    assert!(err.contains(&cert.display().to_string()), "{err}");

    sign(&ca, &key, s.user(), "+1d:+2d", &cert);
    let out = cairn_run(&s, &journal, &config, "later");
    assert_eq!(out.status.code(), Some(255));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("not yet valid"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    sign(&ca, &key, s.user(), "-5m:+1h", &cert);
    let out = cairn_run(&s, &journal, &config, "cert-file");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(out.stdout, b"cert-file\n");
    // The failed attempts left nothing running on the host and nothing dispatched: the journal
    // holds the one execution that ran.
    let ls = Command::new(BIN)
        .args(["ls", "--json", "--journal"])
        .arg(&journal)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&ls.stdout);
    assert_eq!(text.matches("\"delivered\"").count(), 1, "{text}");
}

#[test]
fn a_certificate_held_by_ssh_agent_logs_in_with_no_key_file_on_disk() {
    let (s, ca) = ca_only_sshd();
    let d = tempfile::tempdir().unwrap();
    let journal = d.path().join("journal.db");
    let agent = start_agent(d.path());
    // A key of its own, signed; ssh-add loads KEY and KEY-cert.pub into the agent; then both
    // files go, so only the agent can sign. The config's IdentityFile (the test's plain key)
    // is not authorized: a login proves the agent's certificate was offered.
    let key = d.path().join("agent_key");
    keygen(&key);
    sign(
        &ca,
        &key,
        s.user(),
        "-5m:+1h",
        Path::new(&format!("{}-cert.pub", key.display())),
    );
    let add = Command::new("ssh-add")
        .arg(&key)
        .env("SSH_AUTH_SOCK", &agent.sock)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(
        add.status.success(),
        "{}",
        String::from_utf8_lossy(&add.stderr)
    );
    let listed = Command::new("ssh-add")
        .arg("-L")
        .env("SSH_AUTH_SOCK", &agent.sock)
        .output()
        .unwrap();
    let listed = String::from_utf8_lossy(&listed.stdout).to_string();
    assert!(
        listed.contains("-cert-v01@openssh.com"),
        "agent holds no certificate: {listed}"
    );
    for f in [
        key.clone(),
        key.with_extension("pub"),
        PathBuf::from(format!("{}-cert.pub", key.display())),
    ] {
        fs::remove_file(f).unwrap();
    }

    // Without the agent nothing logs in; with it (named by IdentityAgent, SSH_AUTH_SOCK is
    // empty), the certificate does.
    let out = cairn_run(&s, &journal, &s.ssh_config(), "no-agent");
    assert_eq!(out.status.code(), Some(255));
    let config = d.path().join("config");
    let base = fs::read_to_string(s.ssh_config()).unwrap();
    assert!(base.contains("IdentityAgent none"), "{base}");
    let agent_line = format!("IdentityAgent {}", agent.sock.display());
    fs::write(&config, base.replace("IdentityAgent none", &agent_line)).unwrap();
    let out = cairn_run(&s, &journal, &config, "agent-cert");
    assert_certificate_login(&s, &out, "agent-cert");
}
