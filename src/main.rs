//! The `murmur` command line: train, inspect the GPU, benchmark.

mod chart;
mod commands;
mod env;
mod exit;
mod signals;

use clap::FromArgMatches;

fn main() {
    env::quiet_mesa_wsi();
    let matches = commands::Cli::definition().get_matches();
    let cli = commands::Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
    // Before any thread starts: shards keep their memory flat, and training reuses its
    // tensors' blocks.
    if cli.is_parameter_server() {
        murmur_node::platform::return_large_frees_to_the_system();
    } else {
        murmur_node::platform::keep_large_blocks_for_reuse();
    }
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
