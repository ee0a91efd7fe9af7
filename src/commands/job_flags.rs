//! A job from a TOML file with flags on top: only the flags given on the command line
//! override the file (clap fills every field with its default, so defaults must not).

use std::path::Path;

use clap::parser::ValueSource;
use clap::ArgMatches;
use murmur_node::Job;

/// The job: `file`'s, with the job flags given in `matches` on top; the flags alone when
/// there is no file.
/// `--model gpt` without `--dataset` trains on shakespeare, as `murmur train --model gpt` does.
pub fn job_from(file: Option<&Path>, flags: &Job, matches: &ArgMatches) -> anyhow::Result<Job> {
    let given_here = |f: &str| matches.value_source(f) == Some(ValueSource::CommandLine);
    let text_by_default = flags.is_gpt() && !given_here("dataset");
    let mut flags = flags.clone();
    if text_by_default {
        flags.dataset = "shakespeare".into();
    }
    let Some(path) = file else {
        flags.validate()?;
        return Ok(flags);
    };
    let names = Job::field_names();
    let mut given: Vec<&str> = names
        .iter()
        .map(String::as_str)
        .filter(|f| given_here(f))
        .collect();
    if text_by_default && given_here("model") {
        given.push("dataset");
    }
    Ok(Job::load(path)?.with_fields_from(&flags, &given)?)
}
