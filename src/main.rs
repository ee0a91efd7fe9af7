//! The `murmur` command line: train, inspect the GPU, benchmark.

mod chart;
mod commands;
mod env;
mod exit;
mod signals;

use clap::FromArgMatches;

fn main() {
    env::quiet_mesa_wsi();
    // Every command: shards keep their memory flat, and training keeps its tensors' blocks.
    murmur_node::platform::return_large_frees_to_the_system();
    let matches = commands::Cli::definition().get_matches();
    let cli = commands::Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
    env::init_logging(cli.default_log_filter());
    if let Err(e) = signals::install() {
        eprintln!("murmur: warning: signals will stop murmur at once, not gracefully: {e:#}");
    }
    if let Err(e) = commands::run(cli, &matches) {
        let code = exit::code(&e);
        if code > 128 {
            // An asked-for stop is not an error.
            eprintln!("murmur: {e:#}");
        } else {
            eprintln!("murmur: error: {e:#}");
        }
        std::process::exit(code);
    }
}
