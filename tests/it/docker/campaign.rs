//! The randomized fault campaign: seeded trials on several host sets at once, each trial one
//! dispatch (`cairn run`, two `cairn run` with one execution ID at once, or three executions
//! through `cairn serve --host-session`) with a fault timed against the host, then recovery,
//! then a judgement of every execution against the host's own evidence.
//!
//! Every anomaly fails the campaign and is printed with its trial, seed and evidence: a run
//! twice, a result lost (a client that returned nothing without having been killed, bytes or an
//! exit status other than the host's), a state outside the table of states each fault may
//! produce where it landed ([`allowed`]), an overrun, a final state the host contradicts or
//! `unknown` after the final recovery. After all trials the hosts are recounted (ground truth).
//!
//! Knobs: `CAMPAIGN_TRIALS` (default 200), `CAMPAIGN_SEED` (default: from the clock, printed),
//! `CAMPAIGN_HOST_HELPER` (`mixed`, the default: trials dispatch with the native host helper or
//! the sh script and recover with either, in turn; `never`: the script only; `auto`: the helper).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::{Child, Output};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::thread::sleep;
use std::time::{Duration, Instant, SystemTime};

use cairn::State;

use super::{field, lines_cmd, numbered, BIN};
use crate::support::docker::{
    docker_enabled, output_within, say, spawn, splitmix64, wait_within, Client, Flavour, Hosts, Rng,
};

/// `--reconnect-for` of every client in the campaign.
const RECONNECT_FOR: Duration = Duration::from_secs(8);
/// A cut or hang at least this long may outlast the client's reconnect window (loss noticed
/// by keepalive, 1 s × 3, then 8 s of trying): only then may its answer be `unknown`.
const OUTLASTS: Duration = Duration::from_secs(6);
/// Bound of one client (a trial's dispatch) and of one `recover --wait`.
const CLIENT_LIMIT: Duration = Duration::from_secs(90);
const RECOVER_LIMIT: Duration = Duration::from_secs(120);

// ------------------------------------------------------------------------------ plans

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(super) enum Fault {
    None,
    /// link blackholed for `len`
    Cut,
    /// link down and up several times, each outage short
    Flap,
    /// every process frozen (docker pause) for `len`
    Hang,
    /// docker kill + start
    Reboot,
    /// sshd killed and started again (sessions live on)
    SshdRestart,
    /// sshd stopped, the link cut for 4 s so the client must reconnect, sshd left down past
    /// `--reconnect-for`, then started
    SshdDown,
    /// `kill -9` of the client
    Kill9,
    /// `kill -9` of the host-side supervisor named in the started record
    SupervisorKill,
    /// the marker home's filesystem full for `len`
    DiskFull,
    /// the marker home and everything in it immutable for `len`
    ReadonlyMarkers,
    /// the host's marker home wiped before the trial (as an operator's `rm -rf ~/.cairn` or a
    /// re-imaging would), then a reboot where the plan aims: a reboot after a wipe is
    /// `interrupted` like any other, never `unknown`
    Wiped,
}

const FAULTS: [Fault; 12] = [
    Fault::None,
    Fault::Cut,
    Fault::Flap,
    Fault::Hang,
    Fault::Reboot,
    Fault::SshdRestart,
    Fault::SshdDown,
    Fault::Kill9,
    Fault::SupervisorKill,
    Fault::DiskFull,
    Fault::ReadonlyMarkers,
    Fault::Wiped,
];

/// Where a fault landed for one execution, from the host's own clock: the modification times
/// of its started and finish records against the moment the fault began.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(super) enum Landing {
    /// no started record, or one written after the fault began
    BeforeStart,
    /// started before the fault began, not finished before it
    MidRun,
    /// finished before the fault began
    AfterFinish,
}

/// Where the plan aims the fault.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Aim {
    /// right after the client was spawned, before it can have started anything
    Early,
    /// a random fraction of the command's duration after its started record appeared
    Mid,
    /// once every finish record exists
    Late,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Via {
    /// one `cairn run --json --id ID`
    Run,
    /// two `cairn run --json --id ID` with the same ID at the same moment
    Twin,
    /// `cairn serve --host-session` with [`SESSION_EXECUTIONS`] executions at once
    Session,
}

/// Executions a `Via::Session` trial sends together (one host session, one batch).
const SESSION_EXECUTIONS: usize = 3;

/// A fault to inject: which, how long it lasts (where that applies).
#[derive(Clone, Copy, Debug)]
struct Shot {
    fault: Fault,
    len: Duration,
}

/// What one trial does; derived from (seed, trial number) alone.
#[derive(Debug, Clone)]
struct Plan {
    lines: usize,
    delay_ms: u64,
    code: u64,
    first: Shot,
    aim: Aim,
    /// for `Aim::Mid`: the fraction of the command's duration to wait after its start
    mid_frac: f64,
    /// a second fault in the same trial: when (after the first ended) and which
    second: Option<(Duration, Shot)>,
    via: Via,
    /// if recovery is needed: `kill -9` a first `recover --wait` (or `attach`) after this long
    kill_recovery: Option<Duration>,
    /// the flap's outages and the pauses between them
    flap: Vec<(Duration, Duration)>,
    /// recover with no connection options at all (what the journal recorded is all it has)
    bare_recover: bool,
}

impl Plan {
    fn new(seed: u64, trial: usize) -> Plan {
        let mut r = Rng::new(seed ^ splitmix64(trial as u64 + 1));
        let dur = r.range(600, 4000);
        let lines = r.range(2, 40) as usize;
        let code = if r.range(0, 2) == 0 {
            0
        } else {
            r.range(1, 125)
        };
        let fault = stratified_fault(seed, trial);
        let aim = match r.range(0, 99) {
            0..=14 if fault != Fault::SupervisorKill => Aim::Early,
            85..=99 => Aim::Late,
            _ => Aim::Mid,
        };
        let len = match fault {
            Fault::Cut | Fault::Hang => r.millis(1000, 14000),
            Fault::DiskFull | Fault::ReadonlyMarkers => r.millis(500, 4000),
            _ => Duration::ZERO,
        };
        let second = (r.range(0, 99) < 12).then(|| {
            let f = [
                Fault::Cut,
                Fault::Reboot,
                Fault::SshdRestart,
                Fault::Kill9,
                Fault::Hang,
            ][r.range(0, 4) as usize];
            let len = r.millis(1000, 4000);
            (r.millis(0, 1500), Shot { fault: f, len })
        });
        let via = match r.range(0, 99) {
            0..=32 => Via::Session,
            33..=42 => Via::Twin,
            _ => Via::Run,
        };
        let kill_recovery = (r.range(0, 2) == 0).then(|| r.millis(100, 2000));
        let flap = (0..r.range(3, 5))
            .map(|_| (r.millis(300, 1200), r.millis(800, 1500)))
            .collect();
        let bare_recover = r.range(0, 1) == 0;
        Plan {
            lines,
            delay_ms: dur / lines as u64,
            code,
            first: Shot { fault, len },
            aim,
            mid_frac: r.range(0, 80) as f64 / 100.0,
            second,
            via,
            kill_recovery,
            flap,
            bare_recover,
        }
    }

