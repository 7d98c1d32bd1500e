//! Differential host-key checking: for a table of known_hosts files, cairn must decide exactly
//! what OpenSSH decides — the lookup (`ssh-keygen -F`) and the verdict of a real
//! `ssh -o StrictHostKeyChecking=yes` against a private sshd that offers ed25519, ECDSA and RSA
//! host keys.

use std::collections::BTreeSet;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use cairn::ssh::known_hosts;
use cairn::ssh::{AgentSetting, ConnectOptions, Connection, SshError, Target};

use crate::support::sshd::{keygen, pub_key_text};
use crate::support::{KeyKind, TestSshd};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Decision {
    Accept,
    Unknown,
    Changed,
    Revoked,
}

/// A private sshd with three host keys (ed25519 first, then ECDSA, then RSA), plus two keys the
/// server does not hold.
struct MultiKey {
    sshd: TestSshd,
    ed: String,
    ec: String,
    rsa: String,
    ed_other: String,
    ec_other: String,
}

impl MultiKey {
    fn start() -> MultiKey {
        let sshd = TestSshd::start();
        let d = sshd.dir().to_path_buf();
        keygen(&d.join("ssh_host_ecdsa_key"), KeyKind::Ecdsa, "");
        keygen(&d.join("ssh_host_rsa_key"), KeyKind::Rsa, "");
        keygen(&d.join("other_ed25519"), KeyKind::Ed25519, "");
        keygen(&d.join("other_ecdsa"), KeyKind::Ecdsa, "");
        let cfg = sshd.dir().join("sshd_config");
        let mut c = fs::read_to_string(&cfg).unwrap();
        c.push_str(&format!(
            "HostKey {d}/ssh_host_ecdsa_key\nHostKey {d}/ssh_host_rsa_key\n",
            d = d.display()
        ));
        fs::write(&cfg, c).unwrap();
        sshd.restart_sshd();
        let k = |n: &str| pub_key_text(&d.join(n));
        MultiKey {
            ed: k("ssh_host_ed25519_key.pub"),
            ec: k("ssh_host_ecdsa_key.pub"),
            rsa: k("ssh_host_rsa_key.pub"),
            ed_other: k("other_ed25519.pub"),
            ec_other: k("other_ecdsa.pub"),
            sshd,
        }
    }

    /// `[127.0.0.1]:PORT`, the name both clients look up without HostKeyAlias.
    fn hp(&self) -> String {
        known_hosts::lookup_name("127.0.0.1", self.sshd.port())
    }

    /// Substitute `{H}`, `{ED}`, `{EC}`, `{RSA}`, `{ED2}`, `{EC2}` in a template.
    fn fill(&self, t: &str) -> String {
        t.replace("{H}", &self.hp())
            .replace("{ED}", &self.ed)
            .replace("{EC}", &self.ec)
            .replace("{RSA}", &self.rsa)
            .replace("{ED2}", &self.ed_other)
            .replace("{EC2}", &self.ec_other)
    }

    /// The real OpenSSH client's decision.
    fn openssh(&self, file: &Path, alias: Option<&str>) -> (Decision, String) {
        let mut cmd = Command::new("ssh");
        cmd.args(["-F", "/dev/null"])
            .args(["-o", "BatchMode=yes"])
            .args(["-o", "StrictHostKeyChecking=yes"])
            .arg("-o")
            .arg(format!("UserKnownHostsFile={}", file.display()))
            .args(["-o", "GlobalKnownHostsFile=/dev/null"])
            .args(["-o", "IdentitiesOnly=yes"])
            .args(["-o", "IdentityAgent=none"])
            .args(["-o", "ConnectTimeout=10"])
            .args(["-o", "CheckHostIP=no"])
            .args(["-p", &self.sshd.port().to_string()])
            .arg("-i")
            .arg(self.sshd.client_key());
        if let Some(a) = alias {
            cmd.arg("-o").arg(format!("HostKeyAlias={a}"));
        }
        let out = cmd
            .arg(format!("{}@127.0.0.1", self.sshd.user()))
            .arg("true")
            .stdin(Stdio::null())
            .output()
            .expect("run ssh");
        let err = String::from_utf8_lossy(&out.stderr).into_owned();
        let d = if out.status.success() {
            Decision::Accept
        } else if err.contains("REVOKED") || err.contains("marked as revoked") {
            Decision::Revoked
        } else if err.contains("HOST IDENTIFICATION HAS CHANGED") {
            Decision::Changed
        } else if err.contains("host key is known for")
            || err.contains("Host key verification failed")
        {
            Decision::Unknown
        } else {
            panic!("ssh failed in an unexpected way ({}): {err}", out.status);
        };
        (d, err)
    }

