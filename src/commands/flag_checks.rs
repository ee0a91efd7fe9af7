//! Checks of flag values that several commands share, made before any work starts: a
//! refusal costs the user a second, not an epoch. Each refusal is a [`crate::exit::Usage`]
//! error naming the flag.

use std::path::Path;

use crate::exit::usage;

/// `value` must be a finite number above 0.
pub fn positive(flag: &str, value: f32) -> anyhow::Result<()> {
    if value.is_finite() && value > 0.0 {
        Ok(())
    } else {
        Err(usage(format!(
            "{flag} must be a number above 0, not {value}"
        )))
    }
}

/// `value` must be a finite number of at least 0.
pub fn non_negative(flag: &str, value: f32) -> anyhow::Result<()> {
    if value.is_finite() && value >= 0.0 {
        Ok(())
    } else {
        Err(usage(format!(
            "{flag} must be a number of at least 0, not {value}"
        )))
    }
}

/// `value` must lie in [0, 1).
pub fn below_one(flag: &str, value: f32) -> anyhow::Result<()> {
    if (0.0..1.0).contains(&value) {
        Ok(())
    } else {
        Err(usage(format!(
            "{flag} must be at least 0 and below 1, not {value}"
        )))
    }
}

/// `path` must name a file that can be written: its folder exists and takes new files, and
/// it is not itself a folder. Nothing is left behind by the check.
pub fn writable(flag: &str, path: &Path) -> anyhow::Result<()> {
    let refuse = |why: String| Err(usage(format!("{flag} {}: {why}", path.display())));
    if path.is_dir() {
        return refuse("that is a folder; give a file name".into());
    }
    let folder = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    if !folder.is_dir() {
        return refuse(format!("there is no folder {}", folder.display()));
    }
    let probe = folder.join(format!(".murmur-write-check-{}", std::process::id()));
    match std::fs::File::create(&probe) {
        Ok(_) => {
            let _ = std::fs::remove_file(&probe);
            Ok(())
        }
        Err(e) => refuse(format!("cannot write in {}: {e}", folder.display())),
    }
}

/// `path` must name a file that can be read.
pub fn readable(flag: &str, path: &Path) -> anyhow::Result<()> {
    match std::fs::File::open(path) {
        Ok(_) if path.is_file() => Ok(()),
        Ok(_) => Err(usage(format!("{flag} {}: not a file", path.display()))),
        Err(e) => Err(usage(format!("{flag} {}: {e}", path.display()))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_out_of_range_are_refused_with_the_flag_named() {
        for bad in [f32::NAN, f32::INFINITY, -1.0, 0.0] {
            let e = positive("--lr", bad).unwrap_err().to_string();
            assert!(e.starts_with("--lr must be"), "{e}");
        }
        positive("--lr", 1e-3).unwrap();
        assert!(non_negative("--weight-decay", f32::NAN).is_err());
        assert!(non_negative("--weight-decay", -0.1).is_err());
        non_negative("--weight-decay", 0.0).unwrap();
        assert!(below_one("--dropout", 1.0).is_err());
        assert!(below_one("--dropout", f32::NAN).is_err());
        below_one("--dropout", 0.0).unwrap();
    }

    #[test]
    fn paths_are_checked_without_leaving_anything() {
        let dir = std::env::temp_dir().join(format!("murmur-flag-checks-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        writable("--save", &dir.join("model.safetensors")).unwrap();
        assert_eq!(
            std::fs::read_dir(&dir).unwrap().count(),
            0,
            "the probe is gone"
        );
        let e = writable("--save", &dir.join("no/such/model.safetensors"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("there is no folder"), "{e}");
        assert!(writable("--save", &dir).is_err(), "a folder is not a file");
        assert!(readable("--resume", &dir.join("missing")).is_err());
        assert!(readable("--resume", &dir).is_err());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
