//! What one caller can make the CA ask of the API server. Every SVID request costs a
//! TokenReview before its caller is known, so requests are bounded per source address (a
//! token bucket: a node proxy's start-up burst passes, a flood does not) and the reviews in
//! flight are bounded in total.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use tokio::sync::{Semaphore, SemaphorePermit};
use tracing::warn;

/// Requests one source may send at once; then [`RATE`] a second.
pub const BURST: f64 = 50.0;
pub const RATE: f64 = 10.0;
/// SVID requests being checked with the API server at once, over all callers.
pub const MAX_IN_FLIGHT: usize = 32;
/// Sources remembered; beyond it, those whose bucket has refilled are forgotten.
const MAX_SOURCES: usize = 10_000;
const WARN_EVERY: Duration = Duration::from_secs(10);

/// One source's allowance.
#[derive(Debug, Clone, Copy)]
struct Bucket {
    tokens: f64,
    at: Instant,
}

impl Bucket {
    fn full(now: Instant) -> Bucket {
        Bucket {
            tokens: BURST,
            at: now,
        }
    }

    fn refilled(self, now: Instant) -> Bucket {
        let earned = now.saturating_duration_since(self.at).as_secs_f64() * RATE;
        Bucket {
            tokens: (self.tokens + earned).min(BURST),
            at: now,
        }
    }

    /// Takes one request's token, if there is one.
    fn take(&mut self, now: Instant) -> bool {
        *self = self.refilled(now);
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            false
        }
    }
}

#[derive(Default)]
struct Refusals {
    count: u64,
    warned: Option<Instant>,
}

pub struct Limits {
    sources: Mutex<HashMap<IpAddr, Bucket>>,
    in_flight: Semaphore,
    refusals: Mutex<Refusals>,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            sources: Mutex::default(),
            in_flight: Semaphore::new(MAX_IN_FLIGHT),
            refusals: Mutex::default(),
        }
    }
}

impl Limits {
    /// Whether `source` may send one more request now.
    pub fn admit(&self, source: IpAddr, now: Instant) -> bool {
        let admitted = {
            let mut sources = self.sources.lock().unwrap_or_else(|e| e.into_inner());
            if sources.len() >= MAX_SOURCES && !sources.contains_key(&source) {
                sources.retain(|_, bucket| bucket.refilled(now).tokens < BURST);
            }
            sources
                .entry(source)
                .or_insert_with(|| Bucket::full(now))
                .take(now)
        };
        if !admitted {
            self.refused(source, now);
        }
        admitted
    }

    /// A place among the requests checked with the API server, waiting for one to free
    /// (`None` only if the limits were closed, which they never are).
    pub async fn review_slot(&self) -> Option<SemaphorePermit<'_>> {
        self.in_flight.acquire().await.ok()
    }

    /// A flood would log a line per request: one line every [`WARN_EVERY`] says how many.
    fn refused(&self, source: IpAddr, now: Instant) {
        let mut refusals = self.refusals.lock().unwrap_or_else(|e| e.into_inner());
        refusals.count += 1;
        if refusals
            .warned
            .is_none_or(|at| now.saturating_duration_since(at) >= WARN_EVERY)
        {
            warn!(
                %source,
                refused_so_far = refusals.count,
                "SVID requests over the per-source limit are refused with 429"
            );
            refusals.warned = Some(now);
        }
    }

    #[cfg(test)]
    fn sources(&self) -> usize {
        self.sources.lock().unwrap().len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_source_gets_its_burst_then_its_rate() {
        let limits = Limits::default();
        let (a, b): (IpAddr, IpAddr) = ("10.0.0.1".parse().unwrap(), "10.0.0.2".parse().unwrap());
        let start = Instant::now();
        let admitted = (0..200).filter(|_| limits.admit(a, start)).count();
        assert_eq!(admitted, BURST as usize);
        // Another source is not affected.
        assert!(limits.admit(b, start));
        // A second later the source has earned RATE more, and no more.
        let later = start + Duration::from_secs(1);
        let admitted = (0..200).filter(|_| limits.admit(a, later)).count();
        assert_eq!(admitted, RATE as usize);
        // Idle long enough, it has its whole burst again, never more.
        let idle = later + Duration::from_secs(3600);
        let admitted = (0..200).filter(|_| limits.admit(a, idle)).count();
        assert_eq!(admitted, BURST as usize);
    }

    #[test]
    fn sources_that_went_quiet_are_forgotten_when_too_many() {
        let limits = Limits::default();
        let start = Instant::now();
        for i in 0..MAX_SOURCES as u32 {
            assert!(limits.admit(IpAddr::from(i.to_be_bytes()), start));
        }
        assert_eq!(limits.sources(), MAX_SOURCES);
        let later = start + Duration::from_secs(60);
        assert!(limits.admit("192.0.2.1".parse().unwrap(), later));
        assert_eq!(limits.sources(), 1);
    }
}
