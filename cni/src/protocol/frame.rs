use std::io::{self, BufRead, Read};

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use super::messages::{ErrorKind, ErrorReply, Request, Response};
use super::{MAX_FRAME_BYTES, PROTOCOL_VERSION};

#[derive(Serialize, Deserialize)]
struct RequestFrame {
    version: u32,
    request: Request,
}

#[derive(Serialize, Deserialize)]
struct ResponseFrame {
    version: u32,
    response: Response,
}

/// Read first, on its own, so a frame of another version is reported as such and not as garbage.
#[derive(Deserialize)]
struct VersionProbe {
    version: u64,
}

#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    #[error("frame of {0} bytes exceeds the limit of {MAX_FRAME_BYTES} bytes")]
    TooLarge(usize),
    #[error("not a valid frame: {0}")]
    Malformed(String),
    #[error(
        "protocol version {got} is not supported (this side speaks version {PROTOCOL_VERSION})"
    )]
    UnsupportedVersion { got: u64 },
}

#[derive(Debug, thiserror::Error)]
pub enum FrameError {
    #[error(transparent)]
    Io(#[from] io::Error),
    #[error("frame exceeds the limit of {MAX_FRAME_BYTES} bytes")]
    TooLarge,
    #[error("connection closed in the middle of a frame")]
    Truncated,
}

pub fn encode_request(request: &Request) -> Vec<u8> {
    encode(&RequestFrame {
        version: PROTOCOL_VERSION,
        request: request.clone(),
    })
}

pub fn encode_response(response: &Response) -> Vec<u8> {
    encode(&ResponseFrame {
        version: PROTOCOL_VERSION,
        response: response.clone(),
    })
}

fn encode<T: Serialize>(frame: &T) -> Vec<u8> {
    // Compact JSON never contains a raw newline, so the line framing holds.
    let mut bytes = serde_json::to_vec(frame)
        .expect("protocol frames have string keys only and always serialize");
    bytes.push(b'\n');
    bytes
}

/// Decodes one frame (without its newline). Never panics, whatever the bytes.
pub fn decode_request(frame: &[u8]) -> Result<Request, DecodeError> {
    decode::<RequestFrame>(frame).map(|f| f.request)
}

/// Decodes one frame (without its newline). Never panics, whatever the bytes.
pub fn decode_response(frame: &[u8]) -> Result<Response, DecodeError> {
    decode::<ResponseFrame>(frame).map(|f| f.response)
}

fn decode<T: DeserializeOwned>(frame: &[u8]) -> Result<T, DecodeError> {
    if frame.len() > MAX_FRAME_BYTES {
        return Err(DecodeError::TooLarge(frame.len()));
    }
    let malformed = |e: serde_json::Error| DecodeError::Malformed(e.to_string());
    let probe: VersionProbe = serde_json::from_slice(frame).map_err(malformed)?;
    if probe.version != u64::from(PROTOCOL_VERSION) {
        return Err(DecodeError::UnsupportedVersion { got: probe.version });
    }
    serde_json::from_slice(frame).map_err(malformed)
}

/// Reads one frame, without its newline; `None` at a clean end of stream.
pub fn read_frame<R: BufRead>(reader: &mut R) -> Result<Option<Vec<u8>>, FrameError> {
    let mut frame = Vec::new();
    let limit = MAX_FRAME_BYTES as u64 + 1;
    let read = reader.by_ref().take(limit).read_until(b'\n', &mut frame)?;
    if read == 0 {
        return Ok(None);
    }
    if frame.pop() != Some(b'\n') {
        return Err(if read as u64 >= limit {
            FrameError::TooLarge
        } else {
            FrameError::Truncated
        });
    }
    Ok(Some(frame))
}

/// The proxy's side of one exchange: decode a request frame, let `handler` answer it, encode
/// the answer. A frame that does not decode gets an error response instead of reaching `handler`.
pub fn handle_frame(frame: &[u8], handler: impl FnOnce(Request) -> Response) -> Vec<u8> {
    let response = match decode_request(frame) {
        Ok(request) => handler(request),
        Err(error) => Response::Error(ErrorReply {
            kind: match error {
                DecodeError::UnsupportedVersion { .. } => ErrorKind::UnsupportedVersion,
                DecodeError::TooLarge(_) | DecodeError::Malformed(_) => ErrorKind::BadRequest,
            },
            message: error.to_string(),
        }),
    };
    encode_response(&response)
}

#[cfg(test)]
mod tests {
    use std::io::Cursor;
    use std::net::SocketAddr;

