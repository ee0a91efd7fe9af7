//! Subcommands.

mod bench;
mod code_stats;
mod docs;
mod eval;
mod export;
mod flag_checks;
mod info;
mod job_flags;
mod machine;
mod model_file;
mod pipeline;
mod plot;
mod relay;
mod rendezvous;
mod repro;
mod sample;
mod server;
mod stdout;
mod swarm;
mod train;
mod train_args;
mod train_lm;
mod train_output;
mod worker;

use clap::{ArgMatches, Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "murmur",
    version,
    about = "Train neural networks together over the internet on ordinary GPUs",
    // A flag given twice takes its last value, so scripts can put defaults before "$@".
    args_override_self = true
)]
pub struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Show the GPU adapters murmur can use and the one it picks.
    Info(info::InfoArgs),
    /// Train a model on one machine.
    Train(train_args::TrainArgs),
    /// Rewrite a checkpoint, e.g. its weights alone in f16 (`--weights-only --dtype f16`).
    Export(export::ExportArgs),
    /// Score a trained model: test accuracy (mlp, cnn) or validation nats per byte (gpt).
    Eval(eval::EvalArgs),
    /// Generate text with a trained gpt.
    Sample(sample::SampleArgs),
    /// Swarm credentials (`init`, `issue`), or a whole swarm on this machine over loopback.
    Swarm(swarm::SwarmArgs),
    /// Run a parameter-server shard.
    Server(server::ServerArgs),
    /// Run one worker of a data-parallel swarm.
    Worker(worker::WorkerArgs),
    /// Train one model cut into pipeline stages, each a process on this machine linked over
    /// loopback QUIC, with Clapping's compressed activations (or a baseline).
    Pipeline(pipeline::PipelineArgs),
    /// One stage of a pipeline: started by `murmur pipeline`, or by hand on machines of their
    /// own, which meet through `murmur rendezvous`.
    PipelineStage(pipeline::stage::StageArgs),
    /// Introduce pipeline stages behind NATs to each other, and relay between those whose
    /// NATs let no direct path open.
    Rendezvous(rendezvous::RendezvousArgs),
    /// Forward a QUIC link through added delay, a rate limit and loss (for trying bad paths).
    Relay(relay::RelayArgs),
    /// Draw training curves (loss, accuracy, bytes moved) from `--metrics` files into a PNG or
    /// SVG, one line per file.
    Plot(plot::PlotArgs),
    /// Reproduce a paper's experiments at small scale; tables go to docs/results/.
    #[command(subcommand)]
    Repro(repro::ReproCommand),
    /// Measure performance against a reference run in the same process.
    #[command(subcommand)]
    Bench(bench::BenchCommand),
    /// Print shell completions for murmur.
    Completions(docs::CompletionsArgs),
    /// Print murmur's manual page (or write every page into a folder).
    Man(docs::ManArgs),
}

impl Cli {
    /// The command-line definition, as `main`, completions and the man page see it.
    pub fn definition() -> clap::Command {
        // `--lr -1` reaches the flag's own check (and its clear refusal) instead of being
        // taken for an unknown flag `-1`, in every subcommand.
        fn negatives(c: clap::Command) -> clap::Command {
            c.allow_negative_numbers(true).mut_subcommands(negatives)
        }
        negatives(<Cli as clap::CommandFactory>::command())
    }

    /// Whether this process is a parameter-server shard, which keeps its memory flat rather
    /// than keeping large blocks for the next step (`murmur_node::platform`).
    pub fn is_parameter_server(&self) -> bool {
        matches!(self.command, Command::Server(_))
    }

    /// What is logged unless `RUST_LOG` says otherwise: nodes of a swarm report peers
    /// coming and going; everything else only warnings, so that reports stay readable.
    pub fn default_log_filter(&self) -> &'static str {
        match self.command {
            Command::Server(_)
            | Command::Worker(_)
            | Command::Swarm(_)
            | Command::Rendezvous(_)
            | Command::PipelineStage(_) => "warn,murmur_net=info",
            _ => "warn",
        }
    }
}

/// Runs the command; `matches` are the parsed arguments, which tell the flags given on the
/// command line from defaults (a job file's fields yield only to the former).
pub fn run(cli: Cli, matches: &ArgMatches) -> anyhow::Result<()> {
    let sub = matches
        .subcommand()
        .map(|(_, m)| m)
        .expect("a subcommand is required");
    match cli.command {
        Command::Info(a) => info::run(a),
        Command::Train(a) => train::run(a),
        Command::Export(a) => export::run(a),
        Command::Eval(a) => eval::run(a),
        Command::Sample(a) => sample::run(a),
        Command::Swarm(a) => swarm::run(a, sub),
        Command::Server(a) => server::run(a, sub),
        Command::Worker(a) => worker::run(a),
        Command::Relay(a) => relay::run(a),
        Command::Pipeline(a) => pipeline::run(a),
        Command::PipelineStage(a) => pipeline::stage::run(a),
        Command::Rendezvous(a) => rendezvous::run(a),
        Command::Plot(a) => plot::run(a),
        Command::Repro(r) => repro::run(r),
        Command::Bench(b) => bench::run(b),
        Command::Completions(a) => docs::completions(a),
        Command::Man(a) => docs::man(a),
    }
}

/// A new folder under the system's temporary folder, named `prefix` and random characters
/// (never one that exists, never one another user could have guessed and made first), kept
/// after the command: the caller removes it when the run went well.
fn fresh_temp_dir(prefix: &str) -> anyhow::Result<std::path::PathBuf> {
    Ok(tempfile::Builder::new().prefix(prefix).tempdir()?.keep())
}
