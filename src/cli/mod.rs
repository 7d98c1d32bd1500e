//! The `cairn` command line, in the habits of `ssh`.
//!
//! Exit codes: the remote exit status when it is known; 255 when nothing was dispatched (bad
//! input, unreachable host, refused host key, the host refused the dispatch); 254 when the
//! outcome is `interrupted` or `unknown`; 0 for `--detach` once the command is running.

use std::ffi::OsString;
use std::io::Write;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};

pub mod fleet;
pub mod gateway;
mod ledger;
pub mod listen;
pub mod ops;

use crate::evidence::SessionEvidence;
use crate::executor::EXIT_UNKNOWN;
use crate::executor::{ExecError, Executor, Outcome, OutputSink, RunRequest};
use crate::id::ExecutionId;
use crate::journal::Journal;
use crate::machine::{Machine, Note, Step, Wait, Why};
use crate::options::HostOptions;
use crate::outcome::Capture;
use crate::recovery::Probe;
use crate::ssh::ConnectOptions;
use crate::state::State;

#[derive(Parser, Debug)]
#[command(
    name = "cairn",
    version,
    about = "Run commands on remote hosts over SSH so that a dropped connection never turns into a second run",
    after_help = "Exit codes: the remote exit status when known; 255 nothing was dispatched; \
                  254 outcome interrupted or unknown (see `cairn status ID`)."
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Run COMMAND on HOST (as `ssh HOST COMMAND` would), surviving connection loss.
    Run(RunArgs),
    /// The journal's record of an execution plus a fresh probe of the host.
    Status {
        id: String,
        #[command(flatten)]
        common: Common,
        #[arg(long)]
        json: bool,
    },
    /// Stream an execution's output from the stored offsets, wait, exit with its status.
    Attach {
        id: String,
        #[command(flatten)]
        common: Common,
        #[arg(long)]
        json: bool,
    },
    /// Print an execution's whole stdout (or stderr) as stored on the host.
    Output {
        id: String,
        #[arg(long)]
        stderr: bool,
        #[command(flatten)]
        common: Common,
    },
    /// List executions in the journal.
    Ls {
        #[arg(long)]
        state: Option<State>,
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        common: Common,
    },
    /// Apply the recovery table to every execution that is not settled.
    Recover {
        #[arg(long)]
        json: bool,
        /// Wait for running executions to finish instead of reporting them as running.
        #[arg(long)]
        wait: bool,
        #[command(flatten)]
        common: Common,
    },
    /// Remove old output on every host in the journal, keeping small tombstones so that the
    /// start guard outlives the output. Never touches a running execution.
    Gc {
        /// Remove the output of executions that finished longer ago than this.
        #[arg(long, default_value = "7d", value_parser = parse_duration)]
        output_retention: Duration,
        /// Remove the records (tombstones) themselves after this; a retry of the same ID
        /// arriving later would run again, so keep this longer than any retry window.
        #[arg(long, default_value = "30d", value_parser = parse_duration)]
        tombstone_retention: Duration,
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        common: Common,
    },
    /// Check the journal's hash chain and anchor, or show one execution's timeline.
    Audit {
        #[command(subcommand)]
        command: AuditCommand,
    },
    /// Executions waiting for a human (unknown, interrupted), with their original record.
    Review(gateway::ReviewArgs),
    /// Record a human decision about an execution under review, as evidence.
    Resolve(gateway::ResolveArgs),
    /// Which client processes and gateway runs existed, when, and what they created.
    Sessions(gateway::SessionsArgs),
    /// JSON-RPC 2.0 server for gateways, on stdin/stdout (docs/GATEWAYS.md).
    Serve(gateway::ServeArgs),
    /// MCP server on stdin/stdout (or Streamable HTTP with --listen): tools to run a command,
    /// get its status, read its output.
    Mcp(gateway::McpArgs),
    /// Bearer tokens for `cairn mcp --listen`: add (printed once, stored hashed), ls, revoke.
    Token {
        #[command(subcommand)]
        command: listen::TokenCommand,
    },
    /// Print the options cairn resolved for DESTINATION from ssh_config and the flags, in the
    /// format of `ssh -G` (the keywords cairn uses). Contacts nothing.
    Config {
        destination: String,
        #[command(flatten)]
        common: Common,
    },
    /// Call a named operation of an operations file: `cairn op NAME key=value …`
    /// (docs/OPERATIONS.md).
    Op(ops::OpArgs),
    /// Operations files: `check FILE` (refuse unsafe contracts), `doc FILE` (Markdown).
    Ops {
        #[command(subcommand)]
        command: ops::OpsCommand,
    },
    /// Fleet batches: `ls`, `status B`, `resume B`.
    Batch {
        #[command(subcommand)]
        command: fleet::BatchCommand,
    },
    /// Stop an execution's remote process group and record `cancelled`.
    Cancel {
        id: String,
        /// Seconds between TERM and KILL.
        #[arg(long, default_value_t = 5)]
        grace: u64,
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        common: Common,
    },
}

