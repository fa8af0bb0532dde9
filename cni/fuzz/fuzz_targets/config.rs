//! The plugin's stdin parser and CNI_ARGS parser (`aether_cni::fuzzing::config`).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| aether_cni::fuzzing::config(data));
