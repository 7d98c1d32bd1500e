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
    std::fs::write(&helper, cairn::testing::host_helper::BINARY).expect("write the helper");
    let mut cmd = Command::new("bash");
    cmd.arg(root().join("tests/remote-script-local.sh"))
        .env("CAIRN_HOST_HELPER_BIN", &helper)
        .env(
            "CAIRN_HOST_HELPER_SHA256",
            cairn::testing::host_helper::SHA256,
        );
    // The test harness ignores some signals (SIGPIPE, a realtime one) and children inherit
    // that; sh cannot undo a signal ignored on entry. sshd hands the script default
    // dispositions, so do the same here.
    // SAFETY: the closure runs between fork and exec and makes only async-signal-safe calls.
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
    assert!(
        cairn::testing::host_helper::available(),
        "the build made no helper"
    );
    let dir = tempfile::tempdir().expect("tempdir");
    let helper = dir.path().join("cairn-host");
    std::fs::write(&helper, cairn::testing::host_helper::BINARY).expect("write the helper");
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&helper, std::fs::Permissions::from_mode(0o700)).expect("chmod");
    let size = cairn::testing::host_helper::BINARY.len();
    eprintln!(
        "host helper: {size} bytes, SHA-256 {}",
        cairn::testing::host_helper::SHA256
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
        .args([cairn::testing::host_helper::SHA256, "selftest"])
        .output()
        .expect("run the helper");
    assert_eq!(String::from_utf8_lossy(&ok.stdout), "cairn-host ok v=1\n");
    // hashed once, then sealed: later uses check a stat against the seal
    let seal = dir.path().join(".cairn-host.seal");
    let sealed = std::fs::read_to_string(&seal).expect("the helper sealed its hash");
    assert!(
        sealed.starts_with(cairn::testing::host_helper::SHA256),
        "{sealed}"
    );
    // the file changed in place after it was sealed (one byte): its change time no longer
    // matches, so it is hashed again and refused
    let mut bytes = cairn::testing::host_helper::BINARY.to_vec();
    let last = bytes.len() - 1;
    bytes[last] ^= 0xff;
    std::fs::write(&helper, &bytes).expect("rewrite the helper");
    let changed = Command::new(&helper)
        .args([cairn::testing::host_helper::SHA256, "selftest"])
        .output()
        .expect("run the helper");
    assert_eq!(changed.status.code(), Some(125), "{changed:?}");
    std::fs::write(&helper, cairn::testing::host_helper::BINARY).expect("restore the helper");
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

/// The shells a host's /bin/sh may be, as argv prefixes.
fn shells() -> Vec<Vec<&'static str>> {
    vec![
        vec!["/bin/dash"],
        vec!["/bin/bash"],
        vec!["/bin/busybox", "sh"],
    ]
}

/// A PATH with the few tools the installer uses and no `sha256sum`.
fn path_without_sha256sum(dir: &std::path::Path) -> String {
    let bin = dir.join("tools");
    std::fs::create_dir_all(&bin).unwrap();
    for tool in ["cat", "wc", "mkdir", "mv", "rm", "sync", "cksum"] {
        let real = ["/usr/bin", "/bin"]
            .iter()
            .map(|d| std::path::Path::new(d).join(tool))
            .find(|p| p.exists())
            .unwrap_or_else(|| panic!("{tool} not found"));
        let _ = std::os::unix::fs::symlink(real, bin.join(tool));
    }
    bin.display().to_string()
}

/// Run the installer under `sh` with `stdin`; its protocol lines and the exit status.
fn install(
    sh: &[&str],
    home: &std::path::Path,
    path: Option<&str>,
    stdin: &[u8],
) -> (Vec<String>, Option<i32>) {
    use std::io::Write;
    use std::process::Stdio;
    let text = cairn::testing::marker::session_script().as_bytes();
    let n = "0123456789abcdef0123456789abcdef";
    let mut c = Command::new(sh[0]);
    c.args(&sh[1..])
        .args(["-c", cairn::testing::marker::INSTALLER, "cairn", ".cairn"])
        .arg(cairn::testing::marker::script_sha256())
        .arg(text.len().to_string())
        .arg(cairn::testing::marker::cksum(text).to_string())
        .arg(n)
        .env("HOME", home)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    if let Some(p) = path {
        c.env("PATH", p);
    }
    let mut child = c.spawn().unwrap();
    let _ = child.stdin.take().unwrap().write_all(stdin);
    let out = child.wait_with_output().unwrap();
    let tag = format!("@@cairn-{n}@@ ");
    let lines = String::from_utf8_lossy(&out.stderr)
        .lines()
        .filter_map(|l| l.strip_prefix(&tag).map(str::to_owned))
        .collect();
    (lines, out.status.code())
}

