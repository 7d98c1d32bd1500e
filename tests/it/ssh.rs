//! The SSH layer against a private sshd (and a fault-injecting proxy).

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use cairn::ssh::{AgentSetting, ConnectOptions, Connection, ExecEvent, SshError, Target};

use crate::support::agent::start_agent;
use crate::support::{KeyKind, Proxy, TestSshd};

#[derive(Debug, Default)]
struct Output {
    stdout: Vec<u8>,
    stderr: Vec<u8>,
    status: Option<u32>,
    signal: Option<String>,
}

async fn collect(exec: &mut cairn::ssh::Exec) -> Result<Output, SshError> {
    let mut out = Output::default();
    while let Some(ev) = exec.next().await? {
        match ev {
            ExecEvent::Stdout(d) => out.stdout.extend(d),
            ExecEvent::Stderr(d) => out.stderr.extend(d),
            ExecEvent::ExitStatus(s) => out.status = Some(s),
            ExecEvent::ExitSignal(s) => out.signal = Some(s),
        }
    }
    Ok(out)
}

async fn run(conn: &Connection, cmd: &str) -> Output {
    let mut exec = conn.exec(cmd.as_bytes()).await.expect("exec");
    collect(&mut exec).await.expect("collect")
}

async fn connect(t: &Target) -> Result<Connection, SshError> {
    Connection::connect(t, &ConnectOptions::default()).await
}

fn fingerprint_of(pub_path: &Path) -> String {
    let out = Command::new("ssh-keygen")
        .args(["-l", "-E", "sha256", "-f"])
        .arg(pub_path)
        .output()
        .unwrap();
    String::from_utf8(out.stdout)
        .unwrap()
        .split_whitespace()
        .nth(1)
        .unwrap()
        .to_string()
}

#[tokio::test(flavor = "multi_thread")]
async fn exec_echo_and_fingerprint() {
    let sshd = TestSshd::start();
    let conn = connect(&sshd.target()).await.expect("connect");
    assert_eq!(
        conn.host_key_fingerprint(),
        fingerprint_of(&sshd.host_key_pub())
    );
    assert!(conn.host_key_fingerprint().starts_with("SHA256:"));
    let out = run(&conn, "echo hi").await;
    assert_eq!(out.stdout, b"hi\n");
    assert_eq!(out.status, Some(0));
    assert!(out.stderr.is_empty());
    // The boot-id hook from SetEnv reaches the command.
    let out = run(&conn, "cat \"$CAIRN_BOOT_ID_FILE\"").await;
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        std::fs::read_to_string(sshd.boot_id_file()).unwrap().trim()
    );
    assert!(!conn.is_closed());
    conn.close().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn exit_status_and_stderr() {
    let sshd = TestSshd::start();
    let conn = connect(&sshd.target()).await.expect("connect");
    let out = run(&conn, "exit 3").await;
    assert_eq!(out.status, Some(3));
    let out = run(&conn, "echo out; echo err >&2; exit 1").await;
    assert_eq!(out.stdout, b"out\n");
    assert_eq!(out.stderr, b"err\n");
    assert_eq!(out.status, Some(1));
    let out = run(&conn, "kill -TERM $$").await;
    assert_eq!(out.status, None);
    assert_eq!(out.signal.as_deref(), Some("TERM"));
}

#[tokio::test(flavor = "multi_thread")]
async fn stdin_one_megabyte() {
    let sshd = TestSshd::start();
    let conn = connect(&sshd.target()).await.expect("connect");
    let mut exec = conn.exec(b"wc -c").await.unwrap();
    let data = vec![b'x'; 1024 * 1024 + 7];
    tokio::time::timeout(Duration::from_secs(20), async {
        for chunk in data.chunks(300_000) {
            exec.write_stdin(chunk).await.unwrap();
        }
        exec.close_stdin().await.unwrap();
    })
    .await
    .expect("write_stdin stalled");
    let out = collect(&mut exec).await.unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "1048583");
    assert_eq!(out.status, Some(0));
    // Echoing stdin back while we write must not deadlock either.
    let mut exec = conn.exec(b"cat").await.unwrap();
    let data = vec![b'y'; 2 * 1024 * 1024];
    tokio::time::timeout(Duration::from_secs(20), exec.write_stdin(&data))
        .await
        .expect("write_stdin with echo stalled")
        .unwrap();
    exec.close_stdin().await.unwrap();
    let out = collect(&mut exec).await.unwrap();
    assert_eq!(out.stdout.len(), data.len());
}

