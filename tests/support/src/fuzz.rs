//! A seeded mutation fuzzer for stable Rust: the crates' `tests/fuzz.rs` drive their fuzz
//! targets' checks with it in every test run (`cargo fuzz` goes further, with coverage
//! guidance, on nightly). Inputs are seeds and their mutations: bit flips, byte edits, cuts,
//! splices of other seeds, and tokens of the input's language.

/// xorshift64*: small, seedable, good enough to pick mutations.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

/// Tokens of JSON, spliced into inputs of JSON readers.
pub const JSON_TOKENS: &[&[u8]] = &[
    b"{",
    b"}",
    b"[",
    b"]",
    b"\"",
    b":",
    b",",
    b"null",
    b"true",
    b"-1",
    b"1e999",
    b"18446744073709551616",
    b"\\u0000",
    b"\\ud800",
    b"\n",
    b"=",
    b";",
    b"\xff",
];

fn mutate(rng: &mut Rng, seeds: &[Vec<u8>], tokens: &[&[u8]], input: &[u8]) -> Vec<u8> {
    let mut out = input.to_vec();
    for _ in 0..=rng.below(4) {
        let at = rng.below(out.len() + 1);
        match rng.below(7) {
            0 if !out.is_empty() => {
                let i = at.min(out.len() - 1);
                out[i] ^= 1 << rng.below(8);
            }
            1 if !out.is_empty() => {
                let i = at.min(out.len() - 1);
                out[i] = rng.next() as u8;
            }
            2 => out.insert(at, rng.next() as u8),
            3 if at < out.len() => {
                let end = (at + 1 + rng.below(16)).min(out.len());
                out.drain(at..end);
            }
            4 => out.truncate(at),
            5 => {
                let other = &seeds[rng.below(seeds.len())];
                let from = rng.below(other.len() + 1);
                let end = (from + rng.below(64)).min(other.len());
                out.splice(at..at, other[from..end].iter().copied());
            }
            _ => {
                let token = tokens[rng.below(tokens.len())];
                out.splice(at..at, token.iter().copied());
            }
        }
    }
    out
}

/// The seeds as files `seed-N` in `dir`, and `tokens` as a libFuzzer dictionary `dir.dict`.
fn write_corpus(dir: &std::path::Path, seeds: &[Vec<u8>], tokens: &[&[u8]]) {
    std::fs::create_dir_all(dir).expect("the corpus directory");
    for (n, input) in seeds.iter().enumerate() {
        std::fs::write(dir.join(format!("seed-{n}")), input).expect("a seed file");
    }
    let dict: String = tokens
        .iter()
        .map(|token| {
            let escaped: String = token.iter().map(|b| format!("\\x{b:02x}")).collect();
            format!("\"{escaped}\"\n")
        })
        .collect();
    std::fs::write(dir.with_extension("dict"), dict).expect("the dictionary");
}

/// Runs `check` on every seed, then on `rounds` seeded mutations of them (bit flips, byte
/// edits, cuts, splices of other seeds, `tokens`); returns the number of executions.
/// Deterministic, so a failure reproduces; the crates' `tests/fuzz.rs` run it on stable in
/// every test run, and `cargo fuzz` goes further with coverage guidance.
///
/// With `AETHER_FUZZ_SEEDS=DIR` it only writes the seeds into `DIR` and `tokens` into
/// `DIR.dict`, a corpus and dictionary for `cargo fuzz` (`tests/fuzz.sh`), and checks them:
/// the seeds stay in one place, the test.
pub fn run(
    seeds: &[Vec<u8>],
    tokens: &[&[u8]],
    seed: u64,
    rounds: usize,
    check: impl Fn(&[u8]),
) -> usize {
    if let Some(dir) = std::env::var_os("AETHER_FUZZ_SEEDS") {
        write_corpus(std::path::Path::new(&dir), seeds, tokens);
        seeds.iter().for_each(|input| check(input));
        return seeds.len();
    }
    let mut rng = Rng(seed);
    for input in seeds {
        check(input);
    }
    let mut current = seeds[0].clone();
    for round in 0..rounds {
        // Mostly keep mutating, sometimes start again from a seed.
        if round % 8 == 0 {
            current = seeds[rng.below(seeds.len())].clone();
        }
        current = mutate(&mut rng, seeds, tokens, &current);
        if current.len() > 4096 {
            current.truncate(4096);
        }
        check(&current);
    }
    seeds.len() + rounds
}
