//! The gate socket (`serve --gate-socket`): gates register and acknowledge
//! over a Unix socket only this pod can reach, whatever its networking, and
//! a pod on the node's network without one refuses them over loopback. A
//! "neighbour" here is another process on the same loopback, as every pod
//! and process of a node is under `hostNetwork: true`.

use crate::support;

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use support::events::EventClient;
use support::fake_apiserver::{FakeApiServer, Verb};
use support::gate_clients::{COLLECTOR, ChildLog, GateClient, spawn_exec, wall_now};
use support::sidecar::{Sidecar, Timing, test_dir};

const LEASE: &str = "cluster-metrics";
const SECOND: Duration = Duration::from_secs(1);
const TIMING: Timing = Timing::GATES;
const GATE_LAG: Duration = Duration::from_millis(2500);

/// `curl --unix-socket SOCKET [-X METHOD] http://localhost/PATH`: the status
/// and the body, as a user of the socket would see them.
fn curl(socket: &Path, method: &str, path: &str) -> (u16, String) {
    let out = Command::new("curl")
        .args(["-s", "-m", "5", "-w", "\n%{http_code}", "-X", method])
        .arg("--unix-socket")
        .arg(socket)
        .arg(format!("http://localhost{path}"))
        .output()
        .expect("curl runs");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let (body, status) = text.rsplit_once('\n').unwrap_or(("", &text));
    (status.trim().parse().unwrap_or(0), body.to_owned())
}

