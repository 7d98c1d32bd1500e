//! The host script on its own: the local driver runs every mode under bash, dash and busybox
//! ash (no SSH), and shellcheck keeps it POSIX.

use std::process::Command;

fn root() -> std::path::PathBuf {
    std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

#[test]
fn remote_script_passes_its_local_suite_under_bash_dash_and_busybox_ash() {
    for tool in ["bash", "dash", "busybox", "perl"] {
        let found = Command::new("sh")
            .args(["-c", &format!("command -v {tool}")])
            .output()
            .map(|o| o.status.success())
            .unwrap_or(false);
        assert!(
            found,
            "{tool} is needed for this test (apt-get install -y busybox-static dash)"
        );
    }
    use std::os::unix::process::CommandExt;
    let mut cmd = Command::new("bash");
    cmd.arg(root().join("tests/remote-script-local.sh"));
    // The test harness ignores some signals (SIGPIPE, a realtime one) and children inherit
    // that; sh cannot undo a signal ignored on entry. sshd hands the script default
    // dispositions, so do the same here.
    unsafe {
        cmd.pre_exec(|| {
            for sig in 1..=64 {
                if sig != libc::SIGKILL && sig != libc::SIGSTOP {
                    libc::signal(sig, libc::SIG_DFL);
                }
            }
            Ok(())
        });
    }
    let out = cmd.output().expect("run remote-script-local.sh");
    let text = String::from_utf8_lossy(&out.stdout);
    let summary = text.lines().last().unwrap_or_default();
    eprintln!("tests/remote-script-local.sh: {summary}");
    assert!(
        out.status.success(),
        "{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(summary.contains(" 0 failed"), "{summary}");
}

#[test]
fn remote_script_is_shellcheck_clean_posix_sh() {
    let out = Command::new("shellcheck")
        .args(["-s", "sh"])
        .arg(root().join("remote-scripts/cairn.sh"))
        .output()
        .expect("shellcheck is needed for this test (apt-get install -y shellcheck)");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
}