    fn duration(&self) -> Duration {
        Duration::from_millis(self.delay_ms * self.lines as u64)
    }

    fn command(&self, counter: &str) -> String {
        let d = format!("{}.{:03}", self.delay_ms / 1000, self.delay_ms % 1000);
        lines_cmd(counter, self.lines, &d, self.code)
    }
}

/// Faults dealt in shuffled rounds of every kind: each kind gets its share of the trials.
fn stratified_fault(seed: u64, trial: usize) -> Fault {
    let kinds = fault_kinds();
    let n = kinds.len();
    let mut order: Vec<usize> = (0..n).collect();
    let mut r = Rng::new(seed ^ splitmix64(0xfa17 + (trial / n) as u64));
    for k in (1..n).rev() {
        order.swap(k, r.range(0, k as u64) as usize);
    }
    kinds[order[trial % n]]
}

/// The fault kinds of this run: every one.
fn fault_kinds() -> Vec<Fault> {
    FAULTS.to_vec()
}

/// The counter a trial's command appends to: outside the marker home, so a full, read-only
/// or wiped marker home never hides a run.
fn counter(id: &str) -> String {
    format!("/var/log/cairn-count-{id}")
}

// ------------------------------------------------------------------------------ the table

/// The answers (states a client may report) each fault allows where it landed, before the
/// host's evidence is checked (a `completed` needs a finish record, `interrupted` a started
/// record without one, `failed` neither and no run). `unknown` only where the outage can
/// outlast the reconnect window; `failed` only where the fault began before the start.
///
/// `failed` before the start: a client that could not reach the host, or whose dispatch the
/// host refused, before anything started, may say so (nothing ran; it is safe to send again).
/// A read-only marker home is the design's "unreadable" row: the host cannot show what
/// happened while it lasts, so the answer may be `unknown`; the final state may not.
pub(super) fn allowed(f: Fault, landing: Landing, len: Duration) -> &'static [&'static str] {
    let before = landing == Landing::BeforeStart;
    let outlasts = len >= OUTLASTS;
    match f {
        Fault::None | Fault::Kill9 => &["completed"],
        Fault::SshdRestart | Fault::Flap if before => &["completed", "failed"],
        Fault::SshdRestart | Fault::Flap => &["completed"],
        Fault::Cut | Fault::Hang => match (outlasts, before) {
            (true, true) => &["completed", "failed", "unknown"],
            (true, false) => &["completed", "unknown"],
            (false, true) => &["completed", "failed"],
            (false, false) => &["completed"],
        },
        Fault::SshdDown if before => &["completed", "failed", "unknown"],
        Fault::SshdDown => &["completed", "unknown"],
        Fault::Reboot if before => &["completed", "failed"],
        // (cut off before the host answered the dispatch, on a host whose marker home was
        // wiped since cairn last saw it: the dispatch may have met the old home, which is gone;
        // nothing on the host can say, so `unknown` is the truth)
        Fault::Wiped if before => &["completed", "failed", "unknown"],
        Fault::Reboot | Fault::Wiped | Fault::SupervisorKill => &["completed", "interrupted"],
        Fault::DiskFull if before => &["completed", "failed"],
        Fault::DiskFull => &["completed"],
        Fault::ReadonlyMarkers if before => &["completed", "failed", "unknown"],
        Fault::ReadonlyMarkers => &["completed", "interrupted", "unknown"],
    }
}

/// Faults whose effect on the marker home may cost output bytes: the host's own files are
/// the truth for those, the plan for every other.
fn touches_output(f: Fault) -> bool {
    matches!(f, Fault::DiskFull | Fault::ReadonlyMarkers)
}

// ------------------------------------------------------------------------------ host facts

/// What the host says about one execution.
#[derive(Debug, Default, Clone)]
struct HostFacts {
    count: usize,
    /// when its started record was written, if it exists
    started: Option<SystemTime>,
    /// when its finish record was written, and its first line
    done: Option<(SystemTime, String)>,
    out: Vec<u8>,
    err: Vec<u8>,
}

/// The host's marker files of `id`, read on this machine (the home is a loop mount here).
fn markers(home: &Path, id: &str) -> (Option<SystemTime>, Option<(SystemTime, String)>) {
    let x = home.join(".cairn/x");
    let mtime = |p: PathBuf| std::fs::metadata(p).and_then(|m| m.modified()).ok();
    let started = mtime(x.join(format!("{id}.start")));
    let done = mtime(x.join(format!("{id}.done"))).map(|t| {
        let text = std::fs::read_to_string(x.join(format!("{id}.done"))).unwrap_or_default();
        (t, text.lines().next().unwrap_or("").to_owned())
    });
    (started, done)
}

fn host_facts(h: &Hosts, host: &str, id: &str) -> Result<HostFacts, String> {
    let o = h.exec(
        host,
        &[
            "sh",
            "-c",
            "[ -f \"$1\" ] && wc -l < \"$1\" || echo 0",
            "sh",
            &counter(id),
        ],
    );
    if !o.status.success() {
        return Err(format!("reading the counter of {id} on {host}: {o:?}"));
    }
    let count = String::from_utf8_lossy(&o.stdout)
        .trim()
        .parse()
        .map_err(|e| format!("counter of {id} on {host}: {e}: {o:?}"))?;
    let home = h.home(host);
    let (started, done) = markers(&home, id);
    let x = home.join(".cairn/x").join(id);
    Ok(HostFacts {
        count,
        started,
        done,
        out: std::fs::read(x.join("out")).unwrap_or_default(),
        err: std::fs::read(x.join("err")).unwrap_or_default(),
    })
}

/// Where a fault that began at `began` and was over (undone, or its instant step taken) at
/// `ended` landed: a start after it was over is after the fault; a finish before it began is
/// before it; anything else met the fault while it ran (or as it started).
fn landing(facts: &HostFacts, (began, ended): (SystemTime, SystemTime)) -> Landing {
    match (&facts.started, &facts.done) {
        (None, _) => Landing::BeforeStart,
        (Some(s), _) if *s > ended => Landing::BeforeStart,
        (_, Some((d, _))) if *d < began => Landing::AfterFinish,
        _ => Landing::MidRun,
    }
}