    use super::super::messages::{CapturePlan, CheckStatus, Decision, PodRef};
    use super::*;

    fn pod() -> PodRef {
        PodRef {
            namespace: "shop".into(),
            name: "web-0".into(),
            uid: Some("u-1".into()),
        }
    }

    fn all_requests() -> Vec<Request> {
        vec![
            Request::Ping,
            Request::Add {
                pod: pod(),
                container_id: "c1".into(),
                netns: "/var/run/netns/x".into(),
                ips: vec!["10.0.0.5".parse().unwrap(), "fd00::5".parse().unwrap()],
            },
            Request::Register {
                pod: pod(),
                container_id: "c1".into(),
                ifname: "eth0".into(),
                netns: "/var/run/netns/x".into(),
                ips: vec!["10.0.0.5".parse().unwrap()],
                generation: 7,
            },
            Request::Unregister {
                container_id: "c1".into(),
                ifname: "eth0".into(),
            },
            Request::Check {
                pod: pod(),
                container_id: "c1".into(),
            },
            Request::Gc {
                valid_container_ids: vec!["c1".into(), "c2".into()],
            },
        ]
    }

    fn all_responses() -> Vec<Response> {
        let targets: Vec<SocketAddr> = vec![
            "10.96.0.10:80".parse().unwrap(),
            "[fd00:96::10]:443".parse().unwrap(),
        ];
        vec![
            Response::Pong,
            Response::Decision(Decision::Unmeshed {
                reason: "namespace shop is not managed".into(),
            }),
            Response::Decision(Decision::Meshed(CapturePlan {
                capture_port: 15001,
                targets: targets.clone(),
                generation: 3,
                strict: None,
            })),
            Response::Decision(Decision::Meshed(CapturePlan {
                capture_port: 15001,
                targets,
                generation: 4,
                strict: Some(super::super::StrictPlan {
                    inbound_port: 15008,
                    probe_ports: vec![8080],
                    proxied_probe_ports: vec![8081],
                }),
            })),
            Response::Registered,
            Response::Unregistered { known: false },
            Response::Checked(CheckStatus::Meshed {
                registered: true,
                capture_port: 15001,
                strict_inbound_port: Some(15008),
            }),
            Response::Checked(CheckStatus::Unmeshed { reason: "x".into() }),
            Response::Collected {
                removed: vec!["old".into()],
            },
            Response::Error(ErrorReply {
                kind: ErrorKind::NotReady,
                message: "syncing".into(),
            }),
        ]
    }

    fn strip(mut frame: Vec<u8>) -> Vec<u8> {
        assert_eq!(frame.pop(), Some(b'\n'));
        assert!(!frame.contains(&b'\n'));
        frame
    }

    #[test]
    fn every_request_round_trips() {
        for request in all_requests() {
            let frame = strip(encode_request(&request));
            assert_eq!(decode_request(&frame), Ok(request));
        }
    }

    #[test]
    fn every_response_round_trips() {
        for response in all_responses() {
            let frame = strip(encode_response(&response));
            assert_eq!(decode_response(&frame), Ok(response));
        }
    }

