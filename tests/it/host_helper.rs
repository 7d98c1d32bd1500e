//! The native host helper against a real sshd: uploaded on first contact, recorded as the side
//! that ran each execution, interchangeable with the sh script (an execution dispatched by one
//! is recovered by the other), and replaced by the script where it cannot run (a marker home
//! on a file system mounted `noexec`). The two implementations also answer the same protocol
//! exchanges with the same lines, run locally side by side.

use std::fs;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use cairn::id::ExecutionId;
use cairn::State;

use crate::support::host::*;

/// The `host_side` the journal's `running` event of `id` records.
fn side(h: &Host, id: &str) -> String {
    let ev = h
        .journal()
        .events(&ExecutionId::parse(id).unwrap())
        .expect("events");
    let running = ev
        .iter()
        .find(|e| e.kind == "running")
        .unwrap_or_else(|| panic!("no running event for {id}"));
    running.evidence["host_side"]
        .as_str()
        .unwrap_or_default()
        .to_owned()
}

fn helper_file(h: &Host) -> std::path::PathBuf {
    h.remote_dir.join("bin").join(format!(
        "cairn-host-{}",
        cairn::testing::host_helper::SHA256
    ))
}

/// The program the supervisor of `id` runs (from its started record's `sup_pid`), if alive.
fn supervisor_exe(h: &Host, id: &str) -> Option<String> {
    let rec = fs::read_to_string(h.x().join(format!("{id}.start"))).ok()?;
    let pid = rec
        .split_whitespace()
        .find_map(|kv| kv.strip_prefix("sup_pid="))?
        .to_owned();
    fs::read_link(format!("/proc/{pid}/exe"))
        .ok()
        .map(|p| p.display().to_string())
}

#[test]
fn first_contact_uploads_the_helper_and_the_run_records_it() {
    let h = Host::new();
    let out = h
        .run_cmd(&[], &format!("{}echo hello; exit 4", h.count()))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(4), "{out:?}");
    assert_eq!(out.stdout, b"hello\n");
    assert_eq!(h.runs(), 1);
    let id = h.started_id().unwrap();
    assert_eq!(side(&h, &id), "helper");
    let f = helper_file(&h);
    let bytes = fs::read(&f).expect("the helper is in the marker home");
    assert_eq!(bytes, cairn::testing::host_helper::BINARY);
    use std::os::unix::fs::PermissionsExt;
    let mode = fs::metadata(&f).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o700, "the helper's mode");
    let home = fs::metadata(&h.remote_dir).unwrap().permissions().mode() & 0o777;
    assert_eq!(home, 0o700, "the marker home's mode");
    // a second run finds it and uploads nothing (the file is the same inode)
    use std::os::unix::fs::MetadataExt;
    let ino = fs::metadata(&f).unwrap().ino();
    let out = h.run_cmd(&[], "echo again").output().unwrap();
    assert!(out.status.success(), "{out:?}");
    assert_eq!(fs::metadata(&f).unwrap().ino(), ino);
    assert!(!String::from_utf8_lossy(&out.stderr).contains("uploaded"));
    // --host-helper never: the script, recorded as such
    let out = h
        .run_cmd(&["--host-helper", "never", "--id", "by-sh"], "echo sh")
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    assert_eq!(side(&h, "by-sh"), "sh");
}