// ------------------------------------------------------------------------------ a trial

/// One campaign host: its set, its alias, and the shared journal of the run.
struct Slot<'a> {
    hosts: &'a Hosts,
    host: String,
}

/// Every anomaly of one trial, and what each execution came to.
#[derive(Debug, Default)]
struct TrialResult {
    execs: Vec<Exec>,
    anomalies: Vec<String>,
    /// the recovery killed part-way before the last one ran ("attach" or "recover"), if any
    killed_recovery: Option<&'static str>,
}

/// One execution, judged.
#[derive(Debug, Clone)]
pub(super) struct Exec {
    pub id: String,
    pub host: String,
    pub set: String,
    pub fault: Fault,
    pub second: Option<Fault>,
    pub landing: Landing,
    pub via: Via,
    /// the state the client reported ("none" when it was killed first)
    pub answer: String,
    /// the journal's state after recovery ("absent" when the journal has none)
    pub final_state: String,
}

/// What the clients reported, by execution ID: the JSON state, exit code and bytes, and the
/// process's exit code (for `run`).
#[derive(Debug, Default, Clone)]
struct Answer {
    state: String,
    exit_code: Option<u64>,
    stdout: Option<String>,
    stderr: Option<String>,
    process_exit: Option<i32>,
    reason: Option<String>,
}

impl Answer {
    fn from_json(j: &serde_json::Value, process_exit: Option<i32>) -> Answer {
        Answer {
            state: j["state"].as_str().unwrap_or("?").to_owned(),
            exit_code: j["exit_code"].as_u64(),
            stdout: j["stdout"].as_str().map(str::to_owned),
            stderr: j["stderr"].as_str().map(str::to_owned),
            process_exit,
            reason: j["reason"].as_str().map(str::to_owned),
        }
    }
}

/// The clients of one trial.
struct Clients {
    children: Vec<Option<Child>>,
    /// which of them the campaign killed
    killed: Vec<bool>,
}

impl Clients {
    fn spawn(plan: &Plan, c: &Client, host: &str, ids: &[String], dir: &Path) -> Clients {
        let children = match plan.via {
            Via::Run => vec![spawn(c.run(
                &["--json", "--id", &ids[0]],
                host,
                &plan.command(&counter(&ids[0])),
            ))],
            Via::Twin => (0..2)
                .map(|_| {
                    spawn(c.run(
                        &["--json", "--id", &ids[0]],
                        host,
                        &plan.command(&counter(&ids[0])),
                    ))
                })
                .collect(),
            Via::Session => vec![spawn_session(plan, c, host, ids, dir)],
        };
        let n = children.len();
        Clients {
            children: children.into_iter().map(Some).collect(),
            killed: vec![false; n],
        }
    }

    fn all_exited(&mut self) -> bool {
        self.children.iter_mut().all(|ch| {
            ch.as_mut()
                .is_none_or(|ch| !matches!(ch.try_wait(), Ok(None)))
        })
    }

    /// `kill -9` of the first client, if it is still running (a client that already exited is
    /// not killed: kill would hit its zombie).
    fn kill_first(&mut self) {
        if let Some(ch) = self.children[0].as_mut() {
            if matches!(ch.try_wait(), Ok(None)) {
                let _ = ch.kill();
                self.killed[0] = true;
            }
        }
    }
}

fn spawn_session(plan: &Plan, c: &Client, host: &str, ids: &[String], dir: &Path) -> Child {
    // The requests as serve's stdin, which then ends: serve answers every request it read
    // before it exits.
    let mut lines = String::new();
    for (k, id) in ids.iter().enumerate() {
        let req = serde_json::json!({"jsonrpc": "2.0", "id": k, "method": "execute",
            "params": {"destination": host, "execution_id": id,
                       "command": plan.command(&counter(id))}});
        lines.push_str(&format!("{req}\n"));
    }
    let input = dir.join(format!("{}.requests", ids[0]));
    std::fs::write(&input, lines).expect("write the requests");
    let mut x = c.cmd("serve");
    x.args(["--stdio", "--host-session"])
        .stdin(std::fs::File::open(&input).expect("open the requests"))
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    x.spawn().expect("spawn cairn serve")
}

/// Wait until `f` holds, the clients have all exited, or `limit` passed; true if `f` held.
fn wait_host(clients: &mut Clients, limit: Duration, mut f: impl FnMut() -> bool) -> bool {
    let t0 = Instant::now();
    loop {
        if f() {
            return true;
        }
        if t0.elapsed() > limit || clients.all_exited() {
            return f();
        }
        sleep(Duration::from_millis(5));
    }
}

/// Wait for the plan's moment: right away (early), a while after the first started record
/// (mid), or once every finish record is there (late).
fn aim(plan: &Plan, clients: &mut Clients, home: &Path, ids: &[String]) {
    match plan.aim {
        Aim::Early => sleep(Duration::from_millis((plan.mid_frac * 150.0 / 0.8) as u64)),
        Aim::Mid => {
            let seen = wait_host(clients, Duration::from_secs(30), || {
                ids.iter().any(|id| markers(home, id).0.is_some())
            });
            if seen {
                sleep(plan.duration().mul_f64(plan.mid_frac));
            }
        }
        Aim::Late => {
            wait_host(clients, Duration::from_secs(30), || {
                ids.iter().all(|id| markers(home, id).1.is_some())
            });
        }
    }
}

/// Inject one fault; Ok(the moment it began). Every fault is undone before this returns.
fn inject(
    shot: Shot,
    plan: &Plan,
    h: &Hosts,
    host: &str,
    clients: &mut Clients,
    ids: &[String],
) -> Result<(SystemTime, SystemTime), String> {
    let began = SystemTime::now();
    let hold = |on: &[&str], off: &[&str], len: Duration| {
        h.try_fault(on).and_then(|_| {
            sleep(len);
            h.try_fault(off)
        })
    };
    match shot.fault {
        Fault::None => Ok(()),
        Fault::Cut => hold(&["cut", host], &["restore", host], shot.len),
        Fault::Hang => hold(&["hang", host], &["unhang", host], shot.len),
        Fault::DiskFull => {
            // (a file removed while fill-disk fills, a watcher's, can leave a few blocks free:
            // fill again)
            let fill = || {
                (0..3)
                    .map(|_| h.try_fault(&["fill-disk", host]))
                    .find(|r| r.is_ok())
                    .unwrap_or_else(|| h.try_fault(&["fill-disk", host]))
            };
            fill().and_then(|_| {
                sleep(shot.len);
                h.try_fault(&["unfill-disk", host])
            })
        }
        Fault::ReadonlyMarkers => hold(
            &["readonly-markers", host],
            &["writable-markers", host],
            shot.len,
        ),
        Fault::Flap => plan.flap.iter().try_for_each(|(down, up)| {
            hold(&["cut", host], &["restore", host], *down).map(|_| sleep(*up))
        }),
        Fault::Reboot | Fault::Wiped => h.try_fault(&["reboot", host]),
        Fault::SshdRestart => h.try_fault(&["restart-sshd", host]),
        Fault::SshdDown => h.try_fault(&["stop-sshd", host]).and_then(|_| {
            hold(&["cut", host], &["restore", host], Duration::from_secs(4))?;
            sleep(RECONNECT_FOR + Duration::from_secs(2));
            h.try_fault(&["start-sshd", host])
        }),
        Fault::Kill9 => {
            clients.kill_first();
            Ok(())
        }
        Fault::SupervisorKill => kill_supervisor(h, host, ids),
    }
    .map(|_| (began, SystemTime::now()))
}

