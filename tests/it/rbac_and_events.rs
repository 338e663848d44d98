//! The permissions the project ships, and the Kubernetes Events it records:
//! real `leader-gate` processes against the fake API server, which enforces
//! the Role of `manifests/rbac.yaml` (or one a test swaps in) and stores the
//! core/v1 Events it is sent.
//!
//! Judged by causality from the fake's request log and stored objects, and by
//! what the processes print; every scenario with several instances also runs
//! the overlap monitor.

use crate::support;

use std::time::{Duration, Instant};

use serde_json::Value;
use support::fake_apiserver::{
    FakeApiServer, Fault, FaultKind, RequestRecord, Resource, Role, Verb, lease_holder,
    lease_object,
};
use support::monitor::Monitor;
use support::sidecar::{Sidecar, Timing, first_leader, test_dir};

const NAMESPACE: &str = "collectors";
const LEASE: &str = "cluster-metrics";
const RECORD: &[&str] = &["--record-events"];

fn user(client: &str) -> String {
    format!("system:serviceaccount:{NAMESPACE}:{client}")
}

/// The name RBAC sees for a logged request: none for a create.
fn rbac_name(r: &RequestRecord) -> &str {
    match r.verb {
        Verb::Create => "",
        _ => r.name.as_deref().unwrap_or(""),
    }
}

fn event_requests(api: &FakeApiServer) -> Vec<RequestRecord> {
    api.requests()
        .into_iter()
        .filter(|r| r.resource == Some(Resource::Events))
        .collect()
}

