//! The host side on its own: the local driver runs every mode under bash, dash and busybox
//! ash, and with the native helper (no SSH); shellcheck keeps the script POSIX; the helper is a
//! static executable.

use std::process::Command;

fn root() -> std::path::PathBuf {
    std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

#[test]
fn remote_script_passes_its_local_suite_under_bash_dash_and_busybox_ash_and_so_does_the_helper() {
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
    // the native helper runs the same cases (where they are not about the script's own
    // processes)
    let dir = tempfile::tempdir().expect("tempdir");
    let helper = dir.path().join("cairn-host");
    std::fs::write(&helper, cairn::host_helper::BINARY).expect("write the helper");
    let mut cmd = Command::new("bash");
    cmd.arg(root().join("tests/remote-script-local.sh"))
        .env("CAIRN_HOST_HELPER_BIN", &helper)
        .env("CAIRN_HOST_HELPER_SHA256", cairn::host_helper::SHA256);
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

#[test]
fn the_host_helper_is_a_static_executable_that_refuses_another_hash() {
    assert!(cairn::host_helper::available(), "the build made no helper");
    let dir = tempfile::tempdir().expect("tempdir");
    let helper = dir.path().join("cairn-host");
    std::fs::write(&helper, cairn::host_helper::BINARY).expect("write the helper");
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&helper, std::fs::Permissions::from_mode(0o700)).expect("chmod");
    let size = cairn::host_helper::BINARY.len();
    eprintln!(
        "host helper: {size} bytes, SHA-256 {}",
        cairn::host_helper::SHA256
    );
    assert!(size < 2 << 20, "the helper is {size} bytes");
    let file = Command::new("file")
        .arg(&helper)
        .output()
        .expect("file(1) is needed");
    let text = String::from_utf8_lossy(&file.stdout);
    assert!(text.contains("statically linked"), "{text}");
    let ldd = Command::new("ldd")
        .arg(&helper)
        .output()
        .expect("ldd is needed");
    let text =
        String::from_utf8_lossy(&ldd.stdout).to_string() + &String::from_utf8_lossy(&ldd.stderr);
    assert!(
        text.contains("not a dynamic executable") || text.contains("statically linked"),
        "{text}"
    );
    let ok = Command::new(&helper)
        .args([cairn::host_helper::SHA256, "selftest"])
        .output()
        .expect("run the helper");
    assert_eq!(String::from_utf8_lossy(&ok.stdout), "cairn-host ok v=1\n");
    // any other hash: refused before anything is done (the client falls back to the script)
    let other = "0".repeat(64);
    let bad = Command::new(&helper)
        .args([
            other.as_str(),
            "hello",
            ".cairn",
            "0123456789abcdef0123456789abcdef",
        ])
        .env("HOME", dir.path())
        .output()
        .expect("run the helper");
    assert_eq!(bad.status.code(), Some(125));
    assert!(bad.stdout.is_empty());
    assert!(
        !dir.path().join(".cairn").exists(),
        "a refused helper made the marker home"
    );
}
