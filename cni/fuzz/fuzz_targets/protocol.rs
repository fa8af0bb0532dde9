//! The protocol decoder and framing (`aether_cni::fuzzing::protocol`).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| aether_cni::fuzzing::protocol(data));