/// `kill -9` of the supervisor named in the first started record among `ids`.
fn kill_supervisor(h: &Hosts, host: &str, ids: &[String]) -> Result<(), String> {
    let x = h.home(host).join(".cairn/x");
    let Some(rec) = ids
        .iter()
        .find_map(|id| std::fs::read_to_string(x.join(format!("{id}.start"))).ok())
    else {
        return Ok(()); // nothing started: nothing to kill (judged as no fault)
    };
    let pid: u32 = field(&rec, "sup_pid")
        .and_then(|p| p.parse().ok())
        .ok_or_else(|| format!("no sup_pid in {rec:?}"))?;
    if pid <= 1 {
        return Err(format!("refusing to signal PID {pid} ({rec:?})"));
    }
    let o = h.exec(host, &["kill", "-9", &pid.to_string()]);
    // (a supervisor that already ended is not an error: the command had finished)
    if !o.status.success() && !String::from_utf8_lossy(&o.stderr).contains("No such process") {
        return Err(format!("kill -9 {pid} on {host}: {o:?}"));
    }
    Ok(())
}

/// Leave the host usable for the next trial whatever a failed injection left behind.
fn undo_everything(h: &Hosts, host: &str) {
    for args in [
        ["unhang", host],
        ["restore", host],
        ["writable-markers", host],
        ["unfill-disk", host],
    ] {
        let _ = h.try_fault(&args);
    }
    let _ = h.try_fault(&["start-sshd", host]);
}

/// Collect what the clients reported. Anything missing from a client the campaign did not
/// kill is an anomaly: a lost answer, an overrun, an exit status other than the JSON's.
fn collect(
    plan: &Plan,
    clients: &mut Clients,
    ids: &[String],
    anomalies: &mut Vec<String>,
) -> BTreeMap<String, Vec<Answer>> {
    let mut answers: BTreeMap<String, Vec<Answer>> = BTreeMap::new();
    for (k, ch) in clients.children.iter_mut().enumerate() {
        let killed = clients.killed[k];
        let out = match wait_within(ch.take().expect("child"), CLIENT_LIMIT) {
            Err(o) => {
                anomalies.push(format!(
                    "overrun: client {k} did not finish within {CLIENT_LIMIT:?} (killed): {}",
                    tail(&o)
                ));
                continue;
            }
            Ok(_) if killed => continue,
            Ok(out) => out,
        };
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        match plan.via {
            Via::Run | Via::Twin => {
                match serde_json::from_str::<serde_json::Value>(text.lines().last().unwrap_or("")) {
                    Ok(j) => {
                        let a = Answer::from_json(&j, out.status.code());
                        if a.state == "completed" && a.process_exit.map(|x| x as u64) != a.exit_code
                        {
                            anomalies.push(format!(
                                "exit mismatch: client {k} exited {:?}, its JSON says {:?}",
                                a.process_exit, a.exit_code
                            ));
                        }
                        answers.entry(ids[0].clone()).or_default().push(a);
                    }
                    // Two processes sending one ID at once: the one that lost the race may
                    // say so plainly (the other runs it), never with a database error.
                    Err(_)
                        if plan.via == Via::Twin
                            && String::from_utf8_lossy(&out.stderr)
                                .contains("was accepted by another process at the same moment") =>
                    {
                        answers.entry(ids[0].clone()).or_default().push(Answer {
                            state: "refused".into(),
                            ..Answer::default()
                        })
                    }
                    Err(_) => anomalies.push(format!(
                        "lost: client {k} printed no JSON (exit {:?}): {}",
                        out.status.code(),
                        tail(&out)
                    )),
                }
            }
            Via::Session => session_answers(&text, &out, ids, &mut answers, anomalies),
        }
    }
    answers
}

fn session_answers(
    text: &str,
    out: &Output,
    ids: &[String],
    answers: &mut BTreeMap<String, Vec<Answer>>,
    anomalies: &mut Vec<String>,
) {
    for line in text.lines() {
        let Ok(j) = serde_json::from_str::<serde_json::Value>(line) else {
            anomalies.push(format!(
                "lost: serve printed a line that is not JSON: {line}"
            ));
            continue;
        };
        let k = j["id"].as_u64().unwrap_or(u64::MAX) as usize;
        match ids.get(k) {
            Some(id) if j["result"].is_object() => answers
                .entry(id.clone())
                .or_default()
                .push(Answer::from_json(&j["result"], None)),
            _ => anomalies.push(format!("lost: serve answered {line}")),
        }
    }
    for id in ids {
        if !answers.contains_key(id) {
            anomalies.push(format!(
                "lost: serve never answered {id} (exit {:?}): {}",
                out.status.code(),
                tail(out)
            ));
        }
    }
}

fn tail(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr)
        .lines()
        .rev()
        .take(3)
        .collect::<Vec<_>>()
        .join(" | ")
}

