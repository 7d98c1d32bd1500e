//! A bastion in front of an internal network, in Docker: h1 is the bastion, h2…h21 are targets
//! this machine has no route to (`hosts.sh isolate`: a direct connect fails, proven first); the
//! bastion still reaches them on its bridge. Through `ProxyJump h1` and through `ProxyCommand
//! ssh -W %h:%p h1`: plain runs, a cut between the bastion and a target mid-run, the bastion's
//! sshd restarting mid-run, a target rebooting mid-run, each with ran-once counts, the final
//! state and the bytes; then a fleet run of the 20 targets over ONE connection to the bastion.
//!
//! One set of 21 hosts for the module (the image is built once per process), the phases in
//! order in one test so that a fault in one phase cannot disturb another.

use std::fs;
use std::process::{Command, Output};
use std::thread::sleep;
use std::time::{Duration, Instant};

use cairn::State;

use crate::support::docker::{
    docker_enabled, json, marker, output_within, say, spawn, wait_within, Flavour, Hosts,
};

const BIN: &str = env!("CARGO_BIN_EXE_cairn");
const TARGETS: usize = 20;

fn finish(child: std::process::Child, limit: Duration) -> Output {
    match wait_within(child, limit) {
        Ok(o) => o,
        Err(o) => panic!(
            "cairn did not finish within {limit:?}\nstdout: {}\nstderr: {}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        ),
    }
}

fn lines_cmd(counter: &str, n: usize, code: i32) -> String {
    format!(
        "echo ran >> {counter}; i=0; while [ $i -lt {n} ]; do echo \"line $i\"; i=$((i+1)); \
         sleep 0.1; done; exit {code}"
    )
}

fn numbered(n: usize) -> String {
    (0..n).map(|i| format!("line {i}\n")).collect()
}

fn unique(tag: &str) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    format!("{tag}-{}-{nanos}", std::process::id())
}

/// Established TCP connections from this machine to `ip:22`.
fn connections_to(ip: &str) -> usize {
    let o = Command::new("ss")
        .args(["-Htn", "state", "established", "dst", &format!("{ip}:22")])
        .output()
        .expect("ss (iproute2)");
    String::from_utf8_lossy(&o.stdout)
        .lines()
        .filter(|l| !l.trim().is_empty())
        .count()
}

