//! The replica campaign: seeded random trials against three `cairn mcp --listen` replicas that
//! share one PostgreSQL journal (a private server of its own, since trials restart it) and one
//! real sshd host behind a cuttable proxy.
//!
//! Each trial sends one call to one replica (or the same call, the same intent, to two at
//! once), lands a fault from [`FAULTS`] at a random point (before the command starts, while it
//! runs, after it finished), and retries the same intent on another replica as an agent would,
//! until it gets a settled answer. Then it waits for the journal to settle every execution of
//! the trial and judges it strictly:
//!
//! - ran twice: the trial's counter file on the host says more than one run;
//! - lost: an answer that says `completed` with other bytes or another exit status than the
//!   command's, or a finished command whose outcome is neither answered nor recorded;
//! - wrong state: a journal state or an answer outside what the fault allows where it landed
//!   ([`allowed`]), a `failed` (proven never run) that ran, or two executions of one intent;
//! - takeovers above `MAX_TAKEOVERS` per execution, or counted differently by the owner row and
//!   the `takeover` events;
//! - a fenced late write recorded: an event appended by a replica after another took its
//!   execution over (and before anything handed it back);
//! - unanswered: a replica that was up left a call without a byte of its answer for the
//!   agent's whole patience. A live owner whose own call failed (a journal error while the
//!   database restarted) picks its execution up within a lease or so (docs/REPLICAS.md), so a
//!   caller attached to it on another replica is answered.
//!
//! Every anomaly is printed with its trial, seed and evidence, and fails the test. One known
//! limit of the design (docs/REPLICAS.md) is counted and printed with its evidence instead: a
//! call held inside a replica past the delivery of its twin or retry, accepted afterwards as a
//! new execution (`after_delivery`: allowed only under a fault, and only when the earlier
//! execution's delivery precedes the later one's acceptance in the journal).
//!
//! Knobs: `REPLICA_CAMPAIGN_TRIALS` (default 15), `REPLICA_CAMPAIGN_SEED` (default: from the
//! clock, printed; the same seed replays the same plans).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::thread::{sleep, JoinHandle};
use std::time::{Duration, Instant, SystemTime};

use serde_json::Value;

use super::{execute_within, signal};
use crate::http::{token, Server};
use crate::support::docker::{say, splitmix64, Rng};
use crate::support::host::*;
use crate::support::postgres::{self, PgServer};

const REPLICAS: usize = 3;
/// Every replica's `--lease-for` (short, so that takeovers come within a trial).
const LEASE: &str = "2s";
/// Calls an agent makes for one intent, the first included.
const ATTEMPTS: usize = 5;
/// Bound of the wait for every execution of a trial to settle.
const SETTLE_LIMIT: Duration = Duration::from_secs(60);
/// At most this many takeovers per execution (`MAX_TAKEOVERS` in the journal).
const MAX_TAKEOVERS: i64 = 3;
/// How long a call may go without a byte of its answer before the agent gives up on it: well
/// past the longest legitimate wait here (a lease, a database restart, a 5 s link cut, a 3 s
/// command).
const PATIENCE: Duration = Duration::from_secs(30);
/// A fenced replica's warning, in its log.
const FENCED: &str = "was taken over by replica";

// ------------------------------------------------------------------------------ plans

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Fault {
    None,
    /// `kill -9` of the replica that got the call, started again after the retry
    Kill9,
    /// SIGSTOP of the replica that got the call for longer than its lease, then SIGCONT
    Pause,
    /// PostgreSQL crashed (immediate shutdown) and started again
    PgRestart,
    /// the link to the host cut and refused for a while (every replica's connections)
    LinkCut,
    /// `cairn cancel` of the execution, from a process of its own on the shared journal
    Cancel,
    /// MCP `tasks/cancel` of the execution (its task), sent to a replica the plan picks
    TasksCancel,
}

const FAULTS: [Fault; 7] = [
    Fault::None,
    Fault::Kill9,
    Fault::Pause,
    Fault::PgRestart,
    Fault::LinkCut,
    Fault::Cancel,
    Fault::TasksCancel,
];

/// Where a fault landed for one execution, from the host's own records: the modification time
/// of its started and finish records against the moment the fault began.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Landing {
    BeforeStart,
    MidRun,
    AfterFinish,
}

/// Where the plan aims the fault.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Aim {
    /// soon after the call was sent, before the command can have started
    Early,
    /// a fraction of the command's duration after its started record appeared
    Mid,
    /// once its finish record exists
    Late,
}

/// What one trial does; derived from (seed, trial number) alone.
#[derive(Clone, Debug)]
struct Plan {
    fault: Fault,
    aim: Aim,
    /// for `Aim::Early`: how long after the call; for `Aim::Mid`: the fraction of the duration
    early: Duration,
    mid_frac: f64,
    /// the same call to a second replica at the same moment
    twin: bool,
    /// the replica the call goes to first, and the one the agent retries on first
    to: usize,
    retry: usize,
    lines: usize,
    delay_ms: u64,
    code: u64,
    /// `Pause`: how long the replica stays stopped; `LinkCut`: how long the link stays down
    len: Duration,
}

