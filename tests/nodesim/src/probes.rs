//! Readiness probes, run like the kubelet's: HTTP and TCP probes connect to the pod IP from
//! the node's network namespace; exec probes run inside the container.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::time::Duration;

use k8s_openapi::api::core::v1::Probe;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

/// A probe, resolved against its container's named ports.
#[derive(Debug, Clone)]
pub enum Check {
    Http { port: u16, path: String },
    Tcp { port: u16 },
    Exec { command: Vec<String> },
}

pub fn check(probe: &Probe, named_ports: &[(String, u16)]) -> Option<Check> {
    let port = |p: &IntOrString| match p {
        IntOrString::Int(n) => u16::try_from(*n).ok(),
        IntOrString::String(name) => named_ports.iter().find(|(n, _)| n == name).map(|(_, p)| *p),
    };
    if let Some(http) = &probe.http_get {
        return Some(Check::Http {
            port: port(&http.port)?,
            path: http.path.clone().unwrap_or_else(|| "/".into()),
        });
    }
    if let Some(tcp) = &probe.tcp_socket {
        return Some(Check::Tcp {
            port: port(&tcp.port)?,
        });
    }
    probe.exec.as_ref().map(|e| Check::Exec {
        command: e.command.clone().unwrap_or_default(),
    })
}

/// Runs `f` on a fresh thread that has joined the network namespace at `netns`
/// (a thread's namespace is its own, and the thread ends afterwards).
fn in_netns<T: Send + 'static>(
    netns: PathBuf,
    f: impl FnOnce() -> std::io::Result<T> + Send + 'static,
) -> std::io::Result<T> {
    std::thread::spawn(move || {
        let file = std::fs::File::open(&netns)?;
        nix::sched::setns(file.as_fd(), nix::sched::CloneFlags::CLONE_NEWNET)?;
        f()
    })
    .join()
    .map_err(|_| std::io::Error::other("probe thread panicked"))?
}

/// Whether the probe succeeds. `node_netns` is where network probes start from; `pid` is
/// the container's process for exec probes.
pub async fn run(
    check: &Check,
    pod_ip: &str,
    node_netns: &Path,
    pid: u32,
    timeout: Duration,
) -> bool {
    match check {
        Check::Http { port, path } => {
            let Ok(ip) = pod_ip.parse() else { return false };
            let (addr, path) = (SocketAddr::new(ip, *port), path.clone());
            let netns = node_netns.to_path_buf();
            tokio::task::spawn_blocking(move || {
                in_netns(netns, move || {
                    let mut stream = TcpStream::connect_timeout(&addr, timeout)?;
                    stream.set_read_timeout(Some(timeout))?;
                    write!(stream, "GET {path} HTTP/1.1\r\nHost: {addr}\r\nUser-Agent: kube-probe/aether-nodesim\r\nConnection: close\r\n\r\n")?;
                    let mut head = [0u8; 12];
                    stream.read_exact(&mut head)?;
                    let status: u16 = std::str::from_utf8(&head[9..12]).ok().and_then(|s| s.parse().ok()).unwrap_or(0);
                    Ok((200..400).contains(&status))
                })
            })
            .await
            .ok()
            .and_then(Result::ok)
            .unwrap_or(false)
        }
        Check::Tcp { port } => {
            let Ok(ip) = pod_ip.parse() else { return false };
            let (addr, netns) = (SocketAddr::new(ip, *port), node_netns.to_path_buf());
            tokio::task::spawn_blocking(move || {
                in_netns(netns, move || {
                    TcpStream::connect_timeout(&addr, timeout).map(|_| true)
                })
            })
            .await
            .ok()
            .and_then(Result::ok)
            .unwrap_or(false)
        }
        Check::Exec { command } => {
            let mut nsenter = tokio::process::Command::new("nsenter");
            nsenter
                .arg("-t")
                .arg(pid.to_string())
                .args(["-n", "-m", "-u", "--"])
                .args(command);
            nsenter
                .kill_on_drop(true)
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null());
            matches!(tokio::time::timeout(timeout, nsenter.status()).await, Ok(Ok(status)) if status.success())
        }
    }
}
