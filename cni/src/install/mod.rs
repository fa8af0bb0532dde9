//! `aether-cni install` / `uninstall`, run by the DaemonSet's init container with the host's
//! CNI directories mounted: put the binary in the bin dir and our entry at the end of the
//! primary network config list, or take both away again. Every write is a temp file plus
//! `rename`, so the runtime never reads a half-written binary or config.

mod conflist;

pub use conflist::{EditError, PLUGIN_TYPE};

use conflist::{ConfKind, plugin_entry, primary_config, with_plugin, without_plugin};

use std::fs::{self, File, Permissions};
use std::io::{self, Write};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::plugin::Settings;

#[derive(Debug, thiserror::Error)]
pub enum InstallError {
    #[error(
        "no network config (*.conflist, *.conf, *.json) in {}: install the primary network plugin first; aether chains after it",
        .0.display()
    )]
    NoConfig(PathBuf),
    #[error("{}: {source}", path.display())]
    Io { path: PathBuf, source: io::Error },
    #[error("{} is not valid JSON: {source}", path.display())]
    Json {
        path: PathBuf,
        source: serde_json::Error,
    },
    #[error("cannot edit {}: {source}", path.display())]
    Edit { path: PathBuf, source: EditError },
}

/// What `install` changed, for the init container's log.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Installed {
    pub binary: PathBuf,
    pub config: PathBuf,
    /// False when the config already had exactly this entry.
    pub config_changed: bool,
}

/// Copies `binary` to `<bin_dir>/aether-cni` and appends our entry to the primary config.
pub fn install(
    binary: &Path,
    bin_dir: &Path,
    conf_dir: &Path,
    settings: &Settings,
) -> Result<Installed, InstallError> {
    let target = bin_dir.join(PLUGIN_TYPE);
    let bytes = fs::read(binary).map_err(io_at(binary))?;
    write_atomic(&target, &bytes, 0o755)?;
    let (config, config_changed) = chain(conf_dir, &plugin_entry(settings))?;
    Ok(Installed {
        binary: target,
        config,
        config_changed,
    })
}

/// Our entry in the primary config, if it is there.
pub fn chained_entry(conf_dir: &Path) -> Result<Option<Value>, InstallError> {
    let names = config_names(conf_dir)?;
    let primary =
        primary_config(&names).ok_or_else(|| InstallError::NoConfig(conf_dir.to_owned()))?;
    let config = read_json(&conf_dir.join(primary))?;
    Ok(config["plugins"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|p| p["type"] == PLUGIN_TYPE)
        .cloned())
}

/// Puts `entry` at the end of the primary config (a single-plugin config becomes a list).
/// Returns the config's path and whether it changed. Also how the proxy puts back an entry
/// that something else (another network plugin rewriting its config) took out.
pub fn chain(conf_dir: &Path, entry: &Value) -> Result<(PathBuf, bool), InstallError> {
    let names = config_names(conf_dir)?;
    let primary =
        primary_config(&names).ok_or_else(|| InstallError::NoConfig(conf_dir.to_owned()))?;
    let path = conf_dir.join(primary);
    let kind = ConfKind::of(primary).unwrap_or(ConfKind::List);
    let config = read_json(&path)?;
    let edited = with_plugin(&config, kind, entry).map_err(|source| InstallError::Edit {
        path: path.clone(),
        source,
    })?;
    let config_path = match kind {
        ConfKind::List => path.clone(),
        ConfKind::Single => path.with_extension("conflist"),
    };
    let changed = edited != config || config_path != path;
    if changed {
        write_atomic(&config_path, &pretty(&edited), 0o644)?;
    }
    if config_path != path {
        // The list now stands in for the single-plugin file; the runtime must not pick that.
        fs::remove_file(&path).map_err(io_at(&path))?;
    }
    Ok((config_path, changed))
}

/// Removes our entry from every config list in `conf_dir`, then the binary. Idempotent.
/// Returns the configs it edited.
pub fn uninstall(bin_dir: &Path, conf_dir: &Path) -> Result<Vec<PathBuf>, InstallError> {
    let mut edited = Vec::new();
    for name in config_names(conf_dir)? {
        if ConfKind::of(&name) != Some(ConfKind::List) {
            continue;
        }
        let path = conf_dir.join(&name);
        // A file we cannot read as a chain is not ours to touch.
        let Ok(config) = read_json(&path) else {
            continue;
        };
        if let Ok(Some(without)) = without_plugin(&config) {
            write_atomic(&path, &pretty(&without), 0o644)?;
            edited.push(path);
        }
    }
    let binary = bin_dir.join(PLUGIN_TYPE);
    match fs::remove_file(&binary) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(io_at(&binary)(e)),
        _ => {}
    }
    Ok(edited)
}

fn config_names(dir: &Path) -> Result<Vec<String>, InstallError> {
    let mut names = Vec::new();
    for entry in fs::read_dir(dir).map_err(io_at(dir))? {
        let entry = entry.map_err(io_at(dir))?;
        if let Some(name) = entry.file_name().to_str()
            && ConfKind::of(name).is_some()
            && entry.file_type().map_err(io_at(dir))?.is_file()
        {
            names.push(name.to_owned());
        }
    }
    names.sort();
    Ok(names)
}

fn read_json(path: &Path) -> Result<Value, InstallError> {
    let bytes = fs::read(path).map_err(io_at(path))?;
    serde_json::from_slice(&bytes).map_err(|source| InstallError::Json {
        path: path.to_owned(),
        source,
    })
}

fn pretty(value: &Value) -> Vec<u8> {
    let mut bytes = serde_json::to_vec_pretty(value).unwrap_or_default();
    bytes.push(b'\n');
    bytes
}

/// Write to a temp file in the same directory, fsync, then rename over `path`.
fn write_atomic(path: &Path, bytes: &[u8], mode: u32) -> Result<(), InstallError> {
    let dir = path.parent().unwrap_or(Path::new("."));
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy())
        .unwrap_or_default();
    // A leading dot and no config extension: a runtime never reads the temp file as a config.
    let temp = dir.join(format!(".{name}.aether-tmp-{}", std::process::id()));
    let written = (|| {
        let mut file = File::create(&temp)?;
        file.write_all(bytes)?;
        file.set_permissions(Permissions::from_mode(mode))?;
        file.sync_all()?;
        fs::rename(&temp, path)?;
        File::open(dir)?.sync_all()
    })();
    if written.is_err() {
        let _ = fs::remove_file(&temp);
    }
    written.map_err(io_at(path))
}

fn io_at(path: &Path) -> impl Fn(io::Error) -> InstallError + '_ {
    move |source| InstallError::Io {
        path: path.to_owned(),
        source,
    }
}
