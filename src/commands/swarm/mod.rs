//! `murmur swarm`: credentials for a swarm (`init`, `issue`), and a whole swarm on this machine
//! as separate processes over loopback QUIC (no subcommand).

mod launch;
mod progress;

use std::path::PathBuf;

use anyhow::Context;
use clap::{ArgMatches, Args, Subcommand};
use murmur_net::identity::Swarm;

#[derive(Args, Debug)]
#[command(args_conflicts_with_subcommands = true)]
pub struct SwarmArgs {
    #[command(subcommand)]
    command: Option<SwarmCommand>,
    #[command(flatten)]
    launch: launch::LaunchArgs,
}

#[derive(Subcommand, Debug)]
enum SwarmCommand {
    /// Create a swarm: its certificate authority in DIR (ca.pem for every node, ca.key secret).
    Init {
        #[arg(default_value = "swarm")]
        dir: PathBuf,
        /// A name for the swarm, shown in its certificate.
        #[arg(long, default_value = "murmur")]
        name: String,
    },
    /// Admit a node: write nodes/NAME.pem and nodes/NAME.key into the swarm folder DIR.
    Issue {
        /// The swarm folder (a positional before the names, so it has no default).
        dir: PathBuf,
        /// Node names.
        #[arg(required = true)]
        names: Vec<String>,
    },
}

pub fn run(a: SwarmArgs, matches: &ArgMatches) -> anyhow::Result<()> {
    match a.command {
        Some(SwarmCommand::Init { dir, name }) => {
            if dir.join("ca.key").exists() {
                anyhow::bail!(
                    "{} already holds a swarm; refusing to overwrite its key",
                    dir.display()
                );
            }
            Swarm::generate(&name)?.save(&dir)?;
            eprintln!(
                "created swarm {name:?} in {}: give ca.pem to every node, keep ca.key secret; admit nodes with `murmur swarm issue {} NAME`",
                dir.display(),
                dir.display()
            );
            Ok(())
        }
        Some(SwarmCommand::Issue { dir, names }) => {
            let swarm = Swarm::load(&dir)
                .with_context(|| format!("loading the swarm authority from {}", dir.display()))?;
            for name in names {
                swarm.issue_to(&dir, &name)?;
                let creds = murmur_net::identity::Credentials::load(&dir, &name)?;
                eprintln!(
                    "issued {name}: {}/nodes/{name}.pem and .key, fingerprint {}",
                    dir.display(),
                    creds.fingerprint()
                );
            }
            Ok(())
        }
        None => launch::run(a.launch, matches),
    }
}
