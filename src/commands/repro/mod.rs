//! `murmur repro <paper>`: the small-scale reproductions of the papers' experiments, written
//! as tables to docs/results/ with the command that made them, their raw numbers as JSON,
//! and figures drawn from the JSON beside them.

mod arms;
mod attack;
mod clan;
mod clapping;
mod clapping_gpt;
mod clapping_logistic;
mod figures;
mod liec;
mod local_steps;
mod loco;
mod pipeline_steps;
mod report;
mod swarm_gpt;

use clap::Subcommand;

#[derive(Subcommand)]
pub enum ReproCommand {
    /// LIEC-SGD against P-SGD, MEM-SGD, DoubleSqueeze, CSER, Neolithic and EF21-P, with the
    /// scaled sign on one block and block-wise (shared/specs/liec-sgd.md §5).
    Liec(liec::LiecArgs),
    /// CLAN (LANS over two-way compressed rounds, Algorithms 3 and 4) and the NAG suite with
    /// every codec of the paper (shared/specs/byteps-clan.md §6.3).
    Clan(clan::ClanArgs),
    /// LoCo against f32, bf16, naive 4-bit, error feedback with f32 and 8-bit errors and
    /// block-absmax 4-bit, with AdamW and SGD (shared/specs/loco.md §5.4).
    Loco(loco::LocoArgs),
    /// Clapping-FC and -FU with a sweep over p against the uncompressed pipeline, direct
    /// compression, EF21 and AQ-SGD, a sweep over the number of stages and a one-pass run
    /// (shared/specs/clapping.md §7).
    Clapping(clapping::ClappingArgs),
    /// Clapping-FC with a sweep over p against the uncompressed pipeline, direct compression
    /// and EF21 on a byte-level GPT cut between its blocks (shared/specs/clapping.md §7 R4).
    ClappingGpt(clapping_gpt::ClappingGptArgs),
    /// The byte-level GPT trained by a local swarm (f32, and top-10% and top-1% with error
    /// feedback)
    /// beside the same model trained in one process on the same total batch (issue 20).
    SwarmGpt(swarm_gpt::SwarmGptArgs),
    /// One attacking worker in four (gradients scaled, negated, replaced by noise, replayed,
    /// or computed at a diverging learning rate) against each of the servers' aggregation
    /// rules, with the top-k and sign codecs (issue 21).
    Attack(attack::AttackArgs),
    /// Outer rounds of H local steps (DiLoCo) with f32, top-k, sign and 2-bit top-k
    /// pseudo-gradients under error feedback, against exchanging gradients every step, on
    /// MNIST and Fashion-MNIST (and the byte-level GPT with `--datasets shakespeare`): the
    /// final model and the bytes per worker (issue 27).
    LocalSteps(local_steps::LocalStepsArgs),
    /// Redraw the figures beside the tables (PNG) from the results' JSON, without rerunning
    /// anything: LIEC-SGD's error norm, Clapping's accuracy against p and per arm, LoCo's and
    /// CLAN's accuracy per arm.
    Figures(figures::FiguresArgs),
}

pub fn run(command: ReproCommand) -> anyhow::Result<()> {
    match command {
        ReproCommand::Liec(a) => liec::run(a),
        ReproCommand::Clan(a) => clan::run(a),
        ReproCommand::Loco(a) => loco::run(a),
        ReproCommand::Clapping(a) => clapping::run(a),
        ReproCommand::ClappingGpt(a) => clapping_gpt::run(a),
        ReproCommand::SwarmGpt(a) => swarm_gpt::run(a),
        ReproCommand::Attack(a) => attack::run(a),
        ReproCommand::LocalSteps(a) => local_steps::run(a),
        ReproCommand::Figures(a) => figures::run(a),
    }
}
