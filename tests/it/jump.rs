//! ProxyJump and ProxyCommand against real sshds on loopback: a bastion sshd (behind a
//! counting, cuttable proxy: `front`) and a target sshd (behind another: `inner`, the link
//! between the bastion and the target). Each host accepts only its own key and is known only
//! in its own known_hosts file, so a run that succeeds used each hop's own settings. Fault
//! tests count how many times the command ran on the target, check the journal's final state
//! and the bytes returned.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

use cairn::journal::Journal;
use cairn::{ExecutionId, State};
use serde_json::Value;

use crate::support::host::{json_of, output, spawn, wait_child, wait_for, BIN};
use crate::support::{Proxy, TestSshd};

struct Lab {
    bastion: TestSshd,
    /// client → bastion
    front: Proxy,
    target: TestSshd,
    /// bastion → target
    inner: Proxy,
    dir: tempfile::TempDir,
}

fn host_line(port: u16, s: &TestSshd) -> String {
    format!(
        "[127.0.0.1]:{port} {}\n",
        crate::support::sshd::pub_key_text(&s.host_key_pub())
    )
}

impl Lab {
    fn new() -> Lab {
        Lab::with_bastion(TestSshd::start())
    }

    /// The lab with `bastion` as its jump host (OpenSSH, or Dropbear: `servers.rs`).
    fn with_bastion(bastion: TestSshd) -> Lab {
        let target = TestSshd::start();
        let front = Proxy::start(bastion.port());
        let inner = Proxy::start(target.port());
        let dir = tempfile::tempdir().unwrap();
        let lab = Lab {
            bastion,
            front,
            target,
            inner,
            dir,
        };
        let d = lab.dir.path();
        fs::write(
            d.join("kh_bastion"),
            host_line(lab.front.port(), &lab.bastion),
        )
        .unwrap();
        fs::write(
            d.join("kh_target"),
            host_line(lab.inner.port(), &lab.target),
        )
        .unwrap();
        // Reads until the far end closes, then exits: a proxy command that ends with its link.
        fs::write(
            d.join("tcp-proxy"),
            "#!/bin/bash\nexec 3<>\"/dev/tcp/$1/$2\" || exit 1\ncat <&3 &\nreader=$!\n\
             cat <&0 >&3 &\nwait $reader\n",
        )
        .unwrap();
        Command::new("chmod")
            .arg("+x")
            .arg(d.join("tcp-proxy"))
            .status()
            .unwrap();
        lab.write_config(&d.join("kh_bastion"));
        lab
    }

    fn config(&self) -> PathBuf {
        self.dir.path().join("config")
    }

    /// The ssh_config: `bastion`, and `target` behind it in several ways.
    fn write_config(&self, bastion_known_hosts: &Path) {
        let d = self.dir.path();
        let target_block = |name: &str, route: &str| {
            format!(
                "Host {name}\n  HostName 127.0.0.1\n  Port {port}\n  User {user}\n  \
                 IdentityFile {key}\n  UserKnownHostsFile {kh}\n  {route}\n",
                port = self.inner.port(),
                user = self.target.user(),
                key = self.target.client_key().display(),
                kh = d.join("kh_target").display(),
            )
        };
        let mut cfg = format!(
            "Host bastion\n  HostName 127.0.0.1\n  Port {port}\n  User {user}\n  \
             IdentityFile {key}\n  UserKnownHostsFile {kh}\n",
            port = self.front.port(),
            user = self.bastion.user(),
            key = self.bastion.client_key().display(),
            kh = bastion_known_hosts.display(),
        );
        cfg.push_str(&target_block("target", "ProxyJump bastion"));
        cfg.push_str(&target_block(
            "target-ssh-w",
            &format!(
                "ProxyCommand ssh -F {} -o BatchMode=yes -W %h:%p bastion",
                self.config().display()
            ),
        ));
        cfg.push_str(&target_block(
            "target-script",
            &format!("ProxyCommand {} %h %p", d.join("tcp-proxy").display()),
        ));
        cfg.push_str(&target_block("target-dies", "ProxyCommand sh -c 'exit 3'"));
        cfg.push_str(&target_block("target-direct", "ProxyJump none"));
        // `-J user@127.0.0.1:port` names the bastion by address: its key by that name.
        cfg.push_str(&format!(
            "Host 127.0.0.1\n  IdentityFile {key}\n  UserKnownHostsFile {kh}\n\
             Host *\n  IdentityAgent none\n",
            key = self.bastion.client_key().display(),
            kh = bastion_known_hosts.display(),
        ));
        fs::write(self.config(), cfg).unwrap();
    }

