//! Every SSH server a user meets: the core cases of the suite against Dropbear as well as
//! OpenSSH (a run; a cut mid-run with reattach and byte-identical output; `kill -9` of cairn
//! and `recover`; `--detach` then `attach`; `cancel`; a fleet and a jump host in `fleet.rs` and
//! `jump.rs`), a busybox ash host without `sha256sum`, and a server that lacks what cairn
//! needs. Every server runs each command through a forced command that fails the test when an
//! exec request's command string exceeds 1 KiB (`support::sshd::write_exec_guard`).

use std::time::Duration;

use cairn::State;

use crate::run;
use crate::support::host::{json_of, output, Host};
use crate::support::sshd::Server;
use crate::support::TestSshd;

const LIMIT: Duration = Duration::from_secs(60);

#[test]
fn dropbear_runs_a_command_and_exits_with_its_status() {
    let h = Host::dropbear();
    run::runs_a_command_and_exits_with_its_status_on(&h);
    // it was Dropbear that served it (its own log wording), through the forced command
    let log = h.sshd.log();
    assert!(log.contains("Pubkey auth succeeded for"), "{log}");
    assert!(!h.sshd.exec_lengths().is_empty());
}

#[test]
fn dropbear_cut_during_the_run_reattaches_and_output_is_complete_and_in_order() {
    run::cut_during_the_run_reattaches_and_output_is_complete_and_in_order_on(&Host::dropbear());
}

#[test]
fn dropbear_kill_9_of_the_client_then_recover_completes_from_the_marker() {
    run::kill_9_of_the_client_then_recover_completes_from_the_marker_on(&Host::dropbear());
}

#[test]
fn dropbear_detach_then_cancel_stops_the_process_group() {
    run::detach_then_cancel_stops_the_process_group_on(&Host::dropbear());
}

/// `--detach` prints the ID at once; `attach` from another process streams the whole output
/// and exits with the command's status; the command ran once.
fn detach_then_attach(h: &Host) {
    let out = output(
        h.run_cmd(
            &["--detach", "--id", "det1"],
            &format!("{}sleep 1; echo later; echo warn >&2; exit 6", h.count()),
        ),
        LIMIT,
    );
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "det1");
    let mut c = h.cairn("attach");
    c.args(["det1", "--json"]);
    let out = output(c, LIMIT);
    let v = json_of(&out);
    assert_eq!(out.status.code(), Some(6), "{v}");
    assert_eq!(v["stdout"], "later\n");
    assert_eq!(v["stderr"], "warn\n");
    assert_eq!(h.runs(), 1);
    assert_eq!(h.state("det1"), State::Delivered);
}

#[test]
fn detach_then_attach_on_openssh() {
    detach_then_attach(&Host::new());
}

#[test]
fn dropbear_detach_then_attach() {
    detach_then_attach(&Host::dropbear());
}

/// A Dropbear host whose /bin/sh is busybox ash, the script (not the helper) on it.
fn busybox_host() -> Host {
    let mut h = Host::on(TestSshd::start_dropbear_busybox());
    h.env
        .push(("CAIRN_HOST_HELPER".to_owned(), "never".to_owned()));
    h
}

#[test]
fn a_busybox_ash_host_runs_reattaches_after_a_cut_and_recovers_after_kill_9() {
    let h = busybox_host();
    let out = output(
        h.run_cmd(&["--id", "bb1"], "/bin/sh --help 2>&1 | head -n 1"),
        LIMIT,
    );
    assert!(out.status.success(), "{out:?}");
    let first = String::from_utf8_lossy(&out.stdout);
    assert!(
        first.starts_with("BusyBox"),
        "/bin/sh there is not busybox: {first}"
    );
    assert!(installed_script(&h).exists());
    run::runs_a_command_and_exits_with_its_status_on(&busybox_host());
    run::cut_during_the_run_reattaches_and_output_is_complete_and_in_order_on(&busybox_host());
    run::kill_9_of_the_client_then_recover_completes_from_the_marker_on(&busybox_host());
}