impl Plan {
    fn new(seed: u64, trial: usize) -> Plan {
        let mut r = Rng::new(seed ^ splitmix64(trial as u64 + 1));
        let fault = stratified_fault(seed, trial);
        let dur = r.range(900, 3000);
        let lines = r.range(2, 12) as usize;
        let code = if r.range(0, 2) == 0 {
            0
        } else {
            r.range(1, 120)
        };
        let aim = match r.range(0, 99) {
            0..=19 => Aim::Early,
            80..=99 => Aim::Late,
            _ => Aim::Mid,
        };
        let len = match fault {
            Fault::Pause => r.millis(2600, 5000),
            Fault::LinkCut => r.millis(300, 5000),
            _ => Duration::ZERO,
        };
        let to = r.range(0, REPLICAS as u64 - 1) as usize;
        let retry = (to + r.range(1, REPLICAS as u64 - 1) as usize) % REPLICAS;
        Plan {
            fault,
            aim,
            early: r.millis(0, 250),
            mid_frac: r.range(0, 80) as f64 / 100.0,
            twin: r.range(0, 99) < 25,
            to,
            retry,
            lines,
            delay_ms: dur / lines as u64,
            code,
            len,
        }
    }

    fn duration(&self) -> Duration {
        Duration::from_millis(self.delay_ms * self.lines as u64)
    }

    /// The trial's command: it counts its run in `counter`, prints numbered lines over its
    /// duration, and exits with the plan's status.
    fn command(&self, counter: &Path) -> String {
        format!(
            "echo ran >> '{}'; i=0; while [ $i -lt {} ]; do i=$((i+1)); echo line$i; \
             sleep {}.{:03}; done; exit {}",
            counter.display(),
            self.lines,
            self.delay_ms / 1000,
            self.delay_ms % 1000,
            self.code
        )
    }

    fn stdout(&self) -> String {
        (1..=self.lines).map(|i| format!("line{i}\n")).collect()
    }
}

/// Every fault equally often: each round of `FAULTS.len()` trials is a shuffle of them.
fn stratified_fault(seed: u64, trial: usize) -> Fault {
    let n = FAULTS.len();
    let mut order: Vec<usize> = (0..n).collect();
    let mut r = Rng::new(seed ^ splitmix64(0x4e91 + (trial / n) as u64));
    for k in (1..n).rev() {
        order.swap(k, r.range(0, k as u64) as usize);
    }
    FAULTS[order[trial % n]]
}

// ------------------------------------------------------------------------------ the table

/// The states (of the journal, and of any answer) each fault allows where it landed. None of
/// these faults reaches the host's processes, so a command that started always finishes and
/// its outcome must be collected; one that had not started may be `failed` (proven never
/// run) when the fault met its dispatch.
fn allowed(f: Fault, landing: Landing) -> &'static [&'static str] {
    match (f, landing) {
        (Fault::None, _) => &["completed"],
        // A cancel stops it wherever it lands, unless the command finished first; before the
        // start, nothing may run (judged apart: no start record after `cancelled`).
        (Fault::Cancel | Fault::TasksCancel, Landing::BeforeStart) => {
            &["cancelled", "completed", "failed"]
        }
        (Fault::Cancel | Fault::TasksCancel, _) => &["cancelled", "completed"],
        (_, Landing::BeforeStart) => &["completed", "failed"],
        _ => &["completed"],
    }
}

fn settled(state: &str) -> bool {
    matches!(
        state,
        "completed" | "delivered" | "failed" | "interrupted" | "unknown" | "cancelled" | "rejected"
    )
}

/// `delivered` is `completed` whose answer was written out.
fn as_table_state(state: &str) -> &str {
    if state == "delivered" {
        "completed"
    } else {
        state
    }
}

// ------------------------------------------------------------------------------ the setup

struct Campaign {
    h: Host,
    /// the campaign's own PostgreSQL server (kept alive for as long as the replicas)
    pg: PgServer,
    key: PathBuf,
    auth: String,
    replicas: Vec<Server>,
    /// the logs of replicas killed so far
    dead_logs: Vec<String>,
    seed: u64,
    next_id: u64,
}

fn start_replica(h: &Host, key: &Path) -> Server {
    Server::start(
        h,
        0,
        &["--intent-key", key.to_str().unwrap(), "--lease-for", LEASE],
    )
}

/// One answer an agent got: the replica asked, and the parsed answer (`None`: the connection
/// ended without one).
#[derive(Clone, Debug)]
struct Answer {
    replica: usize,
    body: Option<Value>,
    took: Duration,
}