    fn journal_path(&self) -> PathBuf {
        self.dir.path().join("journal.db")
    }

    fn counter(&self) -> PathBuf {
        self.dir.path().join("ran.count")
    }

    fn runs(&self) -> usize {
        fs::read_to_string(self.counter())
            .map(|s| s.lines().count())
            .unwrap_or(0)
    }

    fn cairn(&self, sub: &str) -> Command {
        let mut c = Command::new(BIN);
        c.arg(sub)
            .env_remove("SSH_AUTH_SOCK")
            .env_remove("CAIRN_JOURNAL")
            .env_remove("CAIRN_INTENT_KEY")
            .env("SHELL", "/bin/sh")
            .arg("--journal")
            .arg(self.journal_path());
        c
    }

    /// `cairn run -F config [extra] DEST -- COMMAND` (the command counts its run first).
    fn run(&self, extra: &[&str], dest: &str, command: &str) -> Command {
        let mut c = self.cairn("run");
        c.arg("-F")
            .arg(self.config())
            .args([
                "--connect-timeout",
                "5s",
                "--keepalive",
                "1s",
                "--reconnect-for",
                "60s",
            ])
            .arg("--remote-dir")
            .arg(self.dir.path().join("home"))
            .args(extra)
            .arg(dest)
            .arg("--")
            .arg(format!(
                "echo ran >> '{}'; {command}",
                self.counter().display()
            ));
        c
    }

    fn journal(&self) -> Journal {
        Journal::open(&self.journal_path()).unwrap()
    }

    fn state(&self, id: &str) -> State {
        self.journal()
            .status(&ExecutionId::parse(id).unwrap())
            .unwrap()
            .unwrap()
            .state
    }

    /// The `connection` object recorded in the `accepted` event of `id`.
    fn recorded_connection(&self, id: &str) -> Value {
        let events = self
            .journal()
            .events(&ExecutionId::parse(id).unwrap())
            .unwrap();
        let accepted = events.iter().find(|e| e.kind == "accepted").unwrap();
        accepted.evidence["connection"].clone()
    }

    fn wait_started(&self) -> String {
        let x = self.dir.path().join("home").join("x");
        wait_for("a started record", Duration::from_secs(20), || {
            fs::read_dir(&x)
                .ok()?
                .filter_map(|e| e.ok())
                .filter_map(|e| e.file_name().into_string().ok())
                .find_map(|n| n.strip_suffix(".start").map(str::to_owned))
        })
    }

