//! The retry budget of each route rule this proxy retries for ([`RetryBudget`]): one per
//! rule and proxy, so one client pod's retries cannot use up another route's.

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;
use std::time::Instant;

use aether_routing::retry::RetryBudget;
use aether_routing::table::{RouteRef, Rule};

/// Above this many routes, budgets with nothing in their window are dropped when a new one
/// is made: the map follows the routes in use, not every route there ever was.
const KEPT_ROUTES: usize = 256;

pub struct RetryBudgets {
    epoch: Instant,
    budgets: Mutex<HashMap<RouteRef, BTreeMap<u32, RetryBudget>>>,
}

impl Default for RetryBudgets {
    fn default() -> Self {
        RetryBudgets {
            epoch: Instant::now(),
            budgets: Mutex::default(),
        }
    }
}

impl RetryBudgets {
    /// A first attempt of a request under `rule`.
    pub fn request(&self, rule: &Rule) {
        let now = self.second();
        self.with(rule, now, |budget| budget.request(now));
    }

    /// Takes a retry from `rule`'s budget if it has one left.
    pub fn try_retry(&self, rule: &Rule) -> bool {
        let now = self.second();
        self.with(rule, now, |budget| budget.try_retry(now))
    }

    fn second(&self) -> u64 {
        self.epoch.elapsed().as_secs()
    }

    fn with<T>(&self, rule: &Rule, now: u64, f: impl FnOnce(&mut RetryBudget) -> T) -> T {
        let mut budgets = self.budgets.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(rules) = budgets.get_mut(&rule.route) {
            return f(rules.entry(rule.index).or_default());
        }
        if budgets.len() >= KEPT_ROUTES {
            budgets.retain(|_, rules| {
                rules.retain(|_, budget| !budget.idle(now));
                !rules.is_empty()
            });
        }
        let rules = budgets.entry(rule.route.clone()).or_default();
        f(rules.entry(rule.index).or_default())
    }
}
