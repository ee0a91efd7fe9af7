//! Reading a metrics file (`--metrics run.jsonl`) back, every line checked: a bad line is an
//! error that names the file and the line.

use std::path::Path;

use anyhow::{bail, Context};
use murmur_node::Metrics;
use serde::Deserialize;

/// The records of the metrics file at `path`, in file order (blank lines skipped).
pub fn read_metrics(path: &Path) -> anyhow::Result<Vec<Metrics>> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    parse_metrics(&text).with_context(|| format!("{} is not a metrics file", path.display()))
}

/// The records of a metrics file's text.
pub fn parse_metrics(text: &str) -> anyhow::Result<Vec<Metrics>> {
    let mut records = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        // An object first: serde would take a struct from an array too, field by field.
        let record = serde_json::from_str::<serde_json::Map<String, serde_json::Value>>(line)
            .and_then(|object| Metrics::deserialize(serde_json::Value::Object(object)))
            .with_context(|| format!("line {} is not a metrics record", i + 1))?;
        // A pipeline's first stages report bytes without a loss.
        let drawn = [
            record.loss.is_some(),
            record.accuracy.is_some(),
            record.valid_loss.is_some(),
            record.bytes_up.is_some(),
            record.bytes_down.is_some(),
        ];
        if !drawn.contains(&true) {
            bail!(
                "line {} has nothing to draw (no loss, accuracy, valid_loss or bytes)",
                i + 1
            );
        }
        records.push(record);
    }
    if records.is_empty() {
        bail!("it holds no records (an empty file)");
    }
    Ok(records)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn good_lines_parse_and_each_bad_input_names_its_line() {
        let good = "{\"step\":1,\"loss\":2.5,\"bytes_up\":0}\n\n{\"step\":2,\"loss\":null}\n{\"step\":2,\"accuracy\":0.5}\n{\"step\":2,\"stage\":0,\"bytes_up\":10}\n";
        let records = parse_metrics(good).unwrap();
        assert_eq!(records.len(), 4);
        assert!(records[1].loss.unwrap().is_nan());

        let cases = [
            (
                "{\"step\":1,\"loss\":1}\nnot json\n",
                "line 2 is not a metrics record",
            ),
            (
                "{\"step\":1,\"loss\":1}\n{\"loss\":1}\n",
                "line 2 is not a metrics record",
            ),
            (
                "{\"step\":-1,\"loss\":1}\n",
                "line 1 is not a metrics record",
            ),
            ("{\"step\":1,\"lr\":0.1}\n", "line 1 has nothing to draw"),
            ("[1, 2]\n", "line 1 is not a metrics record"),
            ("", "no records"),
            ("\n  \n", "no records"),
        ];
        for (text, expected) in cases {
            let err = format!("{:#}", parse_metrics(text).unwrap_err());
            assert!(err.contains(expected), "{text:?}: {err}");
        }
    }
}