/// After the clients: whatever the journal left open is recovered. With the plan's
/// `kill_recovery`, a first `recover --wait` (or `attach`) is killed part-way first.
fn recover(
    plan: &Plan,
    c: &Client,
    ids: &[String],
    killed: bool,
    dir: &Path,
    anomalies: &mut Vec<String>,
) -> Option<&'static str> {
    // (no -F, -i, --known-hosts, no agent, an empty HOME)
    let cmd = |sub: &str| {
        if plan.bare_recover {
            let home = dir.join("bare-home");
            std::fs::create_dir_all(&home).expect("an empty home");
            c.bare(sub, &home)
        } else {
            c.cmd(sub)
        }
    };
    let open: Vec<&String> = ids
        .iter()
        .filter(|id| c.state(id).is_none_or(|s| !s.is_settled()))
        .collect();
    if open.is_empty() && !killed {
        return None;
    }
    let mut killed_recovery = None;
    if let Some(after) = plan.kill_recovery {
        let (what, x) = if plan.via == Via::Run && after.as_millis() % 2 == 0 {
            let mut x = cmd("attach");
            x.arg(&ids[0]);
            ("attach", x)
        } else {
            let mut x = cmd("recover");
            x.args(["--wait", "--json"]);
            ("recover", x)
        };
        let mut ch = spawn(x);
        sleep(after);
        if matches!(ch.try_wait(), Ok(None)) {
            let _ = ch.kill();
            killed_recovery = Some(what);
        }
        let _ = wait_within(ch, CLIENT_LIMIT);
    }
    let mut x = cmd("recover");
    x.args(["--wait", "--json"]);
    match output_within(x, RECOVER_LIMIT) {
        Err(e) => anomalies.push(format!("overrun: recover --wait: {e}")),
        Ok(o) => {
            // (an `unknown` left after recovery is judged against the host's evidence)
            for id in &open {
                if c.state(id)
                    .is_some_and(|s| !s.is_settled() && s != State::Unknown)
                {
                    anomalies.push(format!(
                        "recover (exit {:?}) left {id} {:?}: {}",
                        o.status.code(),
                        c.state(id),
                        tail(&o)
                    ));
                }
            }
        }
    }
    killed_recovery
}

/// One trial: dispatch, fault, clients, recovery, judgement.
fn trial(seed: u64, i: usize, slot: &Slot<'_>, journal: &Path, dir: &Path) -> TrialResult {
    let plan = Plan::new(seed, i);
    let (h, host) = (slot.hosts, slot.host.as_str());
    let base = format!("t{i}-{:x}", seed & 0xffff_ffff);
    let ids: Vec<String> = match plan.via {
        Via::Run | Via::Twin => vec![base.clone()],
        Via::Session => (0..SESSION_EXECUTIONS)
            .map(|k| format!("{base}-s{k}"))
            .collect(),
    };
    let mut c = h.client(BIN.as_ref(), journal.to_owned());
    c.reconnect_for = format!("{}s", RECONNECT_FOR.as_secs());
    // which host implementation dispatches, and which recovers and is asked for the truth
    let (first_side, then_side) = host_sides(seed, i);
    let mut c_dispatch = c.clone();
    c_dispatch.host_helper = Some(first_side.to_owned());
    c.host_helper = Some(then_side.to_owned());
    let mut res = TrialResult::default();
    let home = h.home(host);

    if plan.first.fault == Fault::Wiped {
        if let Err(e) = h.try_fault(&["wipe-markers", host]) {
            res.anomalies
                .push(format!("injection: wipe-markers failed: {e}"));
        }
    }
    // The host's epoch as the trial begins, to tell afterwards whether a dispatch went out
    // under an epoch the host no longer had (see `stale_dispatch`).
    let epoch_at_start = std::fs::read_to_string(home.join(".cairn/epoch"))
        .ok()
        .and_then(|s| s.split_whitespace().next().map(str::to_owned));
    let mut clients = Clients::spawn(&plan, &c_dispatch, host, &ids, dir);
    aim(&plan, &mut clients, &home, &ids);
    let mut began = vec![];
    for (k, shot) in std::iter::once(plan.first)
        .chain(plan.second.map(|(_, s)| s))
        .enumerate()
    {
        if k == 1 {
            sleep(plan.second.map(|(d, _)| d).unwrap_or_default());
        }
        match inject(shot, &plan, h, host, &mut clients, &ids) {
            Ok(t) => began.push(t),
            Err(e) => {
                undo_everything(h, host);
                res.anomalies
                    .push(format!("injection: {:?} failed: {e}", shot.fault));
                began.push((SystemTime::now(), SystemTime::now()));
            }
        }
    }
    let answers = collect(&plan, &mut clients, &ids, &mut res.anomalies);
    let killed = clients.killed.iter().any(|k| *k);
    res.killed_recovery = recover(&plan, &c, &ids, killed, dir, &mut res.anomalies);
    for id in &ids {
        let (e, mut a) = judge(
            &plan,
            slot,
            &c,
            id,
            &answers,
            &clients,
            &began,
            epoch_at_start.as_deref(),
        );
        res.execs.push(e);
        res.anomalies.append(&mut a);
    }
    for a in res.anomalies.iter_mut() {
        a.push_str(&format!(
            " [--host-helper: {first_side} dispatched, {then_side} recovered]"
        ));
    }
    res
}

/// The `--host-helper` of the dispatching client and of the recovering one in trial `i`:
/// `CAMPAIGN_HOST_HELPER=never` (the sh script throughout), `auto` (the native helper
/// throughout, where it runs), or `mixed` (the default: each of the four pairs in turn, so that
/// every fault also meets an execution dispatched by one implementation and recovered by the
/// other).
fn host_sides(seed: u64, i: usize) -> (&'static str, &'static str) {
    match std::env::var("CAMPAIGN_HOST_HELPER").as_deref() {
        Ok("never") => ("never", "never"),
        Ok("auto") => ("auto", "auto"),
        _ => {
            let k = (seed as usize).wrapping_add(i) % 4;
            let side = |b: bool| if b { "auto" } else { "never" };
            (side(k & 1 == 1), side(k & 2 == 2))
        }
    }
}

// ------------------------------------------------------------------------------ judgement

