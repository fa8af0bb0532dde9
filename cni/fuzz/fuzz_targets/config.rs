//! The plugin's stdin parser and CNI_ARGS parser: any bytes give a value or a CNI error.
#![no_main]

use aether_cni::cni_io::{declared_version, parse_cni_args, parse_config};
use aether_cni::plugin::Settings;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = parse_config::<Settings>(data);
    let _ = declared_version(data);
    if let Ok(text) = std::str::from_utf8(data) {
        let _ = parse_cni_args(text);
    }
});
