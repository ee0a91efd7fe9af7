//! Files a node leaves behind (checkpoints, models), written so that a crash or a kill
//! mid-write never leaves a truncated file where a good one was.

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use crate::error::{NodeError, Result};

/// Writes `bytes` to `path` through a temporary file beside it, renamed over `path` once
/// complete (a rename within a folder is atomic).
pub fn write_atomically(path: &Path, bytes: &[u8]) -> Result<()> {
    let partial = partial_path(path);
    std::fs::write(&partial, bytes)
        .map_err(|e| NodeError::io(format!("writing {}", partial.display()), e))?;
    std::fs::rename(&partial, path)
        .map_err(|e| NodeError::io(format!("writing {}", path.display()), e))
}

/// `path` with `.partial` added to its name (never replacing an extension, so that
/// `model.tmp` and `model.safetensors` do not share a temporary file).
fn partial_path(path: &Path) -> PathBuf {
    let mut name = path.file_name().map(OsString::from).unwrap_or_default();
    name.push(".partial");
    path.with_file_name(name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_write_replaces_the_file_whole_and_leaves_no_temporary() {
        let dir = std::env::temp_dir().join(format!("murmur-files-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("model.safetensors");
        write_atomically(&path, b"first").unwrap();
        write_atomically(&path, b"second").unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"second");
        let names: Vec<_> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, ["model.safetensors"]);
        assert!(write_atomically(&dir.join("missing/model"), b"x").is_err());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
