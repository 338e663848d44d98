//! One sidecar elected for several Leases, as real processes against the
//! fake API server: the Leases spread over the group (no pod holds two
//! while there are as many pods as Leases), a killed holder's Lease goes to
//! a pod that held none, fewer pods than Leases still hold every Lease and
//! spread again when pods come back, and each Lease has its own paths.

use crate::support;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use support::fake_apiserver::{FakeApiServer, PolicyRule, lease_holder};
use support::sidecar::{Sidecar, Timing, get, test_dir};

const LEASES: [&str; 3] = ["shard-0", "shard-1", "shard-2"];

/// A server whose Role grants the Leases `LEASES` (the shipped Role names one).
async fn api_for_three_leases() -> FakeApiServer {
    let api = FakeApiServer::start("collectors", LEASES[0]).await;
    let mut role = api.role();
    role.rules.push(PolicyRule::new(
        &["coordination.k8s.io"],
        &["leases"],
        &LEASES[1..],
        &["get", "list", "watch", "update"],
    ));
    api.set_role(role);
    api
}

/// `--lease-name` after the one the harness passes: the other two; and a
/// short claim window, so that a pod holding none is named successor of a
/// surplus Lease within seconds (the default spreads claims over a minute).
const MORE: [&str; 4] = [
    "--lease-name",
    "shard-1,shard-2",
    "--successor-claim-window",
    "2s",
];

/// Who holds each Lease now, as stored.
fn holders(api: &FakeApiServer) -> BTreeMap<&'static str, Option<String>> {
    LEASES
        .iter()
        .map(|name| (*name, api.lease(name).as_ref().and_then(lease_holder)))
        .collect()
}

/// Every Lease held, each by a different pod.
fn spread_out(holders: &BTreeMap<&'static str, Option<String>>) -> bool {
    let mut seen: Vec<&String> = holders.values().flatten().collect();
    seen.sort();
    seen.dedup();
    seen.len() == LEASES.len()
}

async fn wait_until(
    api: &FakeApiServer,
    within: Duration,
    what: &str,
    done: impl Fn(&BTreeMap<&'static str, Option<String>>) -> bool,
) -> BTreeMap<&'static str, Option<String>> {
    let started = Instant::now();
    loop {
        let now = holders(api);
        if done(&now) {
            return now;
        }
        assert!(
            started.elapsed() < within,
            "{what} not reached within {within:?}: {now:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn six_pods_spread_three_leases_and_a_killed_holders_lease_goes_to_a_pod_holding_none() {
    let api = api_for_three_leases().await;
    let dir = test_dir("several-leases");
    let timing = Timing::FAST;
    let names = ["a", "b", "c", "d", "e", "f"];
    let mut pods: BTreeMap<&str, Sidecar> = names
        .iter()
        .map(|name| (*name, Sidecar::spawn_with(&api, &dir, name, timing, &MORE)))
        .collect();
    for pod in pods.values() {
        pod.wait_serving().await;
    }
    let before = wait_until(&api, timing.lease * 6, "three distinct holders", spread_out).await;
    // At rest it stays so: no pod picks up a second Lease.
    tokio::time::sleep(timing.lease).await;
    assert_eq!(holders(&api), before, "the spread moved at rest");

    // Each Lease's own path, the list, and the pod-wide /leader.
    for (lease, holder) in &before {
        let holder = holder.as_deref().unwrap();
        let pod = &pods[holder];
        let own = get(pod.gate, &format!("/leader/{lease}")).await.unwrap();
        assert_eq!(own.status, 200, "{lease} at {holder}: {:?}", own.body);
        assert_eq!(own.body["lease"]["name"], *lease);
        let list = get(pod.gate, "/leases").await.unwrap();
        assert_eq!(list.status, 200);
        assert_eq!(
            list.body["held"],
            serde_json::json!([lease]),
            "{:?}",
            list.body
        );
        assert_eq!(list.body["leases"].as_array().map(Vec::len), Some(3));
        assert_eq!(get(pod.admin, "/leader").await.unwrap().status, 200);
        let unknown = get(pod.gate, "/leader/nope").await.unwrap();
        assert_eq!(unknown.status, 404);
        let events = get(pod.gate, "/events").await.unwrap();
        assert_eq!(events.status, 400, "/events needs ?lease= with several");
    }
    let idle: Vec<&str> = names
        .iter()
        .copied()
        .filter(|n| !before.values().flatten().any(|h| h == n))
        .collect();
    assert_eq!(idle.len(), 3);
    for name in &idle {
        let pod = &pods[name];
        assert_eq!(get(pod.gate, "/leader").await.unwrap().status, 503);
        let other = get(pod.gate, "/leader/shard-1").await.unwrap();
        assert_eq!(other.status, 503);
        assert_eq!(other.body["holder"], before["shard-1"].as_deref().unwrap());
    }

    // SIGKILL the holder of shard-1: its Lease goes to a pod that held none.
    let victim = before["shard-1"].clone().unwrap();
    let mut killed = pods.remove(victim.as_str()).unwrap();
    killed.signal(libc::SIGKILL);
    killed.wait_exit(Duration::from_secs(5)).await;
    let after = wait_until(&api, timing.lease * 4, "shard-1 taken over", |h| {
        h["shard-1"].as_deref().is_some_and(|h| h != victim)
    })
    .await;
    let taker = after["shard-1"].clone().unwrap();
    assert!(
        idle.contains(&taker.as_str()),
        "shard-1 went to {taker}, which held {:?}",
        before
    );
    assert_eq!(after["shard-0"], before["shard-0"]);
    assert_eq!(after["shard-2"], before["shard-2"]);
    assert!(spread_out(&after), "{after:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fewer_pods_than_leases_hold_them_all_and_spread_again_when_a_pod_joins() {
    let api = api_for_three_leases().await;
    let dir = test_dir("several-leases-few");
    let timing = Timing::FAST;
    let mut pods = vec![
        Sidecar::spawn_with(&api, &dir, "a", timing, &MORE),
        Sidecar::spawn_with(&api, &dir, "b", timing, &MORE),
    ];
    // Every Lease gets a leader, and each pod one or two: the first pod
    // may take all three, then hands one over to the pod holding none.
    let held = wait_until(
        &api,
        timing.lease * 8,
        "every Lease held by both pods",
        |h| {
            let mut pods: Vec<&String> = h.values().flatten().collect();
            pods.sort();
            pods.dedup();
            h.values().all(Option::is_some) && pods.len() == 2
        },
    )
    .await;
    // And it stays so at rest.
    tokio::time::sleep(timing.lease).await;
    assert_eq!(holders(&api), held, "the spread moved at rest");
    // A third pod joins: the pod holding two hands one over to it.
    pods.push(Sidecar::spawn_with(&api, &dir, "c", timing, &MORE));
    let after = wait_until(&api, timing.lease * 8, "three distinct holders", spread_out).await;
    let moved: Vec<_> = LEASES
        .iter()
        .filter(|lease| after[*lease] != held[*lease])
        .collect();
    assert_eq!(moved.len(), 1, "one Lease moved: {held:?} -> {after:?}");
    assert_eq!(after[moved[0]].as_deref(), Some("c"));
    for pod in &mut pods {
        pod.signal(libc::SIGTERM);
        assert!(
            pod.wait_exit(Duration::from_secs(10))
                .await
                .is_some_and(|s| s.success())
        );
    }
    // A graceful exit releases every Lease it held.
    let released = holders(&api);
    assert!(released.values().all(Option::is_none), "{released:?}");
}
