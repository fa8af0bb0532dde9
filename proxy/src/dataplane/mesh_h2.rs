//! HTTP/2 between two proxies, on the `h2` crate directly: hyper's HTTP/2 client sends each
//! request through a channel to its connection task and spawns a task per request to wait for
//! the answer, and its server spawns one per request too; on the mesh hop those hand-offs were
//! a large part of the proxy's CPU per request. Here the caller's task drives its own stream,
//! and the inbound side serves a connection's streams from the connection's task.
//!
//! This module holds what both sides share: the connection settings, the body of a received
//! stream, and sending a body into a stream with flow control.

use std::future::poll_fn;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use h2::{RecvStream, SendStream};
use hyper::body::{Body as HttpBody, Bytes, Frame, SizeHint};

use super::http::{Body, BoxError};

/// Per-stream and per-connection receive windows: large enough that one stream of a busy
/// connection can move a large body without waiting for window updates at every 64 KiB.
const STREAM_WINDOW: u32 = 2 << 20;
const CONNECTION_WINDOW: u32 = 5 << 20;
/// Streams a peer may have open on one connection at once; past it, new requests wait.
const MAX_STREAMS: u32 = 1024;
/// Largest header block accepted, as HTTP/1's limits allow about as much.
const MAX_HEADER_LIST: u32 = 64 << 10;
/// Data queued on a stream beyond what the peer's window allows.
const MAX_SEND_BUFFER: usize = 1 << 20;

pub fn client_builder() -> h2::client::Builder {
    let mut builder = h2::client::Builder::new();
    builder
        .enable_push(false)
        .initial_window_size(STREAM_WINDOW)
        .initial_connection_window_size(CONNECTION_WINDOW)
        .max_header_list_size(MAX_HEADER_LIST)
        .max_send_buffer_size(MAX_SEND_BUFFER);
    builder
}

pub fn server_builder() -> h2::server::Builder {
    let mut builder = h2::server::Builder::new();
    builder
        .initial_window_size(STREAM_WINDOW)
        .initial_connection_window_size(CONNECTION_WINDOW)
        .max_concurrent_streams(MAX_STREAMS)
        .max_header_list_size(MAX_HEADER_LIST)
        .max_send_buffer_size(MAX_SEND_BUFFER);
    builder
}

/// The body of a received HTTP/2 stream: its data, then its trailers. Each chunk handed on
/// gives its bytes back to the stream's window, so the peer may send more.
pub struct RecvBody {
    stream: RecvStream,
    data_done: bool,
}

impl RecvBody {
    pub fn new(stream: RecvStream) -> Self {
        RecvBody {
            stream,
            data_done: false,
        }
    }

    pub fn boxed(stream: RecvStream) -> Body {
        use http_body_util::BodyExt;
        RecvBody::new(stream).map_err(BoxError::from).boxed()
    }
}

impl HttpBody for RecvBody {
    type Data = Bytes;
    type Error = h2::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, h2::Error>>> {
        if !self.data_done {
            match ready!(self.stream.poll_data(cx)) {
                Some(Ok(data)) => {
                    // Fails only once the stream is gone, when the window no longer matters.
                    let _ = self.stream.flow_control().release_capacity(data.len());
                    return Poll::Ready(Some(Ok(Frame::data(data))));
                }
                Some(Err(e)) => return Poll::Ready(Some(Err(e))),
                None => self.data_done = true,
            }
        }
        match ready!(self.stream.poll_trailers(cx)) {
            Ok(Some(trailers)) => Poll::Ready(Some(Ok(Frame::trailers(trailers)))),
            Ok(None) => Poll::Ready(None),
            Err(e) => Poll::Ready(Some(Err(e))),
        }
    }

    fn is_end_stream(&self) -> bool {
        self.stream.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        if self.stream.is_end_stream() {
            SizeHint::with_exact(0)
        } else {
            SizeHint::default()
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum PumpError {
    #[error("the peer reset the stream: {0}")]
    Reset(h2::Reason),
    #[error("the stream closed before the body was sent")]
    Closed,
    #[error("reading the body: {0}")]
    Body(BoxError),
    #[error(transparent)]
    H2(#[from] h2::Error),
}

/// Sends `body` into `send`, data then trailers, as the peer's window allows. A body that
/// fails resets the stream, so the peer does not take a truncated body for a whole one.
pub async fn pump(mut body: Body, mut send: SendStream<Bytes>) -> Result<(), PumpError> {
    loop {
        let next = poll_fn(|cx| {
            if let Poll::Ready(reset) = send.poll_reset(cx) {
                return Poll::Ready(Err(match reset {
                    Ok(reason) => PumpError::Reset(reason),
                    Err(e) => PumpError::H2(e),
                }));
            }
            Pin::new(&mut body).poll_frame(cx).map(Ok)
        })
        .await?;
        let frame = match next {
            None => return Ok(send.send_data(Bytes::new(), true)?),
            Some(Ok(frame)) => frame,
            Some(Err(e)) => {
                send.send_reset(h2::Reason::INTERNAL_ERROR);
                return Err(PumpError::Body(e));
            }
        };
        let data = match frame.into_data() {
            Ok(data) => data,
            Err(frame) => {
                if let Ok(trailers) = frame.into_trailers() {
                    send.reserve_capacity(0);
                    return Ok(send.send_trailers(trailers)?);
                }
                continue;
            }
        };
        let end = body.is_end_stream();
        if !data.is_empty() {
            // A claim of one byte, not the chunk's length: a claim on capacity the peer is
            // slow to grant would hold the connection's window away from other streams. h2
            // raises the claim to what is queued once the data is sent.
            send.reserve_capacity(1);
            poll_fn(|cx| {
                while send.capacity() == 0 {
                    match ready!(send.poll_capacity(cx)) {
                        Some(Ok(_)) => {}
                        Some(Err(e)) => return Poll::Ready(Err(PumpError::H2(e))),
                        None => return Poll::Ready(Err(PumpError::Closed)),
                    }
                }
                Poll::Ready(Ok(()))
            })
            .await?;
        }
        send.send_data(data, end)?;
        if end {
            return Ok(());
        }
    }
}