impl Answer {
    fn state(&self) -> Option<&str> {
        self.body.as_ref()?["result"]["state"].as_str()
    }
    fn is_settled(&self) -> bool {
        self.state().is_some_and(settled)
    }
    /// `replica:state` (or `none`, or the error's code) and how long the call took.
    fn brief(&self) -> String {
        let what = match (&self.body, self.state()) {
            (None, _) => "none".to_owned(),
            (Some(_), Some(st)) => st.to_owned(),
            (Some(b), None) => format!("error {}", b["error"]["code"]),
        };
        format!("{}:{what} {:.1}s", self.replica, self.took.as_secs_f64())
    }
    fn execution(&self) -> Option<&str> {
        self.body.as_ref()?["result"]["execution_id"].as_str()
    }
}

impl Campaign {
    fn start(seed: u64) -> Option<Campaign> {
        let pg = postgres::own_server("replicas::randomized_replica_campaign")?;
        let mut h = Host::new();
        h.journal = PathBuf::from(pg.database("replica_campaign"));
        let key = h.sshd.dir().join("intent.key");
        let auth = format!("Bearer {}", token(&h, "agent:campaign", &[]));
        let replicas = (0..REPLICAS).map(|_| start_replica(&h, &key)).collect();
        Some(Campaign {
            h,
            pg,
            key,
            auth,
            replicas,
            dead_logs: Vec::new(),
            seed,
            next_id: 0,
        })
    }

    /// Send `cmd` to replica `i` from a thread of its own.
    fn call(&mut self, i: usize, cmd: &str) -> JoinHandle<Answer> {
        self.next_id += 1;
        let (port, auth, cmd, id) = (
            self.replicas[i].port,
            self.auth.clone(),
            cmd.to_owned(),
            self.next_id,
        );
        std::thread::spawn(move || {
            let t0 = Instant::now();
            let body = execute_within(port, &auth, id, &cmd, PATIENCE);
            Answer {
                replica: i,
                body,
                took: t0.elapsed(),
            }
        })
    }

    fn ids(&self) -> BTreeSet<String> {
        self.h
            .journal()
            .list()
            .expect("list the shared journal")
            .into_iter()
            .map(|(r, _)| r.id.as_str().to_owned())
            .collect()
    }

    /// The marker files in the host's marker home now.
    fn markers(&self) -> BTreeSet<String> {
        std::fs::read_dir(self.h.x())
            .into_iter()
            .flatten()
            .filter_map(|e| e.ok()?.file_name().into_string().ok())
            .collect()
    }

    /// Wait (bounded) for a marker file ending in `suffix` that was not there `before`.
    fn wait_marker(&self, before: &BTreeSet<String>, suffix: &str, limit: Duration) -> bool {
        let t0 = Instant::now();
        while t0.elapsed() < limit {
            if self
                .markers()
                .iter()
                .any(|m| m.ends_with(suffix) && !before.contains(m))
            {
                return true;
            }
            sleep(Duration::from_millis(20));
        }
        false
    }

    fn fence_lines(&self) -> usize {
        let live = self.replicas.iter().map(|r| r.log());
        live.chain(self.dead_logs.iter().cloned())
            .map(|l| l.matches(FENCED).count())
            .sum()
    }

    fn logs(&self) -> String {
        self.replicas
            .iter()
            .enumerate()
            .map(|(i, r)| {
                let log = r.log();
                let tail: Vec<&str> = log.lines().rev().take(25).collect();
                let tail: Vec<&str> = tail.into_iter().rev().collect();
                format!("--- replica {i} (pid {}):\n{}", r.pid(), tail.join("\n"))
            })
            .collect::<Vec<_>>()
            .join("\n")
    }
}

// ------------------------------------------------------------------------------ one trial

impl Campaign {
    /// Run trial `n`: the call(s), the fault, the agent's retries, then the judgement.
    fn trial(&mut self, n: usize, plan: &Plan, tally: &mut Tally) -> String {
        let counter = self.h.sshd.dir().join(format!("ran.{n}"));
        let cmd = plan.command(&counter);
        let ids_before = self.ids();
        let markers_before = self.markers();
        let fenced_before = self.fence_lines();
        let mut pending = vec![self.call(plan.to, &cmd)];
        if plan.twin {
            pending.push(self.call(plan.retry, &cmd));
        }
        self.aim(plan, &markers_before);
        let fault_at = SystemTime::now();
        let mut answers = self.fault(plan, &cmd, pending, &ids_before);
        self.agent(plan, &cmd, &mut answers);
        let (ids, all_settled) = self.settle(&ids_before);
        let fenced = self.fence_lines() - fenced_before;
        let seen = Seen {
            n,
            answers,
            fault_at,
            ids,
            all_settled,
            runs: count_lines(&counter),
            fenced,
        };
        self.judge(plan, &seen, tally);
        let answers: Vec<String> = seen.answers.iter().map(Answer::brief).collect();
        format!("[{}] executions {}", answers.join(", "), seen.ids.len())
    }