#[derive(Subcommand, Debug)]
pub enum AuditCommand {
    /// Verify the journal offline: every entry against its hash and predecessor, every execution
    /// record against its accepted event, the chain head against the anchor (on PostgreSQL:
    /// every execution's and session's chain against its stored head and the sealed
    /// checkpoints). Exit 0 when intact, 1 when damage was found.
    Verify {
        #[arg(long, env = "CAIRN_JOURNAL")]
        journal: Option<PathBuf>,
        /// Anchor file (default: <journal>.anchor; its key is <anchor>.key).
        #[arg(long, env = "CAIRN_ANCHOR")]
        anchor: Option<PathBuf>,
        /// PostgreSQL journal: the replicas' seal key, to check the checkpoints' MACs.
        #[arg(long, env = "CAIRN_SEAL_KEY")]
        seal_key: Option<PathBuf>,
        #[arg(long)]
        json: bool,
    },
    /// PostgreSQL journal: seal a checkpoint now over every chain head that changed since the
    /// last one (replicas with CAIRN_SEAL_KEY set do so every CAIRN_SEAL_INTERVAL seconds).
    Seal {
        #[arg(long, env = "CAIRN_JOURNAL")]
        journal: Option<PathBuf>,
        /// The seal key every replica holds (at least 32 bytes).
        #[arg(long, env = "CAIRN_SEAL_KEY")]
        seal_key: PathBuf,
    },
    /// One execution's timeline, as an investigator reads it.
    Show {
        id: String,
        #[arg(long, env = "CAIRN_JOURNAL")]
        journal: Option<PathBuf>,
        #[arg(long)]
        json: bool,
    },
}

/// Options every command that talks to a host takes.
#[derive(Args, Debug, Clone)]
pub struct Common {
    /// Journal: a SQLite file (default: $XDG_STATE_HOME/cairn/journal.db), or a PostgreSQL
    /// database shared by replicas (postgres://USER@HOST/DB; see docs/REPLICAS.md).
    #[arg(long, env = "CAIRN_JOURNAL")]
    pub journal: Option<PathBuf>,
    /// Port to connect to (overrides ssh_config).
    #[arg(short = 'p', long)]
    pub port: Option<u16>,
    /// Identity (private key) file; may be repeated.
    #[arg(short = 'i', long = "identity")]
    pub identity: Vec<PathBuf>,
    /// ssh_config file (default ~/.ssh/config).
    #[arg(short = 'F', long = "ssh-config")]
    pub ssh_config: Option<PathBuf>,
    /// known_hosts file (default ~/.ssh/known_hosts); with jump hosts, the only file consulted
    /// for every hop too.
    #[arg(long)]
    pub known_hosts: Option<PathBuf>,
    /// Jump hosts, reached in order: [user@]host[:port][,...], or `none` (wins over
    /// ssh_config's ProxyJump, as with ssh -J).
    #[arg(short = 'J', long = "jump", value_name = "HOPS")]
    pub jump: Option<String>,
    /// Record the host key of a host not yet in known_hosts (never a changed one).
    #[arg(long)]
    pub accept_new: bool,
    /// Deadline for one connection attempt (TCP, handshake and authentication); default
    /// ssh_config's ConnectTimeout, else 15s.
    #[arg(long, value_parser = parse_duration)]
    pub connect_timeout: Option<Duration>,
    /// After losing the host, how long to keep trying to reach it before reporting `unknown`.
    #[arg(long, default_value = "5m", value_parser = parse_duration)]
    pub reconnect_for: Duration,
    /// Time between keepalives; three unanswered ones drop the connection. Default
    /// ssh_config's ServerAliveInterval, else 5s.
    #[arg(long, value_parser = parse_duration)]
    pub keepalive: Option<Duration>,
    /// The intent fingerprint key (created 0600 on first use; default: intent.key next to
    /// the journal).
    #[arg(long, env = "CAIRN_INTENT_KEY")]
    pub intent_key: Option<PathBuf>,
    /// Which host implementation runs the marker protocol: auto (the native helper, uploaded
    /// into the marker home on first contact, where it runs; the sh script elsewhere), never
    /// (the sh script only), always (the helper, or fail).
    #[arg(long, env = "CAIRN_HOST_HELPER", default_value = "auto")]
    pub host_helper: crate::host_helper::HostHelper,
    /// With a PostgreSQL journal: how long this process's ownership of its executions lasts
    /// without a heartbeat (it heartbeats every third of it); past it, another replica takes
    /// them over (docs/REPLICAS.md).
    #[arg(long, env = "CAIRN_LEASE_FOR", default_value = "15s", value_parser = parse_duration)]
    pub lease_for: Duration,
}