/// One execution against the host's evidence and the table of allowed answers.
// Each argument is one piece of the trial's evidence; a struct holding them would only rename it.
// Long: the checks of one execution against the host's evidence, in order, each adding to
// one list of what is wrong.
#[allow(clippy::too_many_arguments)]
fn judge(
    plan: &Plan,
    slot: &Slot<'_>,
    c: &Client,
    id: &str,
    answers: &BTreeMap<String, Vec<Answer>>,
    clients: &Clients,
    began: &[(SystemTime, SystemTime)],
    epoch_at_start: Option<&str>,
) -> (Exec, Vec<String>) {
    let (h, host) = (slot.hosts, slot.host.as_str());
    let mut bad = Vec::new();
    // An execution left open may still be running on the host: let it finish first.
    let mut facts = host_facts(h, host, id).unwrap_or_else(|e| {
        bad.push(format!("host facts: {e}"));
        HostFacts::default()
    });
    let t = Instant::now();
    while facts.started.is_some() && facts.done.is_none() && t.elapsed() < Duration::from_secs(10) {
        sleep(Duration::from_millis(200));
        facts = host_facts(h, host, id).unwrap_or_default();
    }
    let landings: Vec<Landing> = began.iter().map(|b| landing(&facts, *b)).collect();
    let state = c.state(id);
    let e = Exec {
        id: id.to_owned(),
        host: host.to_owned(),
        set: h.prefix.clone(),
        fault: plan.first.fault,
        second: plan.second.map(|(_, s)| s.fault),
        landing: landings[0],
        via: plan.via,
        answer: String::new(),
        final_state: state
            .map(|s| s.as_str().to_owned())
            .unwrap_or("absent".into()),
    };
    let mut e = e;
    if facts.count > 1 {
        bad.push(format!("ran twice: counter {}", facts.count));
    }
    let want = expected_bytes(plan, &facts);
    // What each client reported.
    let got = answers.get(id).cloned().unwrap_or_default();
    let expected_answers = clients.killed.iter().filter(|k| !**k).count();
    if got.len() < expected_answers {
        // (collect() said why)
        e.answer = "lost".into();
    }
    for a in got.iter().filter(|a| a.state != "refused") {
        e.answer = a.state.clone();
        let mut ok_states: BTreeSet<&str> = BTreeSet::new();
        ok_states.extend(allowed(plan.first.fault, landings[0], plan.first.len));
        if let Some((_, s)) = plan.second {
            ok_states.extend(allowed(s.fault, landings[1], s.len));
        }
        if unreachable_for(plan, began) >= OUTLASTS {
            // (a reboot that took long, or two outages back to back, can outlast the window
            // as one long outage does)
            ok_states.insert("unknown");
        }
        if !ok_states.contains(a.state.as_str()) {
            bad.push(format!(
                "wrong state: answered {} ({:?}) where {:?} landed {:?} (len {:?}) allows {ok_states:?}",
                a.state, a.reason, plan.first.fault, landings, plan.first.len
            ));
        }
        check_against_host(
            &a.state,
            a.exit_code,
            &a.stdout,
            &a.stderr,
            &facts,
            &want,
            "answer",
            &mut bad,
        );
    }
    if got.is_empty() && e.answer.is_empty() {
        e.answer = "none".into();
    }
    // What the journal settled on after recovery.
    match state {
        None => check_against_host(
            "absent", None, &None, &None, &facts, &want, "journal", &mut bad,
        ),
        // A dispatch cut off before the host answered it, after the host's marker home was
        // wiped, leaves no evidence on the host (see `allowed`): `unknown` is the truth.
        Some(State::Unknown)
            if no_evidence(plan, landings[0], &facts)
                || stale_dispatch(c, id, epoch_at_start, landings[0], &facts) =>
        {
            e.final_state = "unknown-without-evidence".into();
        }
        Some(s) => {
            let st = s.as_str();
            let (code, out, err) = if matches!(s, State::Completed | State::Delivered) {
                stored_result(c, id)
            } else {
                (None, None, None)
            };
            let st = if st == "delivered" { "completed" } else { st };
            check_against_host(st, code, &out, &err, &facts, &want, "journal", &mut bad);
        }
    }
    let events = if bad.is_empty() {
        String::new()
    } else {
        journal_events(c, id)
    };
    let bad = bad
        .into_iter()
        .map(|b| {
            format!(
                "{id} on {host} ({}): {b} [plan {plan:?}; landed {landings:?}; host: ran {} started {:?} done {:?}; answers {got:?}; journal: {events}]",
                h.flavour.as_str(),
                facts.count,
                facts.started,
                facts.done.as_ref().map(|d| &d.1)
            )
        })
        .collect();
    (e, bad)
}

/// How long the host was out of reach, measured: from the first fault that takes it out of
/// reach (cut, hang, reboot, sshd down) beginning to the last one being over.
fn unreachable_for(plan: &Plan, began: &[(SystemTime, SystemTime)]) -> Duration {
    let out = |f: Fault| {
        matches!(
            f,
            Fault::Cut | Fault::Hang | Fault::Reboot | Fault::Wiped | Fault::SshdDown
        )
    };
    let faults = std::iter::once(plan.first.fault).chain(plan.second.map(|(_, s)| s.fault));
    let spans: Vec<(SystemTime, SystemTime)> = faults
        .zip(began.iter().copied())
        .filter(|(f, _)| out(*f))
        .map(|(_, w)| w)
        .collect();
    match (spans.first(), spans.last()) {
        (Some(a), Some(b)) => b.1.duration_since(a.0).unwrap_or_default(),
        _ => Duration::ZERO,
    }
}

/// Whether the host can hold no evidence of the execution: its marker home was wiped before
/// the dispatch, the fault cut the dispatch off before the host answered, and nothing of it
/// is on the host.
fn no_evidence(plan: &Plan, landing: Landing, facts: &HostFacts) -> bool {
    plan.first.fault == Fault::Wiped
        && landing == Landing::BeforeStart
        && facts.started.is_none()
        && facts.done.is_none()
        && facts.count == 0
}

/// Whether the execution was dispatched under an epoch its host no longer had when the trial
/// began (an earlier trial's wipe that the journal never saw), and the fault cut the dispatch
/// off before the host answered, with nothing of it on the host: the client cannot tell "never
/// arrived" from "arrived, then the home was wiped", so `unknown` is the truth.
fn stale_dispatch(
    c: &Client,
    id: &str,
    epoch_at_start: Option<&str>,
    landing: Landing,
    facts: &HostFacts,
) -> bool {
    let (Some(now), Ok(j), Ok(eid)) = (
        epoch_at_start,
        cairn::journal::Journal::open(&c.journal),
        cairn::ExecutionId::parse(id),
    ) else {
        return false;
    };
    let dispatched_under: Vec<String> = j
        .events(&eid)
        .unwrap_or_default()
        .iter()
        .filter(|e| e.kind == cairn::EventKind::Dispatched)
        .filter_map(|e| e.evidence["epoch"].as_str().map(str::to_owned))
        .collect();
    landing == Landing::BeforeStart
        && facts.started.is_none()
        && facts.done.is_none()
        && facts.count == 0
        && !dispatched_under.is_empty()
        && dispatched_under.iter().all(|e| e != now)
}

/// The bytes a completed execution must return: the plan's lines, or the host's files where
/// the fault may have cost bytes (and then they must be what the host has).
fn expected_bytes(plan: &Plan, facts: &HostFacts) -> (String, String) {
    let faults = std::iter::once(plan.first.fault).chain(plan.second.map(|(_, s)| s.fault));
    if faults.into_iter().any(touches_output) {
        (
            String::from_utf8_lossy(&facts.out).into_owned(),
            String::from_utf8_lossy(&facts.err).into_owned(),
        )
    } else {
        (numbered("line", plan.lines), numbered("err", plan.lines))
    }
}