/// Waits until `pred` holds, or fails with `what` and the logs.
async fn wait_until(timeout: Duration, what: &str, logs: &[&Sidecar], pred: impl Fn() -> bool) {
    let deadline = Instant::now() + timeout;
    while !pred() {
        if Instant::now() > deadline {
            let logs: Vec<String> = logs
                .iter()
                .map(|s| format!("--- {} ---\n{}", s.name, s.log()))
                .collect();
            panic!("{what}: not within {timeout:?}\n{}", logs.join("\n"));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The messages of the stored Events, in creation order.
fn messages(api: &FakeApiServer) -> Vec<String> {
    api.events()
        .iter()
        .map(|e| e["message"].as_str().unwrap_or("").to_string())
        .collect()
}

async fn stop(sidecar: &mut Sidecar) {
    sidecar.signal(libc::SIGTERM);
    let status = sidecar.wait_exit(Duration::from_secs(10)).await;
    assert_eq!(
        status.and_then(|s| s.code()),
        Some(0),
        "{} exits cleanly on SIGTERM\n{}",
        sidecar.name,
        sidecar.log()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_exactly_the_role_of_rbac_yaml_two_sidecars_elect_hand_over_and_re_elect() {
    let api = FakeApiServer::start(NAMESPACE, LEASE).await;
    // Nothing swapped in: the Role is the manifest's, rule for rule. With
    // --record-events, as every shipped manifest runs it: the Role's
    // Events rule is exercised too.
    assert_eq!(api.role(), Role::from_repository_manifest(LEASE));
    let dir = test_dir("rbac-yaml");
    let timing = Timing::FAST;
    let mut a = Sidecar::spawn_with(&api, &dir, "a", timing, RECORD);
    let mut b = Sidecar::spawn_with(&api, &dir, "b", timing, RECORD);
    a.wait_serving().await;
    b.wait_serving().await;
    let monitor = Monitor::start(&[&a, &b]);

    // Elect.
    let (old, new) = first_leader(&mut a, &mut b, timing.lease * 3).await;
    let first = old.name.clone();
    // Hand over on SIGTERM: the peer takes the released Lease.
    stop(old).await;
    new.wait_leading(timing.lease * 2).await;
    // Re-elect: the first one comes back (a restarted pod of the same
    // name), and takes over when the second one is stopped in turn.
    let name = old.name.clone();
    *old = Sidecar::spawn_with(&api, &dir, &name, timing, RECORD);
    old.wait_serving().await;
    monitor.watch(old);
    stop(new).await;
    old.wait_leading(timing.lease * 2).await;
    stop(old).await;
    // The Role's Events rule lets every transition through (in order per
    // instance; the two instances' Events may cross on the wire).
    let said_by = |instance: &str| -> Vec<String> {
        api.events()
            .iter()
            .filter(|e| e["reportingInstance"] == instance)
            .map(|e| e["message"].as_str().unwrap_or("").to_string())
            .collect()
    };
    let start = |n: &str| {
        (
            format!("{n} became leader"),
            format!("{n} stopped leading: shutdown"),
        )
    };
    let second = new.name.clone();
    assert_eq!(
        said_by(&first),
        [
            start(&first).0,
            start(&first).1,
            start(&first).0,
            start(&first).1
        ]
    );
    assert_eq!(said_by(&second), [start(&second).0, start(&second).1]);

    // Every request was one the Role allows, and none was refused.
    let log = api.requests();
    assert!(!log.is_empty());
    for r in &log {
        let resource = r
            .resource
            .unwrap_or_else(|| panic!("a request outside the Role's resources: {r:?}"));
        assert!(
            api.role_allows(r.verb, resource, rbac_name(r)),
            "a request the Role does not allow: {r:?}"
        );
        assert!(
            !matches!(r.status, Some(401 | 403)),
            "a refused request: {r:?}"
        );
    }
    let mut used: Vec<String> = log
        .iter()
        .map(|r| format!("{} {:?}", r.verb.rbac_name(), r.resource.unwrap()))
        .collect();
    used.sort();
    used.dedup();
    eprintln!("verbs used under rbac.yaml: {used:?}");
    for expected in [
        "create Leases",
        "list Leases",
        "watch Leases",
        "update Leases",
        "create Events",
    ] {
        assert!(used.iter().any(|u| u == expected), "{expected} in {used:?}");
    }
    monitor.assert_no_overlap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_a_role_without_update_it_never_leads_and_says_so_once_in_the_documented_words() {
    let api = FakeApiServer::start(NAMESPACE, LEASE).await;
    api.set_role(Role::from_repository_manifest(LEASE).without(
        "coordination.k8s.io",
        "leases",
        "update",
    ));
    // The Lease exists (as it does after the first ever run), its holder
    // gone: taking it over takes an update.
    api.create_lease(lease_object(LEASE, Some("gone"), 1));
    let timing = Timing::FAST;
    let a = Sidecar::spawn(&api, &test_dir("no-update"), "a", timing);
    a.wait_serving().await;
    let denied = || {
        api.requests_of("a", Verb::Update)
            .iter()
            .filter(|r| r.status == Some(403))
            .count()
    };
    // Never leading while it tries, again and again.
    let deadline = Instant::now() + timing.lease * 6;
    while denied() < 3 {
        let probe = a.leader().await.expect("/leader answers");
        assert!(!probe.leading(), "led without update: {probe:?}");
        assert!(
            Instant::now() < deadline,
            "no repeated update attempts\n{}",
            a.log()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(!a.leader().await.unwrap().leading());
    assert_eq!(
        lease_holder(&api.lease(LEASE).unwrap()).as_deref(),
        Some("gone")
    );

    // Loud, once: the words name the verb, the resource and the namespace.
    let log = a.log();
    let explained: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("WARN") && l.contains("forbidden (403)"))
        .collect();
    assert_eq!(explained.len(), 1, "one explanation:\n{log}");
    let line = explained[0];
    assert!(
        line.contains(&format!(
            "{} may not update leases.coordination.k8s.io in namespace {NAMESPACE}",
            user("a")
        )),
        "{line}"
    );
    // The Troubleshooting entry (docs/operations.md) is what is printed, names aside.
    let readme =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/operations.md"))
            .expect("docs/operations.md");
    let entry = readme
        .lines()
        .find(|l| l.starts_with("- **`cannot update the lease"))
        .expect("a Troubleshooting entry for the update 403");
    let quoted = entry
        .split('`')
        .nth(1)
        .expect("the entry quotes the log line");
    for part in quoted.split(" … ") {
        let part = part
            .replace("system:serviceaccount:monitoring:metricbeat", &user("a"))
            .replace("monitoring", NAMESPACE);
        assert!(
            line.contains(&part),
            "README says {part:?}; printed:\n{line}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_record_events_starts_and_stops_become_events_about_the_lease() {
    // The Role of manifests/rbac.yaml as it is: it has the Events rule.
    let api = FakeApiServer::start(NAMESPACE, LEASE).await;
    let timing = Timing::FAST;
    let mut a = Sidecar::spawn_with(&api, &test_dir("events"), "a", timing, RECORD);
    a.wait_serving().await;
    a.wait_leading(timing.lease * 3).await;
    wait_until(timing.lease, "a start Event", &[&a], || {
        messages(&api) == ["a became leader"]
    })
    .await;

    // Another holder: the operator writes a name into the Lease.
    let edited = Instant::now();
    api.update_lease(LEASE, |l| l["spec"]["holderIdentity"] = "ghost".into());
    a.wait_for(timing.lease, |p| !p.leading()).await;
    wait_until(timing.lease, "a stop Event", &[&a], || {
        messages(&api).len() == 2
    })
    .await;
    // It leads again once "ghost" expired, and then SIGTERM stops it.
    a.wait_leading(timing.lease * 3).await;
    wait_until(timing.lease, "a second start Event", &[&a], || {
        messages(&api).len() == 3
    })
    .await;
    // The stop Event is slow to be answered: the process waits for it
    // (within its shutdown timeout) rather than exiting without it.
    api.set_fault(
        "a",
        Fault::on(
            &[Verb::Create],
            FaultKind::Latency(Duration::from_millis(1500)),
        ),
    );
    let signalled = Instant::now();
    stop(&mut a).await;
    let exited = Instant::now();
    assert_eq!(
        messages(&api),
        [
            "a became leader",
            "a stopped leading: lost-to-other-holder",
            "a became leader",
            "a stopped leading: shutdown",
        ],
        "the stop Event is sent before the process exits"
    );

    // Each Event follows what it reports.
    let creates = event_requests(&api);
    assert_eq!(creates.len(), 4, "one attempt each: {creates:?}");
    assert!(creates.iter().all(|r| r.status == Some(201)));
    let acquisitions: Vec<RequestRecord> = api
        .requests_of("a", Verb::Update)
        .into_iter()
        .chain(api.requests_of("a", Verb::Create))
        .filter(|r| r.resource == Some(Resource::Leases) && r.status == Some(201))
        .collect();
    assert!(
        acquisitions.iter().all(|w| w.at < creates[0].at),
        "the first start Event after the Lease was created"
    );
    assert!(
        creates[1].at > edited,
        "the lost-lease Event after the edit"
    );
    assert!(
        creates[3].at > signalled,
        "the shutdown Event after SIGTERM"
    );
    assert!(
        exited > creates[3].at + Duration::from_millis(1500),
        "exited only after the slow Event was answered"
    );

    // What kubectl describe lease / kubectl get events show.
    let lease = api.lease(LEASE).unwrap();
    let uid = lease["metadata"]["uid"].as_str().unwrap();
    for event in api.events() {
        let field = |pointer: &str| event.pointer(pointer).cloned().unwrap_or(Value::Null);
        assert_eq!(
            field("/involvedObject"),
            serde_json::json!({
                "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                "name": LEASE, "namespace": NAMESPACE, "uid": uid,
            })
        );
        assert_eq!(field("/metadata/namespace"), NAMESPACE);
        assert_eq!(field("/reason"), "LeaderElection");
        assert_eq!(field("/type"), "Normal");
        assert_eq!(field("/source/component"), "leader-gate");
        assert_eq!(field("/reportingComponent"), "leader-gate");
        assert_eq!(field("/reportingInstance"), "a");
        assert_eq!(field("/count"), 1);
        assert!(field("/firstTimestamp").is_string());
        assert_eq!(field("/firstTimestamp"), field("/lastTimestamp"));
        let name = field("/metadata/name");
        let suffix = name
            .as_str()
            .and_then(|n| n.strip_prefix(&format!("{LEASE}.")))
            .unwrap_or_else(|| panic!("named <lease>.<hex nanos>: {name}"));
        assert!(u64::from_str_radix(suffix, 16).is_ok(), "{name}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_flag_no_event_request_is_made() {
    let api = FakeApiServer::start(NAMESPACE, LEASE).await;
    let timing = Timing::FAST;
    let mut a = Sidecar::spawn(&api, &test_dir("no-events"), "a", timing);
    a.wait_serving().await;
    a.wait_leading(timing.lease * 3).await;
    api.update_lease(LEASE, |l| l["spec"]["holderIdentity"] = "ghost".into());
    a.wait_for(timing.lease, |p| !p.leading()).await;
    a.wait_leading(timing.lease * 3).await;
    stop(&mut a).await;
    // Two starts and two stops happened, and not one request about Events.
    let requests = event_requests(&api);
    assert!(requests.is_empty(), "{requests:?}");
    assert_eq!(api.events(), Vec::<Value>::new());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_a_role_lacking_events_leadership_works_and_the_403_is_said_once() {
    let api = FakeApiServer::start(NAMESPACE, LEASE).await;
    api.set_role(Role::from_repository_manifest(LEASE).without("", "events", "create"));
    let timing = Timing::FAST;
    let mut a = Sidecar::spawn_with(&api, &test_dir("events-denied"), "a", timing, RECORD);
    a.wait_serving().await;
    a.wait_leading(timing.lease * 3).await;
    api.update_lease(LEASE, |l| l["spec"]["holderIdentity"] = "ghost".into());
    a.wait_for(timing.lease, |p| !p.leading()).await;
    a.wait_leading(timing.lease * 3).await;
    let denied = || {
        event_requests(&api)
            .iter()
            .filter(|r| r.status == Some(403))
            .count()
    };
    wait_until(timing.lease, "three denied Events", &[&a], || denied() == 3).await;
    // Still leading, and renewing.
    let renews = api.requests_of("a", Verb::Update).len();
    a.wait_for(timing.lease, |p| p.leading()).await;
    wait_until(timing.lease, "a renew after the denials", &[&a], || {
        api.requests_of("a", Verb::Update).len() > renews
    })
    .await;
    assert!(a.leader().await.unwrap().leading());
    stop(&mut a).await;
    assert_eq!(denied(), 4, "one attempt per Event, the stop's included");
    assert!(api.events().is_empty());

    let log = a.log();
    let said: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("WARN") && l.contains("cannot create events about the lease"))
        .collect();
    assert_eq!(said.len(), 1, "once per episode:\n{log}");
    assert!(
        said[0].contains(&format!(
            "forbidden (403): {} may not create events in namespace {NAMESPACE}",
            user("a")
        )),
        "in the words of the Lease 403s: {}",
        said[0]
    );
    // No Lease request was refused.
    assert!(
        api.requests()
            .iter()
            .filter(|r| r.resource == Some(Resource::Leases))
            .all(|r| r.status != Some(403))
    );
}

/// Every YAML document of `path`.
fn documents(path: &std::path::Path) -> Vec<Value> {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_saphyr::from_multiple(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Every `args` list under `value` whose first item is `serve`.
fn serve_args(value: &Value, out: &mut Vec<Vec<String>>) {
    match value {
        Value::Object(map) => {
            if let Some(Value::Array(args)) = map.get("args")
                && args.first().and_then(Value::as_str) == Some("serve")
            {
                out.push(
                    args.iter()
                        .map(|a| a.as_str().unwrap_or_default().to_owned())
                        .collect(),
                );
            }
            map.values().for_each(|v| serve_args(v, out));
        }
        Value::Array(items) => items.iter().for_each(|v| serve_args(v, out)),
        _ => {}
    }
}

/// Whether `role` grants `verb` on `resource` of `group` (for `name`, or
/// for any name when `name` is empty: then only a rule without names).
fn grants(role: &Value, group: &str, resource: &str, verb: &str, name: &str) -> bool {
    let has = |rule: &Value, key: &str, want: &str| {
        rule[key]
            .as_array()
            .is_some_and(|items| items.iter().any(|i| i == want))
    };
    role["rules"].as_array().into_iter().flatten().any(|rule| {
        has(rule, "apiGroups", group)
            && has(rule, "resources", resource)
            && has(rule, "verbs", verb)
            && match rule["resourceNames"].as_array() {
                None => true,
                Some(names) => !name.is_empty() && names.iter().any(|n| n == name),
            }
    })
}

/// Events are on in what the project ships: every manifest under
/// manifests/ and every recipe under examples/ that runs `leader-gate
/// serve` passes `--record-events`, and the Role that gives it its Lease
/// (in the same directory) lets it create Events, so `kubectl describe
/// lease` and `kubectl get events` show who leads without a 403.
#[test]
fn every_shipped_serve_records_events_and_its_role_may_create_them() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut dirs = vec![root.join("manifests")];
    for entry in std::fs::read_dir(root.join("examples")).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() && !path.ends_with("schemas") {
            dirs.push(path);
        }
    }
    let mut checked = Vec::new();
    for dir in dirs {
        let files: Vec<_> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
            .collect();
        let docs: Vec<(String, Value)> = files
            .iter()
            .flat_map(|f| {
                let name = f.strip_prefix(root).unwrap().display().to_string();
                documents(f).into_iter().map(move |d| (name.clone(), d))
            })
            .collect();
        for (file, doc) in &docs {
            let mut found = Vec::new();
            serve_args(doc, &mut found);
            for args in found {
                assert!(
                    args.iter().any(|a| a == "--record-events"),
                    "{file}: serve without --record-events: {args:?}"
                );
                let leases: Vec<&String> = args
                    .iter()
                    .zip(args.iter().skip(1))
                    .filter(|(flag, _)| *flag == "--lease-name")
                    .map(|(_, value)| value)
                    .collect();
                assert!(!leases.is_empty(), "{file}: no --lease-name in {args:?}");
                for lease in leases {
                    let roles: Vec<&(String, Value)> = docs
                        .iter()
                        .filter(|(_, d)| {
                            d["kind"] == "Role"
                                && grants(d, "coordination.k8s.io", "leases", "update", lease)
                        })
                        .collect();
                    assert!(!roles.is_empty(), "{file}: no Role for the Lease {lease}");
                    for (role_file, role) in roles {
                        assert!(
                            grants(role, "", "events", "create", ""),
                            "{role_file}: Role {} lets {lease}'s sidecar lead but not create Events",
                            role["metadata"]["name"]
                        );
                    }
                    checked.push(format!("{file}: {lease}"));
                }
            }
        }
    }
    // The four manifests (three Leases in one) and three recipes.
    assert!(checked.len() >= 9, "{checked:?}");
}
