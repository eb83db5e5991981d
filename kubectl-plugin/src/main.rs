//! `kubectl consistd`: a kubectl plugin (the `kubectl-consistd` binary on PATH) that shows consistd's
//! elections and rollout channels from their Leases and ConfigMaps, a pod's outbox and reconcile queues
//! from its sidecar, and injects the sidecar offline.

mod cluster;
mod elections;
mod handover;
mod leases;
pub mod outbox;
mod output;
mod queues;
mod rollout;
mod sidecar;

use std::{path::PathBuf, process::ExitCode};

use clap::{CommandFactory, Parser, Subcommand, ValueEnum};

use crate::{
    cluster::ClusterArgs, elections::ElectionsArgs, handover::HandoverArgs, outbox::OutboxArgs, queues::QueuesArgs,
    rollout::RolloutCommand,
};

/// kubectl consistd: consistd's elections and rollout channels as the cluster holds them, and the
/// offline sidecar injector.
#[derive(Debug, Parser)]
#[command(name = "kubectl-consistd", bin_name = "kubectl consistd", version)]
#[command(after_help = "Exit codes: 0 success; 1 an error (named on standard error); 2 usage error; \
                        3 `rollout status`: some member lags.")]
struct Cli {
    #[command(flatten)]
    cluster: ClusterArgs,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// List election Leases: holder, fencing term, last renewal, live members.
    Elections(ElectionsArgs),
    /// Ask an election's holder to step down for another candidate (the Lease's preferred holder), and wait
    /// until that candidate leads in a new term.
    Handover(HandoverArgs),
    /// Rollout channels: `rollout status CHANNEL`.
    #[command(subcommand)]
    Rollout(RolloutCommand),
    /// Add the consistd sidecar to the Pods and workloads in a file and print them (as `consistd inject -f`).
    Inject(Box<InjectArgs>),
    /// Print a shell completion script.
    Completion {
        /// The shell.
        shell: Shell,
    },
    /// A pod's outbox: per destination and peer, the connection and the messages not ACKed yet (read from
    /// the sidecar's admin port through the apiserver's pod proxy).
    Outbox(OutboxArgs),
    /// A pod's reconcile queues: keys ready, held back until the watch shows the pod's writes, waiting
    /// for a retry or requeue, leased; the last error (read from the sidecar's admin port through the
    /// apiserver's pod proxy).
    Queues(QueuesArgs),
}

/// `kubectl consistd inject -f FILE`: the flags of `consistd inject -f`.
#[derive(Debug, clap::Args)]
struct InjectArgs {
    /// The manifests to rewrite ("-" for standard input): Pods, and the pod templates of Deployments,
    /// StatefulSets, DaemonSets, ReplicaSets, Jobs and CronJobs; the result goes to standard output.
    #[arg(short = 'f', long = "filename")]
    file: PathBuf,
    #[command(flatten)]
    defaults: consistd_core::inject::SidecarArgs,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum Shell {
    Bash,
    Zsh,
    Fish,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Inject(args) => {
            let InjectArgs { file, defaults } = *args;
            consistd_core::inject::flags::inject_file(&file, &defaults)
        }
        Command::Completion { shell } => {
            let shell = match shell {
                Shell::Bash => clap_complete::Shell::Bash,
                Shell::Zsh => clap_complete::Shell::Zsh,
                Shell::Fish => clap_complete::Shell::Fish,
            };
            // Into a buffer first: clap_complete panics when its writer fails (a closed pipe).
            let mut script = Vec::new();
            clap_complete::generate(shell, &mut Cli::command(), "kubectl-consistd", &mut script);
            match std::io::Write::write_all(&mut std::io::stdout(), &script) {
                Ok(()) => ExitCode::SUCCESS,
                Err(error) => {
                    eprintln!("kubectl consistd completion: write the script: {error}");
                    ExitCode::FAILURE
                }
            }
        }
        Command::Outbox(args) => cluster_command("outbox", &cli.cluster, async |cluster| {
            outbox::run(&cluster, &args).await.map(|()| ExitCode::SUCCESS).map_err(Into::into)
        }),
        Command::Queues(args) => cluster_command("queues", &cli.cluster, async |cluster| {
            queues::run(&cluster, &args).await.map(|()| ExitCode::SUCCESS).map_err(Into::into)
        }),
        Command::Elections(args) => cluster_command("elections", &cli.cluster, async |cluster| {
            elections::run(&cluster, &args).await.map(|()| ExitCode::SUCCESS).map_err(Into::into)
        }),
        Command::Handover(args) => cluster_command("handover", &cli.cluster, async |cluster| {
            handover::run(&cluster, &args).await.map(|()| ExitCode::SUCCESS).map_err(Into::into)
        }),
        Command::Rollout(RolloutCommand::Status(args)) => {
            cluster_command("rollout status", &cli.cluster, async |cluster| {
                match rollout::status(&cluster, &args).await? {
                    true => Ok(ExitCode::SUCCESS),
                    false => Ok(ExitCode::from(rollout::EXIT_LAGGING)),
                }
            })
        }
    }
}

/// Connects to the cluster and runs `command`; an error is printed as `kubectl consistd NAME: op: cause`
/// and exits 1.
fn cluster_command(
    name: &str,
    flags: &ClusterArgs,
    command: impl AsyncFnOnce(cluster::Cluster) -> Result<ExitCode, Box<dyn std::error::Error>>,
) -> ExitCode {
    let runtime = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("kubectl consistd {name}: start the async runtime: {error}");
            return ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(async {
        let cluster = flags.connect().await?;
        command(cluster).await
    });
    result.unwrap_or_else(|error| {
        eprintln!("kubectl consistd {name}: {}", consistd_core::error::chain(error.as_ref()));
        ExitCode::FAILURE
    })
}
