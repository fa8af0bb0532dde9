//! Runs nftables commands inside a pod's network namespace. The thin I/O shell of this module.
//!
//! Two ways, same JSON: in-process through libnftables (the default when the library loads),
//! or the `nft` program (when "nftPath" is configured or the library is missing). Either way
//! only a short-lived thread or the child process joins the pod's netns with `setns(2)`; the
//! caller's own threads never change namespace, which matters for the node proxy, a
//! multi-threaded process that calls this too. A child joins between fork and exec
//! (`pre_exec`): one fork+exec, where `nsenter --net=PATH nft …` would be two.

use std::fs::File;
use std::io::{self, Write};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use nftables::schema::Nftables;
use nix::errno::Errno;
use nix::sched::{CloneFlags, setns};

use super::libnftables::Libnftables;
use super::ruleset::TABLE;
use super::verify::table_objects;

#[derive(Clone, Debug)]
pub struct Nft {
    backend: Backend,
}

#[derive(Clone)]
enum Backend {
    Library(&'static Libnftables),
    Program(PathBuf),
}

impl std::fmt::Debug for Backend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Backend::Library(_) => f.write_str("libnftables"),
            Backend::Program(program) => write!(f, "{}", program.display()),
        }
    }
}

impl Default for Nft {
    /// libnftables in-process, or `nft` from PATH when the library cannot be loaded.
    fn default() -> Self {
        Nft {
            backend: match Libnftables::get() {
                Some(library) => Backend::Library(library),
                None => Backend::Program(PathBuf::from("nft")),
            },
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum NftError {
    #[error("network namespace {} does not exist", .0.display())]
    NetnsGone(PathBuf),
    #[error("cannot enter network namespace {}: {source}", path.display())]
    Netns { path: PathBuf, source: io::Error },
    #[error(
        "cannot run {}: {source} (install nftables >= 0.9.3 on the node, or set \"nftPath\" in the aether-cni config)",
        program.display()
    )]
    Spawn { program: PathBuf, source: io::Error },
    #[error("`{command}` failed in network namespace {}: {}", netns.display(), message.trim())]
    Failed {
        command: String,
        netns: PathBuf,
        message: String,
    },
    #[error("nftables printed JSON this plugin cannot read: {0}")]
    InvalidJson(serde_json::Error),
}

impl Nft {
    /// Always the `nft` program at `program`, never the library.
    pub fn program(program: impl Into<PathBuf>) -> Self {
        Nft {
            backend: Backend::Program(program.into()),
        }
    }

    /// Applies `batch` as one atomic transaction (`nft -j -f -`).
    pub fn apply(&self, netns: &Path, batch: &Nftables) -> Result<(), NftError> {
        let input = serde_json::to_string(batch).map_err(NftError::InvalidJson)?;
        self.run(netns, Op::Apply(&input)).map(drop)
    }

    /// Our table's objects, from `nft -j list ruleset`; nothing when the table is missing.
    /// Listing the ruleset, not the table, spares parsing `nft`'s "No such file" error text.
    pub fn list_ours(&self, netns: &Path) -> Result<Nftables<'static>, NftError> {
        self.list_table(netns, TABLE)
    }

    /// The objects of table `inet NAME`, the same way.
    pub fn list_table(&self, netns: &Path, name: &str) -> Result<Nftables<'static>, NftError> {
        let out = self.run(netns, Op::ListRuleset)?;
        let listing = serde_json::from_str(&out).map_err(NftError::InvalidJson)?;
        table_objects(&listing, name).map_err(NftError::InvalidJson)
    }

    fn run(&self, netns: &Path, op: Op) -> Result<String, NftError> {
        let ns = File::open(netns).map_err(|source| match source.kind() {
            io::ErrorKind::NotFound => NftError::NetnsGone(netns.to_owned()),
            _ => NftError::Netns {
                path: netns.to_owned(),
                source,
            },
        })?;
        let failed = |message: String| NftError::Failed {
            command: format!("{:?} {}", self.backend, op.args().join(" ")),
            netns: netns.to_owned(),
            message,
        };
        match &self.backend {
            Backend::Library(library) => {
                let text = match op {
                    Op::Apply(input) => input,
                    Op::ListRuleset => "list ruleset",
                };
                in_netns(&ns, netns, || library.run(text))?.map_err(failed)
            }
            Backend::Program(program) => {
                let output = spawn_in(&ns, netns, program, &op)?;
                if output.status.success() {
                    Ok(String::from_utf8_lossy(&output.stdout).into_owned())
                } else {
                    Err(failed(String::from_utf8_lossy(&output.stderr).into_owned()))
                }
            }
        }
    }
}

