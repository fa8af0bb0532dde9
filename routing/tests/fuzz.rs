//! The RouteTarget fuzz check (`aether_routing::fuzzing::route_target_spec`) on stable Rust in
//! every test run: RouteTarget specs that reach each kind of rule, then seeded byte mutations
//! of them (`aether_test_support::fuzz`) and structural ones (values compile judges, entries
//! dropped or repeated).

use aether_routing::fuzzing::route_target_spec;
use aether_test_support::fuzz::{self, JSON_TOKENS};
use serde_json::{Value, json};

const ROUNDS: usize = 200_000;
/// Structural mutations compile for real (regular expressions included), so fewer of them.
const STRUCTURAL: usize = 20_000;

#[test]
fn route_target_specs_compile_or_are_refused_with_a_message() {
    let seeds: Vec<Vec<u8>> = [
        r#"{"service":"web","rules":[{"matches":[{"path":{"type":"PathPrefix","value":"/v2"}}],"backendRefs":[{"name":"v2","port":80,"weight":70},{"name":"v1","port":80,"weight":30}]}]}"#,
        r#"{"service":"web","rules":[{"matches":[{"path":{"type":"RegularExpression","value":"/v[0-9]+/.*"},"headers":[{"name":"x-version","value":"t.o","type":"RegularExpression"}]}],"backendRefs":[{"name":"v1","port":80}]}]}"#,
        r#"{"service":"web","rules":[{"matches":[{"path":{"type":"Exact","value":"/a"},"queryParams":[{"name":"x","value":"1"}],"method":"GET"}],"filters":[{"type":"RequestRedirect","requestRedirect":{"scheme":"https","hostname":"example.com","port":8443,"statusCode":301,"path":{"type":"ReplaceFullPath","replaceFullPath":"/b"}}}]}]}"#,
        r#"{"service":"web","rules":[{"matches":[{"path":{"type":"PathPrefix","value":"/old"}}],"filters":[{"type":"URLRewrite","urlRewrite":{"hostname":"new","path":{"type":"ReplacePrefixMatch","replacePrefixMatch":"/new"}}},{"type":"RequestHeaderModifier","requestHeaderModifier":{"set":[{"name":"x-a","value":"1"}],"add":[{"name":"x-b","value":"2"}],"remove":["x-c"]}}],"backendRefs":[{"name":"web","port":80,"filters":[{"type":"ResponseHeaderModifier","responseHeaderModifier":{"set":[{"name":"x-d","value":"4"}]}}]}],"timeouts":{"request":"10s","backendRequest":"2s"}}]}"#,
        r#"{"service":"web","rules":[{"filters":[{"type":"RequestMirror","requestMirror":{"backendRef":{"name":"v2","port":80},"percent":50}}],"backendRefs":[{"name":"nothing","port":80},{"name":"v1","namespace":"other","port":80}]}]}"#,
    ]
    .iter()
    .map(|s| s.as_bytes().to_vec())
    .collect();
    let mut tokens = JSON_TOKENS.to_vec();
    tokens.extend([
        b"(".as_slice(),
        b"[",
        b".*",
        b"\"RegularExpression\"",
        b"\"PathPrefix\"",
        b"\"ReplacePrefixMatch\"",
        b"\"URLRewrite\"",
    ]);
    let bytes = fuzz::run(&seeds, &tokens, 0x5eed_7a57, ROUNDS, |data| {
        route_target_spec(data);
    });
    // Byte mutations mostly break the JSON; structural ones keep specs that read, with
    // values changed where compile judges them.
    let values: Vec<Value> = seeds
        .iter()
        .map(|s| serde_json::from_slice(s).expect("seeds are JSON"))
        .collect();
    let mut rng = XorShift(0x5eed_57ac);
    let mut specs = 0;
    for round in 0..STRUCTURAL {
        let mut value = values[round % values.len()].clone();
        for _ in 0..=rng.below(4) {
            mutate(&mut value, &mut rng);
        }
        if route_target_spec(&serde_json::to_vec(&value).expect("JSON")) {
            specs += 1;
        }
    }
    eprintln!(
        "RouteTarget specs through compile: {bytes} byte mutations, {STRUCTURAL} structural ones ({specs} read as specs), no crash"
    );
    assert!(
        specs > STRUCTURAL / 4,
        "too few mutations read as specs to exercise compile"
    );
}

struct XorShift(u64);

impl XorShift {
    fn below(&mut self, n: usize) -> usize {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 % n.max(1) as u64) as usize
    }
}

/// Values compile judges: patterns that are or are not regular expressions, paths with and
/// without a leading slash, header names, enum values swapped for others.
const STRINGS: &[&str] = &[
    "",
    "/",
    "//",
    "/a/../b",
    "([",
    ".*",
    "(a|b)+",
    "\\",
    "x-version",
    "X-Version",
    "bad name",
    "PathPrefix",
    "Exact",
    "RegularExpression",
    "ReplaceFullPath",
    "ReplacePrefixMatch",
    "RequestRedirect",
    "URLRewrite",
    "RequestHeaderModifier",
    "RequestMirror",
    "GET",
    "web",
    "v1",
    "nothing",
    "other",
    "10s",
    "0s",
    "1h",
    "-1s",
];

/// One structural change somewhere in `value`: a string, number or bool replaced, an entry
/// removed, an array element duplicated or dropped.
fn mutate(value: &mut Value, rng: &mut XorShift) {
    match value {
        Value::Object(map) if !map.is_empty() => {
            let key = map
                .keys()
                .nth(rng.below(map.len()))
                .cloned()
                .unwrap_or_default();
            if rng.below(8) == 0 {
                map.remove(&key);
            } else if let Some(inner) = map.get_mut(&key) {
                mutate(inner, rng);
            }
        }
        Value::Array(items) if !items.is_empty() => match rng.below(6) {
            0 => {
                let copy = items[rng.below(items.len())].clone();
                items.push(copy);
            }
            1 => {
                items.remove(rng.below(items.len()));
            }
            _ => {
                let i = rng.below(items.len());
                mutate(&mut items[i], rng);
            }
        },
        Value::String(text) => *text = STRINGS[rng.below(STRINGS.len())].to_owned(),
        Value::Number(_) => {
            *value = json!([0, 1, 80, 7070, 65535, 65536, -1, 100, 101][rng.below(9)]);
        }
        Value::Bool(b) => *b = !*b,
        _ => {}
    }
}
