//! The nodes' processes, reached from this machine (the nodes' pods run on it, their host
//! network is its bridge's): found, signalled and asked without the API server, so that a test
//! can do it while that is down.

use std::io::{Read, Write};
use std::time::Duration;

use anyhow::{Context, Result, bail};

/// The host pid of the process named `comm` in pod `pod` (its `POD_NAME`): the nodes' pods run
/// on this machine.
pub fn process_of(pod: &str, comm: &str) -> Result<u32> {
    let wanted = format!("POD_NAME={pod}");
    for entry in std::fs::read_dir("/proc")?.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        let dir = entry.path();
        let named = std::fs::read_to_string(dir.join("comm")).is_ok_and(|c| c.trim() == comm);
        let in_pod = std::fs::read(dir.join("environ"))
            .is_ok_and(|env| env.split(|b| *b == 0).any(|v| v == wanted.as_bytes()));
        if named && in_pod {
            return Ok(pid);
        }
    }
    bail!("no process {comm} of pod {pod} on this machine")
}

/// Sends `SIG<signal>` (`KILL`, `TERM`) to `pid`.
pub fn signal(pid: u32, signal: &str) -> Result<()> {
    let status = std::process::Command::new("kill")
        .args([format!("-{signal}"), pid.to_string()])
        .status()?;
    if !status.success() {
        bail!("cannot send SIG{signal} to {pid}");
    }
    Ok(())
}

/// `GET path` of a node proxy's admin endpoint (`http://<node address>:15020`): the status and
/// the body.
pub fn admin_get(node_ip: &str, path: &str) -> Result<(u16, String)> {
    let addr = format!("{node_ip}:15020");
    let parsed = addr
        .parse()
        .with_context(|| format!("{addr} is no address"))?;
    let mut conn = std::net::TcpStream::connect_timeout(&parsed, Duration::from_secs(2))
        .with_context(|| format!("connecting to {addr}"))?;
    conn.set_read_timeout(Some(Duration::from_secs(5)))?;
    write!(
        conn,
        "GET {path} HTTP/1.1\r\nHost: {node_ip}\r\nConnection: close\r\n\r\n"
    )?;
    let mut answer = String::new();
    conn.read_to_string(&mut answer)
        .with_context(|| format!("reading {path} from {addr}"))?;
    let status = answer
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .with_context(|| format!("{addr}{path} answered no HTTP status: {answer:?}"))?;
    let body = answer
        .split_once("\r\n\r\n")
        .map_or("", |(_, body)| body)
        .to_owned();
    Ok((status, body))
}
