//! TCP ports: once the client has sent something, answer with the identity preamble, then
//! echo every byte back until the client closes. Waiting for the first bytes keeps the port
//! client-first, like the Istio echo app's, so proxies that sniff the protocol do not stall.

use std::sync::Arc;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use super::{Conn, describe};

pub async fn serve<IO>(mut io: IO, conn: Arc<Conn>) -> std::io::Result<()>
where
    IO: AsyncRead + AsyncWrite + Unpin,
{
    let mut buffer = vec![0u8; 16 * 1024];
    let mut greeted = false;
    loop {
        let n = io.read(&mut buffer).await?;
        if n == 0 {
            return io.shutdown().await;
        }
        if !greeted {
            io.write_all(describe::tcp_preamble(&conn).as_bytes())
                .await?;
            greeted = true;
        }
        io.write_all(&buffer[..n]).await?;
    }
}
