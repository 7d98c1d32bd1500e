//! A private ssh-agent for a test, killed when dropped.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// An `ssh-agent -D` listening on a socket of the test's own.
pub struct Agent {
    child: Child,
    pub sock: std::path::PathBuf,
}

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Start an agent on `dir/agent.sock`; returns once the socket exists.
pub fn start_agent(dir: &Path) -> Agent {
    let sock = dir.join("agent.sock");
    let child = Command::new("ssh-agent")
        .arg("-D")
        .arg("-a")
        .arg(&sock)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("ssh-agent");
    let start = Instant::now();
    while !sock.exists() {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "ssh-agent did not start"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    Agent { child, sock }
}