#[derive(Args, Debug)]
pub struct RunArgs {
    /// [user@]host, or an alias from ssh_config (absent with --hosts / --inventory).
    pub destination: Option<String>,
    /// The command, run by the remote account's shell as with ssh.
    #[arg(last = true, required = true, num_args = 1.., allow_hyphen_values = true)]
    pub command: Vec<OsString>,
    #[command(flatten)]
    pub common: Common,
    /// Caller-chosen execution ID ([A-Za-z0-9_-]{1,128}).
    #[arg(long)]
    pub id: Option<String>,
    /// Return as soon as the command is durably started on the host; print its ID.
    #[arg(long)]
    pub detach: bool,
    /// Stop the command on the host after this long (enforced by the host's supervisor).
    #[arg(long, value_parser = parse_duration)]
    pub timeout: Option<Duration>,
    /// Marker directory on the host (relative to the account's home).
    #[arg(long, env = "CAIRN_REMOTE_DIR", default_value = crate::options::DEFAULT_REMOTE_DIR)]
    pub remote_dir: String,
    /// Print one JSON object describing the outcome instead of streaming output.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub intent: Box<gateway::IntentArgs>,
    /// Many hosts: --hosts, --inventory, --parallel, --batch-size, … (src/cli/fleet.rs).
    #[command(flatten)]
    pub fleet: fleet::FleetArgs,
}

pub(crate) use crate::options::parse_duration;

impl Common {
    pub(crate) fn connect_options(&self) -> ConnectOptions {
        let d = ConnectOptions::default();
        ConnectOptions {
            ssh_config: self.ssh_config.clone(),
            port: self.port,
            identity: self.identity.clone(),
            known_hosts: self.known_hosts.clone(),
            accept_new: self.accept_new,
            connect_timeout: self.connect_timeout.unwrap_or(d.connect_timeout),
            connect_timeout_explicit: self.connect_timeout.is_some(),
            keepalive_interval: self.keepalive.unwrap_or(d.keepalive_interval),
            keepalive_explicit: self.keepalive.is_some(),
            jump: self.jump.clone(),
            ..d
        }
    }

    /// The library's options from these flags.
    pub fn host_options(&self) -> HostOptions {
        crate::journal::set_lease_for(self.lease_for);
        HostOptions {
            journal: self.journal.clone(),
            connect: self.connect_options(),
            reconnect_for: self.reconnect_for,
            intent_key: self.intent_key.clone(),
            host_helper: self.host_helper,
        }
    }

    pub(crate) fn executor(&self) -> Result<Executor, ExecError> {
        crate::runner::ExecutorBuilder::host(&self.host_options()).build()
    }
}

/// Streams output to this process's stdout/stderr as it arrives; with `--json`, keeps a
/// bounded copy for the JSON object instead.
struct Terminal {
    json: bool,
    kept: Capture,
}

impl Terminal {
    fn new(json: bool) -> Terminal {
        Terminal {
            json,
            kept: Capture {
                cap: 1 << 20,
                ..Capture::default()
            },
        }
    }
}

impl OutputSink for Terminal {
    fn stdout(&mut self, d: &[u8]) -> std::io::Result<()> {
        if self.json {
            return self.kept.stdout(d);
        }
        let mut o = std::io::stdout().lock();
        o.write_all(d)?;
        o.flush()
    }
    fn stderr(&mut self, d: &[u8]) -> std::io::Result<()> {
        if self.json {
            return self.kept.stderr(d);
        }
        let mut e = std::io::stderr().lock();
        e.write_all(d)?;
        e.flush()
    }
}

fn outcome_json(o: &Outcome, term: Option<&Terminal>) -> serde_json::Value {
    crate::outcome::outcome_json(o, term.map(|t| &t.kept))
}

fn print_json(v: &serde_json::Value) {
    println!("{}", serde_json::to_string(v).unwrap_or_default());
}

/// Say what is known, and what is not, when the outcome is not a plain exit status.
fn explain(o: &Outcome) {
    match o.state {
        State::Interrupted | State::Unknown => eprintln!(
            "cairn: {} is {}: {}\ncairn: it was not run again. Inspect with `cairn status {}`.",
            o.execution_id,
            o.state,
            o.reason.as_deref().unwrap_or("no finish record"),
            o.execution_id
        ),
        State::Failed => eprintln!(
            "cairn: {} failed before it started: {}",
            o.execution_id,
            o.reason.as_deref().unwrap_or("")
        ),
        State::Cancelled => eprintln!("cairn: {} was cancelled", o.execution_id),
        State::Rejected => eprintln!(
            "cairn: {} was not authorized: {}",
            o.execution_id,
            o.reason.as_deref().unwrap_or("")
        ),
        _ => {}
    }
}

fn parse_id(s: &str) -> Result<ExecutionId, ExecError> {
    ExecutionId::parse(s).map_err(|e| ExecError::InvalidRequest(e.to_string()))
}