    /// Wait for the point the plan aims the fault at (each wait bounded).
    fn aim(&self, plan: &Plan, before: &BTreeSet<String>) {
        match plan.aim {
            Aim::Early => sleep(plan.early),
            Aim::Mid => {
                if self.wait_marker(before, ".start", Duration::from_secs(20)) {
                    sleep(plan.duration().mul_f64(plan.mid_frac));
                }
            }
            Aim::Late => {
                self.wait_marker(before, ".done", Duration::from_secs(30));
            }
        }
    }

    /// Land the fault; the answers of the calls in flight (and, for a fault that takes the
    /// replica away, of the agent's first retry on another one).
    fn fault(
        &mut self,
        plan: &Plan,
        cmd: &str,
        pending: Vec<JoinHandle<Answer>>,
        ids_before: &BTreeSet<String>,
    ) -> Vec<Answer> {
        let join = |p: Vec<JoinHandle<Answer>>| -> Vec<Answer> {
            p.into_iter().map(|t| t.join().unwrap()).collect()
        };
        match plan.fault {
            Fault::None => join(pending),
            Fault::LinkCut => {
                self.h.proxy.set_refuse(true);
                self.h.proxy.cut();
                sleep(plan.len);
                self.h.proxy.set_refuse(false);
                join(pending)
            }
            Fault::PgRestart => {
                self.pg.restart();
                join(pending)
            }
            Fault::Cancel | Fault::TasksCancel => {
                self.cancel(plan, ids_before);
                join(pending)
            }
            Fault::Kill9 => {
                self.replicas[plan.to].kill9();
                // the agent sees its connection drop and retries at once elsewhere (with a
                // twin in flight there already, it waits for that one's answer instead)
                let retry = (!plan.twin).then(|| self.call(plan.retry, cmd));
                let mut got = join(pending);
                got.extend(retry.map(|r| r.join().unwrap()));
                // back in service: a new process (a new identity) on a new port
                let fresh = start_replica(&self.h, &self.key);
                let old = std::mem::replace(&mut self.replicas[plan.to], fresh);
                self.dead_logs.push(old.log());
                got
            }
            Fault::Pause => {
                let pid = self.replicas[plan.to].pid();
                signal(pid, "STOP");
                // the agent's call hangs; it retries elsewhere meanwhile (a twin is in flight
                // there already)
                let retry = (!plan.twin).then(|| self.call(plan.retry, cmd));
                sleep(plan.len);
                signal(pid, "CONT");
                let mut got: Vec<Answer> = retry.map(|r| r.join().unwrap()).into_iter().collect();
                got.extend(join(pending));
                got
            }
        }
    }

    /// Cancel the trial's execution (once it is accepted; the wait bounded): `cairn cancel` in a
    /// process of its own, or `tasks/cancel` to the plan's retry replica.
    fn cancel(&self, plan: &Plan, before: &BTreeSet<String>) {
        let t0 = Instant::now();
        let id = loop {
            if let Some(id) = self.ids().difference(before).next().cloned() {
                break id;
            }
            if t0.elapsed() > Duration::from_secs(20) {
                return;
            }
            sleep(Duration::from_millis(20));
        };
        if plan.fault == Fault::TasksCancel {
            let tok = self.auth.trim_start_matches("Bearer ");
            let port = self.replicas[plan.retry].port;
            let _ = crate::tasks_window::mcp(
                port,
                tok,
                9_000_000 + self.next_id,
                "tasks/cancel",
                serde_json::json!({"taskId": id}),
            );
        } else {
            let mut c = self.h.cairn("cancel");
            c.arg(&id);
            let _ = c.output();
        }
    }

    /// The agent: until an answer is settled, retry the same intent on the replicas that are
    /// up, starting with the plan's retry replica (at most `ATTEMPTS` calls in all).
    fn agent(&mut self, plan: &Plan, cmd: &str, answers: &mut Vec<Answer>) {
        let away = matches!(plan.fault, Fault::Kill9 | Fault::Pause).then_some(plan.to);
        let order: Vec<usize> = (0..REPLICAS)
            .map(|k| (plan.retry + k) % REPLICAS)
            .filter(|i| Some(*i) != away)
            .collect();
        let mut calls = if plan.twin { 2 } else { 1 };
        let mut k = 0;
        while !answers.iter().any(Answer::is_settled) && calls < ATTEMPTS {
            sleep(Duration::from_millis(300));
            let i = order[k % order.len()];
            k += 1;
            calls += 1;
            let a = self.call(i, cmd).join().unwrap();
            answers.push(a);
        }
    }