    #[test]
    fn the_wire_format_is_stable() {
        let frame = strip(encode_request(&Request::Gc {
            valid_container_ids: vec!["a".into()],
        }));
        assert_eq!(
            String::from_utf8(frame).unwrap(),
            r#"{"version":1,"request":{"gc":{"validContainerIds":["a"]}}}"#
        );
        let frame = strip(encode_response(&Response::Decision(Decision::Meshed(
            CapturePlan {
                capture_port: 15001,
                targets: vec!["[fd00::1]:80".parse().unwrap()],
                generation: 1,
                strict: None,
            },
        ))));
        assert_eq!(
            String::from_utf8(frame).unwrap(),
            r#"{"version":1,"response":{"decision":{"meshed":{"capturePort":15001,"targets":["[fd00::1]:80"],"generation":1}}}}"#
        );
    }

    #[test]
    fn another_version_is_named_as_such() {
        let frame = br#"{"version":2,"request":{"somethingNew":{}}}"#;
        assert_eq!(
            decode_request(frame),
            Err(DecodeError::UnsupportedVersion { got: 2 })
        );
    }

    #[test]
    fn garbage_is_malformed_not_a_panic() {
        for frame in [
            &b""[..],
            b"null",
            b"{}",
            b"{\"version\":1}",
            b"{\"version\":1,\"request\":{\"add\":{}}}",
            b"{\"version\":-1}",
            b"{\"version\":1,\"request\":\"pong\"}",
            b"\xff\xff",
            &[b'['; 10_000],
        ] {
            assert!(matches!(
                decode_request(frame),
                Err(DecodeError::Malformed(_))
            ));
            assert!(matches!(
                decode_response(frame),
                Err(DecodeError::Malformed(_))
            ));
        }
    }

    #[test]
    fn oversized_frames_are_refused_before_parsing() {
        let frame = vec![b' '; MAX_FRAME_BYTES + 1];
        assert_eq!(
            decode_request(&frame),
            Err(DecodeError::TooLarge(MAX_FRAME_BYTES + 1))
        );
    }

    #[test]
    fn read_frame_splits_lines_and_reports_clean_eof() {
        let mut input = Cursor::new(b"one\ntwo\n".to_vec());
        assert_eq!(read_frame(&mut input).unwrap(), Some(b"one".to_vec()));
        assert_eq!(read_frame(&mut input).unwrap(), Some(b"two".to_vec()));
        assert_eq!(read_frame(&mut input).unwrap(), None);
    }

    #[test]
    fn read_frame_reports_truncation_and_size() {
        let mut input = Cursor::new(b"partial".to_vec());
        assert!(matches!(read_frame(&mut input), Err(FrameError::Truncated)));
        let mut input = Cursor::new(vec![b'x'; MAX_FRAME_BYTES + 10]);
        assert!(matches!(read_frame(&mut input), Err(FrameError::TooLarge)));
        let mut exact = vec![b'x'; MAX_FRAME_BYTES];
        exact.push(b'\n');
        assert_eq!(
            read_frame(&mut Cursor::new(exact))
                .unwrap()
                .map(|f| f.len()),
            Some(MAX_FRAME_BYTES)
        );
    }

    #[test]
    fn handle_frame_answers_garbage_with_an_error() {
        let reply = strip(handle_frame(b"nonsense", |_| Response::Pong));
        let Ok(Response::Error(error)) = decode_response(&reply) else {
            panic!("not an error response");
        };
        assert_eq!(error.kind, ErrorKind::BadRequest);

        let reply = strip(handle_frame(br#"{"version":9}"#, |_| Response::Pong));
        let Ok(Response::Error(error)) = decode_response(&reply) else {
            panic!("not an error response");
        };
        assert_eq!(error.kind, ErrorKind::UnsupportedVersion);
    }

    #[test]
    fn handle_frame_passes_requests_to_the_handler() {
        let frame = strip(encode_request(&Request::Ping));
        let reply = strip(handle_frame(&frame, |request| {
            assert_eq!(request, Request::Ping);
            Response::Pong
        }));
        assert_eq!(decode_response(&reply), Ok(Response::Pong));
    }
}