/// The binary's whole `main` (reached as `cairn::testing::main`, not API): parse the command
/// line, set up logging, run the command on the process's one runtime (`crate::rt`), and exit
/// with its code.
pub fn binary() -> ! {
    let cli = match Cli::try_parse() {
        Ok(c) => c,
        Err(e) => {
            let code = if e.use_stderr() { 255 } else { 0 };
            let _ = e.print();
            std::process::exit(code);
        }
    };
    // cairn's own messages go to stderr as `cairn: …`; CAIRN_LOG=debug shows more.
    let filter = tracing_subscriber::EnvFilter::try_from_env("CAIRN_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("cairn=info,russh=warn"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        // Colour codes only on a terminal: logs that go to a file or a collector stay plain.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_target(false)
        .with_level(false)
        .without_time()
        .init();
    // The process's one runtime: the command runs on this thread, its I/O on the runtime's
    // workers.
    let code = crate::rt::block_on(main(cli));
    // `exit` runs no destructor: stop the runtime first, so that what it holds ends as it
    // would (a ProxyCommand is hung up and stops holding our stderr).
    crate::rt::shutdown();
    std::process::exit(code);
}

/// Run the CLI; returns the process exit code.
pub async fn main(cli: Cli) -> i32 {
    match dispatch(cli).await {
        Ok(code) => code,
        Err(e) => {
            eprintln!("cairn: {e}");
            e.exit_code()
        }
    }
}

async fn dispatch(cli: Cli) -> Result<i32, ExecError> {
    // A key's passphrase may be asked on the terminal, as ssh asks it; never by the servers.
    crate::ssh::allow_prompts(!matches!(cli.command, Command::Serve(_) | Command::Mcp(_)));
    match cli.command {
        Command::Run(args) => run(args).await,
        Command::Status { id, common, json } => status(&parse_id(&id)?, &common, json).await,
        Command::Attach { id, common, json } => {
            let id = parse_id(&id)?;
            let mut ex = common.executor()?;
            let mut term = Terminal::new(json);
            let o = ex.attach(&id, &mut term).await?;
            finish(&mut ex, &o, json.then_some(&term))
        }
        Command::Output { id, stderr, common } => output(&id, stderr, &common).await,
        Command::Ls {
            state,
            json,
            common,
        } => ls(state, json, &common),
        Command::Recover { json, wait, common } => recover(&common, json, wait).await,
        Command::Audit { command } => audit(command),
        Command::Batch { command } => crate::fleet::batch(command.options()).await,
        Command::Review(a) => gateway::review(a),
        Command::Resolve(a) => gateway::resolve(a).await,
        Command::Sessions(a) => gateway::sessions(a),
        Command::Serve(a) => {
            crate::front::stdio::main(a.server.config_with_operations("serve")?).await
        }
        Command::Mcp(a) => match a.http.options(a.server.actor.is_some())? {
            Some(http) => {
                crate::front::http::serve_mcp(a.server.config_with_operations("mcp")?, http).await
            }
            None => crate::front::mcp::main(a.server.config_with_operations("mcp")?).await,
        },
        Command::Token { command } => listen::token(command),
        Command::Op(a) => ops::op(a).await,
        Command::Ops { command } => ops::ops(command),
        Command::Gc {
            output_retention,
            tombstone_retention,
            json,
            common,
        } => gc(output_retention, tombstone_retention, json, &common).await,
        Command::Config {
            destination,
            common,
        } => {
            let target = crate::ssh::resolve(&destination, &common.connect_options())?;
            for (keyword, value) in crate::ssh::ssh_g_lines(&target) {
                println!("{keyword} {value}");
            }
            Ok(0)
        }
        Command::Cancel {
            id,
            grace,
            json,
            common,
        } => cancel(&id, grace, json, &common).await,
    }
}

/// `cairn output ID [--stderr]`: the output kept so far, one stream.
async fn output(id: &str, stderr: bool, common: &Common) -> Result<i32, ExecError> {
    let id = parse_id(id)?;
    let mut ex = common.executor()?;
    let mut term = Terminal::new(false);
    struct OneStream<'a>(&'a mut Terminal, bool);
    impl OutputSink for OneStream<'_> {
        fn stdout(&mut self, d: &[u8]) -> std::io::Result<()> {
            if !self.1 {
                self.0.stdout(d)?;
            }
            Ok(())
        }
        fn stderr(&mut self, d: &[u8]) -> std::io::Result<()> {
            // `--stderr` prints the command's stderr on stdout, so it can be piped.
            if self.1 {
                self.0.stdout(d)?;
            }
            Ok(())
        }
    }
    let done = ex
        .output(&id, stderr, &mut OneStream(&mut term, stderr))
        .await?;
    if done.is_none() {
        eprintln!("cairn: {id} has not finished; this is the output so far");
    }
    Ok(0)
}

