//! The protocol between the CNI plugin and the node proxy, over a Unix socket.
//!
//! Framing: one JSON object per line (`\n`-terminated, at most [`MAX_FRAME_BYTES`]), so it can be
//! read with `socat` when debugging. Every frame carries [`PROTOCOL_VERSION`]; a peer that speaks
//! another version gets a clear error instead of a misread message. A connection carries any
//! number of request/response pairs, one at a time; the plugin closes it when done.
//!
//! The plugin uses [`Client`]; the proxy reads frames with [`read_frame`] (or its own async
//! reader with the same limit) and answers each with [`handle_frame`].

mod client;
mod frame;
mod messages;

pub use client::{Client, ClientError, Connection};
pub use frame::{
    DecodeError, FrameError, decode_request, decode_response, encode_request, encode_response,
    handle_frame, read_frame,
};
pub use messages::{
    CapturePlan, CheckStatus, Decision, ErrorKind, ErrorReply, PodRef, Request, Response,
    StrictPlan,
};

use std::time::Duration;

pub const PROTOCOL_VERSION: u32 = 1;
pub const DEFAULT_SOCKET: &str = "/var/run/aether/cni.sock";
/// Bounds each connect, request and response: the runtime waits on the plugin.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(2);
/// Large enough for a capture set of tens of thousands of route-target ports.
pub const MAX_FRAME_BYTES: usize = 4 << 20;
