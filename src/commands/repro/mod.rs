//! `murmur repro <paper>`: the small-scale reproductions of the papers' experiments, written
//! as tables to docs/results/ with the command that made them.

mod liec;
mod report;

use clap::Subcommand;

#[derive(Subcommand)]
pub enum ReproCommand {
    /// LIEC-SGD against P-SGD, MEM-SGD, DoubleSqueeze, CSER, Neolithic and EF21-P, with the
    /// scaled sign on one block and block-wise (shared/specs/liec-sgd.md §5).
    Liec(liec::LiecArgs),
}

pub fn run(command: ReproCommand) -> anyhow::Result<()> {
    match command {
        ReproCommand::Liec(a) => liec::run(a),
    }
}
