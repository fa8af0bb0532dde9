//! The cost of one authorization decision on a node holding 100 policies, all in the called
//! pod's namespace (the worst case: every one is a candidate): 10 select the pod, one of them a
//! DENY, the others ALLOWs with ServiceAccount, namespace and HTTP-match rules, the caller
//! admitted by the last. `decide/` is the cost per request (the proxy finds a pod's policies
//! once per connection); `find-and-decide/` adds finding them. Run:
//! `cargo bench -p aether-core --bench authz`.

use std::collections::BTreeMap;
use std::hint::black_box;

use aether_core::authz::{
    Action, HttpHead, HttpMatch, Mode, NodeAuthorization, Peer, Policy, PolicySet, Request, Rule,
    ServiceAccountName, Source,
};
use aether_core::identity::ServiceAccount;
use aether_core::route_table::PathMatch;
use criterion::{Criterion, criterion_group, criterion_main};

const POLICIES: usize = 100;
const SELECTING: usize = 10;

struct Head;

impl HttpHead for Head {
    fn method(&self) -> &str {
        "GET"
    }
    fn path(&self) -> &str {
        "/api/v1/items/42"
    }
    fn query(&self) -> Option<&str> {
        None
    }
    fn header_values(&self, _: &str) -> Vec<&str> {
        Vec::new()
    }
}

fn policy(i: usize) -> Policy {
    let app = if i < SELECTING {
        "checkout".to_owned()
    } else {
        format!("app-{i}")
    };
    let sa = |name: String| {
        Source::ServiceAccount(ServiceAccountName {
            namespace: "shop".into(),
            name,
        })
    };
    let rules = vec![
        Rule {
            sources: vec![
                sa(format!("caller-{i}")),
                Source::Namespace(format!("ns-{i}")),
            ],
            ports: vec![8080],
            http: vec![HttpMatch {
                path: Some(PathMatch::Prefix(format!("/api/v{i}"))),
                method: Some("GET".into()),
                ..HttpMatch::default()
            }],
        },
        Rule {
            sources: vec![sa(format!("other-{i}"))],
            ports: Vec::new(),
            http: Vec::new(),
        },
        // The last selecting policy admits the caller, so every other candidate is tried first.
        Rule {
            sources: vec![sa(if i == SELECTING - 1 {
                "web".into()
            } else {
                format!("x-{i}")
            })],
            ports: Vec::new(),
            http: vec![HttpMatch {
                path: Some(PathMatch::Prefix("/api".into())),
                ..HttpMatch::default()
            }],
        },
    ];
    Policy {
        namespace: "shop".into(),
        name: format!("p{i}"),
        action: if i == 0 { Action::Deny } else { Action::Allow },
        mode: Mode::Enforce,
        selectors: vec![BTreeMap::from([("app".into(), app)])],
        rules,
    }
}

fn decide(c: &mut Criterion) {
    let config = NodeAuthorization {
        policies: (0..POLICIES).map(policy).collect(),
        deny_by_default: Vec::new(),
    };
    let (set, errors) = PolicySet::new(&config);
    assert!(errors.is_empty());
    let labels = BTreeMap::from([
        ("app".to_owned(), "checkout".to_owned()),
        ("pod-template-hash".to_owned(), "6d4cf56db6".to_owned()),
    ]);
    let web = ServiceAccount::new("shop", "web");
    let id = web.spiffe_id("cluster.local");
    let peer = Peer {
        service_account: &web,
        spiffe_id: &id,
    };
    let head = Head;
    let applicable = set.applicable("shop", &labels);
    let verdict = PolicySet::decide(
        &applicable,
        Some(peer),
        Request {
            port: 8080,
            http: Some(&head),
        },
    );
    assert!(verdict.allowed(), "{verdict:?}");
    // Per request: the proxy finds the pod's policies once per connection.
    c.bench_function("decide/100-policies", |b| {
        b.iter(|| {
            let request = Request {
                port: 8080,
                http: Some(&head),
            };
            black_box(PolicySet::decide(
                black_box(&applicable),
                Some(peer),
                request,
            ))
        })
    });
    // Per connection, and again at each change of the policies.
    c.bench_function("find-and-decide/100-policies", |b| {
        b.iter(|| {
            let applicable = set.applicable(black_box("shop"), black_box(&labels));
            let request = Request {
                port: 8080,
                http: Some(&head),
            };
            black_box(PolicySet::decide(&applicable, Some(peer), request))
        })
    });
}

criterion_group!(benches, decide);
criterion_main!(benches);
