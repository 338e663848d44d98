//! The named successor and the operator's hand-over (issue 13), end to end:
//! real `leader-gate` processes against the fake Lease API server, the
//! overlap monitor on every scenario, and the cost of each hand-over counted
//! from the fake's request log.

use crate::support;

use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::Value;
use support::fake_apiserver::{
    FakeApiServer, Fault, FaultKind, PolicyRule, RequestRecord, Resource, Verb, lease_holder,
};
use support::monitor::Monitor;
use support::sidecar::{Sidecar, Timing, test_dir};

const NAMESPACE: &str = "collectors";
const LEASE: &str = "cluster-metrics";
const SUCCESSOR: &str = "leader-gate.dev/successor";
/// Claims within [1 s, 2 s] of seeing a leader with an empty slot.
const CLAIM_WINDOW: &str = "2s";
const TIMING: Timing = Timing::FAST;

fn extra() -> [&'static str; 2] {
    ["--successor-claim-window", CLAIM_WINDOW]
}

fn lease(api: &FakeApiServer) -> Value {
    api.lease(LEASE).expect("the lease exists")
}

fn successor(api: &FakeApiServer) -> Option<String> {
    api.lease(LEASE)?
        .pointer(&format!(
            "/metadata/annotations/{}",
            SUCCESSOR.replace('/', "~1")
        ))
        .and_then(Value::as_str)
        .map(str::to_owned)
}