/// A state with its exit code and bytes against the host's evidence.
#[allow(clippy::too_many_arguments)]
fn check_against_host(
    state: &str,
    code: Option<u64>,
    out: &Option<String>,
    err: &Option<String>,
    facts: &HostFacts,
    want: &(String, String),
    what: &str,
    bad: &mut Vec<String>,
) {
    let done_status = facts
        .done
        .as_ref()
        .and_then(|(_, d)| field(d, "status"))
        .and_then(|s| s.parse::<u64>().ok());
    match (state, &facts.done, facts.started.is_some()) {
        ("completed", Some(_), _) => {
            if code != done_status {
                bad.push(format!("lost: {what} exit {code:?}, host status {done_status:?}"));
            }
            if out.as_deref() != Some(want.0.as_str()) {
                bad.push(format!("lost: {what} stdout {out:?}, want {:?}", want.0));
            }
            if err.as_deref() != Some(want.1.as_str()) {
                bad.push(format!("lost: {what} stderr {err:?}, want {:?}", want.1));
            }
        }
        ("completed", None, _) => bad.push(format!("wrong state: {what} completed without a finish record")),
        // (a client that gave up claims nothing; the table decides whether it may)
        ("unknown", _, _) if what == "answer" => {}
        (_, Some(_), _) => bad.push(format!("lost: {what} {state} while the host has a finish record")),
        ("interrupted", None, true) => {}
        ("failed" | "absent", None, false) if facts.count == 0 => {}
        ("failed" | "absent", None, _) => bad.push(format!(
            "wrong state: {what} {state} but it ran {} time(s), started {}",
            facts.count,
            facts.started.is_some()
        )),
        ("unknown", None, _) => bad.push(format!(
            "unknown: the {what} says unknown after recovery, with every host reachable (started {})",
            facts.started.is_some()
        )),
        (st, None, started) => bad.push(format!("wrong state: {what} {st} (started {started})")),
    }
}

/// The journal's events of `id` (kind, state, who appended it, its reason), for the evidence.
fn journal_events(c: &Client, id: &str) -> String {
    let Ok(j) = cairn::journal::Journal::open(&c.journal) else {
        return "(journal not readable)".into();
    };
    let Ok(eid) = cairn::ExecutionId::parse(id) else {
        return "(bad id)".into();
    };
    j.events(&eid)
        .map(|evs| {
            evs.iter()
                .map(|e| {
                    let why = e
                        .evidence
                        .get("reason")
                        .and_then(|r| r.as_str())
                        .unwrap_or("");
                    format!("{} {} {:?} by {} {why}", e.at, e.kind, e.state, e.client)
                })
                .collect::<Vec<_>>()
                .join(" | ")
        })
        .unwrap_or_else(|e| format!("(events: {e})"))
}

/// The journal's stored result of a settled execution: exit code, stdout, stderr.
fn stored_result(c: &Client, id: &str) -> (Option<u64>, Option<String>, Option<String>) {
    let mut x = c.cmd("status");
    x.args([id, "--json"]);
    let code = output_within(x, Duration::from_secs(60))
        .ok()
        .and_then(|o| {
            serde_json::from_slice::<serde_json::Value>(&o.stdout)
                .ok()?
                .get("exit_code")?
                .as_u64()
        });
    let stream = |stderr: bool| {
        let mut x = c.cmd("output");
        x.arg(id);
        if stderr {
            x.arg("--stderr");
        }
        output_within(x, Duration::from_secs(60))
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
    };
    (code, stream(false), stream(true))
}

// ------------------------------------------------------------------------------ the run

/// After all trials: every host recounted. At most one run per execution; none for an
/// execution judged failed or absent from the journal; no run the campaign did not judge.
fn ground_truth(slots: &[Slot<'_>], execs: &[Exec]) -> Vec<String> {
    let mut bad = Vec::new();
    let by_id: BTreeMap<&str, &Exec> = execs.iter().map(|e| (e.id.as_str(), e)).collect();
    for s in slots {
        let o = s.hosts.exec(
            &s.host,
            &[
                "sh",
                "-c",
                "for f in /var/log/cairn-count-*; do [ -f \"$f\" ] && echo \"${f#/var/log/cairn-count-} $(wc -l < \"$f\")\"; done; true",
            ],
        );
        for line in String::from_utf8_lossy(&o.stdout).lines() {
            let mut w = line.split_whitespace();
            let (Some(id), Some(n)) = (w.next(), w.next().and_then(|n| n.parse::<usize>().ok()))
            else {
                continue;
            };
            match by_id.get(id) {
                None => bad.push(format!(
                    "ground truth: {id} ran {n} time(s) on {} but no trial judged it",
                    s.host
                )),
                Some(e) if e.host != s.host => bad.push(format!(
                    "ground truth: {id} of {} ran on {}",
                    e.host, s.host
                )),
                Some(_) if n > 1 => {
                    bad.push(format!("ground truth: {id} ran {n} times on {}", s.host))
                }
                Some(e)
                    if matches!(
                        e.final_state.as_str(),
                        "failed" | "absent" | "unknown-without-evidence"
                    ) =>
                {
                    bad.push(format!(
                        "ground truth: {id} judged {} but ran {n} time(s) on {}",
                        e.final_state, s.host
                    ))
                }
                Some(_) => {}
            }
        }
        let x = s.hosts.home(&s.host).join(".cairn/x");
        for ent in std::fs::read_dir(&x).into_iter().flatten().flatten() {
            let name = ent.file_name().to_string_lossy().into_owned();
            let Some(id) = name.strip_suffix(".start") else {
                continue;
            };
            if let Some(e) = by_id.get(id) {
                if matches!(
                    e.final_state.as_str(),
                    "failed" | "absent" | "unknown-without-evidence"
                ) {
                    bad.push(format!(
                        "ground truth: {id} judged {} but has a started record on {}",
                        e.final_state, s.host
                    ));
                }
            }
        }
    }
    bad
}

fn seed_from_env() -> u64 {
    match std::env::var("CAMPAIGN_SEED") {
        Ok(v) => match v.strip_prefix("0x") {
            Some(hex) => u64::from_str_radix(hex, 16).expect("CAMPAIGN_SEED"),
            None => v.parse().expect("CAMPAIGN_SEED"),
        },
        Err(_) => splitmix64(
            SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos() as u64)
                .unwrap_or(1),
        ),
    }
}