/// `cairn ls [--state S] [--json]`: the journal's executions.
fn ls(state: Option<State>, json: bool, common: &Common) -> Result<i32, ExecError> {
    let path = common.journal.clone().unwrap_or_else(Journal::default_path);
    let j = Journal::open(&path)?;
    let rows: Vec<_> = j
        .list()?
        .into_iter()
        .filter(|(_, st)| state.is_none_or(|s| s == st.state))
        .collect();
    // On a shared journal: how often each was taken over from a replica whose lease
    // expired (bounded by MAX_TAKEOVERS; at the bound it is left for review).
    let shared = j.is_shared();
    let takeovers = j.takeover_counts()?;
    let taken = |id: &crate::id::ExecutionId| takeovers.get(id.as_str()).copied().unwrap_or(0);
    if json {
        let arr: Vec<_> = rows
            .iter()
            .map(|(r, st)| {
                let mut v = serde_json::json!({
                    "execution_id": r.id, "state": st.state, "destination": r.destination,
                    "host": format!("{}@{}:{}", r.user, r.host, r.port),
                    "created_at": r.created_at, "command": r.command_display(),
                });
                if shared {
                    v["takeovers"] = taken(&r.id).into();
                }
                v
            })
            .collect();
        print_json(&serde_json::Value::Array(arr));
    } else {
        let taken_col = if shared { "TAKEOVERS " } else { "" };
        println!(
            "{:<36} {:<11} {:<24} {:<24} {taken_col}COMMAND",
            "ID", "STATE", "HOST", "CREATED"
        );
        for (r, st) in rows {
            let mut cmd = r.command_display().replace('\n', "\\n");
            if cmd.chars().count() > 60 {
                cmd = cmd.chars().take(57).collect::<String>() + "...";
            }
            if shared {
                cmd = format!("{:<9} {cmd}", taken(&r.id));
            }
            println!(
                "{:<36} {:<11} {:<24} {:<24} {}",
                r.id.as_str(),
                st.state.as_str(),
                r.destination,
                r.created_at,
                cmd
            );
        }
    }
    Ok(0)
}

/// `cairn gc`: one pass per (host, account, port, marker home) the journal has dispatched to.
async fn gc(
    output_retention: Duration,
    tombstone_retention: Duration,
    json: bool,
    common: &Common,
) -> Result<i32, ExecError> {
    if tombstone_retention < output_retention {
        return Err(ExecError::InvalidRequest(
            "--tombstone-retention must be at least --output-retention".into(),
        ));
    }
    let mut ex = common.executor()?;
    // One pass per (host, account, port, marker home) the journal has dispatched to.
    let mut seen = std::collections::BTreeSet::new();
    let mut results = Vec::new();
    let mut code = 0;
    for (rec, _) in ex.recorded_executions()? {
        let key = (
            rec.host.clone(),
            rec.port,
            rec.user.clone(),
            rec.remote_dir.clone(),
        );
        if !seen.insert(key) {
            continue;
        }
        let place = format!("{}@{}:{} {}", rec.user, rec.host, rec.port, rec.remote_dir);
        match ex
            .gc_host(&rec, output_retention, tombstone_retention)
            .await
        {
            Ok(r) => results.push(serde_json::json!({"host": place, "result": r})),
            Err(e) => {
                code = 1;
                results.push(serde_json::json!({"host": place, "error": e.to_string()}))
            }
        }
    }
    let pruned = ex.prune_local_cursors()?;
    if json {
        print_json(&serde_json::json!({"hosts": results, "local_cursors_pruned": pruned}));
    } else {
        for r in &results {
            match (r.get("result"), r.get("error")) {
                (Some(v), _) => println!(
                    "{}: {}",
                    r["host"].as_str().unwrap_or(""),
                    v.as_str().unwrap_or("")
                ),
                (_, Some(e)) => println!(
                    "{}: not collected: {}",
                    r["host"].as_str().unwrap_or(""),
                    e.as_str().unwrap_or("")
                ),
                _ => {}
            }
        }
        println!("local: {pruned} output cursor(s) of delivered executions pruned; journal events are evidence and are never removed");
    }
    Ok(code)
}

/// `cairn cancel ID`: exit 0 only when the execution ended `cancelled`.
async fn cancel(id: &str, grace: u64, json: bool, common: &Common) -> Result<i32, ExecError> {
    let id = parse_id(id)?;
    let mut ex = common.executor()?;
    let o = ex.cancel(&id, grace).await?;
    if json {
        print_json(&outcome_json(&o, None));
    } else {
        println!(
            "{}: {}{}",
            o.execution_id,
            o.state,
            o.reason
                .as_deref()
                .map(|r| format!(" ({r})"))
                .unwrap_or_default()
        );
    }
    Ok(if o.state == State::Cancelled { 0 } else { 1 })
}

async fn run(args: RunArgs) -> Result<i32, ExecError> {
    // Everything the user typed is checked before any connection is made.
    let id = args.id.as_deref().map(parse_id).transpose()?;
    let mut command = Vec::new();
    for (i, w) in args.command.iter().enumerate() {
        if i > 0 {
            command.push(b' ');
        }
        command.extend_from_slice(&os_bytes(w));
    }
    if command.contains(&0) {
        return Err(ExecError::InvalidRequest(
            "the command contains a NUL byte, which no shell can receive".into(),
        ));
    }
    if args.fleet.is_fleet() {
        return crate::fleet::run(fleet::run_options(&args), command).await;
    }
    let destination = args.destination.clone().ok_or_else(|| {
        ExecError::InvalidRequest(
            "no destination: give HOST, or --hosts a,b / --inventory FILE".into(),
        )
    })?;
    let intent = args.intent.intent(&args.common)?;
    let mut ex = args.common.executor()?;
    let session = gateway::prepare(&mut ex, &args.intent.approve, "cli", &intent.actor)?;
    let req = RunRequest {
        destination,
        command,
        id,
        timeout_secs: args.timeout.map(|d| d.as_secs().max(1)).unwrap_or(0),
        detach: args.detach,
        remote_dir: args.remote_dir.clone(),
    };
    let mut term = Terminal::new(args.json);
    let o = ex.execute(req, intent, &mut term).await;
    let _ = ex.end_session(
        &session,
        SessionEvidence::EndedExecution {
            execution_id: o.as_ref().ok().map(|o| o.execution_id.as_str()),
        },
    );
    let o = o?;
    if o.attached && !args.json {
        eprintln!(
            "cairn: same intent as execution {} ({}): attached to it; the command was not run again",
            o.execution_id, o.state
        );
    }
    if args.detach && matches!(o.state, State::Running | State::Dispatched) {
        if args.json {
            print_json(&outcome_json(&o, None));
        } else {
            println!("{}", o.execution_id);
        }
        return Ok(0);
    }
    finish(&mut ex, &o, args.json.then_some(&term))
}