    /// The same target in cairn: 127.0.0.1:PORT, this server's key, `file` the only
    /// known_hosts file, optional HostKeyAlias.
    fn target(&self, file: &Path, alias: Option<&str>) -> Target {
        let opts = ConnectOptions {
            ssh_config: Some(PathBuf::from("/dev/null")),
            known_hosts: Some(file.to_path_buf()),
            port: Some(self.sshd.port()),
            identity: vec![self.sshd.client_key()],
            ..Default::default()
        };
        let mut t = cairn::ssh::resolve(&format!("{}@127.0.0.1", self.sshd.user()), &opts)
            .expect("resolve");
        t.identity_agent = AgentSetting::None;
        t.host_key_alias = alias.map(str::to_string);
        t
    }

    async fn cairn(&self, file: &Path, alias: Option<&str>) -> (Decision, String) {
        let t = self.target(file, alias);
        match Connection::connect(&t, &ConnectOptions::default()).await {
            Ok(c) => {
                c.close().await;
                (Decision::Accept, String::new())
            }
            Err(e @ SshError::UnknownHostKey { .. }) => (Decision::Unknown, e.to_string()),
            Err(e @ SshError::HostKeyChanged { .. }) => (Decision::Changed, e.to_string()),
            Err(e @ SshError::HostKeyRevoked { .. }) => (Decision::Revoked, e.to_string()),
            Err(e) => panic!("cairn failed in an unexpected way: {e:?}"),
        }
    }
}

/// Lines `ssh-keygen -F name -f file` reports as matching.
fn keygen_lookup(file: &Path, name: &str) -> BTreeSet<usize> {
    let out = Command::new("ssh-keygen")
        .arg("-F")
        .arg(name)
        .arg("-f")
        .arg(file)
        .stdin(Stdio::null())
        .output()
        .expect("run ssh-keygen -F");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.strip_prefix("# Host "))
        .filter_map(|l| l.split(" found: line ").nth(1))
        .filter_map(|l| l.split_whitespace().next()?.parse().ok())
        .collect()
}

/// Lines cairn's parser reports as matching `name`.
fn cairn_lookup(file: &Path, name: &str) -> BTreeSet<usize> {
    let content = fs::read_to_string(file).unwrap();
    known_hosts::parse(&content)
        .into_iter()
        .filter(|e| e.matches(name))
        .map(|e| e.line)
        .collect()
}

struct Case {
    name: &'static str,
    /// Template, see [`MultiKey::fill`].
    content: &'static str,
    /// HostKeyAlias for both clients (the name looked up instead of `[127.0.0.1]:PORT`).
    alias: Option<&'static str>,
    /// Hash the file with `ssh-keygen -H` first.
    hash: bool,
    /// What OpenSSH 9.x is expected to decide (checked too, so a changed OpenSSH shows up).
    expect: Decision,
}

const fn case(
    name: &'static str,
    content: &'static str,
    alias: Option<&'static str>,
    expect: Decision,
) -> Case {
    Case {
        name,
        content,
        alias,
        hash: false,
        expect,
    }
}

use Decision::*;

