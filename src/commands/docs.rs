//! `murmur completions SHELL` and `murmur man`: shell completions and manual pages, generated
//! from the same clap definitions the parser uses, so they never drift from the flags.

use std::path::PathBuf;

use anyhow::Context;
use clap::Args;
use clap_complete::Shell;

#[derive(Args, Debug)]
pub struct CompletionsArgs {
    /// bash, zsh, fish, elvish or powershell. Install e.g. with
    /// `murmur completions bash > ~/.local/share/bash-completion/completions/murmur`.
    shell: Shell,
}

#[derive(Args, Debug)]
pub struct ManArgs {
    /// Write murmur.1 and a page per subcommand (murmur-train.1, ...) into this folder,
    /// instead of printing murmur.1 on stdout.
    #[arg(long)]
    dir: Option<PathBuf>,
}

pub fn completions(a: CompletionsArgs) -> anyhow::Result<()> {
    let mut command = super::Cli::definition();
    let mut script = Vec::new();
    clap_complete::generate(a.shell, &mut command, "murmur", &mut script);
    super::stdout::print(&script)
}

pub fn man(a: ManArgs) -> anyhow::Result<()> {
    let command = super::Cli::definition();
    match a.dir {
        None => {
            let mut page = Vec::new();
            clap_mangen::Man::new(command).render(&mut page)?;
            super::stdout::print(&page)?;
        }
        Some(dir) => {
            std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
            clap_mangen::generate_to(command, &dir)
                .with_context(|| format!("writing manual pages into {}", dir.display()))?;
            eprintln!("manual pages written to {}", dir.display());
        }
    }
    Ok(())
}