enum Op<'a> {
    Apply(&'a str),
    ListRuleset,
}

impl Op<'_> {
    fn args(&self) -> &'static [&'static str] {
        match self {
            Op::Apply(_) => &["-j", "-f", "-"],
            Op::ListRuleset => &["-j", "list", "ruleset"],
        }
    }
}

/// setns fails with EINVAL when the path is no longer a netns (e.g. unmounted).
fn netns_error(path: &Path, source: io::Error) -> NftError {
    if source.raw_os_error() == Some(Errno::EINVAL as i32) {
        NftError::NetnsGone(path.to_owned())
    } else {
        NftError::Netns {
            path: path.to_owned(),
            source,
        }
    }
}

/// Runs `f` on a scoped thread that has joined `ns`; the thread ends with it.
///
/// The thread also takes a private descriptor table holding only the standard streams:
/// libnftables waits on its netlink socket with select(2), which cannot take a descriptor of
/// 1024 or more (glibc aborts the process). In a process holding thousands of connections (the
/// node proxy), a socket opened in the shared table would get such a number.
fn in_netns<T: Send>(ns: &File, path: &Path, f: impl FnOnce() -> T + Send) -> Result<T, NftError> {
    std::thread::scope(|scope| {
        scope
            .spawn(|| {
                setns(ns.as_fd(), CloneFlags::CLONE_NEWNET)
                    .map_err(|e| netns_error(path, e.into()))?;
                // SAFETY: with CLOSE_RANGE_UNSHARE the descriptors are closed in this thread's
                // own copy of the table only; nothing of the thread uses them afterwards.
                let private =
                    unsafe { libc::close_range(3, u32::MAX, libc::CLOSE_RANGE_UNSHARE as i32) };
                if private != 0 {
                    return Err(NftError::Netns {
                        path: path.to_owned(),
                        source: io::Error::last_os_error(),
                    });
                }
                Ok(f())
            })
            .join()
            .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
    })
}

fn spawn_in(ns: &File, path: &Path, program: &Path, op: &Op) -> Result<Output, NftError> {
    let ns_fd = ns.as_raw_fd();
    let mut child = Command::new(program);
    child
        .args(op.args())
        .stdin(match op {
            Op::Apply(_) => Stdio::piped(),
            Op::ListRuleset => Stdio::null(),
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    // SAFETY: between fork and exec only async-signal-safe calls are allowed; setns(2) is a
    // plain syscall. `ns` outlives the spawn, so the descriptor is open in the child.
    unsafe {
        child.pre_exec(move || {
            setns(BorrowedFd::borrow_raw(ns_fd), CloneFlags::CLONE_NEWNET).map_err(io::Error::from)
        });
    }
    let spawn_error = |source: io::Error| NftError::Spawn {
        program: program.to_owned(),
        source,
    };
    let mut child = child.spawn().map_err(|source| {
        if source.raw_os_error() == Some(Errno::EINVAL as i32) {
            netns_error(path, source)
        } else {
            spawn_error(source)
        }
    })?;
    if let (Op::Apply(input), Some(mut pipe)) = (op, child.stdin.take()) {
        // nft reads all of stdin before it writes anything, so this cannot deadlock.
        pipe.write_all(input.as_bytes()).map_err(spawn_error)?;
    }
    child.wait_with_output().map_err(spawn_error)
}