const CASES: &[Case] = &[
    case("exact [host]:port", "{H} {ED}\n", None, Accept),
    case("wrong port", "[127.0.0.1]:1 {ED}\n", None, Unknown),
    // OpenSSH retries the bare name on a non-default port ("found matching key w/out port"),
    // where only a matching key counts.
    case(
        "bare address, non-22 port",
        "127.0.0.1 {ED}\n",
        None,
        Accept,
    ),
    case(
        "bare address, changed key",
        "127.0.0.1 {ED2}\n",
        None,
        Unknown,
    ),
    case(
        "bare address, revoked",
        "@revoked 127.0.0.1 {ED}\n127.0.0.1 {ED}\n",
        None,
        Revoked,
    ),
    case(
        "bare address, no fallback with HostKeyAlias",
        "127.0.0.1 {ED}\n",
        Some("box.example"),
        Unknown,
    ),
    case("port wildcard", "[127.0.0.1]:* {ED}\n", None, Accept),
    case(
        "several names in one line",
        "other,{H},x.example {ED}\n",
        None,
        Accept,
    ),
    Case {
        name: "hashed [host]:port",
        content: "{H} {ED}\n",
        alias: None,
        hash: true,
        expect: Accept,
    },
    Case {
        name: "hashed alias",
        content: "other.example {ED2}\nhost.example {ED}\n",
        alias: Some("host.example"),
        hash: true,
        expect: Accept,
    },
    Case {
        name: "hashed, other name",
        content: "host.example {ED}\n",
        alias: Some("nothost.example"),
        hash: true,
        expect: Unknown,
    },
    Case {
        name: "hashed, changed key",
        content: "host.example {ED2}\n",
        alias: Some("host.example"),
        hash: true,
        expect: Changed,
    },
    case(
        "wildcard *.example",
        "*.example {ED}\n",
        Some("a.example"),
        Accept,
    ),
    case(
        "wildcard does not match the bare domain",
        "*.example {ED}\n",
        Some("example"),
        Unknown,
    ),
    case(
        "negated name",
        "*.example,!bad.example {ED}\n",
        Some("bad.example"),
        Unknown,
    ),
    case(
        "negation first",
        "!bad.example,*.example {ED}\n",
        Some("bad.example"),
        Unknown,
    ),
    case(
        "negation of another name",
        "*.example,!bad.example {ED}\n",
        Some("good.example"),
        Accept,
    ),
    case(
        "negation only",
        "!bad.example {ED}\n",
        Some("good.example"),
        Unknown,
    ),
    case(
        "negated wildcard",
        "*,!*.internal {ED}\n",
        Some("db.internal"),
        Unknown,
    ),
    case("? wildcard", "10.0.0.? {ED}\n", Some("10.0.0.7"), Accept),
    case(
        "? matches one character only",
        "10.0.0.? {ED}\n",
        Some("10.0.0.17"),
        Unknown,
    ),
    case(
        "case-insensitive name",
        "Host.Example {ED}\n",
        Some("host.example"),
        Accept,
    ),
    case(
        "alias is the only name looked up",
        "{H} {ED}\n",
        Some("x.example"),
        Unknown,
    ),
    case("revoked key", "{H} {ED}\n@revoked * {ED}\n", None, Revoked),
    case(
        "revoked before known",
        "@revoked {H} {ED}\n{H} {ED}\n",
        None,
        Revoked,
    ),
    case(
        "revoked for another host only",
        "{H} {ED}\n@revoked other.example {ED}\n",
        None,
        Accept,
    ),
    case(
        "another key revoked",
        "{H} {ED}\n@revoked * {ED2}\n",
        None,
        Accept,
    ),
    case("revoked, nothing else", "@revoked * {ED}\n", None, Revoked),
    case(
        "comments, tabs, runs of spaces",
        "# a comment\n\n   \n\t{H}\t\t {ED}   trailing comment words\n#{H} {ED2}\n",
        None,
        Accept,
    ),
    case(
        "spaces around marker",
        "  @revoked \t *   {ED}\n{H} {ED}\n",
        None,
        Revoked,
    ),
    case("CRLF line endings", "{H} {ED}\r\n", None, Accept),
    case(
        "all three keys",
        "{H} {EC}\n{H} {RSA}\n{H} {ED}\n",
        None,
        Accept,
    ),
    case("only ECDSA recorded", "{H} {EC}\n", None, Accept),
    case("only RSA recorded", "{H} {RSA}\n", None, Accept),
    case(
        "ECDSA and RSA recorded",
        "{H} {RSA}\n{H} {EC}\n",
        None,
        Accept,
    ),
    case("changed ed25519", "{H} {ED2}\n", None, Changed),
    case("changed ECDSA", "{H} {EC2}\n", None, Changed),
    case(
        "ECDSA known, another ed25519 recorded",
        "{H} {EC}\n{H} {ED2}\n",
        None,
        Changed,
    ),
    case(
        "changed key for another name only",
        "other.example {ED2}\n{H} {ED}\n",
        None,
        Accept,
    ),
    case("unknown host", "other.example {ED}\n", None, Unknown),
    case("empty file", "", None, Unknown),
    case(
        "unparsable key only",
        "{H} ssh-ed25519 AAAAnotbase64!!\n",
        None,
        Unknown,
    ),
    case(
        "unparsable key, then the right one",
        "{H} ssh-ed25519 AAAAnotbase64!!\n{H} {ED}\n",
        None,
        Accept,
    ),
    case(
        "unknown key type only",
        "{H} ssh-unknown AAAAC3NzaC1lZDI1NTE5AAAAIBACmI2vgGbnEi3LlLH9hbEiajwaa\n",
        None,
        Unknown,
    ),
    case("unknown marker", "@bogus {H} {ED}\n", None, Unknown),
    case(
        "cert-authority only (no host certificate)",
        "@cert-authority * {ED}\n",
        None,
        Unknown,
    ),
];

