//! The route engine: a RouteTarget spec through compile and the router
//! (`aether_routing::fuzzing::route_target_spec`).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    aether_routing::fuzzing::route_target_spec(data);
});
