//! Files a node leaves behind (checkpoints, models), written so that a crash or a kill
//! mid-write never leaves a truncated file where a good one was.

use std::path::Path;

use crate::error::Result;

/// Writes `bytes` to `path` whole: through a temporary file beside it, synced and renamed
/// over `path` ([`murmur_net::state_file::write_atomically`], what the nodes' state files
/// use too).
pub fn write_atomically(path: &Path, bytes: &[u8]) -> Result<()> {
    Ok(murmur_net::state_file::write_atomically(path, &[bytes])?)
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
