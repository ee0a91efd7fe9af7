//! The `murmur` command line: train, inspect the GPU, benchmark.

mod chart;
mod commands;
mod env;

use clap::{CommandFactory, FromArgMatches};

fn main() {
    env::quiet_mesa_wsi();
    let matches = commands::Cli::command().get_matches();
    let cli = commands::Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
    env::init_logging(cli.default_log_filter());
    if let Err(e) = commands::run(cli, &matches) {
        eprintln!("murmur: error: {e:#}");
        std::process::exit(1);
    }
}
