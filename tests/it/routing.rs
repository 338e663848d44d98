//! Leader routing through an EndpointSlice (`--route-service`): real sidecars
//! against the fake API server, with the slice and the Role that
//! `manifests/deployment-routing.yaml` ships. Make before break: through a
//! SIGTERM, a hand-over request or a step-down asked by the collector's
//! pre-stop hook (`leader-gate prestop`) the slice is never empty — the old
//! leader stays listed, marked terminating (still serving), until the new
//! leader's one write replaces it — and the release does not wait for the
//! route; the hook returns only after the new leader is listed, plus its
//! drain.
//! After a SIGKILL, a 403 or a Lease edit the leader that lost the Lease never
//! writes again and stays listed as it was until the next leader writes, and
//! no version after that write lists it. A missing grant is logged once and
//! costs no leadership. The slice is judged twice: every version the fake
//! stored (exact), and what a reader sampling it every few milliseconds saw.

use crate::support;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use serde_json::Value;
use support::events::EventClient;
use support::fake_apiserver::{Conditions, FakeApiServer, Resource, Role, Verb};
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

/// The pods a version of the slice lists, with their conditions.
fn entries(slice: &Value) -> Vec<(String, Conditions)> {
    let endpoints = slice["endpoints"].as_array().cloned().unwrap_or_default();
    listed(slice)
        .into_iter()
        .zip(endpoints.iter().map(Conditions::of))
        .collect()
}

/// `pod` alone, with `conditions`.
fn only(pod: &str, conditions: Conditions) -> Vec<(String, Conditions)> {
    vec![(pod.to_string(), conditions)]
}

/// What a reader saw at an instant: the slice's entries (`None`: no slice).
type Sample = (Instant, Option<Vec<(String, Conditions)>>);

/// Reads the slice every few milliseconds, as a client of the API would,
/// until stopped: what it saw and when (`None`: no slice).
struct Sampler {
    stop: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<Vec<Sample>>,
}

impl Sampler {
    fn start(api: &FakeApiServer) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let api = api.clone();
        let stopped = stop.clone();
        let task = tokio::spawn(async move {
            let mut seen = Vec::new();
            while !stopped.load(Ordering::Relaxed) {
                seen.push((
                    Instant::now(),
                    api.endpoint_slice(SLICE).map(|s| entries(&s)),
                ));
                tokio::time::sleep(Duration::from_millis(3)).await;
            }
            seen
        });
        Self { stop, task }
    }

    async fn finish(self) -> Vec<Sample> {
        self.stop.store(true, Ordering::Relaxed);
        self.task.await.expect("the sampler")
    }
}

/// When `holder`'s acquisition (its first Lease write naming itself) after
/// `after` arrived.
fn acquisition_of(api: &FakeApiServer, holder: &str, after: Instant) -> Instant {
    holders(api)
        .into_iter()
        .find(|(at, h)| *at > after && h.as_deref() == Some(holder))
        .unwrap_or_else(|| panic!("no acquisition by {holder}"))
        .0
}

/// A graceful hand-over from `old` to `new`, begun at `from`, made before it
/// broke: every version stored from `from` until the one naming `new` lists
/// one pod; `old` was marked terminating (still serving) in the version
/// right before; the version naming `new` lists it alone, ready (one write
/// replaced the list); and every sample up to then saw `old` (ready or
/// terminating) or `new`, never an empty or missing slice. Returns when
/// `new` was named.
fn assert_made_before_broken(
    api: &FakeApiServer,
    samples: &[Sample],
    old: &str,
    new: &str,
    from: Instant,
) -> Instant {
    let versions: Vec<(Instant, Vec<(String, Conditions)>)> = api
        .endpoint_slice_history()
        .into_iter()
        .filter(|(at, _)| *at > from)
        .map(|(at, v)| (at, entries(&v)))
        .collect();
    let named = versions
        .iter()
        .position(|(_, e)| e.iter().any(|(pod, _)| pod == new))
        .unwrap_or_else(|| panic!("no version names {new}: {versions:?}"));
    let (named_at, naming) = &versions[named];
    assert_eq!(
        *naming,
        only(new, Conditions::READY),
        "the new leader's write replaces the whole list"
    );
    for (_, version) in &versions[..named] {
        assert!(
            !version.is_empty(),
            "the slice was empty during a graceful hand-over: {versions:?}"
        );
    }
    assert!(
        named > 0,
        "{old} was never marked terminating: {versions:?}"
    );
    assert_eq!(
        versions[named - 1].1,
        only(old, Conditions::TERMINATING),
        "the version the new leader replaced"
    );
    let before_named: Vec<_> = samples.iter().filter(|(at, _)| at < named_at).collect();
    assert!(
        before_named.len() > 10,
        "too few samples: {}",
        before_named.len()
    );
    for (at, seen) in before_named {
        let fine = seen.as_ref().is_some_and(|e| {
            *e == only(old, Conditions::READY)
                || *e == only(old, Conditions::TERMINATING)
                || *e == only(new, Conditions::READY)
        });
        assert!(
            fine,
            "{:?} into the hand-over a reader saw {seen:?}",
            at.duration_since(from)
        );
    }
    *named_at
}