#[tokio::test(flavor = "multi_thread")]
async fn unknown_host_key_refused() {
    let sshd = TestSshd::start();
    let kh = sshd.dir().join("empty_known_hosts");
    std::fs::write(&kh, "# nothing here\n").unwrap();
    let mut t = sshd.target();
    t.known_hosts = kh.clone();
    let err = connect(&t).await.expect_err("must refuse");
    let msg = err.to_string();
    assert!(matches!(err, SshError::UnknownHostKey { .. }), "{err:?}");
    assert!(msg.contains(&kh.display().to_string()), "{msg}");
    assert!(msg.contains(&fingerprint_of(&sshd.host_key_pub())), "{msg}");
    assert!(msg.contains("--accept-new"), "{msg}");
    assert!(!err.is_transient());
    // Nothing was written.
    assert_eq!(std::fs::read_to_string(&kh).unwrap(), "# nothing here\n");
}

#[tokio::test(flavor = "multi_thread")]
async fn changed_host_key_refused_even_with_accept_new() {
    let sshd = TestSshd::start();
    let other = sshd.make_key("other_host_key", KeyKind::Ed25519, "", false);
    let kh = sshd.dir().join("changed_known_hosts");
    std::fs::write(
        &kh,
        format!(
            "# comment\n[127.0.0.1]:{} {}\n",
            sshd.port(),
            crate::support::sshd::pub_key_text(&other.with_extension("pub"))
        ),
    )
    .unwrap();
    let before = std::fs::read_to_string(&kh).unwrap();
    for accept_new in [false, true] {
        let mut t = sshd.target();
        t.known_hosts = kh.clone();
        t.accept_new = accept_new;
        let err = connect(&t).await.expect_err("must refuse");
        match &err {
            SshError::HostKeyChanged { line, file, .. } => {
                assert_eq!(*line, 2);
                assert_eq!(file, &kh);
            }
            other => panic!("{other:?}"),
        }
        let msg = err.to_string();
        assert!(
            msg.contains("CHANGED") && msg.contains(&format!("{}:2", kh.display())),
            "{msg}"
        );
        assert!(!err.is_transient());
    }
    assert_eq!(std::fs::read_to_string(&kh).unwrap(), before);
}