/// `cairn recover`: one line (or JSON object) per execution that was not settled.
async fn recover(common: &Common, json: bool, wait: bool) -> Result<i32, ExecError> {
    let mut ex = common.executor()?;
    let mut worst = 0;
    let mut results = Vec::new();
    ex.recover_all(wait, |i, id, before, r| match r {
        Ok(o) => {
            if json {
                let mut v = outcome_json(&o, None);
                v["state_before"] = before.as_str().into();
                results.push((i, v));
            } else {
                println!(
                    "{}  {} -> {}{}{}",
                    id,
                    before,
                    o.state,
                    o.exit_code
                        .map(|c| format!(" (exit {c})"))
                        .unwrap_or_default(),
                    o.reason
                        .as_deref()
                        .filter(|_| !matches!(o.state, State::Completed | State::Running))
                        .map(|r| format!(": {r}"))
                        .unwrap_or_default()
                );
            }
            if matches!(o.state, State::Unknown | State::Interrupted) || o.held_by.is_some() {
                worst = EXIT_UNKNOWN;
            }
        }
        Err(e) => {
            worst = EXIT_UNKNOWN;
            if json {
                results.push((i, serde_json::json!({"execution_id": id, "state_before": before, "error": e.to_string()})));
            } else {
                println!("{id}  {before} -> (not recovered): {e}");
            }
        }
    })
    .await?;
    if json {
        // In the journal's order, whichever finished first.
        results.sort_by_key(|(i, _)| *i);
        print_json(&serde_json::Value::Array(
            results.into_iter().map(|(_, v)| v).collect(),
        ));
    }
    Ok(worst)
}

fn finish(ex: &mut Executor, o: &Outcome, json: Option<&Terminal>) -> Result<i32, ExecError> {
    if let Some(t) = json {
        print_json(&outcome_json(o, Some(t)));
    } else {
        explain(o);
    }
    let _ = std::io::stdout().flush();
    if o.state.has_result() {
        // The outcome is printed: failing to record its delivery only means a later replay may
        // deliver it again, never that the command's status is not the exit code.
        let id = o
            .execution_id
            .parse()
            .map_err(|e: crate::id::IdError| ExecError::Internal(e.to_string()))?;
        if let Err(e) = ex.mark_delivered(&id, "cli") {
            tracing::warn!("cairn: recording the delivery of {id}: {e}");
        }
    }
    Ok(o.exit_code_for_cli())
}

fn audit(cmd: AuditCommand) -> Result<i32, ExecError> {
    match cmd {
        AuditCommand::Verify {
            journal,
            anchor,
            seal_key,
            json,
        } => {
            let path = journal.unwrap_or_else(Journal::default_path);
            let report = match path.to_str().filter(|p| crate::journal::is_postgres_url(p)) {
                Some(url) => crate::audit::verify_postgres(url, seal_key.as_deref()),
                None => {
                    let anchor = anchor
                        .map(crate::audit::Anchor::at)
                        .unwrap_or_else(|| crate::audit::Anchor::for_journal(&path));
                    crate::audit::verify(&path, &anchor)
                }
            }?;
            if json {
                print_json(&serde_json::to_value(&report).unwrap_or_default());
            } else {
                print_verify_report(&report);
            }
            Ok(if report.ok() { 0 } else { 1 })
        }
        AuditCommand::Seal { journal, seal_key } => {
            let path = journal.unwrap_or_else(Journal::default_path);
            let j = Journal::open(&path)?;
            match j.seal(&seal_key)? {
                Some(n) => println!("sealed checkpoint {n} of {}", j.location()),
                None => println!(
                    "nothing to seal: no chain head of {} moved since the last checkpoint",
                    j.location()
                ),
            }
            Ok(0)
        }
        AuditCommand::Show { id, journal, json } => {
            let id = parse_id(&id)?;
            let path = journal.unwrap_or_else(Journal::default_path);
            let j = Journal::open(&path)?;
            let rec = j.execution(&id)?.ok_or_else(|| {
                ExecError::NoSuchExecution(id.to_string(), path.display().to_string())
            })?;
            let events = j.events(&id)?;
            let t = crate::audit_show::timeline(&rec, &events);
            if json {
                print_json(&serde_json::to_value(&t).unwrap_or_default());
            } else {
                print!("{}", crate::audit_show::render(&rec, &events, &t));
            }
            Ok(0)
        }
    }
}

