//! The namespaces a pod's process (or a CNI plugin) starts in.
//!
//! Every simulated node shares this machine's filesystem, but some directories must be the
//! node's own: its CNI config and plugins, and aether's node-local state. A "node view" is
//! a private mount namespace where those directories are bind-mounted from the node's root.
//! A container additionally gets its volumes bound at their mount paths, `/etc/resolv.conf`,
//! its own hostname (UTS namespace) and its pod's network namespace.
//!
//! [`Namespaces::enter`] runs between fork and exec (`pre_exec`), so everything it needs
//! (paths as C strings, the netns file descriptor) is prepared beforehand and it only
//! makes system calls.

use std::ffi::CString;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use nix::mount::{MsFlags, mount};
use nix::sched::{CloneFlags, setns, unshare};

/// Directories that belong to a node rather than to the machine.
/// `/var/lib/cni` holds host-local IPAM's allocations, which are per node.
pub const NODE_PRIVATE_DIRS: &[&str] = &[
    "/etc/cni/net.d",
    "/opt/cni/bin",
    "/var/lib/cni",
    "/var/run/aether",
    "/var/lib/aether",
];

/// A node's filesystem: `NODE_PRIVATE_DIRS` live under `root`.
#[derive(Debug, Clone)]
pub struct NodeView {
    pub root: PathBuf,
}

impl NodeView {
    /// Where `path`, as seen on the node, is on this machine.
    pub fn host_path(&self, path: &Path) -> PathBuf {
        for dir in NODE_PRIVATE_DIRS {
            if let Ok(rest) = path.strip_prefix(dir) {
                return self.root.join(dir.trim_start_matches('/')).join(rest);
            }
        }
        path.to_path_buf()
    }

    /// Creates the node's private directories and their mount points.
    pub fn prepare(&self) -> std::io::Result<()> {
        for dir in NODE_PRIVATE_DIRS {
            std::fs::create_dir_all(dir)?;
            std::fs::create_dir_all(self.host_path(Path::new(dir)))?;
        }
        Ok(())
    }

    fn binds(&self) -> Vec<Bind> {
        NODE_PRIVATE_DIRS
            .iter()
            .map(|dir| Bind::new(&self.host_path(Path::new(dir)), Path::new(dir), false))
            .collect()
    }
}

#[derive(Debug)]
struct Bind {
    source: CString,
    target: CString,
    read_only: bool,
}

impl Bind {
    fn new(source: &Path, target: &Path, read_only: bool) -> Self {
        let c = |p: &Path| CString::new(p.as_os_str().as_bytes()).unwrap_or_default();
        Bind {
            source: c(source),
            target: c(target),
            read_only,
        }
    }
}

/// Everything a process enters before exec.
#[derive(Debug)]
pub struct Namespaces {
    binds: Vec<Bind>,
    /// Mounts the machine makes later (e.g. new pods' netns files) show up inside.
    host_to_container: bool,
    hostname: Option<CString>,
    netns: Option<OwnedFd>,
}

impl Namespaces {
    /// The node view alone (CNI plugins run in it).
    pub fn node(view: &NodeView) -> Self {
        Namespaces {
            binds: view.binds(),
            host_to_container: false,
            hostname: None,
            netns: None,
        }
    }

    /// Binds `source` (a path of the node view) at `target`, after the node's own binds.
    pub fn bind(&mut self, source: &Path, target: &Path, read_only: bool) {
        self.binds.push(Bind::new(source, target, read_only));
    }

    /// `mountPropagation: HostToContainer`: the process's mounts become slaves of the
    /// machine's, instead of private copies.
    pub fn receive_host_mounts(&mut self) {
        self.host_to_container = true;
    }

    pub fn hostname(&mut self, name: &str) {
        self.hostname = CString::new(name).ok();
    }

    /// Joins the network namespace bound at `path`.
    pub fn netns(&mut self, path: &Path) -> std::io::Result<()> {
        self.netns = Some(std::fs::File::open(path)?.into());
        Ok(())
    }

    /// Enters the namespaces. Only for `pre_exec`: it changes the calling process.
    pub fn enter(&self) -> std::io::Result<()> {
        let flags = if self.hostname.is_some() {
            CloneFlags::CLONE_NEWNS | CloneFlags::CLONE_NEWUTS
        } else {
            CloneFlags::CLONE_NEWNS
        };
        unshare(flags)?;
        // Keep this process's mounts from propagating back to the machine (a slave still
        // receives the machine's).
        let propagation = if self.host_to_container {
            MsFlags::MS_SLAVE
        } else {
            MsFlags::MS_PRIVATE
        };
        mount(
            None::<&str>,
            "/",
            None::<&str>,
            MsFlags::MS_REC | propagation,
            None::<&str>,
        )?;
        for bind in &self.binds {
            mount(
                Some(bind.source.as_c_str()),
                bind.target.as_c_str(),
                None::<&str>,
                MsFlags::MS_BIND | MsFlags::MS_REC,
                None::<&str>,
            )?;
            if bind.read_only {
                let flags = MsFlags::MS_BIND | MsFlags::MS_REMOUNT | MsFlags::MS_RDONLY;
                mount(
                    None::<&str>,
                    bind.target.as_c_str(),
                    None::<&str>,
                    flags,
                    None::<&str>,
                )?;
            }
        }
        if let Some(name) = &self.hostname {
            nix::unistd::sethostname(std::ffi::OsStr::from_bytes(name.to_bytes()))?;
        }
        if let Some(fd) = &self.netns {
            setns(fd.as_fd(), CloneFlags::CLONE_NEWNET)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_private_paths_live_under_the_node_root() {
        let view = NodeView {
            root: PathBuf::from("/state/node-1"),
        };
        assert_eq!(
            view.host_path(Path::new("/etc/cni/net.d/10.conflist")),
            Path::new("/state/node-1/etc/cni/net.d/10.conflist")
        );
        assert_eq!(
            view.host_path(Path::new("/var/run/aether")),
            Path::new("/state/node-1/var/run/aether")
        );
        assert_eq!(
            view.host_path(Path::new("/var/run/netns/pod")),
            Path::new("/var/run/netns/pod")
        );
        assert_eq!(
            view.host_path(Path::new("/etc/cni/net.dx")),
            Path::new("/etc/cni/net.dx")
        );
    }
}
