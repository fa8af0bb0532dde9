//! Retry policy: reading a rule's `retry` (GEP-1731), the wait before each retry, and the
//! retry budget that keeps retries from multiplying an outage.

use std::str::FromStr;
use std::time::Duration;

use aether_crds::http::HttpRouteRetry;

use crate::error::RuleError;
use crate::table::Retry;

/// Retries after the first attempt when a rule does not say.
pub const DEFAULT_ATTEMPTS: u32 = 2;
/// The most retries a rule may ask for: more only lengthens an outage.
pub const MAX_ATTEMPTS: u32 = 10;
/// The wait before the first retry when a rule does not say.
pub const DEFAULT_BACKOFF: Duration = Duration::from_millis(25);
/// The longest wait between two attempts, whatever the doubling reaches.
const MAX_BACKOFF: Duration = Duration::from_secs(10);

/// Retries may add at most this share of a rule's requests over the window...
pub const BUDGET_RATIO: f64 = 0.2;
/// ...plus this many per second of the window, so a rule with little traffic still retries.
pub const BUDGET_MIN_PER_SECOND: u32 = 10;
/// The window the budget counts over, in seconds.
pub const BUDGET_WINDOW_SECONDS: usize = 10;

pub(crate) fn compile_retry(
    rule: usize,
    spec: Option<&HttpRouteRetry>,
) -> Result<Option<Retry>, RuleError> {
    let Some(spec) = spec else {
        return Ok(None);
    };
    let invalid = |message: String| RuleError::InvalidValue { rule, message };
    let attempts = match spec.attempts {
        None => DEFAULT_ATTEMPTS,
        Some(n) if (1..=i64::from(MAX_ATTEMPTS)).contains(&n) => n as u32,
        Some(n) => {
            return Err(invalid(format!(
                "retry.attempts {n} is outside 1-{MAX_ATTEMPTS}"
            )));
        }
    };
    let mut codes = Vec::new();
    for &code in spec.codes.iter().flatten() {
        let code = u16::try_from(code)
            .ok()
            .filter(|c| (400..=599).contains(c))
            .ok_or_else(|| {
                invalid(format!(
                    "retry.codes {code} is not an HTTP status in 400-599"
                ))
            })?;
        if !codes.contains(&code) {
            codes.push(code);
        }
    }
    codes.sort_unstable();
    let backoff = match spec.backoff.as_deref() {
        None => DEFAULT_BACKOFF,
        Some(v) => gateway_api::Duration::from_str(v)
            .map(|d| Duration::from_millis(u64::try_from(d.as_millis()).unwrap_or(u64::MAX)))
            .map_err(|e| invalid(format!("retry.backoff {v:?}: {e}")))?,
    };
    Ok(Some(Retry {
        codes,
        attempts,
        backoff_ms: u64::try_from(backoff.as_millis()).unwrap_or(u64::MAX),
    }))
}

/// Whether a response with `status` is tried again under `retry`.
pub fn retries_status(retry: &Retry, status: u16) -> bool {
    retry.codes.binary_search(&status).is_ok()
}

/// The wait before retry number `retry_number` (1 for the first): the rule's backoff doubled
/// for each earlier retry, capped, plus up to half of it again as jitter so that clients that
/// failed together do not retry together. Never below the rule's backoff, as GEP-1731 asks.
pub fn backoff(retry: &Retry, retry_number: u32, random: u64) -> Duration {
    let base = Duration::from_millis(retry.backoff_ms);
    let doubled = base
        .saturating_mul(1 << retry_number.saturating_sub(1).min(16))
        .min(MAX_BACKOFF.max(base));
    let jitter_ms = (doubled.as_millis() as u64 / 2).max(1);
    doubled + Duration::from_millis(random % jitter_ms)
}

/// The retries one rule may still make: over the last [`BUDGET_WINDOW_SECONDS`], retries stay
/// within [`BUDGET_RATIO`] of the requests plus [`BUDGET_MIN_PER_SECOND`] per second. Time is
/// given in whole seconds from any fixed origin, so the budget is a pure value.
#[derive(Debug, Clone, Default)]
pub struct RetryBudget {
    /// Per second of the window, indexed by second modulo the window: which second the slot
    /// counts, its requests and its retries.
    slots: [Slot; BUDGET_WINDOW_SECONDS],
}

#[derive(Debug, Clone, Copy, Default)]
struct Slot {
    second: u64,
    requests: u32,
    retries: u32,
}

impl RetryBudget {
    /// A first attempt of a request: it earns the rule [`BUDGET_RATIO`] of a retry.
    pub fn request(&mut self, now_second: u64) {
        let slot = self.slot(now_second);
        slot.requests = slot.requests.saturating_add(1);
    }