// Many executions reaching a fresh host at once (a gateway given many calls together) wait for
// one probe and one upload: each uploading its own copy cost a gateway more than a megabyte per
// execution in flight.
#[test]
fn executions_reaching_a_fresh_host_together_upload_the_helper_once() {
    use std::io::Write;
    let h = Host::new();
    let mut c = h.cairn("serve");
    c.arg("--stdio").arg("--remote-dir").arg(&h.remote_dir);
    c.stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    let mut child = c.spawn().expect("spawn cairn serve --stdio");
    let n = 24;
    let mut stdin = child.stdin.take().unwrap();
    for i in 0..n {
        let req = serde_json::json!({"jsonrpc": "2.0", "id": i, "method": "execute",
            "params": {"destination": "127.0.0.1", "command": format!("{}echo n{i}", h.count())}});
        writeln!(stdin, "{req}").unwrap();
    }
    // Once stdin ends, serve answers what it took and exits.
    drop(stdin);
    let out = wait_child(child, Duration::from_secs(120));
    let stderr = String::from_utf8_lossy(&out.stderr);
    let answers: Vec<serde_json::Value> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).expect("a JSON response"))
        .collect();
    assert_eq!(answers.len(), n, "{answers:?}\n{stderr}");
    for a in &answers {
        let r = &a["result"];
        assert_eq!(r["state"], "completed", "{a}");
        assert_eq!(r["stdout"], format!("n{}\n", a["id"]), "{a}");
        assert_eq!(side(&h, r["execution_id"].as_str().unwrap()), "helper");
    }
    assert_eq!(h.runs(), n);
    assert_eq!(
        stderr.matches("uploaded the host helper").count(),
        1,
        "one upload for {n} executions: {stderr}"
    );
    assert_eq!(
        fs::read(helper_file(&h)).unwrap(),
        cairn::testing::host_helper::BINARY
    );
}

#[test]
fn a_wrong_file_under_the_helpers_name_is_replaced_and_never_run() {
    let h = Host::new();
    let f = helper_file(&h);
    fs::create_dir_all(f.parent().unwrap()).unwrap();
    fs::create_dir_all(&h.remote_dir).unwrap();
    use std::os::unix::fs::PermissionsExt;
    fs::set_permissions(&h.remote_dir, fs::Permissions::from_mode(0o700)).unwrap();
    let marker = h.sshd.dir().join("impostor-ran");
    fs::write(
        &f,
        format!("#!/bin/sh\necho ran >> '{}'\n", marker.display()),
    )
    .unwrap();
    fs::set_permissions(&f, fs::Permissions::from_mode(0o700)).unwrap();
    let out = h
        .run_cmd(&["--id", "w1"], &format!("{}echo ok", h.count()))
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    assert_eq!(out.stdout, b"ok\n");
    assert_eq!(h.runs(), 1);
    assert_eq!(side(&h, "w1"), "helper");
    assert_eq!(fs::read(&f).unwrap(), cairn::testing::host_helper::BINARY);
    assert!(!marker.exists(), "the file with the wrong hash was run");
}

#[test]
fn dispatched_by_the_helper_recovered_by_the_script_and_the_other_way_round() {
    let h = Host::new();
    for (n, (first, then)) in [("always", "never"), ("never", "always")]
        .iter()
        .enumerate()
    {
        let id = format!("x{n}");
        let mut child = spawn(h.run_cmd(
            &["--host-helper", first, "--id", &id],
            &format!("{}sleep 1; echo finished-{n}; exit 5", h.count()),
        ));
        wait_for("the started record", Duration::from_secs(20), || {
            h.x().join(format!("{id}.start")).exists().then_some(())
        });
        let exe = supervisor_exe(&h, &id).unwrap_or_default();
        child.kill().unwrap();
        let _ = child.wait();
        // the side that dispatched it supervises it
        assert_eq!(
            exe.contains("cairn-host-"),
            *first == "always",
            "supervisor of {id}: {exe}"
        );
        h.wait_done(&id);
        if *first == "always" {
            // recovered by the script alone: the helper is gone from the host
            fs::remove_dir_all(h.remote_dir.join("bin")).unwrap();
        }
        let out = h
            .cairn("recover")
            .args(["--host-helper", then, "--json"])
            .output()
            .unwrap();
        let v: serde_json::Value =
            serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {out:?}"));
        let one = &v.as_array().unwrap()[0];
        assert_eq!(one["execution_id"], id.as_str(), "{v}");
        assert_eq!(one["state"], "completed", "{v}");
        assert_eq!(one["exit_code"], 5, "{v}");
        assert_eq!(h.runs(), n + 1, "ran once each");
        assert_eq!(h.state(&id), State::Completed);
        let o = h.cairn("output").arg(&id).output().unwrap();
        assert_eq!(o.stdout, format!("finished-{n}\n").as_bytes());
        if *then == "always" {
            assert!(helper_file(&h).exists(), "recover uploaded the helper");
        }
    }
}

