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