    /// Wait (bounded) until every execution created since `before` is settled or `unknown`:
    /// the new executions, and whether they all got there.
    fn settle(&self, before: &BTreeSet<String>) -> (Vec<String>, bool) {
        let j = self.h.journal();
        let t0 = Instant::now();
        loop {
            let ids: Vec<String> = self.ids().difference(before).cloned().collect();
            let done = ids.iter().all(|id| {
                let id = cairn::ExecutionId::parse(id).unwrap();
                j.status(&id)
                    .ok()
                    .flatten()
                    .is_some_and(|s| s.state.is_settled() || s.state == cairn::State::Unknown)
            });
            if done || t0.elapsed() > SETTLE_LIMIT {
                return (ids, done);
            }
            sleep(Duration::from_millis(100));
        }
    }
}

fn count_lines(p: &Path) -> usize {
    std::fs::read_to_string(p)
        .map(|s| s.lines().count())
        .unwrap_or(0)
}

/// What a trial left behind, for the judgement.
struct Seen {
    n: usize,
    answers: Vec<Answer>,
    fault_at: SystemTime,
    /// the executions created during the trial
    ids: Vec<String>,
    all_settled: bool,
    /// runs counted on the host
    runs: usize,
    /// fence refusals the replicas logged during the trial
    fenced: usize,
}

// ------------------------------------------------------------------------------ judgement

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    RanTwice,
    Lost,
    WrongState,
    /// takeovers over the bound or miscounted, a fenced write recorded, host and journal
    /// disagreeing
    Other,
    /// a replica that was up left a call without an answer for the client's whole read
    /// timeout
    Unanswered,
}

#[derive(Default)]
struct FaultTally {
    trials: usize,
    executions: usize,
    states: BTreeMap<String, usize>,
    landings: BTreeMap<String, usize>,
    takeovers: i64,
    fenced: usize,
}

#[derive(Default)]
struct Tally {
    trials: usize,
    executions: usize,
    ran_twice: usize,
    lost: usize,
    wrong_state: usize,
    takeovers: i64,
    fenced: usize,
    /// trials in which a held call was accepted after its twin's or retry's delivery
    stale: usize,
    /// calls a replica that was up left unanswered
    unanswered: usize,
    /// `dispatched` events beyond the first of an execution (a takeover's dispatch again)
    redispatched: usize,
    /// executions their live owner picked up after its own call failed (`redrive` events)
    redrives: usize,
    /// executions whose command started after they were recorded `cancelled`
    ran_after_cancel: usize,
    /// each trial's started executions (for the recount at the end)
    started: BTreeMap<usize, usize>,
    anomalies: Vec<String>,
    per_fault: BTreeMap<Fault, FaultTally>,
}

/// What the host's marker home says of `id`: when its started and finish records were written.
fn marker_times(x: &Path, id: &str) -> (Option<SystemTime>, Option<SystemTime>) {
    let mtime = |ext: &str| {
        std::fs::metadata(x.join(format!("{id}.{ext}")))
            .and_then(|m| m.modified())
            .ok()
    };
    (mtime("start"), mtime("done"))
}

fn landing(fault_at: SystemTime, start: Option<SystemTime>, done: Option<SystemTime>) -> Landing {
    match (start, done) {
        (Some(s), _) if s >= fault_at => Landing::BeforeStart,
        (None, _) => Landing::BeforeStart,
        (Some(_), Some(d)) if d < fault_at => Landing::AfterFinish,
        _ => Landing::MidRun,
    }
}

/// The exit status a `completed` event recorded (its copy of the host's finish record).
fn recorded_exit(e: &cairn::journal::Event) -> Option<u64> {
    e.evidence["finish_record"]
        .as_str()?
        .split_whitespace()
        .find_map(|w| w.strip_prefix("status="))?
        .parse()
        .ok()
}

/// Events appended as owner by a replica after another took the execution over from it (and
/// before any later takeover handed it back): writes the fence should have refused. A
/// caller's own notes (it matched, it reused the ID, its caller got the result) are not an
/// owner's writes: any replica serving a caller appends them.
fn late_writes(events: &[cairn::journal::Event]) -> Vec<String> {
    const CALLERS: [&str; 4] = [
        "intent-matched",
        "request-reused",
        "correlation",
        "delivered",
    ];
    let mut lost_it: BTreeSet<String> = BTreeSet::new();
    let mut bad = Vec::new();
    for e in events {
        if e.kind == "takeover" {
            let from = e.evidence["from_client"].as_str().unwrap_or_default();
            let to = e.evidence["to_client"].as_str().unwrap_or_default();
            lost_it.insert(from.to_owned());
            lost_it.remove(to);
        } else if lost_it.contains(&e.client) && !CALLERS.contains(&e.kind.as_str()) {
            bad.push(format!("#{} {} by {}", e.seq, e.kind, e.client));
        }
    }
    bad
}