#[test]
fn a_noexec_marker_home_falls_back_to_the_script() {
    // a tmpfs mounted noexec, as root (CI runs as root; elsewhere this needs root)
    let h = Host::new();
    let mnt = h.sshd.dir().join("noexec");
    fs::create_dir_all(&mnt).unwrap();
    let m = Command::new("mount")
        .args(["-t", "tmpfs", "-o", "noexec,mode=700", "tmpfs"])
        .arg(&mnt)
        .output()
        .expect("mount");
    assert!(
        m.status.success(),
        "mounting a noexec tmpfs needs root: {}",
        String::from_utf8_lossy(&m.stderr)
    );
    struct Unmount<'a>(&'a Path);
    impl Drop for Unmount<'_> {
        fn drop(&mut self) {
            let _ = Command::new("umount").arg("-l").arg(self.0).status();
        }
    }
    let _u = Unmount(&mnt);
    let dir = mnt.join("cairn");
    let run = |extra: &[&str]| {
        let mut c = h.cairn("run");
        c.arg("--remote-dir").arg(&dir).args(extra);
        c.arg("127.0.0.1")
            .arg("--")
            .arg(format!("{}echo via-sh", h.count()));
        c.output().unwrap()
    };
    let out = run(&["--id", "ne1"]);
    assert!(out.status.success(), "{out:?}");
    assert_eq!(out.stdout, b"via-sh\n");
    let ev = h
        .journal()
        .events(&ExecutionId::parse("ne1").unwrap())
        .unwrap();
    let running = ev.iter().find(|e| e.kind == "running").unwrap();
    assert_eq!(running.evidence["host_side"], "sh");
    assert!(
        !dir.join("bin")
            .join(format!(
                "cairn-host-{}",
                cairn::testing::host_helper::SHA256
            ))
            .exists(),
        "an unrunnable helper was left in place"
    );
    // --host-helper always: a clear error, and nothing ran
    let out = run(&["--id", "ne2", "--host-helper", "always"]);
    assert!(!out.status.success(), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--host-helper always"), "{err}");
    assert_eq!(h.runs(), 1);
}

/// One protocol exchange run locally against both sides, normalized (numbers that differ
/// between runs: PIDs, times, epochs, boot IDs), for comparison.
fn exchange(side: &str, home: &Path, args: &[&str], stdin: &[u8]) -> (Vec<String>, Vec<u8>) {
    use std::io::Write;
    let script = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("remote-scripts/cairn.sh"),
    )
    .unwrap();
    let mut c = if side == "sh" {
        let mut c = Command::new("/bin/sh");
        c.args(["-c", "eval \"$1\"", "cairn", &script]);
        c
    } else {
        let mut c = Command::new(home.join("cairn-host"));
        c.arg(cairn::testing::host_helper::SHA256);
        c
    };
    let mut child = c
        .args(args)
        .env("HOME", home)
        .env("SHELL", "/bin/sh")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // (a mode that reads no stdin may have ended before this is written)
    let _ = child.stdin.take().unwrap().write_all(stdin);
    let out = child.wait_with_output().unwrap();
    let tag = "@@cairn-0123456789abcdef0123456789abcdef@@ ";
    let norm = |l: &str| {
        l.split(' ')
            .map(|w| match w.split_once('=') {
                Some((k, _))
                    if [
                        "epoch",
                        "boot",
                        "now",
                        "sup_pid",
                        "sup_start",
                        "started_at",
                        "finished_at",
                    ]
                    .contains(&k) =>
                {
                    format!("{k}=*")
                }
                _ => w.to_owned(),
            })
            .collect::<Vec<_>>()
            .join(" ")
    };
    let text =
        String::from_utf8_lossy(&out.stderr).into_owned() + &String::from_utf8_lossy(&out.stdout);
    let mut lines: Vec<String> = text
        .split('\n')
        .filter_map(|l| l.find(tag).map(|i| norm(&l[i + tag.len()..])))
        .collect();
    // a supervisor that has written the finish record may still be ending: alive or dead then
    // is a matter of moments, not of the implementation
    if lines.iter().any(|l| l.starts_with("done ")) {
        for l in lines.iter_mut() {
            if l == "live alive" || l == "live dead" {
                *l = "live (finished)".into();
            }
        }
    }
    (lines, out.stdout)
}