#[tokio::test(flavor = "multi_thread")]
async fn known_hosts_agrees_with_openssh() {
    let server = MultiKey::start();
    let dir = tempfile::tempdir().unwrap();
    let mut table = Vec::new();
    let mut failures = Vec::new();
    for (i, c) in CASES.iter().enumerate() {
        let file = dir.path().join(format!("kh{i}"));
        fs::write(&file, server.fill(c.content)).unwrap();
        if c.hash {
            let st = Command::new("ssh-keygen")
                .arg("-H")
                .arg("-f")
                .arg(&file)
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .unwrap();
            assert!(st.success(), "ssh-keygen -H");
            let hashed = fs::read_to_string(&file).unwrap();
            assert!(hashed.contains("|1|"), "{}: not hashed: {hashed}", c.name);
        }
        let lookup = c.alias.map(str::to_string).unwrap_or_else(|| server.hp());
        let (kg, cl) = (keygen_lookup(&file, &lookup), cairn_lookup(&file, &lookup));
        let (o, oerr) = server.openssh(&file, c.alias);
        let (r, rerr) = server.cairn(&file, c.alias).await;
        table.push(format!(
            "{:<45} openssh={o:?} cairn={r:?} lookup={kg:?}/{cl:?}",
            c.name
        ));
        if kg != cl {
            failures.push(format!(
                "{}: ssh-keygen -F finds lines {kg:?}, cairn {cl:?}",
                c.name
            ));
        }
        if o != r {
            failures.push(format!(
                "{}: OpenSSH {o:?}, cairn {r:?}\n  ssh: {}\n  cairn: {rerr}",
                c.name,
                oerr.trim()
            ));
        }
        if o != c.expect {
            failures.push(format!(
                "{}: expected OpenSSH to decide {:?}, it decided {o:?}: {}",
                c.name,
                c.expect,
                oerr.trim()
            ));
        }
    }
    eprintln!("{}", table.join("\n"));
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// `HostKeyAlias` in ssh_config is honoured: the alias is the only known_hosts name.
#[test]
fn host_key_alias_from_ssh_config() {
    let d = tempfile::tempdir().unwrap();
    let cfg = d.path().join("config");
    fs::write(
        &cfg,
        "Host box\n  HostName 127.0.0.1\n  Port 2222\n  HostKeyAlias box.example\n",
    )
    .unwrap();
    let opts = ConnectOptions {
        ssh_config: Some(cfg),
        ..Default::default()
    };
    let t = cairn::ssh::resolve("box", &opts).unwrap();
    assert_eq!(t.host_key_alias.as_deref(), Some("box.example"));
    assert_eq!(t.known_host_names(), vec!["box.example".to_string()]);
    let t = cairn::ssh::resolve("other", &opts).unwrap();
    assert_eq!(t.host_key_alias, None);
    assert_eq!(t.known_host_names(), vec!["other".to_string()]);
}

/// With an ssh_config `Host box` / `HostName 127.0.0.1`, both clients look up only the
/// HostName (or HostKeyAlias), never the alias that was typed.
#[tokio::test(flavor = "multi_thread")]
async fn ssh_config_alias_agrees_with_openssh() {
    let server = MultiKey::start();
    let d = tempfile::tempdir().unwrap();
    let kh = d.path().join("known_hosts");
    let port = server.sshd.port();
    let cases: &[(&str, &str, Decision)] = &[
        ("", "[box]:{PORT} {ED}\n", Unknown),
        ("", "box {ED}\n", Unknown),
        ("", "{H} {ED}\n", Accept),
        ("  HostKeyAlias box.example\n", "box.example {ED}\n", Accept),
        ("  HostKeyAlias box.example\n", "{H} {ED}\n", Unknown),
        (
            "  HostKeyAlias box.example\n",
            "box.example {ED2}\n",
            Changed,
        ),
    ];
    let mut failures = Vec::new();
    for (extra, content, expect) in cases {
        let cfg = d.path().join("config");
        fs::write(
            &cfg,
            format!(
                "Host box\n  HostName 127.0.0.1\n  Port {port}\n  User {user}\n  IdentityFile {key}\n\
                 \x20 IdentitiesOnly yes\n  IdentityAgent none\n  UserKnownHostsFile {kh}\n\
                 \x20 GlobalKnownHostsFile /dev/null\n  CheckHostIP no\n  BatchMode yes\n\
                 \x20 StrictHostKeyChecking yes\n{extra}",
                user = server.sshd.user(),
                key = server.sshd.client_key().display(),
                kh = kh.display(),
            ),
        )
        .unwrap();
        fs::write(
            &kh,
            server.fill(&content.replace("{PORT}", &port.to_string())),
        )
        .unwrap();
        let out = Command::new("ssh")
            .arg("-F")
            .arg(&cfg)
            .args(["box", "true"])
            .stdin(Stdio::null())
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        let o = if out.status.success() {
            Accept
        } else if err.contains("HOST IDENTIFICATION HAS CHANGED") {
            Changed
        } else if err.contains("Host key verification failed") {
            Unknown
        } else {
            panic!("ssh: {err}");
        };
        let opts = ConnectOptions {
            ssh_config: Some(cfg.clone()),
            ..Default::default()
        };
        let t = cairn::ssh::resolve("box", &opts).unwrap();
        let r = match Connection::connect(&t, &opts).await {
            Ok(c) => {
                c.close().await;
                Accept
            }
            Err(SshError::UnknownHostKey { .. }) => Unknown,
            Err(SshError::HostKeyChanged { .. }) => Changed,
            Err(e) => panic!("cairn: {e:?}"),
        };
        eprintln!("{extra:?} {content:?}: openssh={o:?} cairn={r:?}");
        if o != r || o != *expect {
            failures.push(format!(
                "{extra:?} {content:?}: OpenSSH {o:?}, cairn {r:?}, expected {expect:?}"
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// `@cert-authority`: the server presents an ed25519 host certificate (`HostCertificate`),
/// signed per case; both clients look up `box.example` (HostKeyAlias).
// Long: one scenario, its phases in order.
#[tokio::test(flavor = "multi_thread")]
async fn host_certificates_agree_with_openssh() {
    let server = MultiKey::start();
    let d = server.sshd.dir().to_path_buf();
    keygen(&d.join("ca"), KeyKind::Ed25519, "");
    keygen(&d.join("ca2"), KeyKind::Ecdsa, "");
    let ca = pub_key_text(&d.join("ca.pub"));
    let cfg = d.join("sshd_config");
    let mut c = fs::read_to_string(&cfg).unwrap();
    c.push_str(&format!(
        "HostCertificate {}\n",
        d.join("ssh_host_ed25519_key-cert.pub").display()
    ));
    fs::write(&cfg, c).unwrap();
    struct CertCase {
        name: &'static str,
        /// Signing CA file name and `ssh-keygen -s` arguments.
        ca: &'static str,
        args: &'static [&'static str],
        /// known_hosts template ({CA} = the first CA's key).
        kh: &'static str,
        expect: Decision,
    }
    let cases = [
        CertCase {
            name: "trusted CA, principal matches",
            ca: "ca",
            args: &["-n", "box.example"],
            kh: "@cert-authority box.example {CA}\n",
            expect: Accept,
        },
        CertCase {
            name: "CA line with wildcard",
            ca: "ca",
            args: &["-n", "box.example,other"],
            kh: "@cert-authority *.example {CA}\n",
            expect: Accept,
        },
        CertCase {
            name: "CA line for another host",
            ca: "ca",
            args: &["-n", "box.example"],
            kh: "@cert-authority other.example {CA}\n",
            expect: Unknown,
        },
        CertCase {
            name: "CA line negated for this host",
            ca: "ca",
            args: &["-n", "box.example"],
            kh: "@cert-authority *.example,!box.example {CA}\n",
            expect: Unknown,
        },
        CertCase {
            name: "wrong principal",
            ca: "ca",
            args: &["-n", "other.example"],
            kh: "@cert-authority * {CA}\n",
            expect: Unknown,
        },
        CertCase {
            name: "no principals",
            ca: "ca",
            args: &[],
            kh: "@cert-authority * {CA}\n",
            expect: Accept,
        },
        CertCase {
            name: "wildcard principal",
            ca: "ca",
            args: &["-n", "*.example"],
            kh: "@cert-authority * {CA}\n",
            expect: Unknown,
        },
        CertCase {
            name: "expired",
            ca: "ca",
            args: &["-n", "box.example", "-V", "20000101:20010101"],
            kh: "@cert-authority * {CA}\n",
            expect: Unknown,
        },
        CertCase {
            name: "not yet valid",
            ca: "ca",
            args: &["-n", "box.example", "-V", "+1d:+2d"],
            kh: "@cert-authority * {CA}\n",
            expect: Unknown,
        },
        CertCase {
            name: "valid window includes now",
            ca: "ca",
            args: &["-n", "box.example", "-V", "-1h:+1h"],
            kh: "@cert-authority * {CA}\n",
            expect: Accept,
        },
        CertCase {
            name: "signed by another CA",
            ca: "ca2",
            args: &["-n", "box.example"],
            kh: "@cert-authority * {CA}\n",
            expect: Unknown,
        },
        CertCase {
            name: "CA revoked",
            ca: "ca",
            args: &["-n", "box.example"],
            kh: "@cert-authority * {CA}\n@revoked * {CA}\n",
            expect: Revoked,
        },
        CertCase {
            name: "certified key revoked",
            ca: "ca",
            args: &["-n", "box.example"],
            kh: "@cert-authority * {CA}\n@revoked * {ED}\n",
            expect: Revoked,
        },
        CertCase {
            name: "untrusted certificate, key recorded plainly",
            ca: "ca2",
            args: &["-n", "box.example"],
            kh: "@cert-authority * {CA}\nbox.example {ED}\n",
            expect: Accept,
        },
        CertCase {
            name: "untrusted certificate, another key recorded",
            ca: "ca",
            args: &["-n", "other.example"],
            kh: "@cert-authority * {CA}\nbox.example {ED2}\n",
            expect: Changed,
        },
    ];
    let kh = d.join("known_hosts_cert");
    let mut table = Vec::new();
    let mut failures = Vec::new();
    for c in &cases {
        let cert = d.join("ssh_host_ed25519_key-cert.pub");
        let _ = fs::remove_file(&cert);
        let st = Command::new("ssh-keygen")
            .arg("-q")
            .arg("-s")
            .arg(d.join(c.ca))
            .args(["-h", "-I", "cairn-test-host"])
            .args(c.args)
            .arg(server.sshd.host_key_pub())
            .stdin(Stdio::null())
            .status()
            .unwrap();
        assert!(st.success() && cert.exists(), "{}: ssh-keygen -s", c.name);
        server.sshd.restart_sshd();
        fs::write(&kh, server.fill(&c.kh.replace("{CA}", &ca))).unwrap();
        let (o, oerr) = server.openssh(&kh, Some("box.example"));
        let (r, rerr) = server.cairn(&kh, Some("box.example")).await;
        table.push(format!("{:<45} openssh={o:?} cairn={r:?}", c.name));
        if o != r || o != c.expect {
            failures.push(format!(
                "{}: OpenSSH {o:?}, cairn {r:?}, expected {:?}\n  ssh: {}\n  cairn: {rerr}",
                c.name,
                c.expect,
                oerr.trim()
            ));
        }
    }
    eprintln!("{}", table.join("\n"));
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
