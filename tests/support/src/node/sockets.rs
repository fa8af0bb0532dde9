//! TCP from inside a pod's netns, and the original destination of a redirected connection.

use std::net::{
    Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6, TcpListener, TcpStream,
};
use std::os::fd::AsRawFd;
use std::path::Path;
use std::time::{Duration, Instant};

use nix::sys::socket::{
    AddressFamily, SockFlag, SockType, SockaddrIn, SockaddrIn6, connect, getsockopt, setsockopt,
    socket, sockopt,
};
use nix::sys::time::TimeVal;

use super::in_netns;

pub const TIMEOUT: Duration = Duration::from_secs(3);

/// A listener bound inside `netns`.
pub fn listen_in(netns: &Path, addr: &str) -> TcpListener {
    let addr: SocketAddr = addr.parse().unwrap();
    in_netns(netns, move || {
        let listener = TcpListener::bind(addr).unwrap();
        listener.set_nonblocking(true).unwrap();
        listener
    })
}

/// Connects from inside `netns`, optionally with a socket mark (as the proxy does), within
/// [`TIMEOUT`] (SO_SNDTIMEO bounds a blocking connect).
pub fn connect_from(netns: &Path, to: SocketAddr, mark: Option<u32>) -> std::io::Result<TcpStream> {
    in_netns(netns, move || {
        let family = if to.is_ipv4() {
            AddressFamily::Inet
        } else {
            AddressFamily::Inet6
        };
        let socket = socket(family, SockType::Stream, SockFlag::SOCK_CLOEXEC, None)?;
        if let Some(mark) = mark {
            setsockopt(&socket, sockopt::Mark, &mark)?;
        }
        setsockopt(
            &socket,
            sockopt::SendTimeout,
            &TimeVal::new(TIMEOUT.as_secs() as i64, 0),
        )?;
        match to {
            SocketAddr::V4(a) => connect(socket.as_raw_fd(), &SockaddrIn::from(a))?,
            SocketAddr::V6(a) => connect(socket.as_raw_fd(), &SockaddrIn6::from(a))?,
        }
        Ok(TcpStream::from(socket))
    })
}

/// The next connection on `listener`, if one comes within [`TIMEOUT`].
pub fn accept_within(listener: &TcpListener) -> Option<TcpStream> {
    let deadline = Instant::now() + TIMEOUT;
    while Instant::now() < deadline {
        match listener.accept() {
            Ok((stream, _)) => return Some(stream),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                std::thread::sleep(Duration::from_millis(10))
            }
            Err(e) => panic!("accept: {e}"),
        }
    }
    None
}

/// What the app dialled, before the redirect (SO_ORIGINAL_DST / IP6T_SO_ORIGINAL_DST).
pub fn original_dst(stream: &TcpStream) -> SocketAddr {
    match stream.local_addr().unwrap() {
        SocketAddr::V4(_) => {
            let sa = getsockopt(stream, sockopt::OriginalDst).unwrap();
            SocketAddr::V4(SocketAddrV4::new(
                Ipv4Addr::from(u32::from_be(sa.sin_addr.s_addr)),
                u16::from_be(sa.sin_port),
            ))
        }
        SocketAddr::V6(_) => {
            let sa = getsockopt(stream, sockopt::Ip6tOriginalDst).unwrap();
            SocketAddr::V6(SocketAddrV6::new(
                Ipv6Addr::from(sa.sin6_addr.s6_addr),
                u16::from_be(sa.sin6_port),
                0,
                0,
            ))
        }
    }
}
