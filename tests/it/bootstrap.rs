//! The host side reaches the host through exec requests of at most 1 KiB: installed once in
//! the marker home (first contact included), streamed on stdin where it cannot be installed,
//! and the markers of the inline script that earlier clients sent are recovered by this one.

use std::fs;
use std::io::Write;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::support::host::{json_of, output, spawn, wait_for, Host};
use cairn::State;

const LIMIT: Duration = Duration::from_secs(60);

fn installed(h: &Host, dir: &Path) -> std::path::PathBuf {
    let _ = h;
    dir.join("bin").join(format!(
        "cairn-sh-{}",
        cairn::testing::marker::script_sha256()
    ))
}

/// `cairn SUB ARGS…` against this host.
fn cairn(h: &Host, sub: &str, args: &[&str]) -> Command {
    let mut c = h.cairn(sub);
    c.args(args);
    c
}

fn host_side(h: &Host, id: &str) -> String {
    let ev = h
        .journal()
        .events(&cairn::ExecutionId::parse(id).unwrap())
        .unwrap();
    let running = ev.iter().find(|e| e.kind == "running").expect("running");
    running.evidence["host_side"]
        .as_str()
        .unwrap_or("")
        .to_owned()
}

#[test]
fn first_contact_installs_the_script_and_no_exec_request_exceeds_one_kib() {
    for helper in ["never", "auto"] {
        let h = Host::new();
        let out = output(
            h.run_cmd(
                &["--id", "fc1", "--host-helper", helper],
                &format!("{}echo first", h.count()),
            ),
            LIMIT,
        );
        assert!(out.status.success(), "{out:?}");
        assert_eq!(out.stdout, b"first\n");
        assert_eq!(h.runs(), 1);
        let file = installed(&h, &h.remote_dir);
        assert_eq!(
            fs::read(&file).unwrap(),
            cairn::testing::marker::session_script().as_bytes(),
            "the installed script is not the client's"
        );
        let first = h.sshd.exec_lengths();
        // hello (no script yet), install, hello, [helper: probe, upload], dispatch
        assert!(first.len() >= 4, "{first:?}");
        assert!(
            first
                .iter()
                .all(|&n| n <= cairn::testing::marker::MAX_EXEC_LEN),
            "{first:?}"
        );
        // a second client: nothing is installed again, the file is the same one
        let ino = std::os::unix::fs::MetadataExt::ino(&fs::metadata(&file).unwrap());
        let out = output(
            h.run_cmd(
                &["--id", "fc2", "--host-helper", helper],
                &format!("{}echo second", h.count()),
            ),
            LIMIT,
        );
        assert!(out.status.success(), "{out:?}");
        assert_eq!(out.stdout, b"second\n");
        assert_eq!(h.runs(), 2);
        assert_eq!(
            std::os::unix::fs::MetadataExt::ino(&fs::metadata(&file).unwrap()),
            ino,
            "the script was installed again"
        );
        let all = h.sshd.exec_lengths();
        eprintln!("--host-helper {helper}: exec request lengths {all:?}");
        assert!(
            all.iter()
                .all(|&n| n <= cairn::testing::marker::MAX_EXEC_LEN),
            "{all:?}"
        );
    }
}