/// `audit verify`'s report as text: a PostgreSQL journal's (sealed by checkpoints) or a file's
/// (anchored).
fn print_verify_report(report: &crate::audit::Report) {
    if let Some(s) = &report.sealing {
        println!(
            "journal {}: {} events in {} executions, {} session events; {} checkpoint(s){}",
            report.journal,
            report.events,
            report.executions,
            report.session_events,
            s.checkpoints,
            s.newest
                .map(|n| format!(", newest #{n}"))
                .unwrap_or_default()
        );
        if s.unsealed_events > 0 || s.unsealed_session_entries > 0 {
            println!(
                "not yet sealed: {} event(s) in {} execution(s), {} session entr{} \
                 (appended after the newest checkpoint; not damage)",
                s.unsealed_events,
                s.unsealed_executions,
                s.unsealed_session_entries,
                if s.unsealed_session_entries == 1 {
                    "y"
                } else {
                    "ies"
                }
            );
        }
        if s.checkpoints > 0 && !s.macs_checked {
            println!(
                "note: no seal key given (--seal-key): the checkpoints' MACs were not checked"
            );
        }
        print_findings(report);
        if report.ok() {
            println!("ok: every chain is intact and matches its stored head and the checkpoints");
        }
    } else {
        println!(
            "journal {}: {} events, {} session events, {} executions, head {}, anchored at {}",
            report.journal,
            report.events,
            report.session_events,
            report.executions,
            report.head_seq,
            report
                .anchored_seq
                .map(|s| s.to_string())
                .unwrap_or_else(|| "-".into())
        );
        if report.unanchored > 0 {
            println!(
                "note: {} event(s) after the anchor (a process stopped between its commit and the anchor update)",
                report.unanchored
            );
        }
        print_findings(report);
        if report.ok() {
            println!("ok: the chain is intact and matches the anchor");
        }
    }
}

fn print_findings(report: &crate::audit::Report) {
    for f in &report.findings {
        println!(
            "DAMAGE {:?} in the {} journal at entry {}{}: {}",
            f.damage,
            f.chain,
            f.seq.map(|s| s.to_string()).unwrap_or_else(|| "-".into()),
            f.execution_id
                .as_deref()
                .map(|e| match f.chain {
                    crate::audit::Chain::Activity => format!(" (execution {e})"),
                    crate::audit::Chain::Sessions => format!(" (session {e})"),
                    crate::audit::Chain::Checkpoints => String::new(),
                })
                .unwrap_or_default(),
            f.detail
        );
    }
}

async fn status(id: &ExecutionId, common: &Common, json: bool) -> Result<i32, ExecError> {
    let mut ex = common.executor()?;
    let crate::executor::Prediction {
        outcome: o,
        probe,
        notes,
        next,
    } = ex.predict(id).await?;
    let host_says = match &probe {
        Ok(Probe::Absent { same_epoch: true }) => {
            "no started record (guard never crossed)".to_string()
        }
        Ok(Probe::Absent { same_epoch: false }) => {
            "no started record, but the host epoch changed".into()
        }
        Ok(Probe::Started { liveness, .. }) => {
            format!("started, supervisor {liveness:?}").to_lowercase()
        }
        Ok(Probe::Finished) => "finished (finish record present)".into(),
        Ok(Probe::Unreadable(w)) => format!("unreadable: {w}"),
        Ok(Probe::Unreachable) => "unreachable".into(),
        Err(e) => format!("not probed: {e}"),
    };
    let next = next_text(&notes, &next, &ex.patience.reconnect_for);
    if json {
        let mut v = outcome_json(&o, None);
        v["host_says"] = host_says.into();
        v["next_action"] = next.into();
        print_json(&v);
    } else {
        let rec = ex.execution_record(id)?;
        println!("execution   {}", o.execution_id);
        println!(
            "host        {} ({})",
            o.host,
            o.host_key_fingerprint
                .as_deref()
                .unwrap_or("host key not yet seen")
        );
        if let Some(r) = rec {
            println!("command     {}", r.command_display().replace('\n', "\\n"));
            println!("accepted    {}", r.created_at);
        }
        println!("state       {} (journal)", o.state);
        if let Some(c) = o.exit_code {
            println!(
                "exit code   {c}{}",
                o.signal
                    .as_deref()
                    .map(|s| format!(" (signal {s})"))
                    .unwrap_or_default()
            );
        }
        if let Some(s) = &o.started_at {
            println!("started     {s}");
        }
        if let Some(s) = &o.finished_at {
            println!("finished    {s}");
        }
        println!("host says   {host_says}");
        println!("next        {next}");
        if let Some(r) = &o.reason {
            println!("evidence    {r}");
        }
    }
    Ok(0)
}