    fn wait_out_lines(&self, id: &str, n: usize) {
        let p = self.dir.path().join("home").join("x").join(id).join("out");
        wait_for(
            &format!("{n} lines of output on the host"),
            Duration::from_secs(30),
            || (fs::read_to_string(&p).unwrap_or_default().lines().count() >= n).then_some(()),
        );
    }
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

const LIMIT: Duration = Duration::from_secs(60);

fn lines(n: usize) -> String {
    (0..n).map(|i| format!("out {i}\n")).collect()
}

fn slow(n: usize) -> String {
    format!("i=0; while [ $i -lt {n} ]; do echo \"out $i\"; i=$((i+1)); sleep 0.1; done; exit 5")
}

#[test]
fn proxy_jump_reaches_the_target_through_the_bastion_and_status_goes_the_same_way() {
    proxy_jump_reaches_the_target_through_the_bastion_and_status_goes_the_same_way_on(&Lab::new());
}

#[test]
fn dropbear_as_the_bastion_reaches_the_target_and_status_goes_the_same_way() {
    proxy_jump_reaches_the_target_through_the_bastion_and_status_goes_the_same_way_on(
        &Lab::with_bastion(TestSshd::start_dropbear()),
    );
}

fn proxy_jump_reaches_the_target_through_the_bastion_and_status_goes_the_same_way_on(lab: &Lab) {
    let o = output(lab.run(&["--json"], "target", "echo through"), LIMIT);
    let v = json_of(&o);
    assert_eq!(o.status.code(), Some(0), "{v} {}", stderr(&o));
    assert_eq!(v["stdout"], "through\n");
    assert_eq!(lab.runs(), 1);
    assert_eq!(lab.front.connections(), 1, "one connection to the bastion");
    assert_eq!(
        lab.inner.connections(),
        1,
        "the target was reached from the bastion"
    );
    let id = v["execution_id"].as_str().unwrap().to_owned();
    let c = lab.recorded_connection(&id);
    assert_eq!(c["jump"][0]["name"], "bastion");
    assert_eq!(c["jump"][0]["port"], lab.front.port());
    assert_eq!(c["jump"][0]["user"], lab.bastion.user());
    assert!(c["jump"][0]["known_hosts"]
        .as_str()
        .unwrap()
        .ends_with("kh_bastion"));
    assert_eq!(c["port"], lab.inner.port());

    // `cairn status` with the journal alone reaches the host the same way: through the bastion.
    let mut status = lab.cairn("status");
    status.args([&id, "--json"]);
    let o = output(status, LIMIT);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(
        lab.front.connections(),
        2,
        "status went through the bastion"
    );
    assert_eq!(lab.inner.connections(), 2);

    // `cairn config` prints the route in ssh -G's words.
    let o = output(
        {
            let mut c = Command::new(BIN);
            c.arg("config").arg("-F").arg(lab.config()).arg("target");
            c
        },
        LIMIT,
    );
    assert!(String::from_utf8_lossy(&o.stdout).contains("\nproxyjump bastion\n"));
}

#[test]
fn minus_j_takes_user_host_port_several_hops_and_none() {
    let lab = Lab::new();
    // `-J user@host:port` on a destination whose config names no jump host.
    let hop = format!("{}@127.0.0.1:{}", lab.bastion.user(), lab.front.port());
    let o = output(lab.run(&["-J", &hop], "target-direct", "echo one"), LIMIT);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(o.stdout, b"one\n");
    assert_eq!((lab.front.connections(), lab.inner.connections()), (1, 1));

    // Two hops: the bastion, then the bastion again through itself, then the target.
    let o = output(
        lab.run(&["-J", "bastion,bastion"], "target-direct", "echo two"),
        LIMIT,
    );
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(o.stdout, b"two\n");
    assert_eq!((lab.front.connections(), lab.inner.connections()), (3, 2));

    // `-J none` wins over the config's ProxyJump: straight to the target.
    let o = output(lab.run(&["-J", "none"], "target", "echo three"), LIMIT);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(o.stdout, b"three\n");
    assert_eq!((lab.front.connections(), lab.inner.connections()), (3, 3));

    // A bad -J is refused before anything is contacted.
    let o = output(lab.run(&["-J", "a,,b"], "target", "echo no"), LIMIT);
    assert_eq!(o.status.code(), Some(255));
    assert!(
        stderr(&o).contains("invalid -J argument \"a,,b\""),
        "{}",
        stderr(&o)
    );
    assert_eq!(lab.runs(), 3);
    assert_eq!(lab.front.connections(), 3);
}

#[test]
fn a_jump_host_with_an_unknown_or_changed_key_is_refused_as_the_target_would_be() {
    let lab = Lab::new();
    let d = lab.dir.path();
    let other = TestSshd::start(); // a host key that is not the bastion's
    for (file, content, needle) in [
        ("kh_empty", String::new(), "is not known"),
        (
            "kh_wrong",
            host_line(lab.front.port(), &other),
            "REMOTE HOST IDENTIFICATION HAS CHANGED for bastion (127.0.0.1:",
        ),
    ] {
        fs::write(d.join(file), content).unwrap();
        lab.write_config(&d.join(file));
        let through = output(lab.run(&[], "target", "echo never"), LIMIT);
        assert_eq!(through.status.code(), Some(255), "{}", stderr(&through));
        let direct = output(lab.run(&[], "bastion", "echo never"), LIMIT);
        assert_eq!(direct.status.code(), Some(255));
        let msg = |o: &Output| {
            stderr(o)
                .lines()
                .find(|l| l.contains(needle))
                .map(|l| l[l.find("the host key").or(l.find("WARNING")).unwrap()..].to_owned())
                .unwrap_or_else(|| panic!("{needle:?} not in: {}", stderr(o)))
        };
        assert_eq!(
            msg(&through),
            msg(&direct),
            "the same message as for the host itself"
        );
        assert_eq!(lab.inner.connections(), 0, "nothing went past the bastion");
    }
    assert_eq!(lab.runs(), 0);
}

#[test]
fn proxy_command_ssh_w_a_script_and_one_that_exits() {
    let lab = Lab::new();
    let o = output(lab.run(&[], "target-ssh-w", "echo via-ssh-w"), LIMIT);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(o.stdout, b"via-ssh-w\n");
    assert_eq!((lab.front.connections(), lab.inner.connections()), (1, 1));

    let o = output(lab.run(&[], "target-script", "echo via-script"), LIMIT);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(o.stdout, b"via-script\n");
    assert_eq!((lab.front.connections(), lab.inner.connections()), (1, 2));

    let o = output(lab.run(&["--json"], "target-dies", "echo never"), LIMIT);
    assert_eq!(o.status.code(), Some(255));
    let v = json_of(&o);
    assert_eq!(v["state"], "failed");
    assert!(
        v["reason"].as_str().unwrap().contains("ProxyCommand"),
        "{v}"
    );
    assert_eq!(lab.runs(), 2);
}

#[test]
fn a_cut_on_the_inner_hop_then_on_the_bastion_reattaches_and_the_command_ran_once() {
    a_cut_on_the_inner_hop_then_on_the_bastion_reattaches_and_the_command_ran_once_on(&Lab::new());
}

#[test]
fn dropbear_as_the_bastion_a_cut_on_either_hop_reattaches_and_the_command_ran_once() {
    a_cut_on_the_inner_hop_then_on_the_bastion_reattaches_and_the_command_ran_once_on(
        &Lab::with_bastion(TestSshd::start_dropbear()),
    );
}

fn a_cut_on_the_inner_hop_then_on_the_bastion_reattaches_and_the_command_ran_once_on(lab: &Lab) {
    let child = spawn(lab.run(&["--json"], "target", &slow(100)));
    let id = lab.wait_started();
    lab.wait_out_lines(&id, 8);
    // The link between the bastion and the target goes down for a while.
    lab.inner.set_refuse(true);
    lab.inner.cut();
    std::thread::sleep(Duration::from_millis(700));
    lab.inner.set_refuse(false);
    // cairn is back on the target through the bastion before the next cut.
    wait_for(
        "the reconnect through the bastion",
        Duration::from_secs(30),
        || {
            let events = lab.journal().events(&ExecutionId::parse(&id).ok()?).ok()?;
            events.iter().any(|e| e.kind == "reconnected").then_some(())
        },
    );
    assert_eq!(
        lab.front.connections(),
        1,
        "the bastion connection survived the inner cut"
    );
    // Then the connection to the bastion itself.
    lab.front.cut();
    let o = wait_child(child, LIMIT);
    let v = json_of(&o);
    assert_eq!(o.status.code(), Some(5), "{v} {}", stderr(&o));
    assert_eq!(v["state"], "completed");
    assert_eq!(v["stdout"], lines(100));
    assert!(v["reconnects"].as_u64().unwrap() >= 2, "{v}");
    assert_eq!(lab.runs(), 1, "the command ran exactly once");
    assert_eq!(lab.state(&id), State::Delivered);
    assert!(lab.front.connections() >= 2, "the chain was rebuilt");
}

/// A jump host that forwards nothing (tinysshd has no `direct-tcpip`): the run fails before
/// any dispatch, naming it, and the target never saw a connection.
#[test]
fn a_jump_host_without_port_forwarding_fails_before_any_dispatch_naming_it() {
    let lab = Lab::with_bastion(TestSshd::start_server(
        crate::support::sshd::Server::TinySsh,
        None,
    ));
    let o = output(lab.run(&[], "target", "echo through"), LIMIT);
    assert_eq!(o.status.code(), Some(255), "{o:?}");
    assert!(stderr(&o).contains("refuses to forward"), "{}", stderr(&o));
    assert_eq!(lab.runs(), 0);
    assert_eq!(lab.inner.connections(), 0, "the target was reached");
    assert!(lab.front.connections() >= 1);
}

#[test]
fn a_proxy_command_that_exits_mid_run_is_a_lost_connection() {
    let lab = Lab::new();
    let child = spawn(lab.run(&["--json"], "target-script", &slow(30)));
    let id = lab.wait_started();
    lab.wait_out_lines(&id, 5);
    // The script's TCP link ends: the script exits, and cairn reconnects with a new one.
    lab.inner.cut();
    let o = wait_child(child, LIMIT);
    let v = json_of(&o);
    assert_eq!(o.status.code(), Some(5), "{v} {}", stderr(&o));
    assert_eq!(v["state"], "completed");
    assert_eq!(v["stdout"], lines(30));
    assert!(v["reconnects"].as_u64().unwrap() >= 1, "{v}");
    assert_eq!(lab.runs(), 1, "the command ran exactly once");
    assert_eq!(lab.state(&id), State::Delivered);
    assert!(lab.inner.connections() >= 2);
}
