use std::fs::File;
use std::io::Write;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use nix::sched::{CloneFlags, setns};

use super::{PluginRun, unique};

/// A named network namespace (`ip netns add`), deleted on drop.
pub struct Netns {
    name: String,
    path: PathBuf,
}

impl Netns {
    pub fn new(prefix: &str) -> Self {
        let name = unique(prefix);
        let status = Command::new("ip")
            .args(["netns", "add", &name])
            .status()
            .unwrap();
        assert!(status.success(), "ip netns add {name} failed");
        let netns = Netns {
            path: Path::new("/var/run/netns").join(&name),
            name,
        };
        netns.ip(&["link", "set", "lo", "up"]);
        netns
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// `ip -n NAME ARGS…`, asserting success.
    pub fn ip(&self, args: &[&str]) {
        let out = Command::new("ip")
            .arg("-n")
            .arg(&self.name)
            .args(args)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "ip -n {} {args:?}: {out:?}",
            self.name
        );
    }

    pub fn sysctl(&self, key: &str, value: &str) {
        let file = format!("/proc/sys/{}", key.replace('.', "/"));
        let value = value.to_owned();
        in_netns(&self.path, move || {
            // /proc/sys/net shows the netns of the thread that opens it.
            let mut f = File::options().write(true).open(&file).unwrap();
            f.write_all(value.as_bytes()).unwrap();
        });
    }

    /// Deletes it now, as a runtime does after a pod is gone.
    pub fn delete(&self) {
        let status = Command::new("ip")
            .args(["netns", "del", &self.name])
            .status()
            .unwrap();
        assert!(status.success());
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        if self.path.exists() {
            let _ = Command::new("ip")
                .args(["netns", "del", &self.name])
                .status();
        }
    }
}

/// Runs `f` on a fresh thread inside `netns`. Sockets it creates stay in that netns.
pub fn in_netns<T: Send + 'static>(netns: &Path, f: impl FnOnce() -> T + Send + 'static) -> T {
    let ns = File::open(netns).unwrap();
    std::thread::spawn(move || {
        setns(ns.as_fd(), CloneFlags::CLONE_NEWNET).unwrap();
        f()
    })
    .join()
    .unwrap()
}

/// Runs `program` inside `netns` with exactly `env` (plus PATH) and `stdin`.
pub fn run_in(netns: &Path, program: &Path, env: &[(&str, &str)], stdin: &[u8]) -> PluginRun {
    let ns = File::open(netns).unwrap();
    let fd = ns.as_raw_fd();
    let mut command = plugin_command(program, env);
    // SAFETY: setns is a plain syscall, fine between fork and exec; `ns` outlives the spawn.
    #[allow(unsafe_code)]
    unsafe {
        command.pre_exec(move || {
            setns(BorrowedFd::borrow_raw(fd), CloneFlags::CLONE_NEWNET)
                .map_err(std::io::Error::from)
        });
    }
    let run = finish(command, stdin);
    drop(ns);
    run
}

/// Runs `program` in this process's netns with exactly `env` (plus PATH) and `stdin`.
pub fn run_here(program: &Path, env: &[(&str, &str)], stdin: &[u8]) -> PluginRun {
    finish(plugin_command(program, env), stdin)
}

fn plugin_command(program: &Path, env: &[(&str, &str)]) -> Command {
    let mut command = Command::new(program);
    command
        .env_clear()
        .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
        .envs(env.iter().copied())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    command
}

fn finish(mut command: Command, stdin: &[u8]) -> PluginRun {
    let mut child = command.spawn().unwrap();
    // The plugin rejects a bad environment before reading stdin, so the pipe may be closed.
    let _ = child.stdin.take().unwrap().write_all(stdin);
    let out = child.wait_with_output().unwrap();
    PluginRun {
        success: out.status.success(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}