/// An `exec` of [`COLLECTOR`] on the gate socket `socket`, once its child
/// started.
async fn exec_on(dir: &Path, socket: &Path) -> (GateClient, ChildLog) {
    let log = ChildLog(dir.join("children.log"));
    let url = format!("unix:{}", socket.display());
    let exec = spawn_exec(dir, "a", &url, &log.0, COLLECTOR);
    log.wait_for(SECOND * 10, |e| e.what == "start").await;
    (exec, log)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_a_gate_socket_only_the_socket_registers_and_acknowledges_and_reads_stay_on_tcp() {
    let api = FakeApiServer::start("collectors", LEASE).await;
    let dir = test_dir("gate-socket-only");
    let lag = format!("{}ms", GATE_LAG.as_millis());
    let (a, socket) = Sidecar::spawn_with_socket(&api, &dir, "a", TIMING, &["--gate-lag", &lag]);
    let socket_arg = socket.to_str().unwrap();
    let term = a.wait_term(TIMING.lease * 3).await;

    // Reads: on TCP as before, and with curl on the socket.
    assert_eq!(a.leader().await.expect("/leader on TCP").status, 200);
    let (status, body) = curl(&socket, "GET", "/leader");
    assert_eq!(status, 200, "{body}");
    let body: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(body["term"], term.as_str());

    // A gate on loopback TCP (a host-network neighbour, or this pod's own
    // gate with the wrong --url) is refused, and told which URL to use.
    let reader = EventClient::try_connect_lease(a.gate, LEASE, None)
        .await
        .unwrap();
    assert_eq!(reader.status, 200, "a plain subscription is a read");
    let mut gate_on_tcp = EventClient::connect_as_gate(a.gate, "x").await;
    assert_eq!(gate_on_tcp.status, 403);
    let said = gate_on_tcp.body_text(SECOND).await;
    assert!(said.contains(&format!("--url unix:{socket_arg}")), "{said}");

    // The gate on the socket is registered for the term.
    let mut x = EventClient::try_connect_socket(&socket, "/events?gate=x")
        .await
        .unwrap();
    assert_eq!(x.status, 200);
    let state = x.next(SECOND).await.expect("a state event");
    assert_eq!(state.data["leading"], true);

    // A graceful step-down: the neighbour's acknowledgement over loopback is
    // refused and changes nothing; the gate's own, over the socket, ends
    // the wait.
    let signalled = Instant::now();
    a.signal(libc::SIGTERM);
    assert_eq!(x.stopped_term(SECOND * 5).await, term);
    assert_eq!(a.acknowledge("x", &term).await, 403, "loopback TCP");
    tokio::time::sleep(SECOND).await;
    assert!(
        !api.requests_of("a", Verb::Update)
            .iter()
            .any(|r| r.holder.is_none() && r.status == Some(200)),
        "released on a neighbour's word, {:?} after SIGTERM",
        signalled.elapsed()
    );
    let acknowledged = Instant::now();
    let path = format!("/gates/x/closed?term={}", term.replace('/', "%2F"));
    let (status, body) = curl(&socket, "POST", &path);
    assert_eq!(status, 204, "{body}");
    let released = api.release_of("a", TIMING.lease * 2).await;
    let after = released.saturating_duration_since(signalled);
    println!(
        "gate socket: acknowledged over the socket {:?} after SIGTERM, released {after:?} after it",
        acknowledged.saturating_duration_since(signalled)
    );
    assert!(released >= acknowledged, "released before the gate said so");
    assert!(
        after < GATE_LAG,
        "released {after:?} after SIGTERM: the socket's acknowledgement did not count"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_on_the_nodes_network_without_a_socket_refuses_gates_and_names_the_fix() {
    let api = FakeApiServer::start("collectors", LEASE).await;
    let dir = test_dir("gate-socket-host-network");
    let lag = format!("{}ms", GATE_LAG.as_millis());
    // Its IP is the node's: the downward API's status.podIP and status.hostIP.
    let a = Sidecar::spawn_with(
        &api,
        &dir,
        "a",
        TIMING,
        &[
            "--pod-ip",
            "10.0.0.7",
            "--host-ip",
            "10.0.0.7",
            "--gate-lag",
            &lag,
        ],
    );
    let term = a.wait_term(TIMING.lease * 3).await;
    let mut gate = EventClient::connect_as_gate(a.gate, "x").await;
    assert_eq!(gate.status, 403);
    let said = gate.body_text(SECOND).await;
    assert!(
        said.contains("node's network") && said.contains("--gate-socket"),
        "{said}"
    );
    assert!(
        a.log()
            .contains("every gate's registration and acknowledgement will be refused"),
        "said at start-up:\n{}",
        a.log()
    );
    // Reads are answered; an acknowledgement is not taken.
    assert_eq!(a.leader().await.expect("/leader").status, 200);
    let signalled = Instant::now();
    a.signal(libc::SIGTERM);
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(a.acknowledge("x", &term).await, 403);
    let released = api.release_of("a", TIMING.lease * 2).await;
    assert!(
        released.saturating_duration_since(signalled) >= GATE_LAG,
        "released before the gate lag"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exec_on_the_gate_socket_runs_its_child_and_its_acknowledgement_releases_at_once() {
    let api = FakeApiServer::start("collectors", LEASE).await;
    let dir = test_dir("gate-socket-exec");
    let lag = format!("{}ms", GATE_LAG.as_millis());
    let (a, socket) = Sidecar::spawn_with_socket(&api, &dir, "a", TIMING, &["--gate-lag", &lag]);
    a.wait_term(TIMING.lease * 3).await;
    let (_exec, log) = exec_on(&dir, &socket).await;
    // Registered for the term (connected when it started, or since).
    tokio::time::sleep(TIMING.retry).await;

    let signalled = Instant::now();
    a.signal(libc::SIGTERM);
    let stopped = log.wait_for(SECOND * 10, |e| e.what == "stop").await;
    let released = api.release_of("a", TIMING.lease * 2).await;
    let after = released.saturating_duration_since(signalled);
    println!("gate socket: exec's child stopped, released {after:?} after SIGTERM");
    assert!(
        after < GATE_LAG,
        "released {after:?} after SIGTERM: exec's acknowledgement over the socket did not count"
    );
    let stopped_wall = stopped.wall;
    let released_wall = wall_now()
        - Instant::now()
            .saturating_duration_since(released)
            .as_secs_f64();
    assert!(
        stopped_wall <= released_wall,
        "released before the child stopped"
    );
}

/// A gate on the socket closes when the sidecar dies without a word, as on
/// TCP: the stream's end decides nothing, the validity it last heard does,
/// well before a peer may take the Lease (a lease duration after its last
/// renew).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exec_on_the_gate_socket_stops_its_child_within_validity_when_the_sidecar_is_killed() {
    let api = FakeApiServer::start("collectors", LEASE).await;
    let dir = test_dir("gate-socket-sigkill");
    let (mut a, socket) = Sidecar::spawn_with_socket(&api, &dir, "a", TIMING, &[]);
    a.wait_term(TIMING.lease * 3).await;
    let (_exec, log) = exec_on(&dir, &socket).await;

    let killed = wall_now();
    a.signal(libc::SIGKILL);
    assert!(a.wait_exit(SECOND * 5).await.is_some());
    let stopped = log.wait_for(TIMING.lease, |e| e.what == "stop").await;
    let after = stopped.wall - killed;
    println!("gate socket: the child stopped {after:.3} s after the sidecar's SIGKILL");
    // Validity ends at most a renew deadline after the kill (the last renew
    // came before it), plus exec's SIGTERM and the child's trap (a second
    // for a loaded machine); a peer may start only a whole lease duration
    // after the last renew, 3 s later still.
    assert!(
        after < (TIMING.renew_deadline + SECOND).as_secs_f64(),
        "the child stopped {after:.3} s after the SIGKILL: later than its validity"
    );
}

/// A neighbour holding every plain `/events` slot over loopback (under
/// `hostNetwork`, any process of the node) cannot keep the pod's own gate
/// from opening: streams that register a gate over the socket take their
/// slot from a pool of their own. With one pool, the leader's `exec` was
/// answered 503 for as long as the readers stayed, and its collector never
/// started.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn loopback_readers_holding_every_slot_cannot_keep_the_leaders_gate_from_opening() {
    let api = FakeApiServer::start("collectors", LEASE).await;
    let dir = test_dir("socket-slots-of-its-own");
    let (a, socket) =
        Sidecar::spawn_with_socket(&api, &dir, "a", TIMING, &["--max-subscribers", "4"]);
    a.wait_serving().await;
    let term = a.wait_term(TIMING.lease * 2).await;
    // A process of the node holds every slot over loopback TCP (plain
    // reads: no registration, nothing the gate channel refuses).
    let mut held = Vec::new();
    for _ in 0..4 {
        let reader = EventClient::try_connect(a.gate, None).await.unwrap();
        assert_eq!(reader.status, 200);
        held.push(reader);
    }
    // The pool of plain reads is full indeed.
    let refused = EventClient::try_connect(a.gate, None).await.unwrap();
    assert_eq!(refused.status, 503, "a fifth plain reader");
    // The pod's own collector, gated over the socket as shipped.
    let log = ChildLog(dir.join("children.log"));
    let url = format!("unix:{}", socket.display());
    let exec = spawn_exec(&dir, "a", &url, &log.0, COLLECTOR);
    let deadline = Instant::now() + SECOND * 10;
    while Instant::now() < deadline && log.entries().is_empty() {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let started = !log.entries().is_empty();
    let said: String = exec.stderr();
    println!(
        "a leads term {term}; 4 loopback readers hold the slots; exec on the socket started \
         its child within 10 s: {started}\nexec said:\n{said}"
    );
    assert!(
        started,
        "the leader's collector, gated over the pod-local socket, never started while \
         loopback readers held every /events slot\nexec said:\n{said}"
    );
    assert_eq!(log.entries()[0].term, term);
    drop(held);
}