async fn wait_until<T>(what: &str, timeout: Duration, mut f: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(value) = f() {
            return value;
        }
        assert!(Instant::now() < deadline, "{what}: not within {timeout:?}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// The candidate that answers 200, polled every 10 ms.
async fn wait_leader(sidecars: &[Sidecar], not: &str, timeout: Duration) -> (String, Instant) {
    let deadline = Instant::now() + timeout;
    loop {
        for sidecar in sidecars.iter().filter(|s| s.name != not) {
            if sidecar.leader().await.is_some_and(|p| p.leading()) {
                return (sidecar.name.clone(), Instant::now());
            }
        }
        assert!(Instant::now() < deadline, "nobody led within {timeout:?}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Successful writes and 409s among `requests`.
fn cost(requests: &[RequestRecord]) -> (Vec<&RequestRecord>, usize) {
    let writes = requests
        .iter()
        .filter(|r| matches!(r.verb, Verb::Update | Verb::Create))
        .collect::<Vec<_>>();
    let ok = writes
        .iter()
        .filter(|r| matches!(r.status, Some(200 | 201)))
        .copied()
        .collect();
    let conflicts = writes.iter().filter(|r| r.status == Some(409)).count();
    (ok, conflicts)
}

fn handover(api: &FakeApiServer, dir: &Path, args: &[&str]) -> std::process::Output {
    let kubeconfig = api.write_kubeconfig("operator", dir);
    std::process::Command::new(env!("CARGO_BIN_EXE_leader-gate"))
        .args([
            "handover",
            "--lease-name",
            LEASE,
            "--lease-namespace",
            NAMESPACE,
        ])
        .args(args)
        .env("KUBECONFIG", kubeconfig)
        .output()
        .expect("run leader-gate handover")
}

async fn start(test: &str, names: &[&str]) -> (FakeApiServer, Vec<Sidecar>, Monitor) {
    let api = FakeApiServer::start(NAMESPACE, LEASE).await;
    let dir = test_dir(test);
    let sidecars: Vec<Sidecar> = names
        .iter()
        .map(|name| Sidecar::spawn_with(&api, &dir, name, TIMING, &extra()))
        .collect();
    for sidecar in &sidecars {
        sidecar.wait_serving().await;
    }
    let monitor = Monitor::start(&sidecars.iter().collect::<Vec<_>>());
    (api, sidecars, monitor)
}

/// Waits for a leader and a named successor other than it.
async fn settled(api: &FakeApiServer, sidecars: &[Sidecar]) -> (String, String) {
    let (leader, _) = wait_leader(sidecars, "", TIMING.lease * 3).await;
    let successor = wait_until("a successor is named", TIMING.lease * 2, || {
        let holder = lease_holder(&lease(api));
        successor(api).filter(|s| Some(s) != holder.as_ref())
    })
    .await;
    (leader, successor)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rolling_restart_of_ten_candidates_costs_a_few_writes_per_hand_over() {
    let names: Vec<String> = (0..10).map(|n| format!("node-{n}")).collect();
    let refs: Vec<&str> = names.iter().map(String::as_str).collect();
    let (api, mut sidecars, monitor) = start("successor-rolling", &refs).await;
    let dir = test_dir("successor-rolling");
    let mut restarted = std::collections::HashSet::new();
    let mut hand_overs = Vec::new();
    // One at a time, the leader whenever it was not restarted yet. Whether
    // the leadership moves on to a node not yet restarted depends on who
    // claimed the successor slot (a random draw): once every node was
    // restarted, the leader is restarted again until three hand-overs were
    // measured.
    for round in 0.. {
        if restarted.len() == names.len() && hand_overs.len() >= 3 {
            break;
        }
        assert!(
            round < names.len() + 3,
            "hand-overs measured: {hand_overs:?}"
        );
        let (leader, named) = settled(&api, &sidecars).await;
        let victim = match names.iter().find(|n| !restarted.contains(*n)) {
            Some(next) if restarted.contains(&leader) => next.clone(),
            _ => leader.clone(),
        };
        restarted.insert(victim.clone());
        api.clear_requests();
        let index = sidecars.iter().position(|s| s.name == victim).unwrap();
        let stopped = Instant::now();
        sidecars[index].signal(libc::SIGTERM);
        sidecars[index]
            .wait_exit(Duration::from_secs(10))
            .await
            .expect("exits on SIGTERM");
        let mut new_leader = None;
        if victim == leader {
            let (new, at) = wait_leader(&sidecars, &victim, TIMING.lease * 2).await;
            assert_eq!(new, named, "the successor takes over");
            new_leader = Some((new, at - stopped));
        }
        let fresh = Sidecar::spawn_logged(
            &api,
            &dir,
            &victim,
            &format!("{victim}-{round}.log"),
            TIMING,
            &extra(),
        );
        fresh.wait_serving().await;
        monitor.watch(&fresh);
        sidecars[index] = fresh;
        // Until the slot is named again and a retry period of quiet.
        let (leader_now, _) = settled(&api, &sidecars).await;
        tokio::time::sleep(TIMING.retry).await;
        let requests = api.requests();
        // The leader's renews are not part of the hand-over's cost.
        let (writes, conflicts) = cost(&requests);
        let writes: Vec<_> = writes
            .into_iter()
            .filter(|r| {
                r.client != leader_now
                    || new_leader.as_ref().is_some_and(|(new, took)| {
                        r.client == *new && r.at <= stopped + *took + Duration::from_millis(5)
                    })
            })
            .collect();
        let summary: Vec<_> = writes
            .iter()
            .map(|r| format!("{} {:?} {:?}", r.client, r.verb, r.status))
            .collect();
        eprintln!(
            "round {round}: restarted {victim} (leader {leader}, successor {named}); took over: {new_leader:?}; writes {summary:?}, conflicts {conflicts}"
        );
        assert!(
            writes.len() <= 3,
            "round {round}: {} writes: {summary:?}",
            writes.len()
        );
        assert!(conflicts <= 5, "round {round}: {conflicts} conflicts");
        if let Some((_, took)) = new_leader {
            hand_overs.push(took);
        }
    }
    assert!(
        hand_overs.len() >= 3,
        "hand-overs among the restarts: {hand_overs:?}"
    );
    monitor.assert_no_overlap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_successor_killed_just_before_the_leader_stops_is_covered_by_the_fallback() {
    let (api, mut sidecars, monitor) = start("successor-killed", &["a", "b", "c"]).await;
    let (leader, named) = settled(&api, &sidecars).await;
    let dead = sidecars.iter().position(|s| s.name == named).unwrap();
    sidecars[dead].signal(libc::SIGKILL);
    sidecars[dead].wait_exit(Duration::from_secs(5)).await;
    let stopped = Instant::now();
    let index = sidecars.iter().position(|s| s.name == leader).unwrap();
    sidecars[index].signal(libc::SIGTERM);
    let third = ["a", "b", "c"]
        .into_iter()
        .find(|n| *n != leader && *n != named)
        .unwrap();
    let (new, at) = wait_leader(&sidecars, &leader, TIMING.lease * 2).await;
    assert_eq!(new, third);
    let took = at - stopped;
    eprintln!("successor {named} killed; {third} took over {took:?} after the SIGTERM of {leader}");
    assert!(
        took <= TIMING.lease + TIMING.retry,
        "a new leader within lease duration + retry period: {took:?}"
    );
    // The fallback: a retry period and its spread after the release, not an expiry.
    assert!(took >= TIMING.retry, "{took:?}");
    monitor.assert_no_overlap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_hands_over_to_a_named_pod_closing_the_gates_first() {
    let (api, sidecars, monitor) = start("successor-handover", &["a", "b", "c"]).await;
    let (leader, named) = settled(&api, &sidecars).await;
    // To the candidate that is neither the leader nor the successor.
    let target = ["a", "b", "c"]
        .into_iter()
        .find(|n| *n != leader && *n != named)
        .unwrap();
    let asked = Instant::now();
    let output = handover(&api, &test_dir("successor-handover"), &["--to", target]);
    let took = asked.elapsed();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{output:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert_eq!(
        stdout.trim(),
        format!("{target} holds lease {NAMESPACE}/{LEASE}")
    );
    let (new, _) = wait_leader(&sidecars, &leader, Duration::from_secs(2)).await;
    assert_eq!(new, target);
    eprintln!("operator hand-over {leader} -> {target}: {took:?} including the CLI's start");
    // The old leader's gates closed first, for the right reason.
    let old = sidecars.iter().find(|s| s.name == leader).unwrap();
    let probe = old.leader().await.expect("answers");
    assert!(!probe.leading());
    assert_eq!(probe.body["last_stop_reason"], "handover-requested");
    monitor.assert_no_overlap();
    // The request was answered: the acquisition cleared it.
    let annotations = lease(&api)["metadata"]["annotations"].clone();
    assert!(annotations.get("leader-gate.dev/handover-to").is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hand_over_to_a_pod_it_cannot_check_falls_back_within_the_bound_and_fails_naming_the_holder()
 {
    // The shipped Role grants no pods: `handover` cannot tell that ghost
    // is no pod, asks, and then says the truth.
    let (api, sidecars, monitor) = start("successor-ghost", &["a", "b", "c"]).await;
    let (leader, _) = settled(&api, &sidecars).await;
    let asked = Instant::now();
    let output = handover(&api, &test_dir("successor-ghost"), &["--to", "ghost"]);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{output:?}: {stderr}");
    assert!(output.stdout.is_empty(), "{output:?}");
    let (new, at) = wait_leader(&sidecars, "", TIMING.lease * 2).await;
    let took = at - asked;
    eprintln!("hand-over to ghost: {new} leads {took:?} after the request ({leader} before)");
    assert!(
        took <= TIMING.lease + TIMING.retry,
        "leaderless no longer than an expiry: {took:?}"
    );
    assert!(
        stderr.contains(&format!(
            "ghost did not take over lease {NAMESPACE}/{LEASE}: {new} holds it"
        )),
        "{stderr}"
    );
    // The pod lookup was tried and denied, and said nothing at the default level.
    let looked_up = api.requests_of("operator", Verb::Get);
    assert!(
        looked_up
            .iter()
            .any(|r| r.resource == Some(Resource::Pods) && r.status == Some(403)),
        "{looked_up:?}"
    );
    assert!(!stderr.contains("pod"), "{stderr}");
    monitor.assert_no_overlap();

    // Nobody holds a deleted Lease: the request is refused in one line.
    api.delete_lease(LEASE);
    let output = handover(&api, &test_dir("successor-ghost"), &["--to", "b"]);
    assert_eq!(output.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(stderr.contains("does not exist"), "{stderr}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hand_over_to_a_stopped_pod_never_makes_two_leaders() {
    let (api, sidecars, monitor) = start("successor-stopped", &["a", "b", "c"]).await;
    let (leader, named) = settled(&api, &sidecars).await;
    let stopped = sidecars.iter().find(|s| s.name == named).unwrap();
    stopped.signal(libc::SIGSTOP);
    let asked = Instant::now();
    let output = handover(&api, &test_dir("successor-stopped"), &["--to", &named]);
    let (new, at) = wait_leader(&sidecars, &named, TIMING.lease * 2).await;
    let took = at - asked;
    eprintln!(
        "hand-over to stopped {named}: {new} leads {took:?} after the request (was {leader}); {output:?}"
    );
    // A real candidate that could not take over: not done, and who holds it said.
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{output:?}");
    assert!(
        stderr.contains(&format!(
            "{named} did not take over lease {NAMESPACE}/{LEASE}: {new} holds it"
        )),
        "{stderr}"
    );
    assert!(took <= TIMING.lease + TIMING.retry, "{took:?}");
    // It resumes with a stale view of the release naming it: its write
    // conflicts, it never leads while the fallback winner does.
    stopped.signal(libc::SIGCONT);
    tokio::time::sleep(TIMING.lease * 2).await;
    monitor.assert_no_overlap();
    let holder = lease_holder(&lease(&api));
    assert_eq!(holder.as_deref(), Some(new.as_str()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hand_over_by_a_user_without_list_or_watch_succeeds_by_reading_the_lease() {
    let (api, sidecars, monitor) = start("successor-no-watch", &["a", "b", "c"]).await;
    let (leader, named) = settled(&api, &sidecars).await;
    // The candidates keep their rights; the operator may get and update the
    // Lease, but neither list nor watch it.
    for sidecar in &sidecars {
        api.set_admin(&sidecar.name, true);
    }
    api.set_role(
        api.role()
            .without("coordination.k8s.io", "leases", "list")
            .without("coordination.k8s.io", "leases", "watch"),
    );
    let target = ["a", "b", "c"]
        .into_iter()
        .find(|n| *n != leader && *n != named)
        .unwrap();
    let output = handover(
        &api,
        &test_dir("successor-no-watch"),
        &["--to", target, "--timeout", "10s"],
    );
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{output:?}: {stderr}");
    assert_eq!(
        stdout.trim(),
        format!("{target} holds lease {NAMESPACE}/{LEASE}")
    );
    // The first watch error is said at once, naming what is missing, and
    // the fallback that took its place.
    let said = stderr
        .lines()
        .find(|l| l.contains("cannot watch lease"))
        .unwrap_or_else(|| panic!("{stderr}"));
    assert!(
        said.contains(&format!(
            "may not list leases.coordination.k8s.io in namespace {NAMESPACE}"
        )),
        "{said}"
    );
    assert!(said.contains("reading it every 2s instead"), "{said}");
    assert_eq!(
        stderr.matches("cannot watch").count(),
        1,
        "said once: {stderr}"
    );
    assert_eq!(lease_holder(&lease(&api)).as_deref(), Some(target));
    monitor.assert_no_overlap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hand_over_request_replaced_by_another_says_so() {
    let (api, sidecars, monitor) = start("successor-two-requests", &["a", "b", "c"]).await;
    let (leader, _) = settled(&api, &sidecars).await;
    let mut others = ["a", "b", "c"].into_iter().filter(|n| *n != leader);
    let (first, second) = (others.next().unwrap(), others.next().unwrap());
    let dir = test_dir("successor-two-requests");
    let kubeconfig = api.write_kubeconfig("operator", &dir);
    let one = tokio::process::Command::new(env!("CARGO_BIN_EXE_leader-gate"))
        .args([
            "handover",
            "--lease-name",
            LEASE,
            "--lease-namespace",
            NAMESPACE,
        ])
        .args(["--to", first])
        .env("KUBECONFIG", &kubeconfig)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("run leader-gate handover");
    // Once the first request is in the Lease, a second one replaces it
    // while the leader still waits out its gate lag.
    wait_until("the first request is in the lease", TIMING.lease, || {
        let annotations = lease(&api)["metadata"]["annotations"].clone();
        (annotations["leader-gate.dev/handover-to"] == first).then_some(())
    })
    .await;
    let two = handover(&api, &dir, &["--to", second]);
    let one = one
        .wait_with_output()
        .await
        .expect("the first handover ends");
    let (stdout_one, stdout_two) = (
        String::from_utf8_lossy(&one.stdout),
        String::from_utf8_lossy(&two.stdout),
    );
    assert!(two.status.success(), "{two:?}");
    assert_eq!(
        stdout_two.trim(),
        format!("{second} holds lease {NAMESPACE}/{LEASE}")
    );
    // The first one's target did not take the Lease: not done, and why.
    assert_eq!(one.status.code(), Some(1), "{one:?}");
    assert!(stdout_one.is_empty(), "{one:?}");
    let stderr_one = String::from_utf8_lossy(&one.stderr);
    assert_eq!(
        stderr_one.lines().last().unwrap_or_default(),
        format!(
            "leader-gate handover: {second} holds lease {NAMESPACE}/{LEASE}, not {first} (another hand-over request, to {second}, replaced this one)"
        ),
        "{stderr_one}"
    );
    monitor.assert_no_overlap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hand_over_whose_api_server_does_not_answer_gives_up_within_the_timeout() {
    let (api, sidecars, _monitor) = start("successor-no-answer", &["a", "b"]).await;
    let (leader, _) = wait_leader(&sidecars, "", TIMING.lease * 3).await;
    let target = if leader == "a" { "b" } else { "a" };
    let dir = test_dir("successor-no-answer");
    let kubeconfig = api.write_kubeconfig("operator", &dir);
    api.set_fault("operator", Fault::on(&[Verb::Get], FaultKind::Hang));
    let started = Instant::now();
    let run = tokio::process::Command::new(env!("CARGO_BIN_EXE_leader-gate"))
        .args([
            "handover",
            "--lease-name",
            LEASE,
            "--lease-namespace",
            NAMESPACE,
        ])
        .args(["--to", target, "--timeout", "2s"])
        .env("KUBECONFIG", &kubeconfig)
        .kill_on_drop(true)
        .output();
    let output = tokio::time::timeout(Duration::from_secs(20), run)
        .await
        .expect("bounded by --timeout")
        .expect("run leader-gate handover");
    let took = started.elapsed();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(took < Duration::from_secs(4), "gave up after {took:?}");
    assert!(
        stderr.contains(&format!(
            "no answer from the API server within --timeout 2s (reading lease {NAMESPACE}/{LEASE})"
        )),
        "{stderr}"
    );
    assert_eq!(lease_holder(&lease(&api)).as_deref(), Some(leader.as_str()));
}

/// `get` on pods for every client (the Role is everyone's), as an operator's
/// own Role would grant it.
fn grant_pods(api: &FakeApiServer) {
    let mut role = api.role();
    role.rules
        .push(PolicyRule::new(&[""], &["pods"], &[], &["get"]));
    api.set_role(role);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_to_naming_no_pod_is_refused_without_a_write_where_pods_can_be_read() {
    let (api, sidecars, monitor) = start("successor-refused", &["a", "b", "c"]).await;
    for name in ["a", "b", "c"] {
        api.add_pod(name);
    }
    grant_pods(&api);
    let (leader, named) = settled(&api, &sidecars).await;
    let dir = test_dir("successor-refused");
    let third = ["a", "b", "c"]
        .into_iter()
        .find(|n| *n != leader && *n != named)
        .unwrap();
    let typo = format!("{third}x");
    api.clear_requests();
    let output = handover(&api, &dir, &["--to", &typo]);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(64), "{output:?}: {stderr}");
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(
        stderr.starts_with(&format!(
            "leader-gate handover: invalid --to: no pod {typo} in namespace {NAMESPACE}, where lease {NAMESPACE}/{LEASE} is (a typo, or a pod of another namespace?)"
        )),
        "{stderr}"
    );
    assert!(
        stderr.contains(&format!("nothing was written and {leader} keeps leading")),
        "{stderr}"
    );
    // The fake's log: the operator read the Lease and the pod, and wrote nothing.
    let operator: Vec<_> = api
        .requests()
        .into_iter()
        .filter(|r| r.client == "operator")
        .collect();
    let seen: Vec<_> = operator
        .iter()
        .map(|r| (r.verb, r.resource, r.name.clone(), r.status))
        .collect();
    assert_eq!(
        seen,
        [
            (
                Verb::Get,
                Some(Resource::Leases),
                Some(LEASE.to_owned()),
                Some(200)
            ),
            (
                Verb::Get,
                Some(Resource::Pods),
                Some(typo.clone()),
                Some(404)
            ),
        ],
        "{operator:?}"
    );
    // No step-down: the leader leads on, its term unchanged.
    let old = sidecars.iter().find(|s| s.name == leader).unwrap();
    let probe = old.leader().await.expect("answers");
    assert!(probe.leading(), "{:?}", probe.body);
    assert_eq!(lease_holder(&lease(&api)).as_deref(), Some(leader.as_str()));
    assert!(
        lease(&api)["metadata"]["annotations"]
            .get("leader-gate.dev/handover-to")
            .is_none()
    );

    // The pod that exists: handed over, exit 0.
    let output = handover(&api, &dir, &["--to", third]);
    assert!(
        output.status.success(),
        "{output:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert_eq!(
        String::from_utf8_lossy(&output.stdout).trim(),
        format!("{third} holds lease {NAMESPACE}/{LEASE}")
    );
    monitor.assert_no_overlap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_missing_in_the_contexts_namespace_suggests_the_namespace_flag() {
    // No candidate ever ran: the Lease does not exist in the context's namespace.
    let api = FakeApiServer::start(NAMESPACE, LEASE).await;
    let dir = test_dir("successor-missing-lease");
    let kubeconfig = api.write_kubeconfig("operator", &dir);
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_leader-gate"))
        .args(["handover", "--lease-name", LEASE, "--to", "b"])
        .env("KUBECONFIG", kubeconfig)
        .env_remove("LEADER_GATE_LEASE_NAMESPACE")
        .output()
        .expect("run leader-gate handover");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert_eq!(
        stderr.trim(),
        format!(
            "leader-gate handover: lease {NAMESPACE}/{LEASE} does not exist: nobody to hand over from ({NAMESPACE} is the kubeconfig context's namespace; if the lease is in another, name it with --lease-namespace)"
        )
    );
}

/// `leader-gate.dev/successor-revision`, as the Lease has it now.
fn successor_revision(api: &FakeApiServer) -> Option<String> {
    api.lease(LEASE)?
        .pointer("/metadata/annotations/leader-gate.dev~1successor-revision")
        .and_then(Value::as_str)
        .map(str::to_owned)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rollout_hands_over_once_to_a_pod_of_the_new_revision_with_a_few_writes() {
    // Four pods of revision `rev-a`, replaced one at a time by pods of
    // `rev-b` (a DaemonSet's rolling update, `--revision` from the pod's
    // controller-revision-hash): two followers first, then the leader,
    // then the follower that was named successor.
    const OLD: &str = "rev-a";
    const NEW: &str = "rev-b";
    let test = "successor-rollout";
    let api = FakeApiServer::start(NAMESPACE, LEASE).await;
    let dir = test_dir(test);
    let spawn = |name: &str, revision: &str| {
        let mut args = extra().to_vec();
        args.extend(["--revision", revision]);
        Sidecar::spawn_with(&api, &dir, name, TIMING, &args)
    };
    let mut sidecars: Vec<Sidecar> = (0..4).map(|n| spawn(&format!("old-{n}"), OLD)).collect();
    for sidecar in &sidecars {
        sidecar.wait_serving().await;
    }
    let monitor = Monitor::start(&sidecars.iter().collect::<Vec<_>>());
    let (leader, named) = settled(&api, &sidecars).await;
    let revisions = |api: &FakeApiServer| {
        api.lease(LEASE)
            .and_then(|l| {
                l.pointer("/metadata/annotations/leader-gate.dev~1revisions")
                    .and_then(Value::as_str)
                    .map(str::to_owned)
            })
            .unwrap_or_default()
    };
    assert_eq!(
        revisions(&api),
        OLD,
        "the leader's acquisition listed its revision"
    );
    // The two followers not named first (the slot still names an old pod
    // when the first new one starts), then the leader, then the named one.
    let others: Vec<String> = sidecars
        .iter()
        .map(|s| s.name.clone())
        .filter(|n| *n != leader && *n != named)
        .collect();
    let order = [&others[0], &others[1], &leader, &named];
    api.clear_requests();
    let mut holders = vec![leader.clone()];
    for (n, victim) in order.into_iter().enumerate() {
        let index = sidecars.iter().position(|s| &s.name == victim).unwrap();
        sidecars[index].signal(libc::SIGTERM);
        sidecars[index]
            .wait_exit(Duration::from_secs(10))
            .await
            .expect("exits on SIGTERM");
        if *victim == leader {
            let (new, _) = wait_leader(&sidecars, victim, TIMING.lease * 2).await;
            holders.push(new);
        }
        let fresh = spawn(&format!("new-{n}"), NEW);
        fresh.wait_serving().await;
        let serving = Instant::now();
        monitor.watch(&fresh);
        sidecars[index] = fresh;
        // A rollout replaces the next pod as soon as this one is ready: a
        // new-revision successor is named within half a retry period of
        // its start (the watch's latency on top), not at the claim window.
        wait_until("a successor of the new revision", TIMING.lease * 3, || {
            successor_revision(&api).filter(|r| r == NEW)
        })
        .await;
        if n == 0 {
            assert!(
                serving.elapsed() < TIMING.retry,
                "the first new pod took the slot {:?} after it served",
                serving.elapsed()
            );
        }
        let named = successor(&api).unwrap_or_default();
        assert!(named.starts_with("new-"), "{named} is named with {NEW}");
    }
    tokio::time::sleep(TIMING.retry * 2).await;
    let (now, _) = wait_leader(&sidecars, "", TIMING.lease).await;
    assert_eq!(
        holders,
        [leader.clone(), now.clone()],
        "the Lease moved once, to a pod of the new revision"
    );
    assert!(now.starts_with("new-"), "{now}");
    assert_eq!(revisions(&api), format!("{OLD} {NEW}"));
    // The cost: the claims of the slot (old pods' and new pods') and the
    // one hand-over, beside the renews and each stopping pod's release of
    // its name.
    let requests = api.requests();
    let (writes, conflicts) = cost(&requests);
    let claims: Vec<_> = writes
        .iter()
        .filter(|r| r.client.starts_with("new-") && r.client != now)
        .map(|r| format!("{} {:?}", r.client, r.verb))
        .collect();
    eprintln!("claims by new followers: {claims:?}; conflicts {conflicts}");
    assert!(
        claims.len() <= 4,
        "a few claims per rollout, not one per new pod: {claims:?}"
    );
    assert!(conflicts <= 4, "{conflicts} conflicts");
    monitor.assert_no_overlap();
}