#[test]
fn the_installer_checks_the_script_under_bash_dash_and_busybox_ash_with_or_without_sha256sum() {
    let text = cairn::testing::marker::session_script().as_bytes();
    let installed = |home: &std::path::Path| {
        home.join(".cairn/bin").join(format!(
            "cairn-sh-{}",
            cairn::testing::marker::script_sha256()
        ))
    };
    let mut corrupt = text.to_vec();
    corrupt[text.len() / 2] ^= 1;
    for sh in shells() {
        for no_sha in [false, true] {
            let what = format!("{sh:?}, without sha256sum: {no_sha}");
            let home = tempfile::tempdir().unwrap();
            let path = no_sha.then(|| path_without_sha256sum(home.path()));
            let path = path.as_deref();
            // one byte changed, same length: refused, nothing left in place or behind
            let (lines, code) = install(&sh, home.path(), path, &corrupt);
            assert_eq!(code, Some(1), "{what}: {lines:?}");
            assert!(
                lines.iter().any(|l| l.contains("checksum mismatch")),
                "{what}: {lines:?}"
            );
            assert!(!installed(home.path()).exists(), "{what}");
            let tmp = home.path().join(".cairn/tmp");
            assert_eq!(std::fs::read_dir(&tmp).unwrap().count(), 0, "{what}");
            // cut short: refused
            let (lines, code) = install(&sh, home.path(), path, &text[..text.len() - 7]);
            assert_eq!(code, Some(1), "{what}: {lines:?}");
            assert!(
                lines.iter().any(|l| l.contains("stdin ended early")),
                "{what}: {lines:?}"
            );
            assert!(!installed(home.path()).exists(), "{what}");
            // the real bytes: in place under its hash, exactly
            let (lines, code) = install(&sh, home.path(), path, text);
            assert_eq!(
                (lines, code),
                (vec!["installed".to_owned()], Some(0)),
                "{what}"
            );
            assert_eq!(
                std::fs::read(installed(home.path())).unwrap(),
                text,
                "{what}"
            );
        }
    }
}

#[test]
fn the_installed_script_runs_from_a_tiny_exec_and_a_copy_cut_short_runs_nothing() {
    let n = "0123456789abcdef0123456789abcdef";
    let text = cairn::testing::marker::session_script().as_bytes();
    for sh in shells() {
        let home = tempfile::tempdir().unwrap();
        let (_, code) = install(&sh, home.path(), None, text);
        assert_eq!(code, Some(0));
        let file = home.path().join(".cairn/bin").join(format!(
            "cairn-sh-{}",
            cairn::testing::marker::script_sha256()
        ));
        let hello = |file: &std::path::Path| {
            let out = Command::new(sh[0])
                .args(&sh[1..])
                .args(["-c", ". \"$1\"", "cairn"])
                .arg(file)
                .args(["hello", ".cairn", n])
                .env("HOME", home.path())
                .env("SHELL", "/bin/sh")
                .output()
                .unwrap();
            (
                String::from_utf8_lossy(&out.stderr).into_owned(),
                out.status.code(),
            )
        };
        let (err, code) = hello(&file);
        assert_eq!(code, Some(0), "{sh:?}: {err}");
        assert!(
            err.contains(&format!("@@cairn-{n}@@ hello v=1 ")),
            "{sh:?}: {err}"
        );
        // a copy cut short anywhere: the shell parses the whole group first, so nothing of it
        // runs (no protocol line, no marker home made), and the exec says it failed
        let home2 = tempfile::tempdir().unwrap();
        let cut = home2.path().join("cut");
        for at in [text.len() / 3, text.len() - 3] {
            std::fs::write(&cut, &text[..at]).unwrap();
            let out = Command::new(sh[0])
                .args(&sh[1..])
                .args(["-c", ". \"$1\"", "cairn"])
                .arg(&cut)
                .args(["hello", ".cairn", n])
                .env("HOME", home2.path())
                .output()
                .unwrap();
            let err = String::from_utf8_lossy(&out.stderr);
            assert!(!err.contains("@@cairn-"), "{sh:?} at {at}: {err}");
            assert_ne!(out.status.code(), Some(0), "{sh:?} at {at}");
            assert!(!home2.path().join(".cairn").exists(), "{sh:?} at {at}");
        }
    }
}
