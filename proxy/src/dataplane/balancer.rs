//! Endpoint choice: power of two choices over a peak-sensitive EWMA of response latency,
//! weighted by requests in flight (the cost Finagle and linkerd use). Cheap per request, and
//! it steers away from a slow or overloaded pod without any global coordination.
//!
//! Passive health (outlier ejection, as Envoy's consecutive gateway failures): an endpoint
//! that fails [`EJECT_AFTER`] times in a row (connection failures, or 502/503/504 answers) is
//! left out of the choice for a while, longer each time it is ejected again. When every
//! candidate is ejected they are all chosen from again: ejection never empties a Service.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

/// How fast old latency observations fade.
const DECAY: Duration = Duration::from_secs(10);
/// The latency an endpoint without observations is assumed to have: optimistic, so new pods
/// get traffic and thus observations.
const DEFAULT_RTT_NS: u64 = 1_000_000;
/// The latency a failed request counts as.
const FAILURE_PENALTY: Duration = Duration::from_secs(1);
/// Failures in a row that eject an endpoint.
pub const EJECT_AFTER: u32 = 5;
/// How long a first ejection lasts; the n-th in a row lasts n times as long, up to
/// [`MAX_EJECTION`].
pub const BASE_EJECTION: Duration = Duration::from_secs(30);
const MAX_EJECTION: Duration = Duration::from_secs(300);

/// Latency and load of every endpoint this proxy sends to.
#[derive(Debug, Default)]
pub struct Balancer {
    stats: RwLock<HashMap<SocketAddr, Arc<EndpointStats>>>,
}

#[derive(Debug)]
pub struct EndpointStats {
    ewma_ns: AtomicU64,
    /// When `ewma_ns` was last updated, in ns since `epoch`.
    stamp_ns: AtomicU64,
    in_flight: AtomicU32,
    /// Failures since the last success.
    failures_in_a_row: AtomicU32,
    /// Ejections since the last success: each lasts longer.
    ejections: AtomicU32,
    /// Until when the endpoint is ejected, in ns since `epoch`; 0 when it is not.
    ejected_until_ns: AtomicU64,
    epoch: Instant,
}

impl EndpointStats {
    fn new() -> Self {
        EndpointStats {
            ewma_ns: AtomicU64::new(DEFAULT_RTT_NS),
            stamp_ns: AtomicU64::new(0),
            in_flight: AtomicU32::new(0),
            failures_in_a_row: AtomicU32::new(0),
            ejections: AtomicU32::new(0),
            ejected_until_ns: AtomicU64::new(0),
            epoch: Instant::now(),
        }
    }

    fn now_ns(&self) -> u64 {
        self.epoch.elapsed().as_nanos() as u64
    }

    pub fn ejected(&self) -> bool {
        self.ejected_until_ns.load(Ordering::Relaxed) > self.now_ns()
    }

    fn succeeded(&self) {
        self.failures_in_a_row.store(0, Ordering::Relaxed);
        self.ejections.store(0, Ordering::Relaxed);
    }

    /// Counts one failure; returns how long the endpoint is ejected when this one ejects it.
    /// Failures while ejected (requests that were under way) do not count.
    fn failed(&self) -> Option<Duration> {
        if self.ejected() {
            return None;
        }
        let in_a_row = self.failures_in_a_row.fetch_add(1, Ordering::Relaxed) + 1;
        if in_a_row < EJECT_AFTER {
            return None;
        }
        self.failures_in_a_row.store(0, Ordering::Relaxed);
        let times = self.ejections.fetch_add(1, Ordering::Relaxed) + 1;
        let duration = BASE_EJECTION.saturating_mul(times).min(MAX_EJECTION);
        self.ejected_until_ns.store(
            self.now_ns() + duration.as_nanos() as u64,
            Ordering::Relaxed,
        );
        Some(duration)
    }

    /// The cost of sending one more request here. The latency estimate decays with the time
    /// since it was last updated, so an endpoint that failed (or was slow) gets traffic again
    /// after a while, and what it answers then counts.
    pub fn cost(&self) -> u64 {
        let now = self.epoch.elapsed().as_nanos() as u64;
        let idle = now.saturating_sub(self.stamp_ns.load(Ordering::Relaxed)) as f64;
        let estimate =
            self.ewma_ns.load(Ordering::Relaxed) as f64 * (-idle / DECAY.as_nanos() as f64).exp();
        let in_flight = u64::from(self.in_flight.load(Ordering::Relaxed));
        (estimate as u64).max(1).saturating_mul(in_flight + 1)
    }