#[test]
fn both_sides_answer_the_same_exchanges_with_the_same_lines() {
    let n = "0123456789abcdef0123456789abcdef";
    let dg = "0".repeat(64);
    let homes: Vec<tempfile::TempDir> = (0..2).map(|_| tempfile::tempdir().unwrap()).collect();
    let hp = homes[1].path().join("cairn-host");
    fs::write(&hp, cairn::testing::host_helper::BINARY).unwrap();
    use std::os::unix::fs::PermissionsExt;
    fs::set_permissions(&hp, fs::Permissions::from_mode(0o700)).unwrap();
    let cmd = b"echo out; echo err >&2; exit 3";
    let len = cmd.len().to_string();
    let session_in = format!("d s1 4 {dg} 0 1 1\ntrue\ne\nd a1 7 {dg} 0 1 1\necho hi\ne\ng\n");
    let cases: Vec<(Vec<&str>, &[u8])> = vec![
        (vec!["hello", ".cairn", n], b""),
        (
            vec!["dispatch", ".cairn", n, "a1", &len, &dg, "0", "1"],
            cmd,
        ),
        (
            vec!["dispatch", ".cairn", n, "a1", &len, &dg, "0", "1"],
            cmd,
        ),
        (vec!["watch", ".cairn", n, "a1", "4", "0", "1"], b""),
        (vec!["watch", ".cairn", n, "nosuch", "0", "0", "0"], b""),
        (
            vec!["dispatch", ".cairn", n, "short", "100", &dg, "0", "1"],
            b"echo",
        ),
        (
            vec!["dispatch", ".cairn", n, "../x", "4", &dg, "0", "1"],
            b"true",
        ),
        (vec!["cancel", ".cairn", n, "a1", "1"], b""),
        (vec!["cancel", ".cairn", n, "c1", "1"], b""),
        (
            vec!["dispatch", ".cairn", n, "c1", "4", &dg, "0", "1"],
            b"true",
        ),
        (vec!["session", ".cairn", n], session_in.as_bytes()),
        (vec!["gc", ".cairn", n, "0", "999999"], b""),
        (vec!["watch", ".cairn", n, "a1", "0", "0", "0"], b""),
        (vec!["gc", ".cairn", n, "0", "0"], b""),
        (vec!["watch", ".cairn", n, "a1", "0", "0", "0"], b""),
    ];
    for (args, input) in &cases {
        let (a, ao) = exchange("sh", homes[0].path(), args, input);
        let (b, bo) = exchange("helper", homes[1].path(), args, input);
        assert_eq!(a, b, "{args:?}: the script's lines, then the helper's");
        if args[0] != "session" {
            assert_eq!(ao, bo, "{args:?}: stdout");
        }
        assert!(!a.is_empty(), "{args:?}: no protocol lines");
    }
}

/// A helper of another version under the marker home, as a client of that version would have
/// left it: the client's own bytes with `tag` after them (the kernel runs them alike, the hash
/// differs), under that hash.
fn other_version(h: &Host, tag: &[u8]) -> (String, std::path::PathBuf) {
    use sha2::Digest;
    use std::os::unix::fs::PermissionsExt;
    let bin = h.remote_dir.join("bin");
    fs::create_dir_all(&bin).unwrap();
    for d in [&h.remote_dir, &bin] {
        fs::set_permissions(d, fs::Permissions::from_mode(0o700)).unwrap();
    }
    let mut b = cairn::testing::host_helper::BINARY.to_vec();
    b.extend_from_slice(tag);
    let sha = hex::encode(sha2::Sha256::digest(&b));
    let p = bin.join(format!("cairn-host-{sha}"));
    fs::write(&p, &b).unwrap();
    fs::set_permissions(&p, fs::Permissions::from_mode(0o700)).unwrap();
    (sha, p)
}

