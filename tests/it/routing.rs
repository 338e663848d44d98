//! Leader routing through an EndpointSlice (`--route-service`): real sidecars
//! against the fake API server, with the slice and the Role that
//! `manifests/deployment-routing.yaml` ships. The slice follows leadership
//! through SIGTERM and SIGKILL and never names a pod that does not hold the
//! Lease; a leader that lost the Lease never writes it again; a missing grant
//! is logged once and costs no leadership.

use crate::support;

use std::time::{Duration, Instant};

use serde_json::Value;
use support::events::EventClient;
use support::fake_apiserver::{FakeApiServer, Resource, Role, Verb};
use support::sidecar::{Sidecar, Timing, test_dir};

const MANIFEST: &str = include_str!("../../manifests/deployment-routing.yaml");
const NAMESPACE: &str = "monitoring";
const LEASE: &str = "statsd-exporter-leader";
const SERVICE: &str = "statsd-exporter";
const SLICE: &str = "statsd-exporter-leader";

/// The first document of `kind` in the shipped manifest.
fn shipped(kind: &str) -> Value {
    let documents: Vec<Value> =
        serde_saphyr::from_multiple(MANIFEST).expect("deployment-routing.yaml is YAML");
    documents
        .into_iter()
        .find(|d| d["kind"] == kind)
        .unwrap_or_else(|| panic!("no {kind} in deployment-routing.yaml"))
}

/// A fake API server with the shipped slice and the shipped Role.
async fn api_with_shipped_objects() -> FakeApiServer {
    let api = FakeApiServer::start(NAMESPACE, LEASE).await;
    api.set_role(Role::from_manifest(MANIFEST).expect("the manifest's Role"));
    api.create_endpoint_slice(shipped("EndpointSlice"));
    api
}

fn pod_ip(n: usize) -> String {
    format!("10.244.0.{}", n + 10)
}

fn spawn(api: &FakeApiServer, dir: &std::path::Path, n: usize) -> Sidecar {
    let name = format!("statsd-{n}");
    let ip = pod_ip(n);
    Sidecar::spawn_with(
        api,
        dir,
        &name,
        Timing::FAST,
        &["--route-service", SERVICE, "--pod-ip", &ip],
    )
}

/// The pods a version of the slice lists, by their Pod reference.
fn listed(slice: &Value) -> Vec<String> {
    slice["endpoints"]
        .as_array()
        .map(|endpoints| {
            endpoints
                .iter()
                .map(|e| e["targetRef"]["name"].as_str().unwrap_or("?").to_string())
                .collect()
        })
        .unwrap_or_default()
}

