//! Leader election on a Lease: one replica writes, the others stand by and take over when
//! the leader stops renewing.

use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::api::{Api, PostParams};
use tokio::sync::watch;

const LEASE_SECONDS: i32 = 15;
const RENEW_EVERY: Duration = Duration::from_secs(5);

/// Whether `spec` lets `me` hold the lease at `now`: free, mine, or expired.
pub fn may_hold(spec: &LeaseSpec, me: &str, now: Timestamp) -> bool {
    let holder = spec.holder_identity.as_deref().unwrap_or_default();
    if holder.is_empty() || holder == me {
        return true;
    }
    let renewed = spec
        .renew_time
        .as_ref()
        .map(|t| t.0)
        .unwrap_or(Timestamp::UNIX_EPOCH);
    let duration = SignedDuration::from_secs(i64::from(
        spec.lease_duration_seconds.unwrap_or(LEASE_SECONDS),
    ));
    renewed + duration < now
}

async fn try_hold(api: &Api<Lease>, name: &str, me: &str) -> kube::Result<bool> {
    let now = Timestamp::now();
    let fresh = |transitions: i32| LeaseSpec {
        holder_identity: Some(me.to_owned()),
        lease_duration_seconds: Some(LEASE_SECONDS),
        renew_time: Some(MicroTime(now)),
        acquire_time: Some(MicroTime(now)),
        lease_transitions: Some(transitions),
        ..Default::default()
    };
    match api.get_opt(name).await? {
        None => {
            let lease = Lease {
                metadata: ObjectMeta {
                    name: Some(name.to_owned()),
                    ..Default::default()
                },
                spec: Some(fresh(0)),
            };
            match api.create(&PostParams::default(), &lease).await {
                Ok(_) => Ok(true),
                Err(kube::Error::Api(e)) if e.code == 409 => Ok(false),
                Err(e) => Err(e),
            }
        }
        Some(mut lease) => {
            let spec = lease.spec.clone().unwrap_or_default();
            if !may_hold(&spec, me, now) {
                return Ok(false);
            }
            let mine = spec.holder_identity.as_deref() == Some(me);
            let mut next = fresh(spec.lease_transitions.unwrap_or(0) + i32::from(!mine));
            if mine {
                next.acquire_time = spec.acquire_time;
            }
            lease.spec = Some(next);
            // The resourceVersion in `lease` makes this a compare-and-swap.
            match api.replace(name, &PostParams::default(), &lease).await {
                Ok(_) => Ok(true),
                Err(kube::Error::Api(e)) if e.code == 409 => Ok(false),
                Err(e) => Err(e),
            }
        }
    }
}

/// Keeps trying to hold the Lease `namespace/name` as `me`, publishing whether it leads.
pub async fn elect(
    client: kube::Client,
    namespace: String,
    name: String,
    me: String,
    leading: watch::Sender<bool>,
) {
    let api: Api<Lease> = Api::namespaced(client, &namespace);
    loop {
        let holds = match try_hold(&api, &name, &me).await {
            Ok(holds) => holds,
            Err(error) => {
                tracing::warn!(error = %error, "cannot renew the leader lease");
                false
            }
        };
        if holds != *leading.borrow() {
            tracing::info!(identity = me, leading = holds, "leadership changed");
            let _ = leading.send(holds);
        }
        tokio::time::sleep(RENEW_EVERY).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lease_is_free_mine_or_expired() {
        let now = Timestamp::from_second(1_000).unwrap();
        let spec = |holder: &str, renewed: i64| LeaseSpec {
            holder_identity: Some(holder.into()),
            renew_time: Some(MicroTime(Timestamp::from_second(renewed).unwrap())),
            lease_duration_seconds: Some(15),
            ..Default::default()
        };
        assert!(may_hold(&LeaseSpec::default(), "a", now));
        assert!(may_hold(&spec("a", 999), "a", now));
        assert!(!may_hold(&spec("b", 990), "a", now), "b renewed 10 s ago");
        assert!(
            may_hold(&spec("b", 980), "a", now),
            "b's lease ran out 5 s ago"
        );
    }
}
