//! The `murmur` command line: train, inspect the GPU, benchmark.

mod commands;
mod env;

use clap::Parser;

fn main() {
    env::quiet_mesa_wsi();
    let cli = commands::Cli::parse();
    env::init_logging(cli.default_log_filter());
    if let Err(e) = commands::run(cli) {
        eprintln!("murmur: error: {e:#}");
        std::process::exit(1);
    }
}
