//! The protocol decoder and framing: never a panic, and whatever decodes re-encodes to the
//! same message.
#![no_main]

use std::io::Cursor;

use aether_cni::protocol::{
    Response, decode_request, decode_response, encode_request, encode_response, handle_frame,
    read_frame,
};
use libfuzzer_sys::fuzz_target;

fn without_newline(mut frame: Vec<u8>) -> Vec<u8> {
    frame.pop();
    frame
}

fuzz_target!(|data: &[u8]| {
    if let Ok(request) = decode_request(data) {
        let again = decode_request(&without_newline(encode_request(&request)));
        assert_eq!(again, Ok(request));
    }
    if let Ok(response) = decode_response(data) {
        let again = decode_response(&without_newline(encode_response(&response)));
        assert_eq!(again, Ok(response));
    }
    let _ = handle_frame(data, |_| Response::Pong);
    let mut reader = Cursor::new(data);
    while let Ok(Some(_)) = read_frame(&mut reader) {}
});