fn describe(events: &[cairn::journal::Event]) -> String {
    events
        .iter()
        .map(|e| {
            let st = e.state.map(|s| s.as_str()).unwrap_or("-");
            let mut ev = e.evidence.to_string();
            if e.kind == "accepted" || ev.len() > 400 {
                ev = ev.chars().take(160).collect::<String>() + "…";
            }
            format!("    #{} {} [{st}] by {} {ev}", e.seq, e.kind, e.client)
        })
        .collect::<Vec<_>>()
        .join("\n")
}

impl Campaign {
    /// Judge one trial; every anomaly goes into the tally with its evidence.
    // Long: one check per invariant of a trial, each against the same evidence, adding to one
    // tally.
    fn judge(&self, plan: &Plan, s: &Seen, t: &mut Tally) {
        let j = self.h.journal();
        let mut bad: Vec<(Kind, String)> = Vec::new();
        let mut evidence = format!("  plan: {plan:?}\n  host runs: {}\n  answers:\n", s.runs);
        for a in &s.answers {
            evidence.push_str(&format!("    replica {}: {:?}\n", a.replica, a.body));
        }
        if !s.all_settled {
            bad.push((Kind::WrongState, "not settled within 60 s".into()));
        }
        let ft = t.per_fault.entry(plan.fault).or_default();
        ft.trials += 1;
        ft.fenced += s.fenced;
        let (mut started, mut not_failed) = (0, 0);
        let mut landings: BTreeMap<&str, Landing> = BTreeMap::new();
        // (accepted seq, accepting process, delivered seq) of each execution that is not failed
        let mut lives: Vec<(i64, String, Option<i64>)> = Vec::new();
        for id in &s.ids {
            let xid = cairn::ExecutionId::parse(id).unwrap();
            let events = j.events(&xid).expect("events");
            let state = j
                .status(&xid)
                .expect("status")
                .map(|st| st.state.as_str())
                .unwrap_or("none");
            let (start, done) = marker_times(&self.h.x(), id);
            let land = landing(s.fault_at, start, done);
            landings.insert(id, land);
            started += usize::from(start.is_some());
            not_failed += usize::from(state != "failed");
            if state != "failed" {
                let seq_of = |k: &str| events.iter().find(|e| e.kind == k).map(|e| e.seq);
                let by = events.first().map(|e| e.client.clone()).unwrap_or_default();
                lives.push((seq_of("accepted").unwrap_or(0), by, seq_of("delivered")));
            }
            evidence.push_str(&format!(
                "  execution {id}: {state}, landing {land:?}, started {}, finished {}\n{}\n",
                start.is_some(),
                done.is_some(),
                describe(&events)
            ));
            let table = allowed(plan.fault, land);
            if !table.contains(&as_table_state(state)) {
                bad.push((
                    Kind::WrongState,
                    format!(
                        "{id} ended {state}; {:?} {land:?} allows {table:?}",
                        plan.fault
                    ),
                ));
            }
            if state == "failed" && start.is_some() {
                bad.push((
                    Kind::WrongState,
                    format!("{id} recorded failed, but it ran"),
                ));
            }
            // A takeover that finds no marker dispatches again under the same ID (the host's
            // start guard lets one of the two start): counted, and judged by the host's count.
            let dispatched = events.iter().filter(|e| e.kind == "dispatched").count();
            t.redispatched += dispatched.saturating_sub(1);
            t.redrives += events.iter().filter(|e| e.kind == "redrive").count();
            // A start record written after the journal recorded `cancelled`: the command ran
            // after its execution was cancelled.
            if let (Some(c), Some(st)) = (events.iter().find(|e| e.kind == "cancelled"), start) {
                let at = st
                    .duration_since(std::time::UNIX_EPOCH)
                    .map(|d| {
                        cairn::journal::rfc3339_from_unix(d.as_secs() as i64, d.subsec_millis())
                    })
                    .unwrap_or_default();
                if at > c.at {
                    t.ran_after_cancel += 1;
                    bad.push((
                        Kind::RanTwice,
                        format!(
                            "{id} started at {at}, after it was recorded cancelled at {}",
                            c.at
                        ),
                    ));
                }
            }
            let completed = events
                .iter()
                .rev()
                .find(|e| e.kind == "completed" || e.kind == "cancelled");
            match completed {
                None if done.is_some() => bad.push((
                    Kind::Lost,
                    format!("{id} finished on the host, and no outcome is recorded"),
                )),
                Some(e) if e.kind == "completed" && recorded_exit(e) != Some(plan.code) => bad
                    .push((
                        Kind::Lost,
                        format!(
                            "{id} recorded exit {:?}, the command exits {}",
                            recorded_exit(e),
                            plan.code
                        ),
                    )),
                _ => {}
            }
            let taken = self.judge_ownership(&j, &xid, &events, &mut bad, t);
            let ft = t.per_fault.entry(plan.fault).or_default();
            ft.takeovers += taken;
            ft.executions += 1;
            *ft.states.entry(state.to_owned()).or_default() += 1;
            *ft.landings.entry(format!("{land:?}")).or_default() += 1;
        }
        // Each started execution runs the command once: more runs than started executions
        // is an execution that ran twice.
        if s.runs > started {
            bad.push((
                Kind::RanTwice,
                format!(
                    "the host ran it {} times for {started} started execution(s)",
                    s.runs
                ),
            ));
        } else if s.runs < started {
            bad.push((
                Kind::Other,
                format!(
                    "{started} started record(s) on the host, {} run(s) counted",
                    s.runs
                ),
            ));
        }
        t.started.insert(s.n, started);
        let stale = not_failed == 2 && Campaign::after_delivery(plan, &mut lives);
        if stale {
            t.stale += 1;
            say(&format!(
                "replica campaign: trial {} seed {}: NOTE a call held inside a replica was \
                 accepted after its twin's or retry's result was delivered: a second execution \
                 of the intent (docs/REPLICAS.md)\n{evidence}",
                s.n, self.seed
            ));
        } else if not_failed > 1 {
            bad.push((
                Kind::WrongState,
                format!("{not_failed} executions (not failed) for one intent"),
            ));
        }
        judge_answers(plan, s, &landings, stale, &mut bad);
        t.trials += 1;
        t.executions += s.ids.len();
        t.fenced += s.fenced;
        for (kind, what) in bad {
            match kind {
                Kind::RanTwice => t.ran_twice += 1,
                Kind::Lost => t.lost += 1,
                Kind::WrongState => t.wrong_state += 1,
                Kind::Other => {}
                Kind::Unanswered => t.unanswered += 1,
            }
            let line = format!(
                "ANOMALY trial={} seed={} ({kind:?}): {what}\n{evidence}{}",
                s.n,
                self.seed,
                self.logs()
            );
            say(&line);
            t.anomalies.push(line);
        }
    }