/// The whole campaign (the test `docker::all_faults_randomized_campaign`).
pub(super) fn run() {
    if !docker_enabled("docker::all_faults_randomized_campaign") {
        return;
    }
    let t0 = Instant::now();
    let trials: usize = std::env::var("CAMPAIGN_TRIALS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(200);
    let seed = seed_from_env();
    say(&format!(
        "fault campaign: seed={seed} trials={trials} (repeat with CAMPAIGN_SEED={seed})"
    ));
    // (the third set's hosts share one host key, as hosts cloned from one image do; its
    // aliases are the other sets' too, each set with its own ssh_config)
    let sets = [
        Hosts::up("camp-ash", Flavour::Ash, 3),
        Hosts::up("camp-deb", Flavour::Debian, 3),
        Hosts::up_with("camp-key", Flavour::Ash, 3, &["--shared-host-key"]),
    ];
    let dir = tempfile::tempdir().expect("tempdir");
    // One journal for every trial of the run, as one operator's machine has.
    let journal = dir.path().join("journal.db");
    let slots: Vec<Slot<'_>> = sets
        .iter()
        .flat_map(|h| {
            (1..=h.n).map(move |k| Slot {
                hosts: h,
                host: format!("h{k}"),
            })
        })
        .collect();
    let next = AtomicUsize::new(0);
    let done = AtomicUsize::new(0);
    let results: Mutex<Vec<(usize, TrialResult)>> = Mutex::new(Vec::new());
    std::thread::scope(|sc| {
        for slot in &slots {
            let (next, done, results, dir, journal) =
                (&next, &done, &results, dir.path(), journal.as_path());
            sc.spawn(move || loop {
                let i = next.fetch_add(1, Ordering::SeqCst);
                if i >= trials {
                    break;
                }
                let r = trial(seed, i, slot, journal, dir);
                for a in &r.anomalies {
                    say(&format!(
                        "fault campaign: ANOMALY trial {i} (seed {seed}): {a}"
                    ));
                }
                results
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .push((i, r));
                let n = done.fetch_add(1, Ordering::SeqCst) + 1;
                if n % 25 == 0 {
                    say(&format!(
                        "fault campaign: {n}/{trials} trials, {:.0}s",
                        t0.elapsed().as_secs_f64()
                    ));
                }
            });
        }
    });
    let results = results.into_inner().unwrap_or_else(|p| p.into_inner());
    report(seed, trials, t0, &slots, results);
}

/// The distribution, the ground truth and the campaign line; fails on any anomaly.
// Long: prints the distribution, the ground truth and the campaign line in that order, then
// fails on an anomaly.
fn report(
    seed: u64,
    trials: usize,
    t0: Instant,
    slots: &[Slot<'_>],
    results: Vec<(usize, TrialResult)>,
) {
    let mut anomalies: Vec<String> = Vec::new();
    let mut execs: Vec<Exec> = Vec::new();
    for (i, r) in results.iter() {
        anomalies.extend(r.anomalies.iter().map(|a| format!("trial {i}: {a}")));
        execs.extend(r.execs.iter().cloned());
    }
    let truth = ground_truth(slots, &execs);
    for t in &truth {
        say(&format!("fault campaign: ANOMALY (seed {seed}): {t}"));
    }
    anomalies.extend(truth);
    let mut by: BTreeMap<String, usize> = BTreeMap::new();
    let mut mid: BTreeMap<Fault, usize> = BTreeMap::new();
    for e in &execs {
        let second = e.second.map(|s| format!("+{s:?}")).unwrap_or_default();
        *by.entry(format!(
            "{:?}{second}/{:?}/{}->{}",
            e.fault, e.landing, e.answer, e.final_state
        ))
        .or_default() += 1;
        if e.landing == Landing::MidRun {
            *mid.entry(e.fault).or_default() += 1;
        }
    }
    say(&format!(
        "fault campaign: {:.0}s; fault/landing/answer->final: {}",
        t0.elapsed().as_secs_f64(),
        by.iter()
            .map(|(k, n)| format!("{k}={n}"))
            .collect::<Vec<_>>()
            .join(" ")
    ));
    let mut per_set: BTreeMap<&str, usize> = BTreeMap::new();
    for e in &execs {
        *per_set.entry(e.set.as_str()).or_default() += 1;
    }
    say(&format!(
        "fault campaign: executions per host set: {per_set:?}"
    ));
    say(&format!(
        "fault campaign: mid-run executions per fault: {}",
        fault_kinds()
            .iter()
            .map(|f| format!("{f:?}={}", mid.get(f).copied().unwrap_or(0)))
            .collect::<Vec<_>>()
            .join(" ")
    ));
    let count = |p: &dyn Fn(&Exec) -> bool| execs.iter().filter(|e| p(e)).count();
    // (a recovery killed part-way, then the final `recover --wait`: how often each ran)
    let killed_recoveries = |what: &str| {
        results
            .iter()
            .filter(|(_, r)| r.killed_recovery == Some(what))
            .count()
    };
    // Every fault kind (but none) must have landed mid-run often enough to mean something.
    let kinds = fault_kinds();
    let min_mid = (trials / (kinds.len() * 5)).max(1);
    for f in kinds.iter().filter(|f| **f != Fault::None) {
        let n = mid.get(f).copied().unwrap_or(0);
        if n < min_mid {
            anomalies.push(format!(
                "{f:?} landed mid-run {n} time(s), fewer than {min_mid}"
            ));
        }
    }
    // A recovery killed part-way must really happen in a run of the default size or larger
    // (a killed attach is rarer: counted, not required).
    if results.len() >= 200 && killed_recoveries("recover") == 0 {
        anomalies.push(format!(
            "no recover was killed part-way in {} trials",
            results.len()
        ));
    }
    let of_kind = |p: &str| anomalies.iter().filter(|a| a.contains(p)).count();
    let line = format!(
        "campaign: trials={} executions={} through_host_sessions={} twins={} double_faults={} \
         ran_twice={} lost_results={} wrong_state={} anomalies={} unknown={} \
         unknown_without_evidence={} answered_unknown={} interrupted={} \
         killed_recovers={} killed_attaches={}",
        results.len(),
        execs.len(),
        count(&|e| e.via == Via::Session),
        count(&|e| e.via == Via::Twin),
        count(&|e| e.second.is_some()),
        of_kind("ran twice"),
        of_kind("lost:"),
        of_kind("wrong state"),
        anomalies.len(),
        count(&|e| e.final_state == "unknown"),
        count(&|e| e.final_state == "unknown-without-evidence"),
        count(&|e| e.answer == "unknown"),
        count(&|e| e.final_state == "interrupted"),
        killed_recoveries("recover"),
        killed_recoveries("attach"),
    );
    // (again last, beside the totals: a CI log that keeps only its tail still names the
    // seed and what went wrong)
    for a in anomalies.iter().take(10) {
        say(&format!("fault campaign: ANOMALY (seed {seed}): {a}"));
    }
    say(&format!("{line} seed={seed}"));
    assert_eq!(results.len(), trials, "every trial ran");
    assert!(
        anomalies.is_empty(),
        "the fault campaign found {} anomalies (seed {seed}):\n{}",
        anomalies.len(),
        anomalies.join("\n")
    );
}
