//! The HTTP routing entry point (`aether_proxy::fuzzing::http_routing`).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| aether_proxy::fuzzing::http_routing(data));