fn installed_script(h: &Host) -> std::path::PathBuf {
    h.remote_dir.join("bin").join(format!(
        "cairn-sh-{}",
        cairn::testing::marker::script_sha256()
    ))
}

#[test]
fn a_host_without_sha256sum_gets_the_script_checked_by_cksum_and_the_helper_too() {
    let h = Host::new();
    h.sshd.hide_tools(&["sha256sum"]);
    let out = output(
        h.run_cmd(
            &["--id", "ns1", "--host-helper", "never"],
            &format!("{}command -v sha256sum || echo none", h.count()),
        ),
        LIMIT,
    );
    assert!(out.status.success(), "{out:?}");
    assert_eq!(out.stdout, b"none\n", "the host still has sha256sum");
    assert_eq!(
        std::fs::read(installed_script(&h)).unwrap(),
        cairn::testing::marker::session_script().as_bytes()
    );
    // the helper: uploaded and run there as well (its own hash check needs no tool)
    let out = output(
        h.run_cmd(&["--id", "ns2"], &format!("{}echo helper", h.count())),
        LIMIT,
    );
    assert!(out.status.success(), "{out:?}");
    assert_eq!(out.stdout, b"helper\n");
    let ev = h
        .journal()
        .events(&cairn::ExecutionId::parse("ns2").unwrap())
        .unwrap();
    let running = ev.iter().find(|e| e.kind == "running").unwrap();
    assert_eq!(running.evidence["host_side"], "helper");
    assert_eq!(h.runs(), 2);
    assert_eq!(h.state("ns1"), State::Delivered);
}

/// Debian's tinysshd: it allows one session channel per connection, and cairn needs several
/// on one (hello, install, dispatch): the first contact fails before any dispatch, naming
/// what the server lacks, and nothing ran.
#[test]
fn tinysshd_fails_before_any_dispatch_naming_the_channel_it_refuses() {
    let h = Host::on(TestSshd::start_server(Server::TinySsh, None));
    let out = output(
        h.run_cmd(&["--id", "ty1"], &format!("{}echo tiny", h.count())),
        LIMIT,
    );
    assert_eq!(out.status.code(), Some(255), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("never dispatched"), "{err}");
    assert!(err.contains("one channel per connection"), "{err}");
    assert_eq!(h.runs(), 0);
    assert_eq!(h.state("ty1"), State::Failed);
    let kinds = h.kinds("ty1");
    assert!(!kinds.contains(&"dispatched".to_owned()), "{kinds:?}");
    assert!(!h.x().join("ty1.start").exists());
    // it was tinysshd that answered
    assert!(h.sshd.log().contains("tinysshd"), "{}", h.sshd.log());
}

/// The forced command's check can fail: an exec request of 1,025 bytes (sent here directly,
/// not by cairn) is recorded and named, on OpenSSH and on Dropbear; 1,024 passes.
#[test]
fn the_exec_length_guard_names_a_command_string_past_one_kib() {
    for s in [TestSshd::start(), TestSshd::start_dropbear()] {
        let t = s.target();
        cairn::testing::rt::block_on(async {
            let c = cairn::ssh::Connection::connect(&t, &cairn::ssh::ConnectOptions::default())
                .await
                .expect("connect");
            for n in [1024, 1025] {
                // `:` and a comment: the shell runs nothing
                let cmd = format!(": #{}", "x".repeat(n - 3));
                let mut ex = c.exec(cmd.as_bytes()).await.expect("exec");
                while ex.next().await.expect("read").is_some() {}
            }
        });
        let lens = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| s.exec_lengths()));
        let why = lens.expect_err("a 1,025-byte exec request passed the guard");
        let why = why.downcast_ref::<String>().cloned().unwrap_or_default();
        assert!(why.contains("1025 bytes: : #xxx"), "{why}");
        assert!(!why.contains("\n1024 bytes"), "{why}");
        // (checked: the server's drop would fail this test again)
        std::fs::remove_file(s.dir().join("exec-too-long")).unwrap();
        assert_eq!(s.exec_lengths(), vec![1024, 1025]);
    }
}
