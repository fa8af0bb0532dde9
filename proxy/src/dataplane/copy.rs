//! Bytes both ways between two connections (an app's, a tunnel's, a backend's) until each
//! side has closed its half. Each direction's buffer starts small and grows while reads fill
//! it: most opaque connections are idle or chatty (a database pool, a queue consumer) and keep
//! a small buffer, while a bulk transfer gets large writes, which on an HTTP/2 tunnel is fewer
//! trips through the connection's flow control for the same bytes.

use std::io;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

/// A direction's first buffer, and the largest it grows to.
const FIRST_BUFFER: usize = 4 * 1024;
pub(super) const LARGEST_BUFFER: usize = 128 * 1024;

/// Copies `a` to `b` and `b` to `a` at once. A side that reaches its end of stream has the other
/// side's write half shut down, and the other direction goes on (half-close). Returns the bytes
/// each way, or the first error, which ends both directions.
pub async fn both_ways<A, B>(a: A, b: B) -> io::Result<(u64, u64)>
where
    A: AsyncRead + AsyncWrite + Unpin,
    B: AsyncRead + AsyncWrite + Unpin,
{
    let (mut a_read, mut a_write) = tokio::io::split(a);
    let (mut b_read, mut b_write) = tokio::io::split(b);
    tokio::try_join!(
        one_way(&mut a_read, &mut b_write),
        one_way(&mut b_read, &mut a_write)
    )
}

async fn one_way<R, W>(from: &mut R, to: &mut W) -> io::Result<u64>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let mut buffer = vec![0u8; FIRST_BUFFER];
    let mut copied = 0u64;
    loop {
        let read = from.read(&mut buffer).await?;
        if read == 0 {
            to.shutdown().await?;
            return Ok(copied);
        }
        to.write_all(&buffer[..read]).await?;
        to.flush().await?;
        copied += read as u64;
        if read == buffer.len() && buffer.len() < LARGEST_BUFFER {
            buffer.resize(buffer.len() * 2, 0);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn carries_both_ways_with_half_close_and_grows_for_bulk() {
        let (app, mut app_peer) = tokio::io::duplex(256 * 1024);
        let (tunnel, mut tunnel_peer) = tokio::io::duplex(256 * 1024);
        let copy = tokio::spawn(both_ways(app, tunnel));
        let bulk: Vec<u8> = (0..1_000_000u32).map(|i| i as u8).collect();
        let sent = bulk.clone();
        let writer = tokio::spawn(async move {
            app_peer.write_all(&sent).await.unwrap();
            // Half-close: the app is done sending, and still reads the answer.
            app_peer.shutdown().await.unwrap();
            let mut answer = String::new();
            app_peer.read_to_string(&mut answer).await.unwrap();
            answer
        });
        let mut received = Vec::new();
        tunnel_peer.read_to_end(&mut received).await.unwrap();
        assert!(received == bulk, "the bytes arrive whole and in order");
        tunnel_peer.write_all(b"got it").await.unwrap();
        tunnel_peer.shutdown().await.unwrap();
        assert_eq!(writer.await.unwrap(), "got it");
        assert_eq!(copy.await.unwrap().unwrap(), (1_000_000, 6));
    }

    #[tokio::test]
    async fn an_error_ends_both_directions() {
        let (app, app_peer) = tokio::io::duplex(1024);
        let (tunnel, mut tunnel_peer) = tokio::io::duplex(1024);
        drop(app_peer);
        // The app's side is gone: writing the tunnel's bytes to it fails, and the copy ends
        // although the tunnel never closed.
        tunnel_peer.write_all(b"late").await.unwrap();
        let result = both_ways(app, tunnel).await;
        assert!(result.is_err(), "{result:?}");
    }
}
