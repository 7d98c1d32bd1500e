//! Host epochs and cloned host keys against real SSH hosts in Docker (issue 16): a reboot after
//! the marker home was wiped reads `interrupted`, and hosts that share one host key keep their
//! own bookkeeping and their own executions. Like `docker.rs`: needs a Docker engine and root;
//! `CAIRN_DOCKER_TESTS=0` skips. Run: `cargo test --test it docker_epochs::`

use std::process::Output;
use std::thread::sleep;
use std::time::{Duration, Instant};

use cairn::journal::Journal;
use cairn::State;

use crate::support::docker::{
    docker_enabled, json, marker, output_within, say, spawn, wait_within, Client, Flavour, Hosts,
};

const BIN: &str = env!("CARGO_BIN_EXE_cairn");

/// One test's hosts and journal directory; prints its timing when it ends.
struct Case {
    name: &'static str,
    t0: Instant,
    hosts: Hosts,
    dir: tempfile::TempDir,
}

impl Case {
    fn start(name: &'static str, group: &str, n: usize, options: &[&str]) -> Option<Case> {
        if !docker_enabled(name) {
            return None;
        }
        let t0 = Instant::now();
        let hosts = Hosts::up_with(group, Flavour::Ash, n, options);
        Some(Case {
            name,
            t0,
            hosts,
            dir: tempfile::tempdir().expect("tempdir"),
        })
    }

    fn client(&self) -> Client {
        self.hosts
            .client(BIN.as_ref(), self.dir.path().join("journal.db"))
    }
}

impl Drop for Case {
    fn drop(&mut self) {
        let how = if std::thread::panicking() {
            "FAILED"
        } else {
            "ok"
        };
        say(&format!(
            "docker test {}: {how} in {:.1}s",
            self.name,
            self.t0.elapsed().as_secs_f64()
        ));
    }
}

fn run_to_end(c: std::process::Command, limit: Duration) -> Output {
    output_within(c, limit).unwrap_or_else(|e| panic!("{e}"))
}

fn unique_id(tag: &str) -> String {
    let n = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() % 1_000_000_000_000)
        .unwrap_or(0);
    format!("{tag}-{n}")
}

/// Every event in the journal as (execution ID, kind, evidence), oldest execution first.
fn events(journal: &std::path::Path) -> Vec<(String, String, serde_json::Value)> {
    let j = Journal::open(journal).expect("open journal");
    let mut v = Vec::new();
    for (rec, _) in j.list().expect("list").into_iter().rev() {
        for e in j.events(&rec.id).expect("events") {
            v.push((rec.id.to_string(), e.kind.to_string(), e.evidence));
        }
    }
    v
}

fn of_kind<'a>(
    evs: &'a [(String, String, serde_json::Value)],
    kind: &str,
) -> Vec<&'a (String, String, serde_json::Value)> {
    evs.iter().filter(|(_, k, _)| k == kind).collect()
}

/// The host's marker home is wiped after a first run; a later run is cut by a reboot mid-run.
/// It was dispatched and started in the new epoch, so the reboot reads `interrupted` (the
/// started record, the new boot identity), not `unknown`; the wipe is said once.
#[test]
fn a_wiped_host_rebooted_mid_run_reads_interrupted() {
    let Some(t) = Case::start(
        "docker_epochs::a_wiped_host_rebooted_mid_run_reads_interrupted",
        "wipereboot",
        1,
        &[],
    ) else {
        return;
    };
    let (h, c) = (&t.hosts, t.client());
    let first = run_to_end(c.run(&["--json"], "h1", "true"), Duration::from_secs(60));
    assert_eq!(json(&first)["state"], "completed", "{first:?}");
    assert!(h.exists("h1", "/root/.cairn/epoch"));
    h.fault(&["wipe-markers", "h1"]);
    assert!(!h.exists("h1", "/root/.cairn"));

    let id = unique_id("wr");
    let counter = format!("/root/count-{id}");
    let child = spawn(c.run(
        &["--json", "--id", &id],
        "h1",
        &format!(
            "echo ran >> {counter}; i=0; while [ $i -lt 40 ]; do echo \"line $i\"; i=$((i+1)); \
             sleep 0.1; done; exit 3"
        ),
    ));
    h.wait_file("h1", &marker(&id, ".start"), Duration::from_secs(20));
    sleep(Duration::from_millis(1000));
    h.fault(&["reboot", "h1"]);
    let out = wait_within(child, Duration::from_secs(90)).unwrap_or_else(|o| {
        panic!(
            "cairn did not finish: {}",
            String::from_utf8_lossy(&o.stderr)
        )
    });
    let v = json(&out);
    assert_eq!(v["state"], "interrupted", "{v}");
    let reason = v["reason"].as_str().unwrap_or_default();
    assert!(reason.contains("reboot"), "{reason}");
    assert!(!reason.contains("epoch changed"), "{reason}");
    assert_eq!(c.state(&id), Some(State::Interrupted));
    assert_eq!(h.count("h1", &counter), 1, "ran once");
    assert!(!h.exists("h1", &marker(&id, ".done")));

    let evs = events(&c.journal);
    let changed = of_kind(&evs, "host-epoch-changed");
    assert_eq!(changed.len(), 1, "the wipe is said once: {changed:?}");
    assert_eq!(changed[0].0, id, "by the dispatch that met the new epoch");
    assert_ne!(changed[0].2["old"], changed[0].2["new"]);
    let start = h.read("h1", &marker(&id, ".start")).unwrap();
    let start = String::from_utf8_lossy(&start);
    let new = changed[0].2["new"].as_str().unwrap();
    assert!(start.contains(&format!("epoch={new} ")), "{start}");
    // A recover without any connection flag settles nothing new and runs nothing.
    let home = tempfile::tempdir().unwrap();
    let rec = run_to_end(
        {
            let mut x = c.bare("recover", home.path());
            x.arg("--json");
            x
        },
        Duration::from_secs(60),
    );
    assert_eq!(String::from_utf8_lossy(&rec.stdout).trim(), "[]", "{rec:?}");
    assert_eq!(h.count("h1", &counter), 1);
}

