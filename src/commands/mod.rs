//! Subcommands.

mod bench;
mod info;
mod machine;
mod train;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "murmur",
    version,
    about = "Train neural networks together over the internet on ordinary GPUs"
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
    Train(train::TrainArgs),
    /// Measure performance against a reference run in the same process.
    #[command(subcommand)]
    Bench(bench::BenchCommand),
}

pub fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Info(a) => info::run(a),
        Command::Train(a) => train::run(a),
        Command::Bench(b) => bench::run(b),
    }
}
