//! One sidecar elected for several Leases, as real processes against the
//! fake API server: the Leases spread over the group (no pod holds two
//! while there are as many pods as Leases), a killed holder's Lease goes to
//! a pod that held none, fewer pods than Leases still hold every Lease and
//! spread again when pods come back, and each Lease has its own paths.

use crate::support;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use support::fake_apiserver::{FakeApiServer, lease_holder};
use support::sidecar::{Sidecar, Timing, get, test_dir};

const LEASES: [&str; 3] = ["shard-0", "shard-1", "shard-2"];

/// A server whose Role grants the Leases `LEASES` (the shipped Role names one).
async fn api_for_three_leases() -> FakeApiServer {
    let api = FakeApiServer::start("collectors", LEASES[0]).await;
    api.grant_leases(&LEASES[1..]);
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

/// Runs `leader-gate ARGS… --url http://GATE` to its end: its exit code and
/// what it said on stderr.
async fn client_exit(
    dir: &std::path::Path,
    name: &str,
    gate: std::net::SocketAddr,
    args: &[&str],
) -> (i32, String) {
    let url = format!("http://{gate}");
    let mut argv = args.to_vec();
    argv.extend(["--url", &url]);
    let mut client = support::gate_clients::GateClient::spawn(dir, name, &argv, &[]);
    (
        client.exit_code(Duration::from_secs(8)).await,
        client.stderr(),
    )
}

/// Waits up to 10 s for `line` in the file at `path`.
async fn wait_for_line(path: &std::path::Path, line: &str) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let text = std::fs::read_to_string(path).unwrap_or_default();
        if text.lines().any(|l| l == line) {
            return;
        }
        assert!(Instant::now() < deadline, "no {line:?} in {text:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
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

/// The gated collector of shard-1: logs `start NAME LEASE SHARD/SHARDS ARG`
/// (ARG: its first argument, `${LEADER_GATE_SHARD}` as exec substituted
/// it), keeps running, logs `stop` on SIGTERM.
const SHARD_COLLECTOR: &str = r#"
note() { echo "$1 $NAME $LEADER_GATE_LEASE $LEADER_GATE_SHARD/$LEADER_GATE_SHARDS $ARG" >> "$LOG"; }
ARG="$1"
trap 'note stop; exit 0' TERM
note start
while kill -0 "$PPID" 2>/dev/null; do sleep 0.05; done
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_gate_follows_the_lease_it_names_and_its_collector_takes_that_shard() {
    use support::file_gate::FileGate;
    use support::gate_clients::GateClient;

    let api = api_for_three_leases().await;
    let dir = test_dir("several-leases-gates");
    let timing = Timing::FAST;
    let names = ["a", "b", "c"];
    let pods: BTreeMap<&str, Sidecar> = names
        .iter()
        .map(|name| (*name, Sidecar::spawn_with(&api, &dir, name, timing, &MORE)))
        .collect();
    for pod in pods.values() {
        pod.wait_serving().await;
    }
    let before = wait_until(&api, timing.lease * 6, "three distinct holders", spread_out).await;
    let holder = before["shard-1"].clone().unwrap();

    // In every pod: exec and file-gate for shard-1, and a watch of shard-2.
    let log = dir.join("shard-1.log");
    let src = dir.join("ksm.yml");
    std::fs::write(
        &src,
        "hosts: [\"ksm-${LEADER_GATE_SHARD}:8080\"] # ${LEADER_GATE_SHARDS} shards, ${NODE_NAME}\n",
    )
    .unwrap();
    let mut execs = Vec::new();
    let mut file_gates = Vec::new();
    let mut copies = BTreeMap::new();
    for name in names {
        let url = format!("http://{}", pods[name].gate);
        execs.push(GateClient::spawn(
            &dir,
            &format!("exec-{name}"),
            &[
                "exec",
                "--url",
                &url,
                "--lease",
                "shard-1",
                "--grace",
                "2s",
                "--",
                "sh",
                "-c",
                SHARD_COLLECTOR,
                "sh",
                "${LEADER_GATE_SHARD}",
            ],
            &[("NAME", name), ("LOG", log.to_str().unwrap())],
        ));
        let copy_dir = dir.join(format!("modules-{name}"));
        std::fs::create_dir_all(&copy_dir).unwrap();
        let dst = copy_dir.join("ksm.yml");
        file_gates.push(FileGate::spawn(
            &dir,
            &format!("file-gate-{name}"),
            pods[name].gate,
            &["--lease", "shard-1"],
            &[(&src, &dst)],
        ));
        copies.insert(name, dst);
    }
    let started = format!("start {holder} shard-1 1/3 1");
    wait_for_line(&log, &started).await;
    let deadline = Instant::now() + Duration::from_secs(10);
    while !copies[holder.as_str()].exists() {
        assert!(Instant::now() < deadline, "no copy at {holder}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(
        std::fs::read_to_string(&copies[holder.as_str()]).unwrap(),
        "hosts: [\"ksm-1:8080\"] # 3 shards, ${NODE_NAME}\n",
        "the copy names the shard, and leaves the collector's own variables"
    );
    // Only the holder of shard-1 runs its collector or has its copy, though
    // every pod holds a Lease.
    tokio::time::sleep(timing.retry * 2).await;
    let text = std::fs::read_to_string(&log).unwrap();
    assert_eq!(text, format!("{started}\n"), "only {holder} runs shard-1");
    for name in names.iter().filter(|n| **n != holder) {
        assert!(!copies[name].exists(), "{name} holds {:?}", before);
    }

    // status and wait name the Lease; without one, `status` is the pod's.
    for name in names {
        let gate = pods[name].gate;
        let expected = if name == holder { 0 } else { 1 };
        let (code, _) = client_exit(
            &dir,
            &format!("status-{name}"),
            gate,
            &["status", "--lease", "shard-1"],
        )
        .await;
        assert_eq!(code, expected, "{name}");
        let (code, _) = client_exit(&dir, &format!("any-{name}"), gate, &["status"]).await;
        assert_eq!(code, 0, "{name} holds one");
    }
    let gate = pods[holder.as_str()].gate;
    let (code, stderr) = client_exit(
        &dir,
        "status-unknown",
        gate,
        &["status", "--lease", "shard-9"],
    )
    .await;
    assert_eq!(code, 2);
    assert!(stderr.contains("shard-9"), "{stderr}");
    let wait = ["wait", "--lease", "shard-1", "--timeout", "5s"];
    assert_eq!(client_exit(&dir, "wait-shard-1", gate, &wait).await.0, 0);

    // A watch of shard-2 sees only shard-2's events.
    let watch_url = format!(
        "http://{}",
        pods[before["shard-2"].as_deref().unwrap()].gate
    );
    let watch = GateClient::spawn(
        &dir,
        "watch-shard-2",
        &["watch", "--url", &watch_url, "--lease", "shard-2", "--json"],
        &[],
    );
    watch
        .wait_line(Duration::from_secs(5), |l| l.contains("\"state\""))
        .await;

    // The holder of shard-1 is killed: the gates of the pod that takes it
    // over open for it, with the same shard.
    let mut pods = pods;
    let mut killed = pods.remove(holder.as_str()).unwrap();
    killed.signal(libc::SIGKILL);
    killed.wait_exit(Duration::from_secs(5)).await;
    let after = wait_until(&api, timing.lease * 4, "shard-1 taken over", |h| {
        h["shard-1"].as_deref().is_some_and(|h| h != holder)
    })
    .await;
    let taker = after["shard-1"].clone().unwrap();
    let restarted = format!("start {taker} shard-1 1/3 1");
    wait_for_line(&log, &restarted).await;
    assert!(
        copies[taker.as_str()].exists() || {
            tokio::time::sleep(Duration::from_secs(2)).await;
            copies[taker.as_str()].exists()
        }
    );
    let lines = watch.lines();
    assert!(lines.len() >= 2, "{lines:?}");
    for line in &lines {
        let event: serde_json::Value = serde_json::from_str(&line.text).unwrap();
        assert_eq!(event["data"]["lease"]["name"], "shard-2", "{}", line.text);
        assert_eq!(event["data"]["lease"]["shard"], 2, "{}", line.text);
    }
    drop(execs);
    drop(file_gates);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn beside_a_lease_alone_a_client_naming_another_lease_is_refused_not_opened() {
    let api = FakeApiServer::start("collectors", "shard-0").await;
    let dir = test_dir("several-leases-alone");
    let pod = Sidecar::spawn(&api, &dir, "a", Timing::FAST);
    pod.wait_serving().await;
    pod.wait_leading(Duration::from_secs(10)).await;
    // Its own name is its /leader; any other is no Lease of this sidecar.
    let own = get(pod.gate, "/leader/shard-0").await.unwrap();
    assert_eq!(own.status, 200);
    assert_eq!(own.body["lease"]["shard"], 0);
    assert_eq!(own.body["lease"]["shards"], 1);
    assert_eq!(get(pod.gate, "/leader/shard-1").await.unwrap().status, 404);
    assert_eq!(
        get(pod.gate, "/events?lease=shard-1").await.unwrap().status,
        404
    );
    let ours = ["status", "--lease", "shard-0"];
    assert_eq!(client_exit(&dir, "ours", pod.gate, &ours).await.0, 0);
    let other = ["status", "--lease", "shard-1"];
    let (code, stderr) = client_exit(&dir, "other", pod.gate, &other).await;
    assert_eq!(code, 2);
    assert!(stderr.contains("404"), "{stderr}");
    // A wait for a Lease this pod does not contend for never opens.
    let wait = ["wait", "--lease", "shard-1", "--timeout", "3s"];
    let (code, stderr) = client_exit(&dir, "wait-other", pod.gate, &wait).await;
    assert_eq!(code, 1);
    assert!(stderr.contains("shard-1"), "{stderr}");
}

/// A pod restarted without resuming (no `--state-dir`) finds its previous
/// process's record still naming it on `shard-1`, live for a while. That
/// record is no Lease this process holds: it holds none, so it stands for
/// the successor slot of `shard-0`, which `b` holds, as any pod holding
/// none does (counting the dead record as held, it stood back, and would
/// have handed over a Lease it led as surplus).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_record_a_dead_process_left_under_this_identity_is_not_held_by_its_restart() {
    let api = FakeApiServer::start("collectors", LEASES[0]).await;
    api.grant_leases(&LEASES[1..2]);
    let dir = test_dir("several-dead-record");
    api.create_lease(serde_json::json!({
        "metadata": {
            "name": LEASES[1],
            // The mark of the process that died.
            "annotations": {"leader-gate.dev/writer": "00000000000000dd"},
        },
        "spec": {
            "holderIdentity": "a",
            "leaseDurationSeconds": 60,
            "acquireTime": "2026-12-04T00:00:00.000000Z",
            "renewTime": "2026-12-04T00:00:00.000000Z",
            "leaseTransitions": 1,
        },
    }));
    let args = ["--lease-name", LEASES[1], "--successor-claim-window", "2s"];
    let b = Sidecar::spawn_with(&api, &dir, "b", Timing::FAST, &args);
    b.wait_serving().await;
    wait_until(&api, Duration::from_secs(10), "b holds shard-0", |h| {
        h[LEASES[0]].as_deref() == Some("b")
    })
    .await;
    let a = Sidecar::spawn_with(&api, &dir, "a", Timing::FAST, &args);
    a.wait_serving().await;
    let successor = |api: &FakeApiServer| {
        api.lease(LEASES[0]).and_then(|l| {
            l["metadata"]["annotations"]["leader-gate.dev/successor"]
                .as_str()
                .map(str::to_owned)
        })
    };
    let deadline = Instant::now() + Duration::from_secs(8);
    while successor(&api).as_deref() != Some("a") {
        assert!(
            Instant::now() < deadline,
            "a never claimed the slot of {}: {:?}\n{}",
            LEASES[0],
            successor(&api),
            a.log()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
