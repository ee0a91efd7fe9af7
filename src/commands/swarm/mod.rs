//! `murmur swarm`: credentials for a swarm (`init`, `issue`, `revoke`), signed jobs (`sign-job`), and a whole swarm on this machine
//! as separate processes over loopback QUIC (no subcommand).

mod launch;
mod progress;

use std::path::PathBuf;

use anyhow::Context;
use clap::{ArgMatches, Args, Subcommand};
use murmur_net::identity::{Role, Swarm, DEFAULT_DAYS, REVOKED_FILE};

use super::job_flags::job_from;
use super::server::signature_beside;

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
    /// Admit nodes in a role: write nodes/NAME.pem and nodes/NAME.key into the swarm folder DIR.
    Issue {
        /// The swarm folder (a positional before the names, so it has no default).
        dir: PathBuf,
        /// Node names.
        #[arg(required = true)]
        names: Vec<String>,
        /// What the certificate lets its holder be: worker, stage, or server/N (the server of
        /// shard N; server alone is shard 0). Servers take pushes only from workers, workers
        /// talk only to the server of each shard, stages only to stages.
        #[arg(long, value_parser = parse_role)]
        role: Role,
        /// Days the certificate is valid (nodes refuse it afterwards; issue it again).
        #[arg(long, default_value_t = DEFAULT_DAYS, value_parser = clap::value_parser!(u32).range(1..=36500))]
        days: u32,
    },
    /// Sign a job with the swarm's key, so that servers serve it and workers train it (they
    /// refuse jobs the swarm did not sign): writes the signature beside the job file
    /// (JOB.toml.sig), or to --out. Give it the job flags the servers will get on top of the
    /// file: the signature covers the job as the servers run it.
    SignJob {
        /// The swarm folder (holding ca.key).
        dir: PathBuf,
        /// The job, as a TOML file (job flags given here override its fields).
        #[arg(long)]
        config: Option<PathBuf>,
        /// Where to write the signature [default: the job file's name with .sig added].
        #[arg(long)]
        out: Option<PathBuf>,
        #[command(flatten)]
        job: Box<murmur_node::Job>,
    },
    /// Revoke nodes' certificates: add them to DIR/revoked.pem, which servers reread within
    /// seconds (hanging up the revoked nodes) and every node reads when it starts.
    Revoke {
        /// The swarm folder.
        dir: PathBuf,
        /// Node names (their certificates in DIR/nodes).
        #[arg(required = true)]
        names: Vec<String>,
    },
}

fn parse_role(text: &str) -> Result<Role, String> {
    text.parse()
        .map_err(|e: murmur_net::NetError| e.to_string())
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
                "created swarm {name:?} in {}: give ca.pem to every node, keep ca.key secret; admit nodes with `murmur swarm issue {} NAME --role worker` (or --role server/N, stage, rendezvous)",
                dir.display(),
                dir.display()
            );
            Ok(())
        }
        Some(SwarmCommand::Issue {
            dir,
            names,
            role,
            days,
        }) => {
            let swarm = Swarm::load(&dir)
                .with_context(|| format!("loading the swarm authority from {}", dir.display()))?;
            for name in names {
                swarm.issue_to(&dir, &name, role, days)?;
                let creds = murmur_net::identity::Credentials::load(&dir, &name)?;
                eprintln!(
                    "issued {name} as {role} for {days} days: {}/nodes/{name}.pem and .key, fingerprint {}",
                    dir.display(),
                    creds.fingerprint()
                );
            }
            Ok(())
        }
        Some(SwarmCommand::Revoke { dir, names }) => {
            let swarm = Swarm::load(&dir)
                .with_context(|| format!("loading the swarm authority from {}", dir.display()))?;
            for name in names {
                if swarm.revoke(&dir, &name)? {
                    eprintln!(
                        "revoked {name} in {}/{REVOKED_FILE}: running servers refuse it within \
                         seconds; copy the file to servers on other machines",
                        dir.display()
                    );
                } else {
                    eprintln!("{name} was already revoked");
                }
            }
            Ok(())
        }
        Some(SwarmCommand::SignJob {
            dir,
            config,
            out,
            job,
        }) => {
            let sub = matches
                .subcommand_matches("sign-job")
                .context("the sign-job arguments")?;
            let job = job_from(config.as_deref(), &job, sub)?;
            let out = match (out, &config) {
                (Some(out), _) => out,
                (None, Some(config)) => signature_beside(config),
                (None, None) => anyhow::bail!(
                    "a job given by flags alone: say where the signature goes with --out FILE"
                ),
            };
            let signature = murmur_node::server::sign_job(&dir, &job).with_context(|| {
                format!("signing the job with the swarm key in {}", dir.display())
            })?;
            std::fs::write(&out, format!("{signature}\n"))
                .with_context(|| format!("writing {}", out.display()))?;
            eprintln!(
                "signed the job ({} workers, model {}, codec {}) in {}: give it to every server \
                 with the job (--job-signature; found beside --config by default)",
                job.workers,
                job.model,
                job.codec,
                out.display()
            );
            Ok(())
        }
        None => launch::run(a.launch, matches),
    }
}