#[tokio::test(flavor = "multi_thread")]
async fn revoked_host_key_refused() {
    let sshd = TestSshd::start();
    let kh = sshd.dir().join("revoked_known_hosts");
    let mut content = std::fs::read_to_string(sshd.known_hosts()).unwrap();
    content.push_str(&format!(
        "@revoked * {}\n",
        crate::support::sshd::pub_key_text(&sshd.host_key_pub())
    ));
    std::fs::write(&kh, content).unwrap();
    let mut t = sshd.target();
    t.known_hosts = kh;
    let err = connect(&t).await.expect_err("must refuse");
    assert!(
        matches!(err, SshError::HostKeyRevoked { line: 2, .. }),
        "{err:?}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn accept_new_records_once() {
    let sshd = TestSshd::start();
    let kh = sshd.dir().join("new/sub/known_hosts");
    let mut opts = sshd.opts();
    opts.known_hosts = Some(kh.clone());
    opts.accept_new = true;
    let t = cairn::ssh::resolve("testhost", &opts).unwrap();
    assert!(t.accept_new);
    let conn = Connection::connect(&t, &opts)
        .await
        .expect("accept-new connect");
    assert_eq!(run(&conn, "true").await.status, Some(0));
    conn.close().await;
    let content = std::fs::read_to_string(&kh).unwrap();
    assert_eq!(content.lines().count(), 1, "{content}");
    assert!(content.starts_with(&format!("[127.0.0.1]:{} ssh-ed25519 ", sshd.port())));
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(
        std::fs::metadata(&kh).unwrap().permissions().mode() & 0o777,
        0o600
    );
    // Again, with and without accept_new: known now, nothing appended.
    let conn = Connection::connect(&t, &opts)
        .await
        .expect("second connect");
    conn.close().await;
    let mut strict = t.clone();
    strict.accept_new = false;
    let conn = connect(&strict)
        .await
        .expect("strict connect after accept-new");
    conn.close().await;
    assert_eq!(std::fs::read_to_string(&kh).unwrap(), content);
}

#[tokio::test(flavor = "multi_thread")]
async fn hashed_known_hosts_accepted() {
    let sshd = TestSshd::start();
    let kh = sshd.dir().join("hashed_known_hosts");
    std::fs::copy(sshd.known_hosts(), &kh).unwrap();
    let st = Command::new("ssh-keygen")
        .arg("-H")
        .arg("-f")
        .arg(&kh)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .unwrap();
    assert!(st.success());
    let content = std::fs::read_to_string(&kh).unwrap();
    assert!(content.starts_with("|1|"), "{content}");
    let mut t = sshd.target();
    t.known_hosts = kh;
    let conn = connect(&t).await.expect("connect with hashed known_hosts");
    conn.close().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn key_types() {
    let sshd = TestSshd::start();
    for (name, kind) in [
        ("k_ed", KeyKind::Ed25519),
        ("k_ecdsa", KeyKind::Ecdsa),
        ("k_rsa", KeyKind::Rsa),
    ] {
        let key = sshd.make_key(name, kind, "", true);
        let mut t = sshd.target();
        t.identity_files = vec![key];
        let conn = connect(&t)
            .await
            .unwrap_or_else(|e| panic!("{kind:?}: {e}"));
        assert_eq!(run(&conn, "true").await.status, Some(0));
        conn.close().await;
    }
    // A key that is not authorized: Auth error listing what was tried.
    let stranger = sshd.make_key("k_stranger", KeyKind::Ed25519, "", false);
    let mut t = sshd.target();
    t.identity_files = vec![stranger.clone()];
    let err = connect(&t).await.expect_err("unauthorized key");
    assert!(matches!(err, SshError::Auth { .. }), "{err:?}");
    assert!(
        err.to_string().contains(&stranger.display().to_string()),
        "{err}"
    );
    assert!(!err.is_transient());
}

/// ECDSA keys whose private scalar OpenSSH wrote short (31 bytes for P-256, about one
/// `ssh-keygen -t ecdsa` key in 512; ssh-key alone rejects it as "length invalid"), and
/// P-384/P-521 ones written short the same way: cairn re-encodes them (src/ssh/keyfix.rs) and
/// logs in with them. Fixed test keys, so this does not depend on ssh-keygen's luck.
#[tokio::test(flavor = "multi_thread")]
async fn ecdsa_short_scalar_keys() {
    let sshd = TestSshd::start();
    let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures");
    for name in [
        "ecdsa-p256-short-scalar.test-key",
        "ecdsa-p384-short-scalar.test-key",
        "ecdsa-p521-short-scalar.test-key",
    ] {
        let key = fixtures.join(name);
        let public = fixtures.join(format!("{name}.pub"));
        sshd.authorize(&public);
        let mut t = sshd.target();
        t.identity_files = vec![key];
        let conn = connect(&t).await.unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(run(&conn, "true").await.status, Some(0));
        conn.close().await;
        let fingerprint = fingerprint_of(&public);
        let log = sshd.log();
        assert!(
            log.contains("Accepted publickey") && log.contains(&fingerprint),
            "{name}: sshd did not accept {fingerprint}:\n{log}"
        );
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn agent_auth_without_key_files() {
    let sshd = TestSshd::start();
    let agent = start_agent(sshd.dir());
    let key = sshd.make_key("agent_key", KeyKind::Ed25519, "", true);
    let st = Command::new("ssh-add")
        .arg(&key)
        .env("SSH_AUTH_SOCK", &agent.sock)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .unwrap();
    assert!(st.success());
    std::fs::remove_file(&key).unwrap();
    let mut t = sshd.target();
    t.identity_files = vec![];
    t.identity_agent = AgentSetting::Path(agent.sock.clone());
    let conn = connect(&t).await.expect("agent auth");
    assert_eq!(run(&conn, "echo ok").await.stdout, b"ok\n");
    conn.close().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn encrypted_key_without_agent() {
    let sshd = TestSshd::start();
    let key = sshd.make_key("enc_key", KeyKind::Ed25519, "secret passphrase", true);
    let mut t = sshd.target();
    t.identity_files = vec![key.clone()];
    t.identity_agent = AgentSetting::None;
    let err = connect(&t).await.expect_err("encrypted key");
    match &err {
        SshError::EncryptedKey { path } => assert_eq!(path, &key),
        other => panic!("{other:?}"),
    }
    assert!(err.to_string().contains("ssh-add"), "{err}");
}

#[tokio::test(flavor = "multi_thread")]
async fn ssh_config_alias_resolves() {
    let sshd = TestSshd::start();
    let t = sshd.target();
    assert_eq!(t.alias, "testhost");
    assert_eq!(t.hostname, "127.0.0.1");
    assert_eq!(t.port, sshd.port());
    assert_eq!(t.user, sshd.user());
    assert_eq!(t.identity_files, vec![sshd.client_key()]);
    assert_eq!(t.known_hosts, sshd.known_hosts());
    assert_eq!(
        t.display(),
        format!("{}@testhost:{}", sshd.user(), sshd.port())
    );
    // Known_hosts is consulted through the config's UserKnownHostsFile too.
    let opts = ConnectOptions {
        ssh_config: Some(sshd.ssh_config()),
        ..Default::default()
    };
    let t = cairn::ssh::resolve("testhost", &opts).unwrap();
    assert_eq!(t.known_hosts, sshd.known_hosts());
    let conn = Connection::connect(&t, &opts)
        .await
        .expect("connect via alias");
    conn.close().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn closed_port_fails_fast() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let sshd = TestSshd::start();
    let t = sshd.target_via(port, &sshd.known_hosts_for_port(port));
    let err = connect(&t).await.expect_err("closed port");
    assert!(matches!(err, SshError::Connect { .. }), "{err:?}");
    assert!(err.is_transient());
    assert!(err.to_string().contains(&port.to_string()));
}

#[tokio::test(flavor = "multi_thread")]
async fn refused_by_proxy_is_transient() {
    let sshd = TestSshd::start();
    let proxy = Proxy::start(sshd.port());
    proxy.set_refuse(true);
    let t = sshd.target_via(proxy.port(), &sshd.known_hosts_for_port(proxy.port()));
    let err = connect(&t).await.expect_err("refused");
    assert!(err.is_transient(), "{err:?}");
    proxy.set_refuse(false);
    let conn = connect(&t).await.expect("after refuse cleared");
    conn.close().await;
    assert_eq!(proxy.connections(), 2);
}

#[tokio::test(flavor = "multi_thread")]
async fn proxy_cut_during_exec_returns_promptly() {
    let sshd = TestSshd::start();
    let proxy = Proxy::start(sshd.port());
    let t = sshd.target_via(proxy.port(), &sshd.known_hosts_for_port(proxy.port()));
    let conn = connect(&t).await.expect("connect via proxy");
    // (the command prints first, so the channel is known to be up when the proxy cuts)
    let mut exec = conn.exec(b"echo up; sleep 30; echo done").await.unwrap();
    loop {
        match exec.next().await {
            Ok(Some(ExecEvent::Stdout(b))) if b.starts_with(b"up") => break,
            Ok(Some(_)) => {}
            other => panic!("before the cut: {other:?}"),
        }
    }
    proxy.cut();
    // (a bound against a hang, not a speed test)
    let r = tokio::time::timeout(Duration::from_secs(30), async {
        let mut saw_status = false;
        loop {
            match exec.next().await {
                Ok(Some(ExecEvent::ExitStatus(_))) => saw_status = true,
                Ok(Some(_)) => {}
                Ok(None) => return (saw_status, None),
                Err(e) => return (saw_status, Some(e)),
            }
        }
    })
    .await
    .expect("next() hung after cut");
    assert!(!r.0, "no exit status may be reported after a cut");
    // A cut is an error, never a clean end of the stream.
    let e = r.1.expect("the stream ended cleanly after a cut");
    assert!(matches!(e, SshError::Disconnected(_)), "{e:?}");
    assert!(e.is_transient());
    // The connection knows it is gone; a new exec fails rather than hangs.
    assert!(conn.is_closed());
    let e = tokio::time::timeout(Duration::from_secs(30), conn.exec(b"true"))
        .await
        .expect("exec on dead connection hung");
    assert!(e.is_err());
}

#[tokio::test(flavor = "multi_thread")]
async fn blackholed_link_detected_by_keepalive() {
    let sshd = TestSshd::start();
    let proxy = Proxy::start(sshd.port());
    let mut t = sshd.target_via(proxy.port(), &sshd.known_hosts_for_port(proxy.port()));
    t.keepalive_interval = Duration::from_millis(500);
    t.keepalive_max = 2;
    let conn = connect(&t).await.expect("connect via proxy");
    let mut exec = conn.exec(b"echo up; sleep 60").await.unwrap();
    loop {
        match exec.next().await {
            Ok(Some(ExecEvent::Stdout(b))) if b.starts_with(b"up") => break,
            Ok(Some(_)) => {}
            other => panic!("before the blackhole: {other:?}"),
        }
    }
    proxy.pause_downstream(true);
    let start = Instant::now();
    // russh gives up after keepalive_max+1 unanswered intervals: 1.5 s here. The command runs
    // for 60 s, so only the keepalive can end the wait; the bound is against a hang.
    let r = tokio::time::timeout(Duration::from_secs(45), async {
        loop {
            match exec.next().await {
                Ok(Some(ExecEvent::ExitStatus(s))) => panic!("exit status {s} after blackhole"),
                Ok(Some(_)) => {}
                Ok(None) => return None,
                Err(e) => return Some(e),
            }
        }
    })
    .await
    .expect("dead link not detected");
    eprintln!("blackhole detected after {:?}: {r:?}", start.elapsed());
    // The keepalive ended it, and says so: never a clean end of the stream.
    let e = r.expect("the stream ended cleanly under a blackhole");
    assert!(matches!(e, SshError::Disconnected(_)), "{e:?}");
    assert!(e.to_string().contains("keepalive"), "{e}");
    assert!(conn.is_closed());
    proxy.cut();
}

#[tokio::test(flavor = "multi_thread")]
async fn connect_timeout_when_server_silent() {
    let sshd = TestSshd::start();
    let proxy = Proxy::start(sshd.port());
    proxy.pause_downstream(true);
    let mut t = sshd.target_via(proxy.port(), &sshd.known_hosts_for_port(proxy.port()));
    t.connect_timeout = Duration::from_millis(800);
    // The server never answers: only the connect timeout can end the attempt (the outer
    // bound is against a hang).
    let err = tokio::time::timeout(Duration::from_secs(60), connect(&t))
        .await
        .expect("connect hung past its timeout")
        .expect_err("silent server");
    assert!(matches!(err, SshError::Timeout { .. }), "{err:?}");
    assert!(err.is_transient());
}

/// Throwaway measurement: fresh connect + `true`, with and without TCP_QUICKACK re-arming.
/// Run alone: `cargo test --test it ssh::quickack_latency -- --ignored --nocapture`.
#[tokio::test(flavor = "multi_thread")]
#[ignore]
async fn quickack_latency() {
    let sshd = TestSshd::start();
    let t = sshd.target();
    let mut results = Vec::new();
    for (label, off) in [
        ("quickack", false),
        ("no quickack", true),
        ("quickack", false),
        ("no quickack", true),
    ] {
        if off {
            std::env::set_var("CAIRN_SSH_NO_QUICKACK", "1");
        } else {
            std::env::remove_var("CAIRN_SSH_NO_QUICKACK");
        }
        let n = 20;
        let mut times = Vec::new();
        for _ in 0..n {
            let start = Instant::now();
            let conn = connect(&t).await.unwrap();
            assert_eq!(run(&conn, "true").await.status, Some(0));
            times.push(start.elapsed());
            conn.close().await;
        }
        times.sort();
        results.push(format!(
            "{label}: median {:?}, min {:?}, max {:?}",
            times[n / 2],
            times[0],
            times[n - 1]
        ));
    }
    std::env::remove_var("CAIRN_SSH_NO_QUICKACK");
    for r in results {
        println!("{r}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn proxy_pause_resume_and_cut_after_bytes() {
    let sshd = TestSshd::start();
    let proxy = Proxy::start(sshd.port());
    let t = sshd.target_via(proxy.port(), &sshd.known_hosts_for_port(proxy.port()));
    let conn = connect(&t).await.expect("connect via proxy");
    // Paused briefly (well under the keepalive bound): output is held, then delivered intact.
    // (exec waits for the channel confirmation, so pause after it.)
    let mut exec = conn.exec(b"sleep 0.2; echo held").await.unwrap();
    proxy.pause_downstream(true);
    tokio::time::sleep(Duration::from_millis(600)).await;
    proxy.pause_downstream(false);
    let out = collect(&mut exec).await.unwrap();
    assert_eq!(out.stdout, b"held\n");
    assert_eq!(out.status, Some(0));
    // Cut once 64 KiB of stdin have gone upstream: the writer or reader sees the loss.
    let mut exec = conn.exec(b"cat >/dev/null").await.unwrap();
    proxy.cut_after_upstream_bytes(Some(64 * 1024));
    let data = vec![b'z'; 1024 * 1024];
    let r = tokio::time::timeout(Duration::from_secs(5), async {
        exec.write_stdin(&data).await?;
        exec.close_stdin().await?;
        collect(&mut exec).await
    })
    .await
    .expect("hung after cut_after_upstream_bytes");
    match r {
        Err(SshError::Disconnected(_)) => {}
        Ok(out) => assert_eq!(out.status, None, "{out:?}"),
        Err(e) => panic!("{e:?}"),
    }
    assert_eq!(proxy.connections(), 1);
}

#[tokio::test(flavor = "multi_thread")]
async fn stdin_to_command_that_exits_early() {
    let sshd = TestSshd::start();
    let conn = connect(&sshd.target()).await.expect("connect");
    let mut exec = conn.exec(b"head -c 10 >/dev/null; exit 4").await.unwrap();
    let data = vec![b'q'; 8 * 1024 * 1024];
    tokio::time::timeout(Duration::from_secs(10), exec.write_stdin(&data))
        .await
        .expect("write_stdin hung after the command exited")
        .expect("early exit is not a lost connection");
    let _ = exec.close_stdin().await;
    let out = collect(&mut exec).await.unwrap();
    assert_eq!(out.status, Some(4));
    assert!(!conn.is_closed());
}