/// A read-only mount at `p` (tmpfs; as root, as CI runs), unmounted when dropped.
struct ReadOnly(std::path::PathBuf);
impl ReadOnly {
    fn tmpfs(p: &Path) -> ReadOnly {
        fs::create_dir_all(p).unwrap();
        let m = Command::new("mount")
            .args(["-t", "tmpfs", "-o", "ro,mode=700", "tmpfs"])
            .arg(p)
            .output()
            .expect("mount");
        assert!(
            m.status.success(),
            "mounting a read-only tmpfs needs root: {}",
            String::from_utf8_lossy(&m.stderr)
        );
        ReadOnly(p.to_path_buf())
    }
    /// Make the mount at `p` (already a mount point) read-only.
    fn remount(p: &Path) -> ReadOnly {
        let m = Command::new("mount")
            .args(["-o", "remount,ro"])
            .arg(p)
            .output()
            .expect("mount");
        assert!(m.status.success(), "{}", String::from_utf8_lossy(&m.stderr));
        ReadOnly(p.to_path_buf())
    }
}
impl Drop for ReadOnly {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

#[test]
fn a_marker_home_that_cannot_hold_the_script_gets_it_streamed_on_stdin() {
    let h = Host::new();
    fs::create_dir_all(&h.remote_dir).unwrap();
    use std::os::unix::fs::PermissionsExt;
    fs::set_permissions(&h.remote_dir, fs::Permissions::from_mode(0o700)).unwrap();
    // bin/ cannot be written (nor the helper uploaded): everything else can
    let _ro = ReadOnly::tmpfs(&h.remote_dir.join("bin"));
    let out = output(
        h.run_cmd(
            &["--id", "st1"],
            &format!("{}echo streamed; exit 3", h.count()),
        ),
        LIMIT,
    );
    assert_eq!(out.status.code(), Some(3), "{out:?}");
    assert_eq!(out.stdout, b"streamed\n");
    assert_eq!(h.runs(), 1);
    assert_eq!(h.state("st1"), State::Delivered);
    assert_eq!(host_side(&h, "st1"), "sh");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("streaming the script"), "{err}");
    assert!(!installed(&h, &h.remote_dir).exists());
    // detached, then attached by another process: streamed again, the same result
    let out = output(
        h.run_cmd(
            &["--id", "st2", "--detach"],
            &format!("{}sleep 1; echo later", h.count()),
        ),
        LIMIT,
    );
    assert!(out.status.success(), "{out:?}");
    let out = output(cairn(&h, "attach", &["st2"]), LIMIT);
    assert!(out.status.success(), "{out:?}");
    assert_eq!(out.stdout, b"later\n");
    assert_eq!(h.runs(), 2);
    assert!(h
        .sshd
        .exec_lengths()
        .iter()
        .all(|&n| n <= cairn::testing::marker::MAX_EXEC_LEN));
}

#[test]
fn a_read_only_marker_home_still_answers_for_what_it_holds() {
    let h = Host::new();
    // the marker home is a mount of its own, writable while the command runs
    fs::create_dir_all(&h.remote_dir).unwrap();
    let m = Command::new("mount")
        .args(["-t", "tmpfs", "-o", "mode=700", "tmpfs"])
        .arg(&h.remote_dir)
        .output()
        .expect("mount");
    assert!(m.status.success(), "{}", String::from_utf8_lossy(&m.stderr));
    let out = output(
        h.run_cmd(
            &["--id", "ro1", "--detach", "--host-helper", "never"],
            &format!("{}sleep 1; echo kept; exit 4", h.count()),
        ),
        LIMIT,
    );
    assert!(out.status.success(), "{out:?}");
    h.wait_done("ro1");
    // then the home loses its installed script (an older client's home, a wiped bin/) and
    // becomes read-only: the script can only be streamed
    fs::remove_file(installed(&h, &h.remote_dir)).unwrap();
    let _ro = ReadOnly::remount(&h.remote_dir);
    let out = output(cairn(&h, "attach", &["ro1"]), LIMIT);
    assert_eq!(out.status.code(), Some(4), "{out:?}");
    assert_eq!(out.stdout, b"kept\n");
    assert_eq!(h.runs(), 1);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("streaming the script"), "{err}");
}

/// Dispatch `command` as ID `id` the way clients before the installed script did: the whole
/// script (`tests/fixtures/cairn-sh-inline-v1.sh`, as it was then) inline in `sh -c`, run on
/// this (loopback) host as sshd would run it, the command bytes on stdin. ATTACH=0: it returns
/// once the supervisor has started the command.
fn dispatch_inline_v1(h: &Host, id: &str, command: &str) {
    let script = fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/cairn-sh-inline-v1.sh"),
    )
    .unwrap();
    use sha2::Digest;
    let digest = hex::encode(sha2::Sha256::digest(command.as_bytes()));
    let mut child = Command::new("/bin/sh")
        .args(["-c", "eval \"$1\"", "cairn", &script, "dispatch"])
        .arg(&h.remote_dir)
        .args(["0123456789abcdef0123456789abcdef", id])
        .arg(command.len().to_string())
        .args([digest.as_str(), "0", "0"])
        .env("CAIRN_BOOT_ID_FILE", h.sshd.boot_id_file())
        .env("SHLVL", "1")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(command.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("verdict started"), "{err}");
}

