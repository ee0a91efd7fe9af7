//! Pieces every reproduction report shares: statistics over seeds, the machine line, and
//! writing a results file without losing the notes a person added below its tables.

use std::path::{Path, PathBuf};

use anyhow::Context;

/// Mean and sample standard deviation.
pub fn mean_std(values: &[f64]) -> (f64, f64) {
    let n = values.len() as f64;
    if values.is_empty() {
        return (f64::NAN, f64::NAN);
    }
    let mean = values.iter().sum::<f64>() / n;
    let var = if values.len() > 1 {
        values.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / (n - 1.0)
    } else {
        0.0
    };
    (mean, var.sqrt())
}

/// `mean ± std` with `digits` decimals (just the mean for one seed).
pub fn pm(values: &[f64], digits: usize) -> String {
    let (m, s) = mean_std(values);
    if values.len() > 1 {
        format!("{m:.digits$} ± {s:.digits$}")
    } else {
        format!("{m:.digits$}")
    }
}

/// Where a reproduction writes its table: `--out` if given, else `file` under docs/results/
/// (a quick run's under target/repro/, so it never overwrites a full table).
pub fn results_path(out: &Option<PathBuf>, quick: bool, file: &str) -> PathBuf {
    out.clone().unwrap_or_else(|| {
        let dir = if quick {
            "target/repro"
        } else {
            "docs/results"
        };
        Path::new(dir).join(file)
    })
}

/// The arms that `--arms` names by label (all of them without it), in their order. A name
/// that is no arm's label is refused, with the labels there are.
pub fn keep_arms<A>(
    arms: Vec<A>,
    keep: &Option<Vec<String>>,
    label: impl Fn(&A) -> &str,
) -> anyhow::Result<Vec<A>> {
    let Some(keep) = keep else {
        return Ok(arms);
    };
    if let Some(unknown) = keep.iter().find(|k| !arms.iter().any(|a| label(a) == *k)) {
        let labels: Vec<String> = arms.iter().map(|a| format!("{:?}", label(a))).collect();
        return Err(crate::exit::usage(format!(
            "--arms {unknown:?}: no such arm; the arms are {}",
            labels.join(", ")
        )));
    }
    Ok(arms
        .into_iter()
        .filter(|a| keep.iter().any(|k| k == label(a)))
        .collect())
}

/// The heading under which people write their reading of the tables; a rerun keeps it.
pub const NOTES: &str = "## Notes";

/// Writes `generated` to `path`, followed by the notes section of the file already there.
pub fn write_keeping_notes(path: &Path, generated: &str) -> anyhow::Result<()> {
    let notes = std::fs::read_to_string(path)
        .ok()
        .and_then(|old| old.find(NOTES).map(|i| old[i..].to_string()));
    let mut text = generated.to_string();
    if let Some(notes) = notes {
        text.push('\n');
        text.push_str(&notes);
    }
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))
}

/// The command line that produced a report, as the user typed it.
pub fn command_line() -> String {
    let args: Vec<String> = std::env::args().skip(1).collect();
    format!("murmur {}", args.join(" "))
}

/// The list a `--flag a;b` gave, or `default`.
pub fn list_or(given: &Option<Vec<String>>, default: &[&str]) -> Vec<String> {
    given
        .clone()
        .unwrap_or_else(|| default.iter().map(|s| s.to_string()).collect())
}

/// What a reproduction of swarm arms that keeps its finished arms takes besides its own
/// flags: whether to start afresh, the device and the datasets' folder.
#[derive(clap::Args, Debug, Clone)]
pub struct KeptArms {
    /// Run every arm again, ignoring the finished arms in the JSON.
    #[arg(long)]
    pub fresh: bool,
    #[arg(long, value_enum, default_value_t)]
    pub device: murmur_node::DeviceKind,
    /// The datasets' folder [default: $MURMUR_DATA, else ./data].
    #[arg(long)]
    pub data: Option<PathBuf>,
}

impl KeptArms {
    /// The results an earlier run left in `json`, unless `--fresh` says to start again.
    pub fn kept<T: serde::de::DeserializeOwned>(&self, json: &Path) -> anyhow::Result<Option<T>> {
        if self.fresh {
            return Ok(None);
        }
        load_kept(json)
    }
}

/// Writes `results` to `json` (pretty JSON), making its folder: after every finished arm, so
/// that a stopped run keeps them.
pub fn write_json(json: &Path, results: &impl serde::Serialize) -> anyhow::Result<()> {
    if let Some(dir) = json.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    std::fs::write(json, serde_json::to_string_pretty(results)?)
        .with_context(|| format!("writing {}", json.display()))
}

/// The results an earlier run left in `json`, if there are any it can read: a run that
/// keeps finished arms starts from them (a file of another shape is ignored, not an error).
fn load_kept<T: serde::de::DeserializeOwned>(json: &Path) -> anyhow::Result<Option<T>> {
    match std::fs::read_to_string(json) {
        Ok(text) => Ok(serde_json::from_str(&text).ok()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e).with_context(|| format!("reading {}", json.display())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spread_is_the_sample_standard_deviation_and_notes_survive_a_rerun() {
        let (m, s) = mean_std(&[1.0, 2.0, 3.0]);
        assert_eq!((m, s), (2.0, 1.0));
        assert_eq!(pm(&[0.5], 2), "0.50");
        let dir = std::env::temp_dir().join(format!("murmur-report-{}", std::process::id()));
        let path = dir.join("r.md");
        write_keeping_notes(&path, "# T\n\nold table\n").unwrap();
        let with_notes = std::fs::read_to_string(&path).unwrap() + "\n## Notes\n\nwhy\n";
        std::fs::write(&path, with_notes).unwrap();
        write_keeping_notes(&path, "# T\n\nnew table\n").unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(text.contains("new table") && !text.contains("old table"));
        assert!(text.ends_with("## Notes\n\nwhy\n"), "{text}");
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn quick_runs_never_write_over_the_full_tables_and_arms_are_kept_by_label() {
        assert_eq!(
            results_path(&None, false, "x.md"),
            Path::new("docs/results/x.md")
        );
        assert_eq!(
            results_path(&None, true, "x.md"),
            Path::new("target/repro/x.md")
        );
        let chosen = Some(PathBuf::from("elsewhere.md"));
        assert_eq!(
            results_path(&chosen, true, "x.md"),
            Path::new("elsewhere.md")
        );

        let arms = vec!["a", "b", "c"];
        assert_eq!(keep_arms(arms.clone(), &None, |x| x).unwrap(), arms);
        let keep = Some(vec!["c".to_string(), "a".to_string()]);
        assert_eq!(
            keep_arms(arms.clone(), &keep, |x| x).unwrap(),
            ["a", "c"],
            "the arms' own order"
        );
        let bogus = Some(vec!["a".to_string(), "bogus".to_string()]);
        let e = keep_arms(arms, &bogus, |x| x).unwrap_err();
        assert_eq!(crate::exit::code(&e), crate::exit::USAGE);
        assert!(e.to_string().contains("\"bogus\": no such arm"), "{e}");
    }
}
