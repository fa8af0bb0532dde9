//! Files in the proxy's state directory (on the node, surviving restarts of the proxy), written
//! so that a crash at any moment leaves either the old content or the new, never half of it.

use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

/// Writes `bytes` to a temporary file next to `path`, readable by root only, and renames it
/// over `path`.
pub fn write_atomically(path: &Path, bytes: &[u8]) -> io::Result<()> {
    let dir = path
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let mut temp_name = path.file_name().unwrap_or_default().to_owned();
    temp_name.push(".tmp");
    let temp = dir.join(temp_name);
    let written = (|| {
        let mut file = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&temp)?;
        file.write_all(bytes)?;
        file.sync_all()?;
        std::fs::rename(&temp, path)?;
        // The rename itself is durable only once the directory is synced.
        File::open(dir)?.sync_all()
    })();
    if written.is_err() {
        let _ = std::fs::remove_file(&temp);
    }
    written
}

/// [`write_atomically`], creating the file's directory first (private, see
/// [`create_private_dir`]): what is saved before the agent made the state directory.
pub fn write_in_private_dir(path: &Path, bytes: &[u8]) -> io::Result<()> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        create_private_dir(dir)?;
    }
    write_atomically(path, bytes)
}

/// The state directory holds the netns paths of pods: only root needs to read it. An existing
/// directory keeps its mode (it may be shared, e.g. a hostPath the operator chose).
pub fn create_private_dir(path: &std::path::Path) -> std::io::Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(path)
}
