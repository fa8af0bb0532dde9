//! What the fuzz targets check, as plain functions: `cargo fuzz` (cni/fuzz, nightly) drives
//! them with coverage guidance, and a stable test (`tests/fuzz.rs`) drives them with seeded
//! mutations (`aether_test_support::fuzz`) in every CI run. Each panics only on a bug.

use std::io::Cursor;

use crate::cni_io::{declared_version, parse_cni_args, parse_config};
use crate::plugin::Settings;
use crate::protocol::{
    Response, decode_request, decode_response, encode_request, encode_response, handle_frame,
    read_frame,
};

/// The plugin's stdin parser and CNI_ARGS parser: any bytes give a value or a CNI error.
pub fn config(data: &[u8]) {
    let _ = parse_config::<Settings>(data);
    let _ = declared_version(data);
    if let Ok(text) = std::str::from_utf8(data) {
        let _ = parse_cni_args(text);
    }
}

/// The protocol decoder and framing: never a panic, and whatever decodes re-encodes to the
/// same message.
pub fn protocol(data: &[u8]) {
    let without_newline = |mut frame: Vec<u8>| {
        frame.pop();
        frame
    };
    if let Ok(request) = decode_request(data) {
        let again = decode_request(&without_newline(encode_request(&request)));
        assert_eq!(
            again,
            Ok(request),
            "a request does not survive a round trip"
        );
    }
    if let Ok(response) = decode_response(data) {
        let again = decode_response(&without_newline(encode_response(&response)));
        assert_eq!(
            again,
            Ok(response),
            "a response does not survive a round trip"
        );
    }
    let _ = handle_frame(data, |_| Response::Pong);
    let mut reader = Cursor::new(data);
    while let Ok(Some(_)) = read_frame(&mut reader) {}
}