    /// Whether the later of two executions of one intent was accepted only after the earlier
    /// one's result was delivered: a call held inside a replica (stopped, or waiting for the
    /// database or the host) past the delivery of its twin or its retry, which the intent rule
    /// makes a new call (docs/REPLICAS.md). Never without a fault; any other pair is an anomaly.
    fn after_delivery(plan: &Plan, lives: &mut [(i64, String, Option<i64>)]) -> bool {
        if plan.fault == Fault::None {
            return false;
        }
        lives.sort();
        let (first, later) = (&lives[0], &lives[1]);
        first.2.is_some_and(|d| d < later.0)
    }

    /// Takeovers within the bound and counted alike by the owner row and the events, and no
    /// write recorded from a replica after its execution was taken from it.
    fn judge_ownership(
        &self,
        j: &cairn::journal::Journal,
        xid: &cairn::ExecutionId,
        events: &[cairn::journal::Event],
        bad: &mut Vec<(Kind, String)>,
        t: &mut Tally,
    ) -> i64 {
        let taken = events.iter().filter(|e| e.kind == "takeover").count() as i64;
        let row = j.ownership(xid).expect("ownership");
        let counted = row.as_ref().map_or(0, |o| i64::from(o.takeovers));
        if taken > MAX_TAKEOVERS || counted != taken {
            bad.push((
                Kind::Other,
                format!("{xid}: {taken} takeover event(s), the owner row counts {counted} (at most {MAX_TAKEOVERS})"),
            ));
        }
        if row.as_ref().is_some_and(|o| !o.settled) {
            bad.push((
                Kind::Other,
                format!("{xid}: its ownership is not closed: {row:?}"),
            ));
        }
        let late = late_writes(events);
        if !late.is_empty() {
            bad.push((
                Kind::Other,
                format!("{xid}: fenced late writes recorded: {late:?}"),
            ));
        }
        t.takeovers += taken;
        taken
    }
}