/// Three hosts present one host key (a cloned image). The same command, scope and actor sent
/// to each makes three executions, each run once on its own host; their bookkeeping stays
/// apart (no false "wiped" event, one `host-key-shared` per pair), a reboot of one of them
/// reads `interrupted`, and a wipe of one is said for that one only.
// Long: one scenario, its phases in order.
#[test]
fn hosts_sharing_one_host_key_share_neither_bookkeeping_nor_executions() {
    let Some(t) = Case::start(
        "docker_epochs::hosts_sharing_one_host_key_share_neither_bookkeeping_nor_executions",
        "sharedkey",
        3,
        &["--shared-host-key"],
    ) else {
        return;
    };
    let (h, c) = (&t.hosts, t.client());
    let counter = "/root/count-shared";
    let cmd = format!("echo ran >> {counter}; sleep 4; echo done");
    let mut ids = Vec::new();
    for host in ["h1", "h2", "h3"] {
        let out = run_to_end(c.run(&["--detach"], host, &cmd), Duration::from_secs(60));
        assert_eq!(out.status.code(), Some(0), "{host}: {out:?}");
        ids.push(String::from_utf8_lossy(&out.stdout).trim().to_owned());
    }
    assert_ne!(ids[0], ids[1]);
    assert_ne!(ids[1], ids[2]);
    assert_ne!(ids[0], ids[2]);
    let j = Journal::open(&c.journal).unwrap();
    let intents: Vec<_> = ids
        .iter()
        .map(|id| {
            j.intent_of(&cairn::ExecutionId::parse(id).unwrap())
                .unwrap()
                .unwrap()
        })
        .collect();
    assert_eq!(intents[0].intent["host_key"], intents[1].intent["host_key"]);
    assert_eq!(intents[1].intent["host_key"], intents[2].intent["host_key"]);
    assert_ne!(intents[0].fingerprint, intents[1].fingerprint);

    // h2 reboots under its command; h1 and h3 finish.
    h.wait_file("h2", &marker(&ids[1], ".start"), Duration::from_secs(20));
    h.fault(&["reboot", "h2"]);
    for (host, id) in [("h1", &ids[0]), ("h3", &ids[2])] {
        h.wait_file(host, &marker(id, ".done"), Duration::from_secs(30));
    }
    let home = tempfile::tempdir().unwrap();
    let rec = run_to_end(
        {
            let mut x = c.bare("recover", home.path());
            x.arg("--json");
            x
        },
        Duration::from_secs(90),
    );
    let v: serde_json::Value =
        serde_json::from_slice(&rec.stdout).unwrap_or_else(|e| panic!("{e}: {rec:?}"));
    let state_of = |id: &str| {
        v.as_array()
            .unwrap()
            .iter()
            .find(|o| o["execution_id"] == id)
            .map(|o| (o["state"].clone(), o["reason"].clone()))
            .unwrap_or_else(|| panic!("{id} not recovered: {v}"))
    };
    assert_eq!(state_of(&ids[0]).0, "completed", "{v}");
    assert_eq!(state_of(&ids[2]).0, "completed", "{v}");
    let (st, reason) = state_of(&ids[1]);
    assert_eq!(st, "interrupted", "{v}");
    let reason = reason.as_str().unwrap();
    assert!(!reason.contains("epoch changed"), "{reason}");
    assert!(reason.contains("still has epoch"), "{reason}");
    for host in ["h1", "h2", "h3"] {
        assert_eq!(h.count(host, counter), 1, "ran once on {host}");
    }

    let evs = events(&c.journal);
    assert!(of_kind(&evs, "host-epoch-changed").is_empty(), "{evs:?}");
    let shared = of_kind(&evs, "host-key-shared");
    assert_eq!(shared.len(), 3, "one per pair: {shared:?}");
    let mut pairs: Vec<(String, String)> = shared
        .iter()
        .map(|(_, _, e)| {
            let (a, b) = (
                e["destination"].as_str().unwrap().to_owned(),
                e["other_destination"].as_str().unwrap().to_owned(),
            );
            if a < b {
                (a, b)
            } else {
                (b, a)
            }
        })
        .collect();
    pairs.sort();
    pairs.dedup();
    assert_eq!(pairs.len(), 3, "{pairs:?}");

    // A wipe of h3 is said for h3 only, and changes nothing for h1.
    h.fault(&["wipe-markers", "h3"]);
    for host in ["h1", "h3"] {
        let out = run_to_end(c.run(&["--json"], host, "true"), Duration::from_secs(60));
        assert_eq!(json(&out)["state"], "completed", "{host}: {out:?}");
    }
    let evs = events(&c.journal);
    let changed = of_kind(&evs, "host-epoch-changed");
    assert_eq!(changed.len(), 1, "{changed:?}");
    let h3 = Journal::open(&c.journal)
        .unwrap()
        .execution(&cairn::ExecutionId::parse(&ids[2]).unwrap())
        .unwrap()
        .unwrap();
    assert_eq!(
        changed[0].2["destination"],
        format!("{}@{}:{}", h3.user, h3.host, h3.port)
    );
}
