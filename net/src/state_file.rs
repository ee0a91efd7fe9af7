//! Files a node keeps for itself between runs (a shard's state folder, a worker's state),
//! framed so that damage is found before anything is decoded: a magic of 8 bytes naming the
//! kind and version, the body's length (8 bytes) and CRC-32 (4 bytes, little-endian), and the
//! body (postcard, as on the wire). The CRC finds damage; the files are the node's own, not a
//! peer's, so a cryptographic digest would only cost time (SHA-256 took a third of a shard's
//! save). Writes go through a temporary file, synced and renamed over the old one, so a kill
//! leaves the old file or the new, never half of one.

use std::ffi::OsString;
use std::fs;
use std::io::Write;
use std::path::Path;

use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::error::{NetError, Result};

fn io_error(path: &Path, doing: &str, e: std::io::Error) -> NetError {
    NetError::State(format!("{doing} {}: {e}", path.display()))
}

/// Writes `magic`, the body's length and CRC and the body to `path` whole
/// ([`write_atomically`]).
pub fn write(path: &Path, magic: &[u8; 8], value: &impl Serialize) -> Result<()> {
    let body = postcard::to_allocvec(value)
        .map_err(|e| NetError::State(format!("encoding {}: {e}", path.display())))?;
    let len = (body.len() as u64).to_le_bytes();
    let crc = crc32fast::hash(&body).to_le_bytes();
    write_atomically(path, &[magic, &len, &crc, &body])
}

/// Writes `parts` one after the other to `path` through a temporary file beside it
/// (`path` with `.partial` added to its name, never replacing an extension), synced and then
/// renamed over `path`, and syncs the folder: a kill or a power cut leaves the old file or
/// the new, never half of one. Every file a node leaves goes through here.
pub fn write_atomically(path: &Path, parts: &[&[u8]]) -> Result<()> {
    let mut name = path.file_name().map(OsString::from).unwrap_or_default();
    name.push(".partial");
    let partial = path.with_file_name(name);
    let write = || -> std::io::Result<()> {
        let mut file = fs::File::create(&partial)?;
        for part in parts {
            file.write_all(part)?;
        }
        file.sync_data()?;
        fs::rename(&partial, path)?;
        // The rename itself is durable once the folder is synced (where folders open).
        if let Some(dir) = path.parent().and_then(|d| fs::File::open(d).ok()) {
            let _ = dir.sync_all();
        }
        Ok(())
    };
    write().map_err(|e| io_error(path, "writing", e))
}

/// Reads a file [`write()`] wrote with `magic`, checking its magic, length and CRC before
/// decoding.
pub fn read<T: DeserializeOwned>(path: &Path, magic: &[u8; 8]) -> Result<T> {
    let bytes = fs::read(path).map_err(|e| io_error(path, "reading", e))?;
    decode(magic, &bytes).map_err(|why| NetError::State(format!("{}: {why}", path.display())))
}

/// The body of a file's bytes, or why they are not one.
pub fn decode<T: DeserializeOwned>(
    magic: &[u8; 8],
    bytes: &[u8],
) -> std::result::Result<T, String> {
    let head = magic.len() + 12;
    if bytes.len() < head || &bytes[..magic.len()] != magic {
        return Err(format!(
            "not a {} file (or one of another version)",
            String::from_utf8_lossy(magic)
        ));
    }
    let (len, rest) = bytes[magic.len()..].split_at(8);
    let (crc, body) = rest.split_at(4);
    if u64::from_le_bytes(len.try_into().expect("8 bytes")) != body.len() as u64 {
        return Err("damaged: cut short, or with bytes past its end".into());
    }
    if crc32fast::hash(body) != u32::from_le_bytes(crc.try_into().expect("4 bytes")) {
        return Err("damaged: its contents do not match their CRC".into());
    }
    postcard::from_bytes(body).map_err(|e| format!("damaged: {e}"))
}
