//! What crosses a node's link, seen from this machine: the local cluster's nodes reach each
//! other through the host end of their underlay veth (`vh-<node>`), where a packet socket sees
//! every frame both ways. No capture tool is needed on the nodes or in the images.

use std::ffi::CString;
use std::io::Read;
use std::os::fd::{FromRawFd, OwnedFd};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;

use anyhow::{Context, Result, bail};

/// The TLS record header of application data (TLS 1.2 and 1.3 both write 0x0303).
const TLS_APPLICATION_DATA: [u8; 3] = [0x17, 0x03, 0x03];

/// A capture running on one interface until [`Capture::stop`].
pub struct Capture {
    stop: Arc<AtomicBool>,
    thread: JoinHandle<std::io::Result<Captured>>,
}

/// Every frame seen, back to back.
pub struct Captured {
    pub frames: usize,
    pub bytes: Vec<u8>,
}

impl Captured {
    pub fn contains(&self, needle: &[u8]) -> bool {
        self.bytes.windows(needle.len()).any(|w| w == needle)
    }

    /// How many TLS application-data record headers the frames hold.
    pub fn tls_records(&self) -> usize {
        self.bytes
            .windows(TLS_APPLICATION_DATA.len())
            .filter(|w| *w == TLS_APPLICATION_DATA)
            .count()
    }
}

impl Capture {
    /// Starts capturing every frame of `interface` (needs root).
    pub fn start(interface: &str) -> Result<Capture> {
        let name = CString::new(interface)?;
        // SAFETY: `name` is a valid C string for the duration of the call.
        let index = unsafe { libc::if_nametoindex(name.as_ptr()) };
        if index == 0 {
            bail!("no interface {interface} on this machine");
        }
        let protocol = (libc::ETH_P_ALL as u16).to_be();
        // SAFETY: plain system call; the descriptor is owned right after.
        let fd = unsafe {
            libc::socket(
                libc::AF_PACKET,
                libc::SOCK_RAW | libc::SOCK_CLOEXEC,
                i32::from(protocol),
            )
        };
        if fd < 0 {
            return Err(std::io::Error::last_os_error()).context("a packet socket (needs root)");
        }
        // SAFETY: `fd` was just returned by socket(2) and nothing else owns it.
        let socket = unsafe { OwnedFd::from_raw_fd(fd) };
        // SAFETY: an all-zero sockaddr_ll is valid; the fields that matter are set below.
        let mut address: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
        address.sll_family = libc::AF_PACKET as u16;
        address.sll_protocol = protocol;
        address.sll_ifindex = i32::try_from(index)?;
        // SAFETY: `address` is a sockaddr_ll of the size given, alive for the call.
        let bound = unsafe {
            libc::bind(
                fd,
                (&raw const address).cast(),
                std::mem::size_of::<libc::sockaddr_ll>() as libc::socklen_t,
            )
        };
        if bound != 0 {
            return Err(std::io::Error::last_os_error())
                .with_context(|| format!("binding a packet socket to {interface}"));
        }
        // Reads wake up every 100 ms to see whether to stop.
        let timeout = libc::timeval {
            tv_sec: 0,
            tv_usec: 100_000,
        };
        // SAFETY: `timeout` is a timeval of the size given, alive for the call.
        let set = unsafe {
            libc::setsockopt(
                fd,
                libc::SOL_SOCKET,
                libc::SO_RCVTIMEO,
                (&raw const timeout).cast(),
                std::mem::size_of::<libc::timeval>() as libc::socklen_t,
            )
        };
        if set != 0 {
            return Err(std::io::Error::last_os_error()).context("SO_RCVTIMEO");
        }
        let stop = Arc::new(AtomicBool::new(false));
        let stopping = stop.clone();
        let thread = std::thread::spawn(move || {
            let mut socket = std::fs::File::from(socket);
            let mut captured = Captured {
                frames: 0,
                bytes: Vec::new(),
            };
            let mut frame = vec![0u8; 65_536];
            while !stopping.load(Ordering::Relaxed) {
                match socket.read(&mut frame) {
                    Ok(n) => {
                        captured.frames += 1;
                        captured.bytes.extend_from_slice(&frame[..n]);
                    }
                    Err(e)
                        if matches!(
                            e.kind(),
                            std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                        ) => {}
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                    Err(e) => return Err(e),
                }
            }
            Ok(captured)
        });
        Ok(Capture { stop, thread })
    }

    /// Stops the capture and gives what it saw.
    pub fn stop(self) -> Result<Captured> {
        self.stop.store(true, Ordering::Relaxed);
        match self.thread.join() {
            Ok(result) => Ok(result.context("reading the packet socket")?),
            Err(_) => bail!("the capture thread panicked"),
        }
    }
}