/// What `cairn recover` would do next, in words, from the machine's next step.
fn next_text(notes: &[Note], next: &Step, window: &std::time::Duration) -> String {
    if notes.contains(&Note::Redispatch) {
        return "dispatch again under the same ID (`cairn recover`)".into();
    }
    match next {
        Step::Held | Step::WaitForOwner => Machine::held_reason(),
        Step::Settled | Step::Report => "nothing: settled".into(),
        Step::Settle { state, why } => {
            let reason = match why {
                Why::Said(r) | Why::Table(r) => r.clone(),
                Why::HostKeyChanged { pinned, presented } => {
                    format!("the host key changed (pinned {pinned}, presented {presented})")
                }
            };
            format!("record {state}: {reason}")
        }
        Step::Running { .. }
        | Step::Wait {
            why: Wait::Look, ..
        } => "reattach (`cairn attach`)".into(),
        Step::Complete { .. } => {
            "collect the stored result (`cairn recover` or `cairn attach`)".into()
        }
        Step::Wait {
            why: Wait::Reconnect { error, .. },
            ..
        } => format!(
            "host unreachable ({error}); the outcome is not known yet: `cairn recover` keeps \
             trying for up to {window:?}, then records unknown"
        ),
        Step::Wait {
            why: Wait::Retry(reason),
            ..
        } => reason.clone(),
        Step::Connect { .. } if notes.iter().any(|n| matches!(n, Note::Lost(_))) => {
            "the probe did not complete; reconnect and probe again (`cairn recover`)".into()
        }
        Step::Connect { .. } | Step::Dispatch { .. } | Step::Send | Step::Watch { .. } => {
            "probe again (`cairn recover`)".into()
        }
        Step::Withhold => "nothing: settled by another process before it was sent".into(),
    }
}

#[cfg(unix)]
fn os_bytes(s: &OsString) -> Vec<u8> {
    use std::os::unix::ffi::OsStrExt;
    s.as_bytes().to_vec()
}
#[cfg(not(unix))]
fn os_bytes(s: &OsString) -> Vec<u8> {
    s.to_string_lossy().into_owned().into_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("90").unwrap(), Duration::from_secs(90));
        assert_eq!(parse_duration("5m").unwrap(), Duration::from_secs(300));
        assert_eq!(parse_duration("250ms").unwrap(), Duration::from_millis(250));
        assert!(parse_duration("5 parsecs").is_err());
        assert!(parse_duration("").is_err());
    }

    /// The flags' defaults are the library's: a front that builds the option structs itself
    /// gets what `cairn` with no flags does.
    #[test]
    fn clap_defaults_are_the_library_defaults() {
        use crate::options::{ApproveOptions, IntentOptions, DEFAULT_REMOTE_DIR};
        // Flags that also read the environment can only be compared when it is silent.
        let unset = |v: &str| std::env::var_os(v).is_none();
        let c = Cli::try_parse_from(["cairn", "run", "h", "--", "x"]).unwrap();
        let Command::Run(r) = c.command else {
            panic!("not a run")
        };
        if unset("CAIRN_JOURNAL") && unset("CAIRN_INTENT_KEY") {
            assert_eq!(
                format!("{:?}", r.common.host_options()),
                format!("{:?}", HostOptions::default())
            );
        }
        assert_eq!(r.common.reconnect_for, HostOptions::default().reconnect_for);
        if unset("CAIRN_REMOTE_DIR") {
            assert_eq!(r.remote_dir, DEFAULT_REMOTE_DIR);
        }
        if unset("CAIRN_SCOPE") && unset("CAIRN_ACTOR") {
            assert_eq!(
                format!("{:?}", r.intent.options()),
                format!("{:?}", IntentOptions::default())
            );
        }
        if unset("CAIRN_POLICY") {
            assert_eq!(
                format!("{:?}", r.intent.approve.options()),
                format!("{:?}", ApproveOptions::default())
            );
        }
        assert_eq!(
            format!("{:?}", r.fleet.options()),
            format!("{:?}", crate::fleet::FleetOptions::default())
        );

        let c = Cli::try_parse_from(["cairn", "serve", "--stdio"]).unwrap();
        let Command::Serve(a) = c.command else {
            panic!("not serve")
        };
        if unset("CAIRN_REMOTE_DIR") {
            assert_eq!(a.server.remote_dir, DEFAULT_REMOTE_DIR);
        }
        assert_eq!(
            a.server.channels_per_connection,
            crate::pool::DEFAULT_PER_CONNECTION as u64
        );
        assert_eq!(a.server.approve.approve, ApproveOptions::default().mode);
    }

    #[test]
    fn cli_parses_ssh_style_run() {
        let c = Cli::try_parse_from([
            "cairn", "run", "-p", "2222", "db-1", "--", "echo", "-n", "x",
        ])
        .unwrap();
        match c.command {
            Command::Run(r) => {
                assert_eq!(r.destination.as_deref(), Some("db-1"));
                assert_eq!(r.common.port, Some(2222));
                assert_eq!(r.command, vec!["echo", "-n", "x"]);
            }
            _ => panic!(),
        }
    }
}