    /// Takes one retry from the budget if the budget has one left.
    pub fn try_retry(&mut self, now_second: u64) -> bool {
        let (requests, retries) = self.window(now_second);
        let allowed = BUDGET_RATIO * f64::from(requests)
            + f64::from(BUDGET_MIN_PER_SECOND) * BUDGET_WINDOW_SECONDS as f64;
        if f64::from(retries) + 1.0 > allowed {
            return false;
        }
        let slot = self.slot(now_second);
        slot.retries = slot.retries.saturating_add(1);
        true
    }

    /// Whether nothing happened within the window: the budget is back to its initial state
    /// and need not be kept.
    pub fn idle(&self, now_second: u64) -> bool {
        self.window(now_second) == (0, 0)
    }

    fn slot(&mut self, now_second: u64) -> &mut Slot {
        let slot = &mut self.slots[now_second as usize % BUDGET_WINDOW_SECONDS];
        if slot.second != now_second {
            *slot = Slot {
                second: now_second,
                ..Slot::default()
            };
        }
        slot
    }

    fn window(&self, now_second: u64) -> (u32, u32) {
        self.slots
            .iter()
            .filter(|s| {
                s.second <= now_second && now_second - s.second < BUDGET_WINDOW_SECONDS as u64
            })
            .fold((0, 0), |(requests, retries), s| {
                (requests + s.requests, retries + s.retries)
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(
        codes: Option<Vec<i64>>,
        attempts: Option<i64>,
        backoff: Option<&str>,
    ) -> HttpRouteRetry {
        HttpRouteRetry {
            codes,
            attempts,
            backoff: backoff.map(Into::into),
        }
    }

    #[test]
    fn a_retry_stanza_compiles_with_defaults_and_sorted_codes() {
        assert_eq!(compile_retry(0, None), Ok(None));
        assert_eq!(
            compile_retry(0, Some(&spec(None, None, None))),
            Ok(Some(Retry {
                codes: vec![],
                attempts: DEFAULT_ATTEMPTS,
                backoff_ms: 25
            }))
        );
        assert_eq!(
            compile_retry(
                0,
                Some(&spec(Some(vec![503, 500, 503]), Some(3), Some("1s")))
            ),
            Ok(Some(Retry {
                codes: vec![500, 503],
                attempts: 3,
                backoff_ms: 1000
            }))
        );
    }

    #[test]
    fn bad_retry_values_are_refused_with_the_field_named() {
        let message = |s: HttpRouteRetry| compile_retry(2, Some(&s)).unwrap_err().to_string();
        assert_eq!(
            message(spec(None, Some(50), None)),
            "rule 2: retry.attempts 50 is outside 1-10"
        );
        assert_eq!(
            message(spec(None, Some(0), None)),
            "rule 2: retry.attempts 0 is outside 1-10"
        );
        assert_eq!(
            message(spec(Some(vec![200]), None, None)),
            "rule 2: retry.codes 200 is not an HTTP status in 400-599"
        );
        assert!(
            message(spec(None, None, Some("-1s"))).starts_with("rule 2: retry.backoff \"-1s\": ")
        );
    }

    #[test]
    fn only_the_listed_statuses_are_retried() {
        let retry = Retry {
            codes: vec![502, 503],
            attempts: 2,
            backoff_ms: 25,
        };
        assert!(retries_status(&retry, 503));
        assert!(!retries_status(&retry, 500));
        assert!(!retries_status(&retry, 200));
    }

    #[test]
    fn backoff_doubles_never_waits_less_than_asked_and_is_capped() {
        let retry = Retry {
            codes: vec![],
            attempts: 10,
            backoff_ms: 100,
        };
        for random in [0, 7, 49, u64::MAX] {
            let first = backoff(&retry, 1, random);
            assert!(first >= Duration::from_millis(100) && first < Duration::from_millis(150));
            let third = backoff(&retry, 3, random);
            assert!(third >= Duration::from_millis(400) && third < Duration::from_millis(600));
            assert!(backoff(&retry, 10, random) < Duration::from_secs(15));
        }
    }

    #[test]
    fn the_budget_holds_retries_to_a_share_of_requests_plus_a_floor() {
        let mut budget = RetryBudget::default();
        // An outage: every request fails and wants 3 retries, at 1000 requests a second.
        let (mut requests, mut retries) = (0u32, 0u32);
        for second in 0..30 {
            for _ in 0..1000 {
                budget.request(second);
                requests += 1;
                for _ in 0..3 {
                    if budget.try_retry(second) {
                        retries += 1;
                    }
                }
            }
        }
        let ratio = f64::from(retries) / f64::from(requests);
        assert!(ratio > 0.2 && ratio < 0.22, "{ratio}");
    }

    #[test]
    fn the_floor_lets_a_quiet_rule_retry_and_the_window_forgets() {
        let mut budget = RetryBudget::default();
        let floor = BUDGET_MIN_PER_SECOND * BUDGET_WINDOW_SECONDS as u32;
        for _ in 0..floor {
            assert!(budget.try_retry(5));
        }
        assert!(!budget.try_retry(5));
        assert!(!budget.idle(14));
        assert!(budget.idle(15));
        assert!(budget.try_retry(15));
    }
}
