//! An encrypted key file that no agent holds: `cairn run` asks for its passphrase on the
//! terminal, as ssh does (a real pty, made by util-linux `script`), with echo off and three
//! tries; without a terminal it stays a clear error and nothing runs.

use std::io::{Read, Write};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::support::host::{output, BIN};
use crate::support::{KeyKind, TestSshd};

const PASS: &str = "correct horse";

fn shell_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', "'\\''"))
}

fn run_line(s: &TestSshd, key: &Path, journal: &Path, counter: &Path) -> Vec<String> {
    vec![
        BIN.to_owned(),
        "run".into(),
        "--journal".into(),
        journal.display().to_string(),
        "-F".into(),
        "/dev/null".into(),
        "-p".into(),
        s.port().to_string(),
        "-i".into(),
        key.display().to_string(),
        "--known-hosts".into(),
        s.known_hosts().display().to_string(),
        "--remote-dir".into(),
        s.dir().join("home").display().to_string(),
        "127.0.0.1".into(),
        "--".into(),
        format!(
            "echo ran >> {}; echo unlocked",
            shell_quote(&counter.display().to_string())
        ),
    ]
}

/// Wait (bounded) until the terminal output holds `needle` `n` times.
fn wait_screen(screen: &Mutex<Vec<u8>>, needle: &str, n: usize) {
    let t0 = Instant::now();
    loop {
        let text = String::from_utf8_lossy(&screen.lock().unwrap()).into_owned();
        if text.matches(needle).count() >= n {
            return;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "no {needle:?} on the terminal after 30s:\n{text}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn an_encrypted_key_is_unlocked_at_a_terminal_prompt_with_echo_off() {
    let s = TestSshd::start();
    let key = s.make_key("enc_key", KeyKind::Ed25519, PASS, true);
    let d = tempfile::tempdir().unwrap();
    let counter = d.path().join("ran");
    let line = run_line(&s, &key, &d.path().join("j.db"), &counter)
        .iter()
        .map(|a| shell_quote(a))
        .collect::<Vec<_>>()
        .join(" ");
    let mut child = Command::new("script")
        .args(["-qefc", &line, "/dev/null"])
        .env_remove("SSH_AUTH_SOCK")
        .env_remove("CAIRN_JOURNAL")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("script (util-linux)");
    let screen = Arc::new(Mutex::new(Vec::new()));
    let mut out = child.stdout.take().unwrap();
    let sc = screen.clone();
    let reader = std::thread::spawn(move || {
        let mut buf = [0u8; 4096];
        while let Ok(n) = out.read(&mut buf) {
            if n == 0 {
                break;
            }
            sc.lock().unwrap().extend_from_slice(&buf[..n]);
        }
    });
    let mut stdin = child.stdin.take().unwrap();
    let prompt = format!("Enter passphrase for key '{}': ", key.display());
    wait_screen(&screen, &prompt, 1);
    stdin.write_all(b"wrong guess\n").unwrap();
    wait_screen(&screen, "Bad passphrase, try again.", 1);
    wait_screen(&screen, &prompt, 2);
    stdin.write_all(format!("{PASS}\n").as_bytes()).unwrap();
    let t0 = Instant::now();
    let status = loop {
        if let Some(st) = child.try_wait().unwrap() {
            break st;
        }
        if t0.elapsed() > Duration::from_secs(60) {
            let _ = child.kill();
            panic!(
                "cairn did not finish:\n{}",
                String::from_utf8_lossy(&screen.lock().unwrap())
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    drop(stdin);
    let _ = reader.join();
    let text = String::from_utf8_lossy(&screen.lock().unwrap()).into_owned();
    assert!(status.success(), "{text}");
    assert!(text.contains("unlocked"), "{text}");
    assert!(
        !text.contains(PASS) && !text.contains("wrong guess"),
        "the passphrase was echoed:\n{text}"
    );
    assert_eq!(std::fs::read_to_string(&counter).unwrap(), "ran\n");
}

#[test]
fn without_a_terminal_an_encrypted_key_is_a_clear_error_and_nothing_runs() {
    let s = TestSshd::start();
    let key = s.make_key("enc_key", KeyKind::Ed25519, PASS, true);
    let d = tempfile::tempdir().unwrap();
    let counter = d.path().join("ran");
    let line = run_line(&s, &key, &d.path().join("j.db"), &counter);
    // setsid: a new session with no controlling terminal, whatever this test runs under.
    let mut c = Command::new("setsid");
    c.arg("-w")
        .args(&line)
        .env_remove("SSH_AUTH_SOCK")
        .env_remove("CAIRN_JOURNAL");
    let o = output(c, Duration::from_secs(60));
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(255), "{err}");
    assert!(
        err.contains("no terminal") && err.contains(&format!("ssh-add {}", key.display())),
        "{err}"
    );
    assert!(!counter.exists(), "nothing ran");
}