/// Once a pod other than `lost` was written into the slice after `after`, no
/// version (stored or sampled) lists `lost` again.
fn assert_never_listed_after_the_next_write(
    api: &FakeApiServer,
    samples: &[Sample],
    lost: &str,
    after: Instant,
) {
    let versions: Vec<(Instant, Vec<String>)> = api
        .endpoint_slice_history()
        .into_iter()
        .filter(|(at, _)| *at > after)
        .map(|(at, v)| (at, listed(&v)))
        .collect();
    let Some(replaced) = versions
        .iter()
        .find(|(_, pods)| pods.iter().any(|p| p != lost))
        .map(|(at, _)| *at)
    else {
        return; // nobody else wrote
    };
    for (at, pods) in versions.iter().filter(|(at, _)| *at >= replaced) {
        assert!(
            !pods.iter().any(|p| p == lost),
            "{lost} listed again {:?} after the next leader's write",
            at.duration_since(replaced)
        );
    }
    for (at, seen) in samples.iter().filter(|(at, _)| *at > replaced) {
        let pods: Vec<&String> = seen.iter().flatten().map(|(p, _)| p).collect();
        assert!(
            !pods.iter().any(|p| *p == lost),
            "a reader saw {lost} {:?} after the next leader's write",
            at.duration_since(replaced)
        );
    }
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

/// Every version of the slice that lists a pod ready was stored while that
/// pod held the Lease (the last Lease write before it names that pod); one
/// that lists a pod marked terminating, after that pod had held it (a
/// graceful step-down's mark may land after the release, even after the
/// next acquisition, until the next leader's slice write replaces it); and
/// no version lists two.
fn assert_slice_named_only_holders(api: &FakeApiServer) {
    let holders = holders(api);
    for (at, version) in api.endpoint_slice_history() {
        let pods = entries(&version);
        assert!(pods.len() <= 1, "the slice listed {pods:?}");
        let Some((pod, conditions)) = pods.first() else {
            continue;
        };
        let before = || holders.iter().filter(|(written, _)| *written < at);
        if *conditions == Conditions::TERMINATING {
            assert!(
                before().any(|(_, holder)| holder.as_deref() == Some(pod.as_str())),
                "the slice marked {pod} terminating before it ever held the Lease"
            );
            continue;
        }
        let holder = before().next_back().and_then(|(_, holder)| holder.clone());
        assert_eq!(
            holder.as_deref(),
            Some(pod.as_str()),
            "the slice named {pod} while the Lease was held by {holder:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn through_sigterm_the_old_leader_stays_listed_until_the_new_one_replaces_it_and_sigkill_leaves_it_until_the_next_write()
 {
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
    // The shipped slice keeps its labels and ports; only endpoints change.
    let slice = api.endpoint_slice(SLICE).unwrap();
    assert_eq!(slice["ports"], shipped("EndpointSlice")["ports"]);
    assert_eq!(
        slice["metadata"]["labels"]["kubernetes.io/service-name"],
        SERVICE
    );
    assert_eq!(slice["endpoints"][0]["addresses"][0], pod_ip(first));
    assert_eq!(entries(&slice), only(&first_name, Conditions::READY));

    // SIGTERM: still listed, marked terminating, until the next leader's
    // write replaces it.
    let mut leader = sidecars.remove(first);
    // A gate of the pod that acknowledges at once: with the route holding
    // no release, the release goes out then, not after the gate lag.
    let mut sub = EventClient::connect_as_gate(leader.gate, "sub").await;
    let sampler = Sampler::start(&api);
    let signalled = Instant::now();
    leader.signal(libc::SIGTERM);
    let term = sub.stopped_term(Duration::from_secs(5)).await;
    assert_eq!(leader.acknowledge("sub", &term).await, 204);
    assert!(leader.wait_exit(Duration::from_secs(20)).await.is_some());
    let second = wait_any_leader(&sidecars.iter().collect::<Vec<_>>(), within).await;
    let second_name = sidecars[second].name.clone();
    wait_listed(&api, &second_name, Duration::from_secs(5)).await;
    let samples = sampler.finish().await;
    let named = assert_made_before_broken(&api, &samples, &first_name, &second_name, signalled);
    let acquired = acquisition_of(&api, &second_name, signalled);
    println!(
        "MEASURE the slice named the new leader {:?} after its acquisition arrived",
        named.duration_since(acquired)
    );
    assert!(
        named.duration_since(acquired) < Duration::from_secs(1),
        "named {:?} after the acquisition",
        named.duration_since(acquired)
    );
    let released = release_of(&api, &first_name, signalled).expect("the release");
    // The gate lag is 80 % of the 1 s margin here: the route does not make
    // the release wait for it, the acknowledging gate ends it.
    assert!(
        released.duration_since(signalled) < Duration::from_millis(800),
        "released {:?} after SIGTERM: the route held it to the gate lag",
        released.duration_since(signalled)
    );

    // SIGKILL: it cannot mark itself; it stays listed, ready, until the next
    // leader's write replaces it, and is never listed after that.
    let mut killed = sidecars.remove(second);
    let sampler = Sampler::start(&api);
    let kill_at = Instant::now();
    killed.signal(libc::SIGKILL);
    assert!(killed.wait_exit(Duration::from_secs(5)).await.is_some());
    let third_name = sidecars[0].name.clone();
    sidecars[0].wait_leading(within).await;
    wait_listed(&api, &third_name, Duration::from_secs(5)).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    let samples = sampler.finish().await;
    let versions: Vec<_> = api
        .endpoint_slice_history()
        .into_iter()
        .filter(|(at, _)| *at > kill_at)
        .map(|(_, v)| entries(&v))
        .collect();
    assert_eq!(
        versions.first(),
        Some(&only(&third_name, Conditions::READY)),
        "the next leader's write is the first after the kill: {versions:?}"
    );
    assert!(
        samples
            .iter()
            .all(|(_, seen)| seen.as_ref().is_some_and(|e| e.len() == 1)),
        "the slice always listed one pod"
    );
    assert_never_listed_after_the_next_write(&api, &samples, &second_name, kill_at);
    assert_slice_named_only_holders(&api);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_that_lost_the_lease_to_an_edit_never_writes_the_slice_again_and_the_next_hand_over_keeps_it_full()
 {
    let api = api_with_shipped_objects().await;
    let dir = test_dir("routing-lost");
    let mut sidecars: Vec<Sidecar> = (0..2).map(|n| spawn(&api, &dir, n)).collect();
    for s in &sidecars {
        s.wait_serving().await;
    }
    let within = Timing::FAST.lease * 4;
    let all: Vec<&Sidecar> = sidecars.iter().collect();
    let first = wait_any_leader(&all, within).await;
    let a = sidecars[first].name.clone();
    wait_listed(&api, &a, Duration::from_secs(5)).await;
    // An operator writes another holder into the Lease: `a` loses it
    // abruptly (no release of its own) and must leave the slice alone.
    let sampler = Sampler::start(&api);
    api.update_lease(LEASE, |lease| {
        lease["spec"]["holderIdentity"] = "operator".into();
    });
    sidecars[first]
        .wait_for(Duration::from_secs(5), |p| !p.leading())
        .await;
    let lost_at = Instant::now();
    tokio::time::sleep(Timing::FAST.retry * 2).await;
    let writes_after = api
        .requests_of(&a, Verb::Update)
        .into_iter()
        .filter(|r| r.resource == Some(Resource::EndpointSlices) && r.at > lost_at)
        .count();
    assert_eq!(
        writes_after, 0,
        "the slice was written after the term was lost"
    );
    // Documented: it stays listed as it was (ready, not marked) until the
    // next leader writes. Once the operator's record expires, one of the two
    // leads in a new term and does.
    assert_eq!(
        entries(&api.endpoint_slice(SLICE).unwrap()),
        only(&a, Conditions::READY)
    );
    let next = wait_any_leader(&all, within).await;
    let next_name = sidecars[next].name.clone();
    wait_listed(&api, &next_name, Duration::from_secs(5)).await;
    let samples = sampler.finish().await;
    if next_name != a {
        assert_never_listed_after_the_next_write(&api, &samples, &a, lost_at);
    }
    assert!(
        samples
            .iter()
            .all(|(_, seen)| seen.as_ref().is_some_and(|e| e.len() == 1)),
        "the slice always listed one pod"
    );

    // Its next graceful hand-over (SIGTERM) is made before it breaks.
    let other = sidecars[1 - next].name.clone();
    let mut leader = sidecars.remove(next);
    let sampler = Sampler::start(&api);
    let signalled = Instant::now();
    leader.signal(libc::SIGTERM);
    assert!(leader.wait_exit(Duration::from_secs(20)).await.is_some());
    sidecars[0].wait_leading(within).await;
    wait_listed(&api, &other, Duration::from_secs(5)).await;
    let samples = sampler.finish().await;
    assert_made_before_broken(&api, &samples, &next_name, &other, signalled);
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
async fn through_a_handover_request_the_slice_is_never_empty_and_a_leader_denied_its_renew_never_writes_it_again()
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

    // A hand-over request: marked terminating, then replaced, as on SIGTERM.
    let second = 1 - first;
    let second_name = sidecars[second].name.clone();
    let sampler = Sampler::start(&api);
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
    let samples = sampler.finish().await;
    let named = assert_made_before_broken(&api, &samples, &first_name, &second_name, asked);
    let acquired = acquisition_of(&api, &second_name, asked);
    assert!(
        named.duration_since(acquired) < Duration::from_secs(1),
        "named {:?} after the acquisition",
        named.duration_since(acquired)
    );

    // Its renew denied (403): it loses the Lease abruptly and never writes
    // the slice again in that term; it stays listed, ready, until the next
    // leader writes (documented), and is not listed after that write.
    let granted = api.role();
    let mut denied = granted.clone();
    for rule in &mut denied.rules {
        if rule.resources.iter().any(|r| r == "leases") {
            rule.verbs.retain(|v| v != "update");
        }
    }
    let sampler = Sampler::start(&api);
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
        entries(&api.endpoint_slice(SLICE).unwrap()),
        only(&second_name, Conditions::READY)
    );
    api.set_role(granted);
    let next = wait_any_leader(&all, within).await;
    wait_listed(&api, &sidecars[next].name, Duration::from_secs(5)).await;
    let samples = sampler.finish().await;
    if sidecars[next].name != second_name {
        assert_never_listed_after_the_next_write(&api, &samples, &second_name, lost_at);
    }
    assert_slice_named_only_holders(&api);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_step_down_from_the_prestop_hook_keeps_the_slice_full_and_returns_once_the_peer_is_listed()
 {
    let api = api_with_shipped_objects().await;
    let dir = test_dir("routing-prestop");
    // The example's timing: no gate lag (the route is the switch).
    let sidecars: Vec<Sidecar> = (0..2)
        .map(|n| {
            let ip = pod_ip(n);
            Sidecar::spawn_with(
                &api,
                &dir,
                &format!("statsd-{n}"),
                Timing::FAST,
                &["--route-service", SERVICE, "--pod-ip", &ip, "--gate-lag=0s"],
            )
        })
        .collect();
    for s in &sidecars {
        s.wait_serving().await;
    }
    let all: Vec<&Sidecar> = sidecars.iter().collect();
    let within = Timing::FAST.lease * 4;
    let old = wait_any_leader(&all, within).await;
    let old_name = sidecars[old].name.clone();
    let new_name = sidecars[1 - old].name.clone();
    wait_listed(&api, &old_name, Duration::from_secs(5)).await;

    // The collector's preStop hook, as the manifest writes it.
    let sampler = Sampler::start(&api);
    let asked = Instant::now();
    let mut hook = support::gate_clients::GateClient::spawn(
        &dir,
        "prestop",
        &[
            "prestop",
            "--url",
            &format!("http://{}", sidecars[old].gate),
            "--lease",
            LEASE,
            "--timeout=5s",
            "--drain=1s",
        ],
        &[],
    );
    let (status, returned) = hook
        .wait_exit(Duration::from_secs(10))
        .await
        .expect("prestop returns within its bound");
    assert_eq!(status.code(), Some(0), "{}", hook.stderr());
    let samples = sampler.finish().await;
    let named = assert_made_before_broken(&api, &samples, &old_name, &new_name, asked);
    assert!(
        returned.duration_since(named) >= Duration::from_millis(950),
        "the collector is stopped only after the new leader is listed and the drain passed: {:?}",
        returned.duration_since(named)
    );
    let mut sidecars = sidecars;
    assert!(
        sidecars[old].exited().is_none(),
        "no SIGTERM was sent to the old sidecar"
    );
    assert_eq!(
        entries(&api.endpoint_slice(SLICE).unwrap()),
        only(&new_name, Conditions::READY)
    );
    assert_slice_named_only_holders(&api);
    println!(
        "MEASURE routing prestop: the new leader listed {:.3}s after the hook's request; the hook returned {:.3}s after it",
        named.duration_since(asked).as_secs_f64(),
        returned.duration_since(asked).as_secs_f64()
    );
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
