//! The main job of cairn, end to end, on this machine:
//! start a private OpenSSH sshd on loopback with a cuttable TCP proxy in front of it, run a
//! command through `cairn run`, cut the connection in the middle, and watch cairn reconnect,
//! reattach and finish, with the command having run exactly once.
//!
//! `cargo run --example demo` (needs `sshd`: `apt-get install -y openssh-server`).

#[path = "../tests/it/support/mod.rs"]
mod support;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

// Long: one demonstration, its steps in order.
fn main() {
    if !std::path::Path::new("/usr/sbin/sshd").exists() {
        eprintln!(
            "demo: /usr/sbin/sshd is missing; install it with: apt-get install -y openssh-server"
        );
        std::process::exit(2);
    }
    let status = Command::new("cargo")
        .args(["build", "--quiet", "--bin", "cairn"])
        .status()
        .expect("cargo build");
    assert!(status.success(), "building cairn failed");
    let bin = std::env::current_exe()
        .ok()
        .and_then(|p| Some(p.parent()?.parent()?.join("cairn")))
        .filter(|p| p.exists())
        .expect("the cairn binary next to this example");

    let sshd = support::TestSshd::start();
    let proxy = support::Proxy::start(sshd.port());
    let known_hosts = sshd.known_hosts_for_port(proxy.port());
    let remote = sshd.dir().join("cairn-home");
    let counter = sshd.dir().join("ran.count");
    let command = format!(
        "echo ran >> '{}'; for i in 1 2 3 4 5 6 7 8 9 10; do echo \"step $i of 10\"; sleep 0.4; done; echo done",
        counter.display()
    );
    println!(
        "demo: sshd on 127.0.0.1:{}, a proxy on 127.0.0.1:{} in front of it",
        sshd.port(),
        proxy.port()
    );
    println!("demo: $ cairn run 127.0.0.1 -- '<ten steps, 0.4 s apart>'\n");

    let mut child = Command::new(&bin)
        .arg("run")
        .arg("--journal")
        .arg(sshd.dir().join("journal.db"))
        .args(["-F", "/dev/null", "-p", &proxy.port().to_string(), "-i"])
        .arg(sshd.client_key())
        .arg("--known-hosts")
        .arg(&known_hosts)
        .arg("--remote-dir")
        .arg(&remote)
        .args(["--keepalive", "1s", "127.0.0.1", "--"])
        .arg(&command)
        .env_remove("SSH_AUTH_SOCK")
        .stdin(Stdio::null())
        .spawn()
        .expect("start cairn");

    std::thread::sleep(Duration::from_millis(1600));
    println!("\ndemo: >>> cutting the connection and refusing new ones for 2 s <<<\n");
    proxy.set_refuse(true);
    proxy.cut();
    std::thread::sleep(Duration::from_secs(2));
    proxy.set_refuse(false);
    println!("\ndemo: >>> the link is back <<<\n");

    let t0 = Instant::now();
    let code = loop {
        if let Some(st) = child.try_wait().expect("wait") {
            break st.code();
        }
        if t0.elapsed() > Duration::from_secs(60) {
            let _ = child.kill();
            panic!("cairn did not finish within 60 s");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let runs = std::fs::read_to_string(&counter)
        .map(|s| s.lines().count())
        .unwrap_or(0);
    println!("\ndemo: cairn exited with {code:?}; the host recorded {runs} run(s) of the command");
    let ok = code == Some(0) && runs == 1;
    println!(
        "demo: {}",
        if ok {
            "ran once, output complete: OK"
        } else {
            "UNEXPECTED"
        }
    );
    std::process::exit(if ok { 0 } else { 1 });
}
