//! A job from a TOML file with flags on top: only the flags given on the command line
//! override the file (clap fills every field with its default, so defaults must not).

use std::path::Path;

use clap::parser::ValueSource;
use clap::ArgMatches;
use murmur_node::Job;

/// The job: `file`'s, with the job flags given in `matches` on top; the flags alone when
/// there is no file.
pub fn job_from(file: Option<&Path>, flags: &Job, matches: &ArgMatches) -> anyhow::Result<Job> {
    let Some(path) = file else {
        flags.validate()?;
        return Ok(flags.clone());
    };
    let names = Job::field_names();
    let given: Vec<&str> = names
        .iter()
        .map(String::as_str)
        .filter(|f| matches.value_source(f) == Some(ValueSource::CommandLine))
        .collect();
    Ok(Job::load(path)?.with_fields_from(flags, &given)?)
}