// Long: one scenario, its phases in order.
#[test]
fn a_bastion_fronts_targets_the_client_cannot_route_to() {
    let name = "docker_jump::a_bastion_fronts_targets_the_client_cannot_route_to";
    if !docker_enabled(name) {
        return;
    }
    let t0 = Instant::now();
    let h = Hosts::up("jump-ash", Flavour::Ash, TARGETS + 1);
    let state = h.ssh_config().parent().unwrap().to_path_buf();
    let ips: Vec<(String, String)> = fs::read_to_string(state.join("hosts"))
        .unwrap()
        .lines()
        .map(|l| {
            let mut w = l.split_whitespace();
            (w.next().unwrap().to_owned(), w.next().unwrap().to_owned())
        })
        .collect();
    let ip = |alias: &str| ips.iter().find(|(a, _)| a == alias).unwrap().1.clone();
    let targets: Vec<String> = (2..=TARGETS + 1).map(|i| format!("h{i}")).collect();
    for t in &targets {
        h.fault(&["isolate", t]);
    }

    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("config");
    fs::write(
        &config,
        format!(
            "Host {}\n  ProxyJump h1\nHost pc-h3\n  HostName {}\n  \
             ProxyCommand ssh -F {} -W %h:%p h1\n{}",
            targets.join(" "),
            ip("h3"),
            h.ssh_config().display(),
            fs::read_to_string(h.ssh_config()).unwrap()
        ),
    )
    .unwrap();
    let mut c = h.client(BIN.as_ref(), dir.path().join("journal.db"));
    c.ssh_config = config.clone();
    let s = |v: &serde_json::Value| v.as_str().unwrap_or_default().to_owned();

    // 1. The client has no route to a target: a direct connect fails, nothing runs.
    let o = output_within(
        c.run(&["--json", "-J", "none"], "h2", "echo direct"),
        Duration::from_secs(60),
    )
    .unwrap();
    let v = json(&o);
    assert_eq!(o.status.code(), Some(255), "{v}");
    assert_eq!(v["state"], "failed", "{v}");
    assert!(s(&v["reason"]).contains("could not connect"), "{v}");

    // 2. Through ProxyJump, and through ProxyCommand `ssh -W %h:%p h1`.
    let o = output_within(
        c.run(&["--json"], "h2", "cat /etc/hostname"),
        Duration::from_secs(60),
    )
    .unwrap();
    let v = json(&o);
    assert_eq!(o.status.code(), Some(0), "{v}");
    assert_eq!(s(&v["stdout"]).trim(), "h2", "{v}");
    let o = output_within(
        c.run(&["--json"], "pc-h3", "cat /etc/hostname"),
        Duration::from_secs(60),
    )
    .unwrap();
    let v = json(&o);
    assert_eq!(o.status.code(), Some(0), "{v}");
    assert_eq!(s(&v["stdout"]).trim(), "h3", "{v}");

    // 3. The link between the bastion and the target goes down mid-run, then comes back.
    let id = unique("cut");
    let counter = format!("/root/count-{id}");
    let child = spawn(c.run(&["--json", "--id", &id], "h4", &lines_cmd(&counter, 50, 7)));
    h.wait_file("h4", &marker(&id, ".start"), Duration::from_secs(20));
    sleep(Duration::from_millis(800));
    h.fault(&["cut", "h4"]);
    sleep(Duration::from_secs(4));
    h.fault(&["restore", "h4"]);
    let o = finish(child, Duration::from_secs(90));
    let v = json(&o);
    assert_eq!(o.status.code(), Some(7), "{v}");
    assert_eq!(v["state"], "completed", "{v}");
    assert_eq!(s(&v["stdout"]), numbered(50));
    assert!(v["reconnects"].as_u64().unwrap_or(0) >= 1, "{v}");
    assert_eq!(h.count("h4", &counter), 1, "ran once");
    assert_eq!(c.state(&id), Some(State::Delivered));

    // 4. The bastion's sshd restarts mid-run (open sessions survive, new ones wait).
    let id = unique("sshd");
    let counter = format!("/root/count-{id}");
    let child = spawn(c.run(&["--json", "--id", &id], "h5", &lines_cmd(&counter, 30, 9)));
    h.wait_file("h5", &marker(&id, ".start"), Duration::from_secs(20));
    sleep(Duration::from_millis(800));
    h.fault(&["restart-sshd", "h1"]);
    let o = finish(child, Duration::from_secs(90));
    let v = json(&o);
    assert_eq!(o.status.code(), Some(9), "{v}");
    assert_eq!(v["state"], "completed", "{v}");
    assert_eq!(s(&v["stdout"]), numbered(30));
    assert_eq!(h.count("h5", &counter), 1, "ran once");
    assert_eq!(c.state(&id), Some(State::Delivered));

    // 5. The target reboots behind the bastion mid-run: interrupted, never run again. (hosts.sh
    // waits for the rebooted sshd from this machine: the route is back for that wait only.)
    let id = unique("reboot");
    let counter = format!("/root/count-{id}");
    let child = spawn(c.run(&["--json", "--id", &id], "h6", &lines_cmd(&counter, 60, 3)));
    h.wait_file("h6", &marker(&id, ".start"), Duration::from_secs(20));
    sleep(Duration::from_millis(800));
    h.fault(&["unisolate", "h6"]);
    h.fault(&["reboot", "h6"]);
    h.fault(&["isolate", "h6"]);
    let o = finish(child, Duration::from_secs(90));
    let v = json(&o);
    assert_eq!(o.status.code(), Some(254), "{v}");
    assert_eq!(v["state"], "interrupted", "{v}");
    assert!(numbered(60).starts_with(&s(&v["stdout"])), "{v}");
    assert_eq!(h.count("h6", &counter), 1, "ran once, never again");
    assert_eq!(c.state(&id), Some(State::Interrupted));

    // 6. A fleet run of the 20 targets: one connection to the bastion, 20 channels.
    let bastion_ip = ip("h1");
    let baseline = connections_to(&bastion_ip);
    let mut fleet = c.cmd("run");
    fleet
        .args(["--json", "--hosts", &targets.join(","), "--"])
        .arg("sleep 3; cat /etc/hostname");
    let child = spawn(fleet);
    let mut most = 0;
    let t1 = Instant::now();
    while t1.elapsed() < Duration::from_secs(5) {
        most = most.max(connections_to(&bastion_ip).saturating_sub(baseline));
        sleep(Duration::from_millis(100));
    }
    let o = finish(child, Duration::from_secs(120));
    assert_eq!(
        o.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let text = String::from_utf8_lossy(&o.stdout);
    let done: Vec<serde_json::Value> = text
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|v| v["host"].is_string())
        .collect();
    assert_eq!(done.len(), TARGETS, "{text}");
    for v in &done {
        assert_eq!(v["state"], "completed", "{v}");
        assert_eq!(s(&v["stdout"]).trim(), s(&v["host"]), "{v}");
    }
    assert_eq!(
        most, 1,
        "the 20 targets shared one connection to the bastion"
    );
    say(&format!(
        "{name}: {:.1}s (fleet of {TARGETS} through one bastion connection)",
        t0.elapsed().as_secs_f64()
    ));
}