    /// Folds one observed latency in. A latency above the average replaces it at once (peak
    /// sensitivity); below, it pulls the average down with weight by elapsed time.
    pub fn observe(&self, latency: Duration) {
        let now = self.epoch.elapsed().as_nanos() as u64;
        let sample = latency.as_nanos().min(u128::from(u64::MAX)) as u64;
        let last = self.stamp_ns.swap(now, Ordering::Relaxed);
        let old = self.ewma_ns.load(Ordering::Relaxed);
        let next = if sample > old {
            sample
        } else {
            let elapsed = now.saturating_sub(last) as f64;
            let weight = (-elapsed / DECAY.as_nanos() as f64).exp();
            (old as f64 * weight + sample as f64 * (1.0 - weight)) as u64
        };
        self.ewma_ns.store(next, Ordering::Relaxed);
    }
}

/// A request in flight to an endpoint; observes its latency when finished.
pub struct InFlight {
    stats: Arc<EndpointStats>,
    started: Instant,
}

impl InFlight {
    /// The endpoint answered.
    pub fn finish(self) {
        self.stats.observe(self.started.elapsed());
        self.stats.succeeded();
    }

    /// The endpoint answered 502, 503 or 504: its latency counts as any answer's, and the
    /// answer as a failure towards ejection. Returns the ejection this one caused, if any.
    pub fn finish_unavailable(self) -> Option<Duration> {
        self.stats.observe(self.started.elapsed());
        self.stats.failed()
    }

    /// The endpoint failed (unreachable, refused, wrong identity): it counts as very slow, so
    /// traffic moves to the others until the penalty decays, and as a failure towards
    /// ejection. Returns the ejection this one caused, if any.
    pub fn fail(self) -> Option<Duration> {
        self.stats
            .observe(self.started.elapsed().max(FAILURE_PENALTY));
        self.stats.failed()
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.stats.in_flight.fetch_sub(1, Ordering::Relaxed);
    }
}

impl Balancer {
    pub fn stats(&self, addr: SocketAddr) -> Arc<EndpointStats> {
        if let Some(stats) = self.read().get(&addr) {
            return stats.clone();
        }
        let mut all = self.stats.write().unwrap_or_else(|e| e.into_inner());
        all.entry(addr)
            .or_insert_with(|| Arc::new(EndpointStats::new()))
            .clone()
    }

    /// Chooses one of `candidates` (by index) with two random draws from `random`, leaving
    /// ejected ones out unless all are.
    pub fn pick<T>(
        &self,
        candidates: &[T],
        addr: impl Fn(&T) -> SocketAddr,
        random: u64,
    ) -> Option<usize> {
        let stats = |i: usize| self.stats(addr(&candidates[i]));
        let cheaper = |a: usize, b: usize| {
            if stats(b).cost() < stats(a).cost() {
                b
            } else {
                a
            }
        };
        match candidates.len() {
            0 => None,
            1 => Some(0),
            n => {
                let (a, b) = two_distinct(n, random);
                if !stats(a).ejected() && !stats(b).ejected() {
                    return Some(cheaper(a, b));
                }
                let healthy: Vec<usize> = (0..n).filter(|i| !stats(*i).ejected()).collect();
                Some(match healthy.len() {
                    0 => cheaper(a, b),
                    1 => healthy[0],
                    m => {
                        let (x, y) = two_distinct(m, random);
                        cheaper(healthy[x], healthy[y])
                    }
                })
            }
        }
    }

    /// How many known endpoints are ejected now.
    pub fn ejected(&self) -> usize {
        self.read().values().filter(|s| s.ejected()).count()
    }

    /// Marks a request to `addr` as started.
    pub fn start(&self, addr: SocketAddr) -> InFlight {
        let stats = self.stats(addr);
        stats.in_flight.fetch_add(1, Ordering::Relaxed);
        InFlight {
            stats,
            started: Instant::now(),
        }
    }

