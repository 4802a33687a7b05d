//! `lego-rl generate-docs DIR`: man pages (clap_mangen) and shell completions, committed under
//! `man/`; a test fails when they are stale.

use std::path::{Path, PathBuf};

use clap::Args;

use super::Outcome;

/// Write man pages and shell completions.
///
/// Example:
///   lego-rl generate-docs man
#[derive(Args, Debug)]
pub struct GenerateDocsArgs {
    /// Output directory.
    pub dir: PathBuf,
}

/// Runs `generate-docs` for `cli`, the whole command line (`lego_rl::cli::Cli::command()`; passed
/// in so that `cmd` does not point back at `cli`).
pub fn run(args: GenerateDocsArgs, cli: &clap::Command) -> anyhow::Result<Outcome> {
    for (name, bytes) in render_docs(cli)? {
        let path = args.dir.join(&name);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent)?;
        }
        std::fs::write(&path, bytes)?;
    }
    Ok(Outcome::Ok)
}

/// Every generated file of `cli` as (path relative to the docs dir, contents).
pub fn render_docs(cli: &clap::Command) -> anyhow::Result<Vec<(String, Vec<u8>)>> {
    let mut files = Vec::new();
    let cmd = cli.clone();
    let mut buf = Vec::new();
    clap_mangen::Man::new(cmd.clone()).render(&mut buf)?;
    files.push(("lego-rl.1".to_string(), buf));
    for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set()) {
        let name = format!("lego-rl-{}", sub.get_name());
        let sub = sub.clone().name(name.clone());
        let mut buf = Vec::new();
        clap_mangen::Man::new(sub).render(&mut buf)?;
        files.push((format!("{name}.1"), buf));
    }
    for shell in [
        clap_complete::Shell::Bash,
        clap_complete::Shell::Zsh,
        clap_complete::Shell::Fish,
    ] {
        let mut buf = Vec::new();
        clap_complete::generate(shell, &mut cli.clone(), "lego-rl", &mut buf);
        let file = match shell {
            clap_complete::Shell::Bash => "completions/lego-rl.bash",
            clap_complete::Shell::Zsh => "completions/_lego-rl",
            _ => "completions/lego-rl.fish",
        };
        files.push((file.to_string(), buf));
    }
    Ok(files)
}

/// Files under `dir` that differ from what [`render_docs`] would write for `cli`.
pub fn stale_docs(dir: &Path, cli: &clap::Command) -> anyhow::Result<Vec<String>> {
    Ok(render_docs(cli)?
        .into_iter()
        .filter(|(name, bytes)| std::fs::read(dir.join(name)).ok().as_deref() != Some(bytes.as_slice()))
        .map(|(name, _)| name)
        .collect())
}