/// Every answer with a result names an execution of this trial, in a state its fault allows
/// there, with the command's bytes and exit status when it says `completed`; the answers that
/// are not `failed` all name one execution; and the agent got a settled answer.
fn judge_answers(
    plan: &Plan,
    s: &Seen,
    landings: &BTreeMap<&str, Landing>,
    stale: bool,
    bad: &mut Vec<(Kind, String)>,
) {
    let mut named = BTreeSet::new();
    let away = matches!(plan.fault, Fault::Kill9 | Fault::Pause).then_some(plan.to);
    for a in &s.answers {
        // (a replica that was up all along answers long before the agent's patience ends)
        if a.body.is_none() && Some(a.replica) != away && a.took >= PATIENCE {
            bad.push((
                Kind::Unanswered,
                format!(
                    "replica {} left the call unanswered for {:.0} s",
                    a.replica,
                    a.took.as_secs_f64()
                ),
            ));
        }
        let (Some(state), Some(id)) = (a.state(), a.execution()) else {
            continue;
        };
        let Some(land) = landings.get(id) else {
            bad.push((
                Kind::Other,
                format!("replica {} answered for {id}, not of this trial", a.replica),
            ));
            continue;
        };
        if !allowed(plan.fault, *land).contains(&as_table_state(state)) {
            bad.push((
                Kind::WrongState,
                format!("replica {} answered {state} for {id}", a.replica),
            ));
        }
        if state != "failed" {
            named.insert(id.to_owned());
        }
        let r = &a.body.as_ref().unwrap()["result"];
        if state == "completed"
            && (r["stdout"].as_str() != Some(plan.stdout().as_str())
                || r["exit_code"].as_u64() != Some(plan.code))
        {
            bad.push((
                Kind::Lost,
                format!(
                    "replica {} answered completed with stdout {:?}, exit {}; the command prints {:?}, exits {}",
                    a.replica, r["stdout"], r["exit_code"], plan.stdout(), plan.code
                ),
            ));
        }
    }
    if named.len() > 1 && !stale {
        bad.push((
            Kind::WrongState,
            format!("answers name {named:?} for one intent"),
        ));
    }
    if !s.answers.iter().any(Answer::is_settled) {
        bad.push((
            Kind::Other,
            format!("no settled answer after {} call(s)", s.answers.len()),
        ));
    }
}

// ------------------------------------------------------------------------------ the run

fn seed_from_env() -> u64 {
    match std::env::var("REPLICA_CAMPAIGN_SEED") {
        Ok(v) => match v.strip_prefix("0x") {
            Some(hex) => u64::from_str_radix(hex, 16).expect("REPLICA_CAMPAIGN_SEED"),
            None => v.parse().expect("REPLICA_CAMPAIGN_SEED"),
        },
        Err(_) => splitmix64(
            SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos() as u64)
                .unwrap_or(1),
        ),
    }
}

/// The whole campaign (the test `replicas::randomized_replica_campaign`).
pub(super) fn run() {
    let trials: usize = std::env::var("REPLICA_CAMPAIGN_TRIALS")
        .ok()
        .map(|v| v.parse().expect("REPLICA_CAMPAIGN_TRIALS"))
        .unwrap_or(15);
    let seed = seed_from_env();
    say(&format!(
        "replica campaign: seed={seed} trials={trials} (repeat with REPLICA_CAMPAIGN_SEED={seed})"
    ));
    let Some(mut c) = Campaign::start(seed) else {
        return;
    };
    let mut t = Tally::default();
    // REPLICA_CAMPAIGN_ONLY=N replays trial N of the seed alone.
    let only: Option<usize> = std::env::var("REPLICA_CAMPAIGN_ONLY")
        .ok()
        .map(|v| v.parse().expect("REPLICA_CAMPAIGN_ONLY"));
    for n in (0..trials).filter(|n| only.is_none_or(|o| o == *n)) {
        let plan = Plan::new(seed, n);
        let t0 = Instant::now();
        let before = t.anomalies.len();
        let brief = c.trial(n, &plan, &mut t);
        say(&format!(
            "replica campaign: trial {n} {:?} {:?}{} to {} retry {}: {brief}: {} ({:.1}s)",
            plan.fault,
            plan.aim,
            if plan.twin { " twin" } else { "" },
            plan.to,
            plan.retry,
            if t.anomalies.len() == before {
                "ok"
            } else {
                "ANOMALY"
            },
            t0.elapsed().as_secs_f64()
        ));
    }
    // Ground truth at the end: every trial's counter, once more.
    for n in 0..trials {
        let runs = count_lines(&c.h.sshd.dir().join(format!("ran.{n}")));
        let started = t.started.get(&n).copied().unwrap_or(0);
        if runs > started {
            t.ran_twice += 1;
            t.anomalies.push(format!(
                "ANOMALY trial={n} seed={seed}: ran {runs} times for {started} started execution(s) (recount)"
            ));
        }
    }
    say(&format!(
        "replica campaign: trials={} executions={} ran_twice={} ran_after_cancel={} lost={} wrong_state={} anomalies={} takeovers={} fenced={} redispatched={} after_delivery={} unanswered={} redrives={}",
        t.trials, t.executions, t.ran_twice, t.ran_after_cancel, t.lost, t.wrong_state, t.anomalies.len(), t.takeovers,
        t.fenced, t.redispatched, t.stale, t.unanswered, t.redrives
    ));
    for (f, ft) in &t.per_fault {
        say(&format!(
            "replica campaign: fault {f:?}: trials={} executions={} states={:?} landings={:?} takeovers={} fenced={}",
            ft.trials, ft.executions, ft.states, ft.landings, ft.takeovers, ft.fenced
        ));
    }
    assert!(
        t.anomalies.is_empty(),
        "replica campaign (seed {seed}): {} anomalies:\n{}",
        t.anomalies.len(),
        t.anomalies.join("\n")
    );
}
