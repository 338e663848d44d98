//! `manifests/lease-protection` (issue 14, item 7): the Leases shipped, and
//! `create` taken off the Role by the component's JSON patch, so that a Lease
//! deleted under a live leader cannot be re-created by a fresh instance.
//!
//! Real `leader-gate` processes against the fake API server, which enforces
//! the Role of `manifests/rbac.yaml` as the component's patch leaves it, and
//! holds the Lease of the component's `leases.yaml` as `kubectl apply` would
//! create it. Judged from the fake's request log and the processes' logs.
//! (The component's ValidatingAdmissionPolicy is checked offline by
//! scripts/check-manifests.sh: the fake has no admission.)

use crate::support;

use std::time::{Duration, Instant};

use serde_json::Value;
use support::fake_apiserver::{Attributes, FakeApiServer, Role, Verb, lease_holder};
use support::sidecar::{Sidecar, Timing, test_dir};

/// The names the manifests use, so the shipped Lease applies unchanged.
const NAMESPACE: &str = "monitoring";
const LEASE: &str = "metricbeat-leader";
const ROLE_PATCH: &str = include_str!("../../manifests/lease-protection/role-without-create.yaml");
const LEASES: &str = include_str!("../../manifests/lease-protection/leases.yaml");

/// What the log says when the Lease is absent and may not be created.
const APPLY_THE_LEASE: &str = "does not exist and this service account may not create it: \
     apply the shipped Lease (manifests/lease-protection/leases.yaml";

fn protected_role() -> Role {
    Role::from_repository_manifest_patched(LEASE, ROLE_PATCH)
}

/// The Lease `leases.yaml` ships for `LEASE`.
fn shipped_lease() -> Value {
    let documents: Vec<Value> = serde_saphyr::from_multiple(LEASES).expect("leases.yaml is YAML");
    documents
        .into_iter()
        .find(|d| d["kind"] == "Lease" && d["metadata"]["name"] == LEASE)
        .expect("leases.yaml ships the Lease of rbac.yaml")
}

fn lease_access(verb: &'static str, name: &'static str) -> Attributes<'static> {
    Attributes {
        verb,
        group: "coordination.k8s.io",
        resource: "leases",
        name,
    }
}

#[test]
fn the_component_s_patch_leaves_the_role_every_lease_verb_but_create() {
    let role = protected_role();
    assert!(!role.allows(&lease_access("create", "")), "{role:?}");
    for verb in ["get", "update", "list", "watch"] {
        assert!(role.allows(&lease_access(verb, LEASE)), "{verb}: {role:?}");
    }
    // Only that rule went: the Events rule (for --record-events) stays.
    let original = Role::from_repository_manifest(LEASE);
    assert!(original.allows(&lease_access("create", "")));
    assert_eq!(role.rules.len(), original.rules.len() - 1);
    assert_eq!(
        role,
        original.without("coordination.k8s.io", "leases", "create")
    );
    // The shipped Lease is the one the Role names, in the Role's namespace.
    assert_eq!(shipped_lease()["metadata"]["namespace"], NAMESPACE);
    assert!(shipped_lease()["spec"].is_null(), "leader-gate fills it in");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_create_a_sidecar_leads_on_the_shipped_lease() {
    let api = FakeApiServer::start(NAMESPACE, LEASE).await;
    api.set_role(protected_role());
    api.create_lease(shipped_lease());
    let timing = Timing::FAST;
    let a = Sidecar::spawn(&api, &test_dir("lease-protection-shipped"), "a", timing);
    a.wait_serving().await;
    // A Lease it never saw held is waited on for one duration (G7), then taken.
    a.wait_leading(timing.lease * 3).await;
    assert_eq!(
        lease_holder(&api.lease(LEASE).unwrap()).as_deref(),
        Some("a")
    );
    assert!(
        api.requests_of("a", Verb::Create).is_empty(),
        "no create needed: {:?}",
        api.requests_of("a", Verb::Create)
    );
    let denied: Vec<_> = api
        .requests()
        .into_iter()
        .filter(|r| r.status == Some(403))
        .collect();
    assert!(denied.is_empty(), "{denied:?}");
    assert!(!a.log().contains("forbidden"), "{}", a.log());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_create_and_without_the_lease_it_never_leads_and_says_to_apply_the_shipped_lease() {
    let api = FakeApiServer::start(NAMESPACE, LEASE).await;
    api.set_role(protected_role());
    let timing = Timing::FAST;
    let a = Sidecar::spawn(&api, &test_dir("lease-protection-absent"), "a", timing);
    a.wait_serving().await;
    let denied = || {
        api.requests_of("a", Verb::Create)
            .iter()
            .filter(|r| r.status == Some(403))
            .count()
    };
    let deadline = Instant::now() + timing.lease * 6;
    while denied() < 2 {
        let probe = a.leader().await.expect("/leader answers");
        assert!(!probe.leading(), "led without a Lease: {probe:?}");
        assert!(
            Instant::now() < deadline,
            "no repeated create attempts\n{}",
            a.log()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(!a.leader().await.unwrap().leading());
    assert!(api.lease(LEASE).is_none());

    // Said once, in words that name the Lease and what to do.
    let log = a.log();
    let told: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("WARN") && l.contains(APPLY_THE_LEASE))
        .collect();
    assert_eq!(told.len(), 1, "told once:\n{log}");
    assert!(
        told[0].contains(&format!("the lease {NAMESPACE}/{LEASE} does not exist")),
        "{}",
        told[0]
    );
    assert!(told[0].contains("may not create leases"), "{}", told[0]);
    // The Troubleshooting entry (docs/operations.md) quotes what is printed.
    let readme =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/operations.md"))
            .expect("docs/operations.md");
    let entry = readme
        .lines()
        .find(|l| {
            l.starts_with(&format!(
                "- **`the lease {NAMESPACE}/{LEASE} does not exist"
            ))
        })
        .expect("a Troubleshooting entry for the create 403");
    let quoted = entry
        .split('`')
        .nth(1)
        .expect("the entry quotes the log line");
    for part in quoted.trim_end_matches(" …").split(" … ") {
        assert!(
            told[0].contains(part),
            "README says {part:?}; printed:\n{}",
            told[0]
        );
    }

    // Applying the shipped Lease ends it: it leads (one duration later).
    api.create_lease(shipped_lease());
    a.wait_leading(timing.lease * 3).await;
    assert_eq!(
        lease_holder(&api.lease(LEASE).unwrap()).as_deref(),
        Some("a")
    );
}