/// Waits until the slice lists exactly `pod`.
async fn wait_listed(api: &FakeApiServer, pod: &str, within: Duration) {
    let deadline = Instant::now() + within;
    loop {
        let now = api.endpoint_slice(SLICE).map(|s| listed(&s));
        if now.as_deref() == Some(&[pod.to_string()][..]) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "the slice does not list {pod}: {now:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Waits until one of `sidecars` leads: its index.
async fn wait_any_leader(sidecars: &[&Sidecar], within: Duration) -> usize {
    let deadline = Instant::now() + within;
    loop {
        for (i, s) in sidecars.iter().enumerate() {
            if s.leader().await.is_some_and(|p| p.leading()) {
                return i;
            }
        }
        assert!(Instant::now() < deadline, "nobody led");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The holder of record over time: every successful Lease write, in order
/// of arrival, with the holder it wrote (`None` for a release).
fn holders(api: &FakeApiServer) -> Vec<(Instant, Option<String>)> {
    api.requests()
        .into_iter()
        .filter(|r| r.resource == Some(Resource::Leases))
        .filter(|r| matches!(r.verb, Verb::Create | Verb::Update))
        .filter(|r| matches!(r.status, Some(200 | 201)))
        .map(|r| (r.at, r.holder))
        .collect()
}

/// Every version of the slice that lists a pod was stored while that pod
/// held the Lease (the last Lease write before it names that pod), and no
/// version lists two.
fn assert_slice_named_only_holders(api: &FakeApiServer) {
    let holders = holders(api);
    for (at, version) in api.endpoint_slice_history() {
        let pods = listed(&version);
        assert!(pods.len() <= 1, "the slice listed {pods:?}");
        let Some(pod) = pods.first() else { continue };
        let holder = holders
            .iter()
            .rev()
            .find(|(written, _)| *written < at)
            .and_then(|(_, holder)| holder.clone());
        assert_eq!(
            holder.as_deref(),
            Some(pod.as_str()),
            "the slice named {pod} while the Lease was held by {holder:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_slice_follows_leadership_through_sigterm_and_sigkill_and_names_only_the_holder() {
    let api = api_with_shipped_objects().await;
    let dir = test_dir("routing-follows");
    let mut sidecars: Vec<Sidecar> = (0..3).map(|n| spawn(&api, &dir, n)).collect();
    for s in &sidecars {
        s.wait_serving().await;
    }
    let within = Timing::FAST.lease * 4;
    let first = wait_any_leader(&sidecars.iter().collect::<Vec<_>>(), within).await;
    let first_name = sidecars[first].name.clone();
    wait_listed(&api, &first_name, Duration::from_secs(5)).await;
    // How long after its acquisition the slice named the new leader.
    let acquired = holders(&api)
        .into_iter()
        .find(|(_, h)| h.as_deref() == Some(first_name.as_str()))
        .expect("the leader's acquisition")
        .0;
    let named = api
        .endpoint_slice_history()
        .into_iter()
        .find(|(_, v)| listed(v) == [first_name.clone()])
        .expect("the version naming the leader")
        .0;
    println!(
        "MEASURE the slice named the new leader {:?} after its acquisition arrived",
        named.duration_since(acquired)
    );
    // The shipped slice keeps its labels and ports; only endpoints change.
    let slice = api.endpoint_slice(SLICE).unwrap();
    assert_eq!(slice["ports"], shipped("EndpointSlice")["ports"]);
    assert_eq!(
        slice["metadata"]["labels"]["kubernetes.io/service-name"],
        SERVICE
    );
    assert_eq!(slice["endpoints"][0]["addresses"][0], pod_ip(first));
    assert_eq!(slice["endpoints"][0]["conditions"]["ready"], true);

    // SIGTERM: out of the slice before the release, then the next leader in.
    let mut leader = sidecars.remove(first);
    // A gate of the pod that acknowledges at once does not shorten the wait.
    let mut sub = EventClient::connect_as_gate(leader.gate, "sub").await;
    let signalled = Instant::now();
    leader.signal(libc::SIGTERM);
    let term = sub.stopped_term(Duration::from_secs(5)).await;
    assert_eq!(leader.acknowledge("sub", &term).await, 204);
    assert!(leader.wait_exit(Duration::from_secs(20)).await.is_some());
    let released = api
        .requests_of(&first_name, Verb::Update)
        .into_iter()
        .filter(|r| r.resource == Some(Resource::Leases) && r.holder.is_none())
        .find(|r| r.status == Some(200))
        .expect("the release")
        .at;
    let removed = api
        .endpoint_slice_history()
        .into_iter()
        .find(|(at, v)| *at > named && listed(v).is_empty())
        .expect("a version without the stepped-down leader")
        .0;
    assert!(
        removed < released,
        "the slice still named {first_name} when it released the Lease"
    );
    // The slice is written at once, but kube-proxy on every node applies it
    // later: the release still waits the whole gate lag (80 % of the 1 s
    // margin here), not just for the write or the other gate's word.
    assert!(
        released.duration_since(signalled) >= Duration::from_millis(800),
        "released {:?} after SIGTERM, before the gate lag; the slice changed {:?} after it",
        released.duration_since(signalled),
        removed.duration_since(signalled)
    );
    let second = wait_any_leader(&sidecars.iter().collect::<Vec<_>>(), within).await;
    let second_name = sidecars[second].name.clone();
    wait_listed(&api, &second_name, Duration::from_secs(5)).await;

    // SIGKILL: it cannot take itself out; the next leader's write replaces it.
    let mut killed = sidecars.remove(second);
    killed.signal(libc::SIGKILL);
    assert!(killed.wait_exit(Duration::from_secs(5)).await.is_some());
    let third_name = sidecars[0].name.clone();
    sidecars[0].wait_leading(within).await;
    wait_listed(&api, &third_name, Duration::from_secs(5)).await;

    assert_slice_named_only_holders(&api);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_that_lost_the_lease_never_writes_the_slice_again() {
    let api = api_with_shipped_objects().await;
    let dir = test_dir("routing-lost");
    let a = spawn(&api, &dir, 0);
    a.wait_serving().await;
    a.wait_leading(Timing::FAST.lease * 3).await;
    wait_listed(&api, &a.name, Duration::from_secs(5)).await;
    // An operator writes another holder into the Lease: `a` loses it
    // abruptly (no release of its own) and must leave the slice alone.
    api.update_lease(LEASE, |lease| {
        lease["spec"]["holderIdentity"] = "operator".into();
    });
    a.wait_for(Duration::from_secs(5), |p| !p.leading()).await;
    let lost_at = Instant::now();
    tokio::time::sleep(Timing::FAST.retry * 2).await;
    let writes_after = api
        .requests_of(&a.name, Verb::Update)
        .into_iter()
        .filter(|r| r.resource == Some(Resource::EndpointSlices) && r.at > lost_at)
        .count();
    assert_eq!(
        writes_after, 0,
        "the slice was written after the term was lost"
    );
    // Documented: it stays listed until the next leader writes. Once the
    // operator's record expires, `a` leads again in a new term and does.
    a.wait_leading(Timing::FAST.lease * 4).await;
    wait_listed(&api, &a.name, Duration::from_secs(5)).await;
    assert_slice_named_only_holders(&api);
}

/// The release `name` wrote (the first update clearing the holder), after `after`.
fn release_of(api: &FakeApiServer, name: &str, after: Instant) -> Option<Instant> {
    api.requests_of(name, Verb::Update)
        .into_iter()
        .filter(|r| r.resource == Some(Resource::Leases) && r.holder.is_none())
        .find(|r| r.status == Some(200) && r.at > after)
        .map(|r| r.at)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_slice_follows_a_handover_request_and_a_leader_denied_its_renew_never_writes_it_again()
{
    let api = api_with_shipped_objects().await;
    let dir = test_dir("routing-handover-403");
    let sidecars: Vec<Sidecar> = (0..2).map(|n| spawn(&api, &dir, n)).collect();
    for s in &sidecars {
        s.wait_serving().await;
    }
    let all: Vec<&Sidecar> = sidecars.iter().collect();
    let within = Timing::FAST.lease * 4;
    let first = wait_any_leader(&all, within).await;
    let first_name = sidecars[first].name.clone();
    wait_listed(&api, &first_name, Duration::from_secs(5)).await;

    // A hand-over request: out of the slice before the release, as on SIGTERM.
    let second = 1 - first;
    let second_name = sidecars[second].name.clone();
    let asked = Instant::now();
    let kubeconfig = api.write_kubeconfig("operator", &dir);
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_leader-gate"))
        .args([
            "handover",
            "--lease-name",
            LEASE,
            "--lease-namespace",
            NAMESPACE,
        ])
        .args(["--to", &second_name])
        .env("KUBECONFIG", kubeconfig)
        .output()
        .expect("run leader-gate handover");
    assert!(output.status.success(), "{output:?}");
    sidecars[second].wait_leading(within).await;
    wait_listed(&api, &second_name, Duration::from_secs(5)).await;
    let released = release_of(&api, &first_name, asked).expect("the hand-over's release");
    let removed = api
        .endpoint_slice_history()
        .into_iter()
        .find(|(at, v)| *at > asked && listed(v).is_empty())
        .expect("a version without the leader that handed over")
        .0;
    assert!(
        removed < released,
        "the slice still named {first_name} when it released the Lease"
    );

    // Its renew denied (403): it loses the Lease abruptly and never writes
    // the slice again in that term; it stays listed until the next leader
    // writes (documented).
    let granted = api.role();
    let mut denied = granted.clone();
    for rule in &mut denied.rules {
        if rule.resources.iter().any(|r| r == "leases") {
            rule.verbs.retain(|v| v != "update");
        }
    }
    api.set_role(denied);
    sidecars[second].wait_for(within, |p| !p.leading()).await;
    let lost_at = Instant::now();
    tokio::time::sleep(Timing::FAST.retry * 3).await;
    let writes_after: Vec<_> = api
        .requests_of(&second_name, Verb::Update)
        .into_iter()
        .filter(|r| r.resource == Some(Resource::EndpointSlices) && r.at > lost_at)
        .collect();
    assert!(
        writes_after.is_empty(),
        "the slice was written after a 403 ended the term: {writes_after:?}"
    );
    assert_eq!(
        listed(&api.endpoint_slice(SLICE).unwrap()),
        std::slice::from_ref(&second_name)
    );
    api.set_role(granted);
    let next = wait_any_leader(&all, within).await;
    wait_listed(&api, &sidecars[next].name, Duration::from_secs(5)).await;
    assert_slice_named_only_holders(&api);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_grant_on_the_slice_is_logged_once_and_costs_no_leadership() {
    let api = FakeApiServer::start(NAMESPACE, LEASE).await;
    let role = Role::from_manifest(MANIFEST)
        .expect("the manifest's Role")
        .without("discovery.k8s.io", "endpointslices", "get")
        .without("discovery.k8s.io", "endpointslices", "update");
    api.set_role(role);
    api.create_endpoint_slice(shipped("EndpointSlice"));
    let dir = test_dir("routing-forbidden");
    let a = spawn(&api, &dir, 0);
    a.wait_serving().await;
    a.wait_leading(Timing::FAST.lease * 3).await;
    // Several attempts (backoff from the retry period), one line.
    let deadline = Instant::now() + Duration::from_secs(10);
    while api
        .requests_of(&a.name, Verb::Get)
        .iter()
        .filter(|r| r.resource == Some(Resource::EndpointSlices))
        .count()
        < 3
    {
        assert!(
            Instant::now() < deadline,
            "no retries of the slice\n{}",
            a.log()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let log = a.log();
    let lines: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("routing: cannot read or update the EndpointSlice"))
        .collect();
    assert_eq!(lines.len(), 1, "one line per episode:\n{log}");
    for words in [
        "may not get endpointslices.discovery.k8s.io in namespace monitoring",
        "named statsd-exporter-leader",
    ] {
        assert!(lines[0].contains(words), "{words:?} missing: {}", lines[0]);
    }
    assert!(a.leader().await.unwrap().leading(), "still the leader");
    // With backoff (doubling from the retry period), not at every renew.
    let gets = |from: Instant| {
        api.requests_of(&a.name, Verb::Get)
            .iter()
            .filter(|r| r.resource == Some(Resource::EndpointSlices) && r.at >= from)
            .count()
    };
    let from = Instant::now();
    tokio::time::sleep(Timing::FAST.retry * 8).await;
    let retries = gets(from);
    assert!(retries <= 4, "{retries} reads in 8 retry periods");
    assert_eq!(
        listed(&api.endpoint_slice(SLICE).unwrap()),
        Vec::<String>::new(),
        "nothing was written"
    );
}

/// The published state changes at every renew; the slice is not read at
/// every renew for that (which would double the leader's requests), only
/// again after about a lease duration.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_reads_the_slice_about_once_a_lease_duration_not_at_every_renew() {
    let api = api_with_shipped_objects().await;
    let dir = test_dir("routing-reads");
    let a = spawn(&api, &dir, 0);
    a.wait_serving().await;
    a.wait_leading(Timing::FAST.lease * 3).await;
    wait_listed(&api, &a.name, Duration::from_secs(5)).await;
    let from = Instant::now();
    let window = Timing::FAST.lease * 2;
    tokio::time::sleep(window).await;
    let count = |verb| {
        api.requests_of(&a.name, verb)
            .into_iter()
            .filter(|r| r.at > from)
            .filter(|r| r.status == Some(200))
            .count()
    };
    let reads = api
        .requests_of(&a.name, Verb::Get)
        .into_iter()
        .filter(|r| r.at > from && r.resource == Some(Resource::EndpointSlices))
        .count();
    let renews = count(Verb::Update);
    println!("MEASURE in {window:?}: {reads} slice reads, {renews} successful updates (renews)");
    assert!(renews >= 6, "it renewed: {renews}");
    assert!(reads <= 3, "{reads} slice reads in {window:?}");
}
