//! Just enough gRPC and protobuf for the Istio echo app's one unary method,
//! `proto.EchoTestService/Echo`: `EchoRequest{string message = 1}` in,
//! `EchoResponse{string message = 1}` out, each in one length-prefixed message frame.
//! Hand-encoded so the crate needs no protobuf toolchain.

/// The request path of the Echo method.
pub const ECHO_PATH: &str = "/proto.EchoTestService/Echo";

/// gRPC status codes this program sends or names.
pub mod code {
    pub const OK: u16 = 0;
    pub const RESOURCE_EXHAUSTED: u16 = 8;
    pub const UNIMPLEMENTED: u16 = 12;
    pub const INTERNAL: u16 = 13;
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WireError {
    #[error("no message frame in the body")]
    NoFrame,
    #[error("message frame is truncated: header says {declared} bytes, {available} present")]
    Truncated { declared: usize, available: usize },
    #[error("compressed messages are not supported")]
    Compressed,
    #[error("{0} bytes after the message frame; unary calls carry one message")]
    TrailingData(usize),
    #[error("malformed protobuf: {0}")]
    Protobuf(&'static str),
    #[error("message field is not UTF-8")]
    NotUtf8,
}

/// Wraps one message in a gRPC frame: compressed flag 0, 4-byte big-endian length, bytes.
pub fn frame(message: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(5 + message.len());
    out.push(0);
    // A message over 4 GiB cannot be framed; nothing here builds one.
    out.extend_from_slice(
        &u32::try_from(message.len())
            .unwrap_or(u32::MAX)
            .to_be_bytes(),
    );
    out.extend_from_slice(message);
    out
}

/// The one message of a unary call's body.
pub fn unframe(body: &[u8]) -> Result<&[u8], WireError> {
    let (header, rest) = body.split_first_chunk::<5>().ok_or(WireError::NoFrame)?;
    if header[0] != 0 {
        return Err(WireError::Compressed);
    }
    let declared = u32::from_be_bytes([header[1], header[2], header[3], header[4]]) as usize;
    if rest.len() < declared {
        return Err(WireError::Truncated {
            declared,
            available: rest.len(),
        });
    }
    let (message, trailing) = rest.split_at(declared);
    if !trailing.is_empty() {
        return Err(WireError::TrailingData(trailing.len()));
    }
    Ok(message)
}

/// Encodes `{string message = 1}` (EchoRequest and EchoResponse have that same shape).
pub fn encode_message_field(text: &str) -> Vec<u8> {
    let mut out = Vec::with_capacity(text.len() + 6);
    // proto3 leaves default (empty) scalars off the wire.
    if !text.is_empty() {
        out.push(0x0a); // field 1, wire type 2 (length-delimited)
        put_varint(&mut out, text.len() as u64);
        out.extend_from_slice(text.as_bytes());
    }
    out
}

/// Decodes field 1 as a string, skipping unknown fields; the last occurrence wins, as in
/// protobuf. A message without it is the empty string.
pub fn decode_message_field(mut bytes: &[u8]) -> Result<String, WireError> {
    let mut message: &[u8] = &[];
    while !bytes.is_empty() {
        let key = take_varint(&mut bytes)?;
        let (field, wire_type) = (key >> 3, key & 7);
        match wire_type {
            0 => {
                take_varint(&mut bytes)?;
            }
            1 => bytes = skip(bytes, 8)?,
            2 => {
                let len = usize::try_from(take_varint(&mut bytes)?)
                    .map_err(|_| WireError::Protobuf("length too large"))?;
                if len > bytes.len() {
                    return Err(WireError::Protobuf("length past the end"));
                }
                let (value, rest) = bytes.split_at(len);
                if field == 1 {
                    message = value;
                }
                bytes = rest;
            }
            5 => bytes = skip(bytes, 4)?,
            _ => return Err(WireError::Protobuf("unsupported wire type")),
        }
    }
    String::from_utf8(message.to_vec()).map_err(|_| WireError::NotUtf8)
}

fn put_varint(out: &mut Vec<u8>, mut value: u64) {
    while value >= 0x80 {
        out.push((value as u8) | 0x80);
        value >>= 7;
    }
    out.push(value as u8);
}

fn take_varint(bytes: &mut &[u8]) -> Result<u64, WireError> {
    let mut value = 0u64;
    for shift in (0..64).step_by(7) {
        let (&byte, rest) = bytes
            .split_first()
            .ok_or(WireError::Protobuf("varint past the end"))?;
        *bytes = rest;
        value |= u64::from(byte & 0x7f) << shift;
        if byte & 0x80 == 0 {
            return Ok(value);
        }
    }
    Err(WireError::Protobuf("varint too long"))
}

fn skip(bytes: &[u8], n: usize) -> Result<&[u8], WireError> {
    bytes
        .get(n..)
        .ok_or(WireError::Protobuf("fixed-width field past the end"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_round_trip() {
        let framed = frame(b"abc");
        assert_eq!(framed, [0, 0, 0, 0, 3, b'a', b'b', b'c']);
        assert_eq!(unframe(&framed), Ok(&b"abc"[..]));
        assert_eq!(unframe(&frame(b"")), Ok(&b""[..]));
    }

    #[test]
    fn bad_frames_are_errors() {
        assert_eq!(unframe(b""), Err(WireError::NoFrame));
        assert_eq!(unframe(&[0, 0, 0]), Err(WireError::NoFrame));
        assert_eq!(unframe(&[1, 0, 0, 0, 0]), Err(WireError::Compressed));
        assert_eq!(
            unframe(&[0, 0, 0, 0, 4, 1]),
            Err(WireError::Truncated {
                declared: 4,
                available: 1
            })
        );
        assert_eq!(
            unframe(&[0, 0, 0, 0, 0, 9]),
            Err(WireError::TrailingData(1))
        );
    }

    #[test]
    fn message_field_round_trips() {
        assert_eq!(encode_message_field("hi"), [0x0a, 2, b'h', b'i']);
        assert_eq!(encode_message_field(""), Vec::<u8>::new());
        let long = "x".repeat(300);
        let encoded = encode_message_field(&long);
        assert_eq!(&encoded[..3], &[0x0a, 0xac, 0x02]);
        assert_eq!(decode_message_field(&encoded).unwrap(), long);
        assert_eq!(decode_message_field(&[]).unwrap(), "");
    }

    #[test]
    fn unknown_fields_are_skipped_and_last_wins() {
        let mut bytes = vec![0x08, 0x96, 0x01]; // field 1 as varint 150: not ours
        bytes.extend([0x11, 1, 2, 3, 4, 5, 6, 7, 8]); // field 2, fixed64
        bytes.extend([0x0a, 1, b'a']);
        bytes.extend([0x1d, 1, 2, 3, 4]); // field 3, fixed32
        bytes.extend([0x22, 2, b'z', b'z']); // field 4, string
        bytes.extend([0x0a, 1, b'b']);
        assert_eq!(decode_message_field(&bytes).unwrap(), "b");
    }

    #[test]
    fn malformed_protobuf_is_an_error() {
        for bytes in [
            &[0x0a][..],      // key, no length
            &[0x0a, 5, b'a'], // length past the end
            &[0x0b],          // wire type 3 (group)
            &[0x11, 1, 2],    // fixed64 cut short
            &[
                0x08, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01,
            ],
        ] {
            assert!(decode_message_field(bytes).is_err(), "{bytes:?}");
        }
        assert_eq!(
            decode_message_field(&[0x0a, 1, 0xff]),
            Err(WireError::NotUtf8)
        );
    }
}