#[test]
fn an_execution_the_inline_script_of_earlier_clients_started_is_recovered_by_this_one() {
    let h = Host::new();
    let cmd = format!("{}sleep 2; echo from-v1; exit 4", h.count());
    dispatch_inline_v1(&h, "v1run", &cmd);
    let x = h.x();
    assert!(x.join("v1run.start").exists());
    assert!(!installed(&h, &h.remote_dir).exists());
    // this client, asked for the same execution: it attaches to the running one (the start
    // guard holds), is killed, and `recover` reads the result from the records v1 wrote
    let mut child = spawn(h.run_cmd(&["--id", "v1run"], &cmd));
    wait_for("the running event", LIMIT, || {
        (h.journal()
            .events(&cairn::ExecutionId::parse("v1run").unwrap())
            .ok()?
            .iter()
            .any(|e| e.kind == "running"))
        .then_some(())
    });
    child.kill().unwrap();
    let _ = child.wait();
    h.wait_done("v1run");
    let out = output(cairn(&h, "recover", &["--json"]), LIMIT);
    let v = json_of(&out);
    let one = &v.as_array().unwrap()[0];
    assert_eq!(one["execution_id"], "v1run", "{v}");
    assert_eq!(one["state"], "completed", "{v}");
    assert_eq!(one["exit_code"], 4);
    let o = output(cairn(&h, "output", &["v1run"]), LIMIT);
    assert_eq!(o.stdout, b"from-v1\n");
    assert_eq!(h.runs(), 1);
    // and one v1 finished long ago: its stored result, never a second run
    let cmd2 = format!("{}echo done-by-v1", h.count());
    dispatch_inline_v1(&h, "v1done", &cmd2);
    h.wait_done("v1done");
    let out = output(h.run_cmd(&["--id", "v1done"], &cmd2), LIMIT);
    assert!(out.status.success(), "{out:?}");
    assert_eq!(out.stdout, b"done-by-v1\n");
    assert_eq!(h.runs(), 2);
    assert_eq!(h.state("v1done"), State::Delivered);
}

#[test]
fn a_host_session_gets_the_script_streamed_where_it_cannot_be_installed() {
    use std::io::{BufRead, BufReader};
    let h = Host::new();
    fs::create_dir_all(&h.remote_dir).unwrap();
    use std::os::unix::fs::PermissionsExt;
    fs::set_permissions(&h.remote_dir, fs::Permissions::from_mode(0o700)).unwrap();
    let _ro = ReadOnly::tmpfs(&h.remote_dir.join("bin"));
    let log = h.sshd.dir().join("serve.log");
    let mut c = Command::new(crate::support::host::BIN);
    c.arg("serve");
    h.conn_args(&mut c, "60s");
    c.arg("--stdio")
        .arg("--remote-dir")
        .arg(&h.remote_dir)
        .args(["--host-session", "--host-helper", "never"])
        .env("CAIRN_LOG", "cairn=info")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(fs::File::create(&log).unwrap());
    let mut child = c.spawn().unwrap();
    let mut stdin = child.stdin.take().unwrap();
    for n in 1..=3 {
        let req = serde_json::json!({
            "jsonrpc": "2.0", "id": n, "method": "execute",
            "params": {"destination": "127.0.0.1",
                       "command": format!("{}echo s{n}", h.count())}
        });
        writeln!(stdin, "{req}").unwrap();
    }
    stdin.flush().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let stdout = child.stdout.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let mut seen = Vec::new();
    while seen.len() < 3 {
        let line = rx.recv_timeout(LIMIT).expect("a response");
        let v: serde_json::Value = serde_json::from_str(&line).unwrap();
        seen.push(v);
    }
    drop(stdin);
    let _ = crate::support::host::wait_child(child, LIMIT);
    for v in &seen {
        let n = v["id"].as_u64().unwrap();
        assert_eq!(v["result"]["state"], "completed", "{v}");
        assert_eq!(v["result"]["stdout"], format!("s{n}\n"), "{v}");
    }
    assert_eq!(h.runs(), 3);
    let text = fs::read_to_string(&log).unwrap();
    assert!(text.contains("using the sh script, streamed"), "{text}");
    assert!(!installed(&h, &h.remote_dir).exists());
}