    /// Forgets endpoints that are no longer anywhere in the mesh, so the state follows the
    /// endpoints that exist rather than every one there ever was; returns how many are kept.
    pub fn retain(&self, keep: impl Fn(&SocketAddr) -> bool) -> usize {
        let mut stats = self.stats.write().unwrap_or_else(|e| e.into_inner());
        stats.retain(|addr, _| keep(addr));
        stats.len()
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, HashMap<SocketAddr, Arc<EndpointStats>>> {
        self.stats.read().unwrap_or_else(|e| e.into_inner())
    }
}

/// Two different indexes below `n` (n ≥ 2) from one random number.
fn two_distinct(n: usize, random: u64) -> (usize, usize) {
    let n = n as u64;
    let a = random % n;
    let b = (a + 1 + (random / n) % (n - 1)) % n;
    (a as usize, b as usize)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addr(i: u8) -> SocketAddr {
        SocketAddr::from(([10, 0, 0, i], 80))
    }

    #[test]
    fn two_draws_are_distinct_and_cover_every_pair() {
        let mut seen = std::collections::HashSet::new();
        for random in 0..1_000 {
            let (a, b) = two_distinct(4, random);
            assert_ne!(a, b);
            assert!(a < 4 && b < 4);
            seen.insert((a, b));
        }
        assert_eq!(seen.len(), 12);
    }

    #[test]
    fn endpoints_that_went_are_forgotten() {
        let balancer = Balancer::default();
        for i in 1..=3 {
            balancer.stats(addr(i)).observe(Duration::from_millis(5));
        }
        assert_eq!(balancer.retain(|a| *a == addr(2)), 1);
        // A kept endpoint keeps what was learnt about it; a forgotten one starts afresh.
        assert!(balancer.stats(addr(2)).cost() > DEFAULT_RTT_NS);
        assert!(balancer.stats(addr(1)).cost() <= DEFAULT_RTT_NS);
    }

    #[test]
    fn the_slower_endpoint_loses() {
        let balancer = Balancer::default();
        balancer.stats(addr(1)).observe(Duration::from_millis(50));
        balancer.stats(addr(2)).observe(Duration::from_micros(200));
        let endpoints = [addr(1), addr(2)];
        for random in 0..100 {
            assert_eq!(balancer.pick(&endpoints, |a| *a, random), Some(1));
        }
    }

    #[test]
    fn requests_in_flight_add_cost_until_finished() {
        let balancer = Balancer::default();
        let endpoints = [addr(1), addr(2)];
        let busy: Vec<_> = (0..3).map(|_| balancer.start(addr(1))).collect();
        assert_eq!(balancer.pick(&endpoints, |a| *a, 0), Some(1));
        drop(busy);
        assert_eq!(balancer.stats(addr(1)).in_flight.load(Ordering::Relaxed), 0);
        assert_eq!(balancer.pick(&[addr(3)], |a| *a, 7), Some(0));
        assert_eq!(balancer.pick::<SocketAddr>(&[], |a| *a, 7), None);
    }

    #[test]
    fn a_failing_endpoint_stops_getting_traffic() {
        let balancer = Balancer::default();
        let endpoints = [addr(1), addr(2)];
        balancer.start(addr(1)).fail();
        balancer.start(addr(2)).finish();
        for random in 0..100 {
            assert_eq!(balancer.pick(&endpoints, |a| *a, random), Some(1));
        }
    }

    #[test]
    fn an_endpoint_failing_in_a_row_is_ejected_and_a_success_resets_the_count() {
        let balancer = Balancer::default();
        let endpoints = [addr(1), addr(2), addr(3)];
        for _ in 0..EJECT_AFTER - 1 {
            assert_eq!(balancer.start(addr(1)).fail(), None);
        }
        balancer.start(addr(1)).finish();
        for _ in 0..EJECT_AFTER - 1 {
            assert_eq!(balancer.start(addr(1)).finish_unavailable(), None);
        }
        assert!(!balancer.stats(addr(1)).ejected());
        assert_eq!(
            balancer.start(addr(1)).finish_unavailable(),
            Some(BASE_EJECTION)
        );
        assert_eq!(balancer.ejected(), 1);
        // Even when its latency looks best, an ejected endpoint is not chosen.
        balancer.stats(addr(2)).observe(Duration::from_millis(50));
        balancer.stats(addr(3)).observe(Duration::from_millis(50));
        for random in 0..200 {
            assert_ne!(balancer.pick(&endpoints, |a| *a, random), Some(0));
        }
    }

    #[test]
    fn ejections_grow_and_never_empty_a_service() {
        let balancer = Balancer::default();
        let endpoints = [addr(1), addr(2)];
        let eject = |a| {
            let mut ejected = None;
            for _ in 0..EJECT_AFTER {
                ejected = balancer.start(a).fail();
            }
            ejected
        };
        assert_eq!(eject(addr(1)), Some(BASE_EJECTION));
        // Ejected already: further failures do not extend it.
        assert_eq!(eject(addr(1)), None);
        balancer
            .stats(addr(1))
            .ejected_until_ns
            .store(0, Ordering::Relaxed);
        assert_eq!(eject(addr(1)), Some(BASE_EJECTION * 2));
        assert_eq!(eject(addr(2)), Some(BASE_EJECTION));
        assert_eq!(balancer.ejected(), 2);
        for random in 0..20 {
            assert!(balancer.pick(&endpoints, |a| *a, random).is_some());
        }
    }

    #[test]
    fn a_peak_is_taken_at_once_and_fades() {
        let stats = EndpointStats::new();
        stats.observe(Duration::from_millis(100));
        assert_eq!(stats.ewma_ns.load(Ordering::Relaxed), 100_000_000);
        std::thread::sleep(Duration::from_millis(20));
        stats.observe(Duration::from_millis(1));
        let after = stats.ewma_ns.load(Ordering::Relaxed);
        assert!(after < 100_000_000 && after > 1_000_000, "{after}");
    }
}