// Long: one scenario, its phases in order.
#[test]
fn uploading_a_new_helper_removes_other_versions_but_not_one_still_running() {
    let h = Host::new();
    let (_, idle) = other_version(&h, b"idle");
    let (busy_sha, busy) = other_version(&h, b"busy");
    // the busy one supervises a command that runs until the test lets it end
    let gate = h.sshd.dir().join("gate");
    let cmd = format!(
        "i=0; while [ ! -e '{}' ] && [ $i -lt 600 ]; do sleep 0.1; i=$((i+1)); done",
        gate.display()
    );
    let dir = h.remote_dir.display().to_string();
    let len = cmd.len().to_string();
    let dg = "0".repeat(64);
    let n = "0123456789abcdef0123456789abcdef";
    let mut c = Command::new(&busy);
    c.args([
        busy_sha.as_str(),
        "dispatch",
        &dir,
        n,
        "old1",
        &len,
        &dg,
        "0",
        "0",
    ])
    .env("HOME", h.sshd.dir())
    .env("SHELL", "/bin/sh")
    .stdin(std::process::Stdio::piped())
    .stdout(std::process::Stdio::piped())
    .stderr(std::process::Stdio::piped());
    let mut child = c.spawn().unwrap();
    {
        use std::io::Write;
        child
            .stdin
            .take()
            .unwrap()
            .write_all(cmd.as_bytes())
            .unwrap();
    }
    let out = child.wait_with_output().unwrap();
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("verdict started"),
        "{out:?}"
    );
    let exe = supervisor_exe(&h, "old1").expect("the old helper's supervisor runs");
    assert_eq!(Path::new(&exe), busy, "the supervisor of old1");
    // the first contact of this client uploads its own version: the idle one goes
    let out = h
        .run_cmd(&["--id", "n1"], &format!("{}echo new", h.count()))
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    assert_eq!(out.stdout, b"new\n");
    assert_eq!(side(&h, "n1"), "helper");
    assert_eq!(
        fs::read(helper_file(&h)).unwrap(),
        cairn::testing::host_helper::BINARY
    );
    assert!(
        !idle.exists(),
        "a helper of another version was left in place"
    );
    assert!(
        busy.exists(),
        "a helper that still supervises a command was removed"
    );
    // cairn gc, run by the helper, follows the same rule
    let (_, idle2) = other_version(&h, b"idle2");
    let out = h.cairn("gc").output().unwrap();
    assert!(out.status.success(), "{out:?}");
    assert!(!idle2.exists(), "cairn gc left a helper of another version");
    assert!(
        busy.exists(),
        "cairn gc removed a helper that still supervises a command"
    );
    assert!(
        helper_file(&h).exists(),
        "cairn gc removed this client's helper"
    );
    // once its command has ended and its supervisor with it, the next upload removes it too
    fs::write(&gate, b"").unwrap();
    h.wait_done("old1");
    wait_for("the old supervisor to end", Duration::from_secs(20), || {
        supervisor_exe(&h, "old1").is_none().then_some(())
    });
    fs::remove_file(helper_file(&h)).unwrap();
    let out = h
        .run_cmd(&["--id", "n2"], &format!("{}echo again", h.count()))
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    assert_eq!(side(&h, "n2"), "helper");
    assert!(!busy.exists(), "the old helper outlived its supervisor");
    assert_eq!(
        fs::read(helper_file(&h)).unwrap(),
        cairn::testing::host_helper::BINARY
    );
    assert_eq!(h.runs(), 2);
    // (beside the one helper: the installed script)
    let left: Vec<_> = fs::read_dir(h.remote_dir.join("bin"))
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("cairn-host-"))
        .collect();
    assert_eq!(left.len(), 1, "{left:?}");
}
