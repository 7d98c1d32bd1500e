//! The command-line parts of fleet runs: `cairn run --hosts …`'s flags and `cairn batch …`
//! (the runs themselves are [`crate::fleet`]).

use std::path::PathBuf;

use clap::{Args, Subcommand};

use super::gateway::ApproveArgs;
use super::{Common, RunArgs};
use crate::fleet::{FleetOptions, FleetRun};

/// Options of `cairn run` for many hosts.
#[derive(Args, Debug, Clone, Default)]
pub struct FleetArgs {
    /// Run on these hosts ([user@]host or ssh_config aliases, comma-separated) instead of one
    /// DESTINATION.
    #[arg(long, value_delimiter = ',', value_name = "HOST,…")]
    pub hosts: Vec<String>,
    /// Run on the hosts listed in FILE, one destination per line (`#` comments, blank lines).
    #[arg(long, value_name = "FILE")]
    pub inventory: Option<PathBuf>,
    /// Hosts worked on at once. One execution per host, so one connection per host carries at
    /// most one channel at a time.
    #[arg(long, default_value_t = crate::fleet::DEFAULT_PARALLEL)]
    pub parallel: usize,
    /// Stop starting new hosts once more than K hosts failed (failed, non-zero exit,
    /// interrupted, unknown).
    #[arg(long, value_name = "K")]
    pub max_failures: Option<usize>,
    /// Stop starting new hosts after the first failure (= --max-failures 0).
    #[arg(long)]
    pub fail_fast: bool,
    /// Rolling batches of N hosts: the next batch starts only when every host of the previous
    /// one completed with status 0.
    #[arg(long, value_name = "N")]
    pub batch_size: Option<usize>,
    /// Write each host's output to DIR/HOST.out and DIR/HOST.err instead of the terminal.
    #[arg(long, value_name = "DIR")]
    pub output_dir: Option<PathBuf>,
    /// Caller-chosen batch ID (default bt_ + UUIDv7).
    #[arg(long = "batch", value_name = "ID")]
    pub batch_id: Option<String>,
}

impl FleetArgs {
    pub fn is_fleet(&self) -> bool {
        !self.hosts.is_empty() || self.inventory.is_some()
    }

    /// The library's options from these flags.
    pub fn options(&self) -> FleetOptions {
        FleetOptions {
            hosts: self.hosts.clone(),
            inventory: self.inventory.clone(),
            parallel: self.parallel,
            max_failures: self.max_failures,
            fail_fast: self.fail_fast,
            batch_size: self.batch_size,
            output_dir: self.output_dir.clone(),
            batch_id: self.batch_id.clone(),
        }
    }
}

/// `cairn batch …`
#[derive(Subcommand, Debug)]
pub enum BatchCommand {
    /// Every host of a batch with its execution's state (from the journal; no host contact).
    Status {
        batch: String,
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        common: Common,
    },
    /// Continue a batch: start hosts that never got an execution, re-dispatch only what
    /// provably never started, reattach to running ones, collect finished ones, and list
    /// interrupted or unknown ones for review.
    Resume {
        batch: String,
        #[arg(long)]
        json: bool,
        /// Override the recorded parallelism.
        #[arg(long)]
        parallel: Option<usize>,
        /// Write output to DIR/HOST.out and DIR/HOST.err.
        #[arg(long, value_name = "DIR")]
        output_dir: Option<PathBuf>,
        #[command(flatten)]
        common: Common,
        #[command(flatten)]
        approve: ApproveArgs,
    },
    /// List batches.
    Ls {
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        common: Common,
    },
}

impl BatchCommand {
    /// The library's command from these flags.
    pub fn options(self) -> crate::fleet::BatchCommand {
        use crate::fleet::BatchCommand as B;
        match self {
            BatchCommand::Status {
                batch,
                json,
                common,
            } => B::Status {
                batch,
                json,
                host: common.host_options(),
            },
            BatchCommand::Resume {
                batch,
                json,
                parallel,
                output_dir,
                common,
                approve,
            } => B::Resume {
                batch,
                json,
                parallel,
                output_dir,
                host: common.host_options(),
                approve: approve.options(),
            },
            BatchCommand::Ls { json, common } => B::Ls {
                json,
                host: common.host_options(),
            },
        }
    }
}

/// What `cairn run` gave, for a run on many hosts.
pub fn run_options(args: &RunArgs) -> FleetRun {
    FleetRun {
        host: args.common.host_options(),
        approve: args.intent.approve.options(),
        intent: args.intent.options(),
        destination: args.destination.clone(),
        id: args.id.clone(),
        detach: args.detach,
        timeout: args.timeout,
        remote_dir: args.remote_dir.clone(),
        json: args.json,
        fleet: args.fleet.options(),
    }
}
