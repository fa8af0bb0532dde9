//! The HTTP routing fuzz target's check (`aether_proxy::fuzzing::http_routing`) on stable
//! Rust in every test run: request heads that reach every rule, then seeded mutations of them.
//! `cargo fuzz` (proxy/fuzz) goes further with coverage guidance.

use aether_proxy::fuzzing::http_routing;
use aether_test_support::fuzz;

const ROUNDS: usize = 400_000;

/// Pieces of HTTP/1.1 request heads spliced into inputs.
const HTTP_TOKENS: &[&[u8]] = &[
    b"\r\n",
    b": ",
    b"/",
    b"//",
    b"/..",
    b"%2F",
    b"%",
    b"?",
    b"&",
    b"=",
    b"#",
    b" ",
    b"\t",
    b"GET ",
    b"POST ",
    b"http://",
    b"HTTP/1.1",
    b"Host: ",
    b"x-version: two\r\n",
    b"x-pattern: abcz\r\n",
    b"x-remove: 1\r\n",
    b"q=v%202",
    b"\xff",
    b"\0",
];

#[test]
fn http_routing_survives_mutated_requests() {
    let seeds: Vec<Vec<u8>> = [
        "GET /exact HTTP/1.1\r\nHost: echo\r\n\r\n",
        "GET /prefix/a/b?x=1 HTTP/1.1\r\nHost: echo:80\r\n\r\n",
        "PUT /full/anything?keep=1 HTTP/1.1\r\nHost: echo\r\n\r\n",
        "GET /re/abc/123 HTTP/1.1\r\nHost: echo\r\nx-remove: yes\r\n\r\n",
        "GET /?q=v%202 HTTP/1.1\r\nHost: echo\r\nx-version: two\r\nx-pattern: abcz\r\n\r\n",
        "GET /redirect/deep/path?y=2 HTTP/1.1\r\nHost: echo\r\n\r\n",
        "POST /mirror HTTP/1.1\r\nHost: echo\r\ncontent-length: 0\r\n\r\n",
        "GET http://echo.shop.svc.cluster.local/prefix/x HTTP/1.1\r\nHost: echo\r\n\r\n",
        "OPTIONS * HTTP/1.1\r\nHost: echo\r\n\r\n",
    ]
    .iter()
    .map(|s| s.as_bytes().to_vec())
    .collect();
    let runs = fuzz::run(&seeds, HTTP_TOKENS, 0x5eed_4777, ROUNDS, http_routing);
    eprintln!("HTTP routing: {runs} executions, no crash");
}
