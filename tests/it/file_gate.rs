//! `leader-gate file-gate` against real `leader-gate serve` processes and the
//! fake Lease API server: DST exists exactly while its pod leads (checked
//! against the sidecar's own event stream), is never seen half-written, is
//! gone after a step-down, a shutdown, a restart after the gate's own
//! SIGKILL and — SIGKILL the leading sidecar — before any peer leads; and
//! `--reload-url` is POSTed once per change. Judged by timestamps and
//! causality, never by speed.
//!
//! The documented delay: the file gate reads the same stream as a
//! subscriber, so what separates an event from the file's change is its
//! scheduling, a write (fsync, rename, fsync of the directory) and the
//! sampler's period. Closing must fit within the margin `lease_duration −
//! renew_deadline` (the window in which no peer can start), so that is the
//! delay allowed here, in both directions; the figures measured are printed
//! as `MEASURE` lines.

use crate::support;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use serde_json::json;
use support::events::{EventClient, Received};
use support::fake_apiserver::{FakeApiServer, Fault, FaultKind, Verb};
use support::file_gate::{
    Change, FileGate, Post, Reloads, Sampler, StatusMode, StatusStandIn, replace,
};
use support::kubelet::Kubelet;
use support::sidecar::{Sidecar, Timing, test_dir};

const LEASE: &str = "cluster-metrics";
const SECOND: Duration = Duration::from_secs(1);
const TIMING: Timing = Timing::FAST;
/// The delay allowed between a stream event and the file's change: the
/// margin (see the module documentation).
const ALLOWED_DELAY: Duration = Duration::from_secs(1);
/// How often the sampler looks at a DST.
const SAMPLE_PERIOD: Duration = Duration::from_millis(2);
const RELOAD_PATH: &str = "/-/reload";

/// One pod: a sidecar, a subscriber of its stream, a file gate with a
/// recording reload endpoint, and a sampler on the gate's DST.
struct Pod {
    name: String,
    dir: PathBuf,
    sidecar: Sidecar,
    stream: EventClient,
    seen: Vec<Received>,
    gate: FileGate,
    src: PathBuf,
    dst: PathBuf,
    sampler: Sampler,
    reloads: Reloads,
}

impl Pod {
    /// Waits on the stream for an event of `kind`.
    async fn expect(&mut self, kind: &str, timeout: Duration) -> Received {
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let received = self.stream.next(left).await.unwrap_or_else(|| {
                panic!(
                    "{}: no {kind} within {timeout:?}; seen {:?}\nsidecar log:\n{}",
                    self.name,
                    self.seen.iter().map(Received::kind).collect::<Vec<_>>(),
                    self.sidecar.log()
                )
            });
            self.seen.push(received.clone());
            if received.kind() == kind {
                return received;
            }
        }
    }

    /// Waits for `n` more `renewed` events.
    async fn renewals(&mut self, n: usize) {
        for _ in 0..n {
            self.expect("renewed", TIMING.retry * 3).await;
        }
    }

    /// A (new) file gate for this pod's mapping, reloading `reloads`.
    fn spawn_gate(&self, name: &str, reloads: &Reloads) -> FileGate {
        FileGate::spawn(
            &self.dir,
            name,
            self.sidecar.gate,
            &["--reload-url", &reloads.url(RELOAD_PATH)],
            &[(&self.src, &self.dst)],
        )
    }

    /// The first change after change `from` where DST is present (or not).
    async fn dst(&self, from: usize, present: bool, timeout: Duration) -> (usize, Change) {
        self.sampler
            .until(from, timeout, |c| c.exists() == present)
            .await
    }

    fn logs(&self) -> String {
        format!(
            "file gate log:\n{}\nsidecar log:\n{}",
            self.gate.log(),
            self.sidecar.log()
        )
    }
}

/// Options for [`start`].
struct Setup<'a> {
    src: &'a [u8],
    /// Read DST in a tight loop instead of every [`SAMPLE_PERIOD`].
    tight: bool,
    /// The reload endpoint answers only after this long.
    reload_delay: Duration,
    serve_args: &'a [&'a str],
    /// The file gate's fsyncs hang while this file exists (the debug-only
    /// test hook `LEADER_GATE_TEST_STALL_FSYNC`).
    stall: Option<&'a std::path::Path>,
}

impl Default for Setup<'_> {
    fn default() -> Self {
        Setup {
            src: b"- targets: ['cluster-metrics:9100']\n",
            tight: false,
            reload_delay: Duration::ZERO,
            serve_args: &[],
            stall: None,
        }
    }
}

/// Starts one pod per name; nobody contends until every pod's stream and
/// file gate are subscribed, so both see every transition from the first.
async fn start(test: &str, names: &[&str], setup: Setup<'_>) -> (FakeApiServer, Vec<Pod>) {
    let api = FakeApiServer::start("collectors", LEASE).await;
    for name in names {
        api.set_fault(name, Fault::all(FaultKind::Partition));
    }
    let root = test_dir(test);
    let mut pods = Vec::new();
    for name in names {
        let dir = root.join(name);
        let out = dir.join("conf.d");
        std::fs::create_dir_all(&out).unwrap();
        let (src, dst) = (dir.join("targets.yml"), out.join("targets.yml"));
        std::fs::write(&src, setup.src).unwrap();
        let sidecar = Sidecar::spawn_with(&api, &dir, name, TIMING, setup.serve_args);
        sidecar.wait_serving().await;
        let mut stream = EventClient::connect(sidecar.gate, None).await;
        let state = stream.next(SECOND).await.expect("a state event first");
        assert_eq!(state.kind(), "state");
        let period = if setup.tight {
            Duration::ZERO
        } else {
            SAMPLE_PERIOD
        };
        let sampler = Sampler::start(&dst, period);
        let reloads = Reloads::start_slow(&[&dst], setup.reload_delay).await;
        let stall: Vec<_> = setup
            .stall
            .map(|path| ("LEADER_GATE_TEST_STALL_FSYNC", path))
            .into_iter()
            .collect();
        let gate = FileGate::spawn_env(
            &dir,
            &format!("{name}-file-gate"),
            sidecar.gate,
            &["--reload-url", &reloads.url(RELOAD_PATH)],
            &[(&src, &dst)],
            &stall,
        );
        wait_subscribers(&sidecar, 2).await;
        pods.push(Pod {
            name: name.to_string(),
            dir,
            sidecar,
            stream,
            seen: vec![state],
            gate,
            src,
            dst,
            sampler,
            reloads,
        });
    }
    for name in names {
        api.clear_faults(name);
    }
    (api, pods)
}

/// How many streams are open on the sidecar now, by its metrics.
async fn subscribers(sidecar: &Sidecar) -> Option<usize> {
    let probe = sidecar.admin_get("/metrics").await?;
    probe
        .body
        .as_str()?
        .lines()
        .find_map(|l| l.strip_prefix("leader_gate_event_subscribers "))?
        .parse()
        .ok()
}

/// Waits until `n` streams are open on the sidecar (the test's and the gate's).
async fn wait_subscribers(sidecar: &Sidecar, n: usize) {
    let line = format!("leader_gate_event_subscribers {n}");
    let deadline = Instant::now() + SECOND * 10;
    loop {
        if let Some(probe) = sidecar.admin_get("/metrics").await
            && probe
                .body
                .as_str()
                .is_some_and(|t| t.lines().any(|l| l == line))
        {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{}: never {n} subscribers",
            sidecar.name
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The first pod whose stream says it started leading.
async fn leader(pods: &mut [Pod], timeout: Duration) -> (usize, Received) {
    let deadline = Instant::now() + timeout;
    loop {
        for (i, pod) in pods.iter_mut().enumerate() {
            while let Some(received) = pod.stream.next(Duration::from_millis(20)).await {
                pod.seen.push(received.clone());
                if received.kind() == "started-leading" {
                    return (i, received);
                }
            }
        }
        assert!(Instant::now() < deadline, "nobody started leading");
    }
}

/// `later − earlier` in ms, negative when `later` came first.
fn signed_ms(later: Instant, earlier: Instant) -> f64 {
    if later >= earlier {
        later.duration_since(earlier).as_secs_f64() * 1e3
    } else {
        -(earlier.duration_since(later).as_secs_f64() * 1e3)
    }
}

fn published_us(received: &Received) -> i64 {
    received.data["published_at_us"]
        .as_i64()
        .expect("published_at_us")
}

/// The file changed after the event was published (causality, one wall
/// clock), and within the allowed delay of its receipt on the stream.
fn assert_follows(what: &str, change: &Change, event: &Received) -> f64 {
    assert!(
        change.wall_us >= published_us(event),
        "{what}: the file changed before the {} was published ({} < {})",
        event.kind(),
        change.wall_us,
        published_us(event)
    );
    let delay = signed_ms(change.at, event.at);
    assert!(
        delay <= ALLOWED_DELAY.as_secs_f64() * 1e3,
        "{what}: {delay:.1} ms after the {} arrived, more than {ALLOWED_DELAY:?}",
        event.kind()
    );
    println!(
        "MEASURE file-gate {what}: {delay:.1} ms after the subscriber received {}",
        event.kind()
    );
    delay
}

/// One POST per change and no more (the first one the start-up reload,
/// which tells the collector that no copy is there), each a reload that came
/// after its change: with the file present after an appearance (or an
/// update), absent after a removal. (POSTs are sent in the background, so a test makes its
/// next change only once the POST for the last one arrived.)
async fn assert_posts_follow(pod: &Pod, presence_after_each_change: &[bool]) {
    pod.reloads
        .wait_count(presence_after_each_change.len(), SECOND * 10)
        .await;
    tokio::time::sleep(Duration::from_millis(300)).await; // no more come
    let posts = pod.reloads.posts();
    assert_eq!(
        posts.len(),
        presence_after_each_change.len(),
        "{}: one POST per change ({presence_after_each_change:?}); got {posts:#?}",
        pod.name
    );
    for (post, present) in posts.iter().zip(presence_after_each_change) {
        assert_eq!(
            (post.method.as_str(), post.path.as_str()),
            ("POST", RELOAD_PATH)
        );
        assert_eq!(post.existed, [*present], "{}: {posts:#?}", pod.name);
    }
}

fn kib(n: usize, fill: u8, header: &str) -> Vec<u8> {
    let mut content = header.as_bytes().to_vec();
    while content.len() < n * 1024 {
        content.extend(std::iter::repeat_n(fill, 63));
        content.push(b'\n');
    }
    content
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dst_exists_exactly_while_the_instance_leads_across_a_holder_edit_and_a_return() {
    let (api, mut pods) = start("fg-exactly", &["a"], Setup::default()).await;
    let pod = &mut pods[0];
    let src = std::fs::read(&pod.src).unwrap();

    let started = pod.expect("started-leading", TIMING.lease * 2).await;
    let (n, appeared) = pod.dst(1, true, TIMING.lease).await;
    assert_follows("appeared", &appeared, &started);
    pod.reloads.wait_count(2, SECOND * 5).await;
    pod.renewals(3).await;

    api.update_lease(LEASE, |l| l["spec"]["holderIdentity"] = json!("ghost"));
    let stopped = pod.expect("stopped-leading", SECOND * 2).await;
    assert_eq!(stopped.data["reason"], "lost-to-other-holder");
    let (n, gone) = pod.dst(n + 1, false, TIMING.lease).await;
    assert_follows("removed on a step-down", &gone, &stopped);
    pod.reloads.wait_count(3, SECOND * 5).await;

    // The ghost's lease runs out; this pod leads again.
    let again = pod.expect("started-leading", TIMING.lease * 3).await;
    assert_ne!(again.term(), started.term());
    let (_, back) = pod.dst(n + 1, true, TIMING.lease).await;
    assert_follows("appeared again", &back, &again);
    pod.renewals(3).await;

    let changes = pod.sampler.changes();
    assert_eq!(
        pod.sampler.presence(),
        [false, true, false, true],
        "no other change, across every renewal: {:?}\n{}",
        pod.sampler.summary(),
        pod.logs()
    );
    assert!(
        changes.iter().flat_map(|c| &c.content).all(|c| *c == src),
        "DST only ever held SRC"
    );
    // A causal check of the whole history: no change before its event.
    assert!(gone.at < again.at && appeared.at < gone.at);
    assert_posts_follow(pod, &[false, true, false, true]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reader_never_sees_a_partial_copy_across_src_changes_and_a_step_down() {
    let old = kib(256, b'o', "# version old\n");
    let new = kib(257, b'n', "# version new\n");
    let setup = Setup {
        src: &old,
        tight: true,
        ..Setup::default()
    };
    let (api, mut pods) = start("fg-whole", &["a"], setup).await;
    let pod = &mut pods[0];
    pod.expect("started-leading", TIMING.lease * 2).await;
    let (n, _) = pod.dst(1, true, TIMING.lease).await;

    // SRC changes while leading (atomically, as a ConfigMap does); the copy
    // follows at the next renewal.
    pod.reloads.wait_count(2, SECOND * 5).await;
    let mut from = n;
    for (i, content) in [&new, &old, &new].into_iter().enumerate() {
        let changed_at = Instant::now();
        replace(&pod.src, content);
        let (n, copied) = pod
            .sampler
            .until(from + 1, TIMING.retry * 3 + ALLOWED_DELAY, |c| {
                c.content.as_ref() == Some(content)
            })
            .await;
        println!(
            "MEASURE file-gate SRC change to copy: {:.1} ms (renewals every {:?})",
            signed_ms(copied.at, changed_at),
            TIMING.retry
        );
        from = n;
        pod.reloads.wait_count(3 + i, SECOND * 5).await;
    }
    api.update_lease(LEASE, |l| l["spec"]["holderIdentity"] = json!("ghost"));
    pod.expect("stopped-leading", SECOND * 2).await;
    pod.dst(from + 1, false, TIMING.lease).await;

    let reads = pod.sampler.reads();
    let sampler = std::mem::replace(&mut pod.sampler, Sampler::start(&pod.dst, SAMPLE_PERIOD));
    let changes = sampler.stop();
    println!("MEASURE file-gate whole-copy reader: {reads} reads of DST");
    assert!(reads > 100, "the reader ran: {reads} reads");
    for change in &changes {
        if let Some(content) = &change.content {
            assert!(
                *content == old || *content == new,
                "a reader saw {} bytes that are neither whole version (starts {:?})",
                content.len(),
                String::from_utf8_lossy(&content[..content.len().min(32)])
            );
        }
    }
    let presence: Vec<bool> = changes.iter().map(Change::exists).collect();
    assert_eq!(
        presence,
        [false, true, true, true, true, false],
        "absent, the old copy, three updates, removed: {changes:?}"
    );
    // A write in flight at the removal owns its temporary file and drops it
    // once it finds itself stale (after its write and fsync): give that
    // thread a moment, then nothing may be left.
    let left = || -> Vec<_> {
        std::fs::read_dir(pod.dst.parent().unwrap())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect()
    };
    let deadline = Instant::now() + SECOND * 2;
    while !left().is_empty() && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(
        left().is_empty(),
        "no temporary file left behind: {:?}",
        left()
    );
    assert_posts_follow(pod, &[false, true, true, true, true, false]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_of_the_file_gate_removes_dst_then_exits_0() {
    let (_api, mut pods) = start("fg-sigterm", &["a"], Setup::default()).await;
    let pod = &mut pods[0];
    pod.expect("started-leading", TIMING.lease * 2).await;
    let (n, appeared) = pod.dst(1, true, TIMING.lease).await;
    pod.reloads.wait_count(2, SECOND * 5).await;
    pod.gate.signal(libc::SIGTERM);
    let status = pod.gate.wait_exit(SECOND * 10).await;
    assert_eq!(
        status.and_then(|s| s.code()),
        Some(0),
        "exit 0 on SIGTERM\n{}",
        pod.logs()
    );
    // Gone by the time the process has exited, while the pod still leads.
    assert!(!pod.dst.exists(), "DST outlived its file gate");
    let (_, gone) = pod.dst(n + 1, false, SECOND).await;
    assert!(pod.sidecar.leader().await.is_some_and(|p| p.leading()));
    assert!(gone.at > appeared.at);
    assert_posts_follow(pod, &[false, true, false]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_of_the_file_gate_removes_its_copy_at_once() {
    let (_api, mut pods) = start("fg-sigkill-guard", &["a"], Setup::default()).await;
    let pod = &mut pods[0];
    pod.expect("started-leading", TIMING.lease * 2).await;
    let (n, _) = pod.dst(1, true, TIMING.lease).await;
    // The placement's reload first (POSTs go in the background): killed
    // before it was sent, the gate would leave two POSTs, not three. Seen
    // in CI on a loaded machine.
    let placed = pod.reloads.wait_count(2, SECOND * 5).await;
    assert_eq!(placed[1].existed, [true], "{placed:#?}");

    // Its guard sees it die and removes the copy while the pod still leads.
    let killed = Instant::now();
    pod.gate.signal(libc::SIGKILL);
    let (_, gone) = pod.dst(n + 1, false, SECOND).await;
    let took = gone.at.saturating_duration_since(killed);
    println!(
        "MEASURE file-gate SIGKILL to copy removed: {:.1} ms",
        took.as_secs_f64() * 1000.0
    );
    assert!(took < Duration::from_millis(100), "removed after {took:?}");
    // Then it tells the collector (which learns only from a reload).
    let posts = pod.reloads.wait_count(3, SECOND).await;
    let told = posts[2].at.saturating_duration_since(killed);
    println!(
        "MEASURE file-gate SIGKILL to the guard's reload: {:.1} ms",
        told.as_secs_f64() * 1000.0
    );
    assert_eq!(posts[2].existed, [false], "after the removal: {posts:#?}");
    pod.gate.wait_exit(SECOND * 5).await.expect("killed");
    assert!(pod.sidecar.leader().await.is_some_and(|p| p.leading()));
    assert!(!pod.dst.exists());
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(pod.reloads.count(), 3, "answered 2xx: sent once");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_file_gate_restarted_after_its_container_was_killed_removes_the_stale_copy_first() {
    let (api, mut pods) = start("fg-sigkill-gate", &["a"], Setup::default()).await;
    let pod = &mut pods[0];
    pod.expect("started-leading", TIMING.lease * 2).await;
    pod.dst(1, true, TIMING.lease).await;
    pod.reloads.wait_count(2, SECOND * 5).await; // the placement's reload, sent

    // The gate and its guard killed at once (a gate that is its
    // container's PID 1, a group OOM kill) leave the file: nothing is left
    // to remove it.
    pod.gate.kill_with_its_children();
    pod.gate.wait_exit(SECOND * 5).await.expect("killed");
    pod.renewals(2).await;
    assert!(pod.dst.exists(), "nobody removed it");

    // Restart while still leading: removed at start-up, before anything
    // else, then rewritten once the stream says this pod still leads.
    pod.gate = pod.spawn_gate("a-file-gate-2", &pod.reloads);
    let posts = pod.reloads.wait_count(4, SECOND * 10).await;
    assert_eq!(posts[2].existed, [false], "removed first: {posts:#?}");
    assert_eq!(posts[3].existed, [true], "then rewritten: {posts:#?}");
    let log = pod.gate.log();
    let removed = log.find("stale copies from an earlier run: removed");
    let wrote = log.find("leading: wrote");
    assert!(
        removed.is_some() && removed < wrote,
        "removal, then the copy:\n{log}"
    );

    // Killed again, then the pod stops leading while no gate runs: the
    // stale copy stays until a new gate removes it at start-up.
    pod.gate.kill_with_its_children();
    pod.gate.wait_exit(SECOND * 5).await.expect("killed");
    api.update_lease(LEASE, |l| l["spec"]["holderIdentity"] = json!("ghost"));
    pod.expect("stopped-leading", SECOND * 2).await;
    assert!(pod.dst.exists(), "nobody removed it");
    let from = pod.sampler.count();
    let restarted_at = Instant::now();
    pod.gate = pod.spawn_gate("a-file-gate-3", &pod.reloads);
    let posts = pod.reloads.wait_count(5, SECOND * 10).await;
    assert_eq!(posts[4].existed, [false], "removed at start-up: {posts:#?}");
    let (n, removed) = pod.dst(from, false, SECOND * 2).await;
    println!(
        "MEASURE file-gate restart to stale copy removed: {:.1} ms",
        signed_ms(removed.at, restarted_at)
    );
    // Not leading: nothing is written until the pod leads again.
    let again = pod.expect("started-leading", TIMING.lease * 3).await;
    let (_, back) = pod.dst(n + 1, true, TIMING.lease).await;
    assert_follows("appeared after the restart", &back, &again);
    let posts = pod.reloads.wait_count(6, SECOND * 2).await;
    assert_eq!(posts[5].existed, [true]);
    pod.renewals(2).await;
    assert_eq!(pod.reloads.count(), 6, "{:#?}", pod.reloads.posts());
}

/// Two pods; the leading sidecar is stopped by `signal`: its DST must be
/// removed before the peer starts leading (and before the peer's DST
/// appears). Returns (signal → removal, removal → peer start) in ms.
async fn failover(test: &str, signal: i32, serve_args: &[&str]) -> (f64, f64) {
    let setup = Setup {
        serve_args,
        ..Setup::default()
    };
    let (_api, mut pods) = start(test, &["a", "b"], setup).await;
    let (x, _) = leader(&mut pods, TIMING.lease * 2).await;
    let y = 1 - x;
    let (n, _) = pods[x].dst(1, true, TIMING.lease).await;
    pods[x].reloads.wait_count(2, SECOND * 5).await;
    pods[x].renewals(2).await;
    assert!(!pods[y].dst.exists());

    let signalled = Instant::now();
    pods[x].sidecar.signal(signal);
    let peer = pods[y].expect("started-leading", TIMING.lease * 3).await;
    let (_, removed) = pods[x].dst(n + 1, false, SECOND).await;
    let (_, peer_copy) = pods[y].dst(1, true, TIMING.lease).await;
    let to_removal = signed_ms(removed.at, signalled);
    let before_peer = signed_ms(peer.at, removed.at);
    println!("MEASURE file-gate {test}: signal to removal {to_removal:.1} ms");
    println!("MEASURE file-gate {test}: removal to the peer's started-leading {before_peer:.1} ms");
    assert!(
        removed.at < peer.at && removed.wall_us < published_us(&peer),
        "{test}: DST removed {before_peer:.1} ms before the peer started (negative: after)\n{}",
        pods[x].logs()
    );
    assert!(removed.at < peer_copy.at, "never both copies at once");
    pods[x].reloads.wait_count(3, SECOND * 2).await;
    assert_eq!(pods[x].sampler.presence(), [false, true, false]);
    assert_eq!(pods[y].sampler.presence(), [false, true]);
    assert_posts_follow(&pods[x], &[false, true, false]).await;
    (to_removal, before_peer)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_of_the_leading_sidecar_removes_dst_before_any_peer_leads() {
    let (to_removal, _) = failover("fg-sigkill-serve", libc::SIGKILL, &[]).await;
    // It ran out of validity: the last renewal's valid_for_ms at most.
    assert!(to_removal <= TIMING.renew_deadline.as_secs_f64() * 1e3 + 1e3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_of_the_leading_sidecar_removes_dst_before_the_peer_leads() {
    // A graceful hand-over releases the lease at once: --gate-lag gives the
    // gates their time first (as the README says to set it).
    failover("fg-sigterm-serve", libc::SIGTERM, &["--gate-lag", "500ms"]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reload_url_is_posted_once_per_change_and_never_for_a_renewal() {
    let (api, mut pods) = start("fg-reload", &["a"], Setup::default()).await;
    let pod = &mut pods[0];
    pod.expect("started-leading", TIMING.lease * 2).await;
    pod.dst(1, true, TIMING.lease).await;
    pod.renewals(5).await;
    assert_eq!(
        pod.reloads.count(),
        2,
        "start-up, the copy; renewals change nothing"
    );

    replace(&pod.src, b"- targets: ['elsewhere:9100']\n");
    pod.sampler
        .until(2, TIMING.retry * 3 + ALLOWED_DELAY, |c| {
            c.content.as_deref() == Some(b"- targets: ['elsewhere:9100']\n".as_slice())
        })
        .await;
    pod.renewals(3).await;
    assert_eq!(pod.reloads.count(), 3, "one POST for the new content");

    api.update_lease(LEASE, |l| l["spec"]["holderIdentity"] = json!("ghost"));
    pod.expect("stopped-leading", SECOND * 2).await;
    pod.dst(3, false, TIMING.lease).await;
    pod.reloads.wait_count(4, SECOND * 2).await;
    // Not leading, for the rest of the ghost's lease: nothing to say.
    tokio::time::sleep(TIMING.lease / 2).await;
    let changes = pod.sampler.count() - 1;
    assert_eq!(changes, 3, "{:?}", pod.sampler.summary());
    assert_posts_follow(pod, &[false, true, true, false]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_reload_endpoint_does_not_delay_a_removal() {
    // A collector that reloads a large configuration before it answers
    // (Prometheus /-/reload does) holds the POST for seconds.
    let setup = Setup {
        reload_delay: TIMING.lease,
        ..Setup::default()
    };
    let (api, mut pods) = start("fg-slow-reload", &["a"], setup).await;
    let pod = &mut pods[0];
    pod.expect("started-leading", TIMING.lease * 2).await;
    let (n, _) = pod.dst(1, true, TIMING.lease).await;
    pod.reloads.wait_count(2, SECOND * 2).await;
    // The POST is still unanswered when leadership ends.
    api.update_lease(LEASE, |l| l["spec"]["holderIdentity"] = json!("ghost"));
    let stopped = pod.expect("stopped-leading", SECOND * 2).await;
    let (_, gone) = pod.dst(n + 1, false, TIMING.lease * 2).await;
    assert_follows("removed while a reload POST hangs", &gone, &stopped);
    pod.reloads.wait_count(3, TIMING.lease * 2).await;
    assert_posts_follow(pod, &[false, true, false]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dst_deleted_by_someone_else_while_leading_is_restored() {
    let (_api, mut pods) = start("fg-deleted", &["a"], Setup::default()).await;
    let pod = &mut pods[0];
    pod.expect("started-leading", TIMING.lease * 2).await;
    let (n, _) = pod.dst(1, true, TIMING.lease).await;
    pod.reloads.wait_count(2, SECOND * 5).await;
    std::fs::remove_file(&pod.dst).unwrap();
    let deleted_at = Instant::now();
    let (n, _) = pod.dst(n + 1, false, SECOND).await;
    let (_, back) = pod.dst(n + 1, true, TIMING.retry * 3 + ALLOWED_DELAY).await;
    println!(
        "MEASURE file-gate deleted DST restored after {:.1} ms",
        signed_ms(back.at, deleted_at)
    );
    assert_eq!(
        back.content.as_deref(),
        Some(std::fs::read(&pod.src).unwrap().as_slice())
    );
    pod.renewals(2).await;
    // Our deletion was no change of the gate's; its restoration is one.
    assert_posts_follow(pod, &[false, true, true]).await;
}

/// Waits until the file gate's log says `what`.
async fn wait_log(pod: &Pod, what: &str, timeout: Duration) {
    let deadline = Instant::now() + timeout;
    while !pod.gate.log().contains(what) {
        assert!(
            Instant::now() < deadline,
            "{}: no {what:?} within {timeout:?}\n{}",
            pod.name,
            pod.logs()
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_stuck_on_the_disk_neither_delays_a_removal_nor_lands_after_it() {
    // A disk stuck on demand: the file gate's fsyncs hang while `stall`
    // exists (a debug-build test hook; see src/client/file_gate/writer.rs).
    let stall = test_dir("fg-stuck-disk-stall").join("stall");
    let setup = Setup {
        stall: Some(&stall),
        ..Setup::default()
    };
    let (api, mut pods) = start("fg-stuck-disk", &["a"], setup).await;
    let pod = &mut pods[0];
    let old = std::fs::read(&pod.src).unwrap();
    let new = b"- targets: ['elsewhere:9100']\n".to_vec();
    pod.expect("started-leading", TIMING.lease * 2).await;
    let (n, _) = pod.dst(1, true, TIMING.lease).await;
    pod.reloads.wait_count(2, SECOND * 5).await;

    // The disk gets stuck, SRC changes: the next renewal's copy hangs in
    // its fsync.
    std::fs::write(&stall, b"").unwrap();
    replace(&pod.src, &new);
    wait_log(pod, "test hook: fsync stalled", TIMING.retry * 3 + SECOND).await;

    // Leadership ends meanwhile: DST goes at once, the write still stuck.
    api.update_lease(LEASE, |l| l["spec"]["holderIdentity"] = json!("ghost"));
    let stopped = pod.expect("stopped-leading", SECOND * 2).await;
    let (n, gone) = pod.dst(n + 1, false, TIMING.lease).await;
    assert_follows(
        "removed while a write is stuck on the disk",
        &gone,
        &stopped,
    );
    assert!(
        stall.exists() && !pod.gate.log().contains("test hook: fsync released"),
        "the write was still stuck when DST was removed\n{}",
        pod.logs()
    );
    pod.reloads.wait_count(3, SECOND * 5).await;

    // The disk comes back while the ghost still holds the lease: the write
    // that began while leading is dropped, never renamed over the removal.
    std::fs::remove_file(&stall).unwrap();
    wait_log(pod, "test hook: fsync released", SECOND * 5).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!pod.dst.exists(), "a stale write landed\n{}", pod.logs());
    assert!(pod.gate.log().contains("dropped a copy"), "{}", pod.logs());
    assert_eq!(
        pod.sampler.presence(),
        [false, true, false],
        "{:?}\n{}",
        pod.sampler.summary(),
        pod.logs()
    );

    // Leading again once the ghost's lease ran out: the current SRC.
    let again = pod.expect("started-leading", TIMING.lease * 3).await;
    let (_, back) = pod.dst(n + 1, true, TIMING.lease).await;
    assert_follows("appeared again", &back, &again);
    assert_eq!(back.content.as_ref(), Some(&new));
    let changes = pod.sampler.changes();
    assert_eq!(changes[1].content.as_ref(), Some(&old));
    let left: Vec<_> = std::fs::read_dir(pod.dst.parent().unwrap())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(left.len(), 1, "no temporary file left behind: {left:?}");
    assert_posts_follow(pod, &[false, true, false, true]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_removes_dst_and_exits_while_a_write_is_stuck_on_the_disk() {
    let stall = test_dir("fg-stuck-sigterm-stall").join("stall");
    let setup = Setup {
        stall: Some(&stall),
        ..Setup::default()
    };
    let (_api, mut pods) = start("fg-stuck-sigterm", &["a"], setup).await;
    let pod = &mut pods[0];
    pod.expect("started-leading", TIMING.lease * 2).await;
    let (n, _) = pod.dst(1, true, TIMING.lease).await;
    pod.reloads.wait_count(2, SECOND * 5).await;
    std::fs::write(&stall, b"").unwrap();
    replace(&pod.src, b"- targets: ['elsewhere:9100']\n");
    wait_log(pod, "test hook: fsync stalled", TIMING.retry * 3 + SECOND).await;

    // The disk stays stuck: the gate removes DST and exits all the same,
    // once its bounded wait for the writer (2 s) is over.
    let signalled = Instant::now();
    pod.gate.signal(libc::SIGTERM);
    let status = pod.gate.wait_exit(SECOND * 10).await;
    let exited = signed_ms(Instant::now(), signalled);
    let still_stuck = stall.exists() && !pod.gate.log().contains("test hook: fsync released");
    let _ = std::fs::remove_file(&stall);
    assert_eq!(
        status.and_then(|s| s.code()),
        Some(0),
        "exit 0 on SIGTERM with the disk stuck\n{}",
        pod.logs()
    );
    assert!(
        still_stuck,
        "the write was stuck throughout\n{}",
        pod.logs()
    );
    let (_, gone) = pod.dst(n + 1, false, SECOND).await;
    println!(
        "MEASURE file-gate SIGTERM with a stuck write: removed after {:.1} ms, exited after {exited:.1} ms",
        signed_ms(gone.at, signalled)
    );
    assert!(!pod.dst.exists());
    assert_eq!(pod.sampler.presence(), [false, true, false]);
}

/// Timings whose margin (3 s) holds a gate lag of seconds.
const SLOW: Timing = Timing {
    lease: Duration::from_secs(6),
    renew_deadline: Duration::from_secs(3),
    retry: Duration::from_secs(1),
};
const GATE_LAG: Duration = Duration::from_millis(2500);

/// A graceful release, as the fake API server saw it.
struct Release {
    /// From the sidecar's SIGTERM to the write that cleared the holder.
    after: Duration,
    at: Instant,
    /// The reload POSTs that came after the copy was loaded (the removal's
    /// and its retries).
    posts: Vec<Post>,
    gate_log: String,
}

/// Pod `a` alone and leading: a sidecar with a gate lag of [`GATE_LAG`].
async fn lone_leader(test: &str) -> (FakeApiServer, PathBuf, Sidecar) {
    let api = FakeApiServer::start("collectors", LEASE).await;
    let dir = test_dir(test);
    let lag = format!("{}ms", GATE_LAG.as_millis());
    let a = Sidecar::spawn_with(&api, &dir, "a", SLOW, &["--gate-lag", &lag]);
    a.wait_serving().await;
    a.wait_leading(SLOW.lease * 3).await;
    (api, dir, a)
}

/// Pod `a` alone, leading: a sidecar with a gate lag of [`GATE_LAG`], and a
/// file gate (with `env`) whose copy the collector loaded. `answer` then
/// sets how the reload endpoint answers from now on, and the sidecar is
/// SIGTERMed: its graceful release waits for the file gate's
/// acknowledgement, or the gate lag.
async fn release_with(
    test: &str,
    env: &[(&str, &std::path::Path)],
    answer: impl FnOnce(&Reloads),
) -> Release {
    let (api, dir, a) = lone_leader(test).await;
    let out = dir.join("conf.d");
    std::fs::create_dir_all(&out).unwrap();
    let (src, dst) = (dir.join("targets.yml"), out.join("targets.yml"));
    std::fs::write(&src, "- targets: ['cluster-metrics:9100']\n").unwrap();
    let reloads = Reloads::start_slow(&[&dst], Duration::ZERO).await;
    let gate = FileGate::spawn_env(
        &dir,
        "file-gate",
        a.gate,
        &["--reload-url", &reloads.url(RELOAD_PATH)],
        &[(&src, &dst)],
        env,
    );
    // The start-up reload, then the copy's: the gate is registered and
    // the collector loaded the copy.
    let posts = reloads.wait_count(2, SECOND * 10).await;
    assert_eq!(posts[1].existed, [true], "{posts:#?}\n{}", gate.log());
    answer(&reloads);

    let (after, at) = sigterm_until_released(&api, &a).await;
    // Retries that come after the release count too.
    tokio::time::sleep(SECOND).await;
    let gate_log = gate.log();
    println!(
        "MEASURE file-gate {test}: released {:.1} ms after SIGTERM (gate lag {GATE_LAG:?})",
        after.as_secs_f64() * 1e3
    );
    println!("file gate log:\n{gate_log}\nsidecar log:\n{}", a.log());
    Release {
        after,
        at,
        posts: reloads.posts().split_off(2),
        gate_log,
    }
}

/// Metricbeat's count of reloaded modules, back to what it was.
const BEFORE: &str = "libbeat.config.module.running <= before";

/// SIGTERMs `a`'s sidecar; how long after it, and when, its graceful
/// release cleared the holder.
async fn sigterm_until_released(api: &FakeApiServer, a: &Sidecar) -> (Duration, Instant) {
    let signalled = Instant::now();
    a.signal(libc::SIGTERM);
    let at = loop {
        let release = api
            .requests_of("a", Verb::Update)
            .into_iter()
            .find(|r| r.holder.is_none() && r.status == Some(200));
        if let Some(release) = release {
            break release.at;
        }
        assert!(
            signalled.elapsed() < SLOW.lease * 2,
            "never released\n{}",
            a.log()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    (at.saturating_duration_since(signalled), at)
}

/// Pod `a` alone, leading, with a file gate proven by a stand-in of
/// Metricbeat's `/stats` (3 modules that are not gated, one more while the
/// copy is loaded), which stops the copy `stop_after` it went, judged by
/// `condition`. With `restarted`, an earlier file gate of this pod left its
/// marker. The sidecar is SIGTERMed once the copy is loaded.
async fn release_proven_by_status(
    test: &str,
    stop_after: Option<Duration>,
    mode: StatusMode,
    condition: &str,
    restarted: bool,
) -> (Release, StatusStandIn) {
    let (api, dir, a) = lone_leader(test).await;
    let out = dir.join("modules.d");
    std::fs::create_dir_all(&out).unwrap();
    let (src, dst) = (dir.join("cluster.yml"), out.join("cluster.yml"));
    std::fs::write(&src, "- module: kubernetes\n").unwrap();
    if restarted {
        std::fs::write(leader_gate::client::file_gate::marker_path(&dst), "").unwrap();
    }
    let status = StatusStandIn::start(&dst, 3, stop_after, mode).await;
    let gate = FileGate::spawn(
        &dir,
        "file-gate",
        a.gate,
        &["--status-url", &status.url(), "--stopped-when", condition],
        &[(&src, &dst)],
    );
    let deadline = Instant::now() + SECOND * 10;
    while !status.loaded() {
        assert!(Instant::now() < deadline, "never loaded\n{}", gate.log());
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let (after, at) = sigterm_until_released(&api, &a).await;
    let gate_log = gate.log();
    println!(
        "MEASURE file-gate {test}: released {:.1} ms after SIGTERM (gate lag {GATE_LAG:?}, status reads {})",
        after.as_secs_f64() * 1e3,
        status.reads()
    );
    println!("file gate log:\n{gate_log}\nsidecar log:\n{}", a.log());
    let release = Release {
        after,
        at,
        posts: Vec::new(),
        gate_log,
    };
    (release, status)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_status_that_says_stopped_late_delays_the_acknowledgement_exactly_that_long() {
    let late = Duration::from_millis(1200);
    let (release, status) = release_proven_by_status(
        "fg-status-late",
        Some(late),
        StatusMode::Counts,
        BEFORE,
        false,
    )
    .await;
    let stopped = status
        .served_stopped()
        .expect("the status said stopped at some point");
    // Causality: not before the status said stopped; and that, not the gate
    // lag, ended the wait.
    assert!(
        release.at > stopped,
        "released {:?} before the status said stopped\n{}",
        stopped - release.at,
        release.gate_log
    );
    assert!(
        release.after >= late,
        "released {:?} after SIGTERM, before the collector stopped ({late:?})",
        release.after
    );
    assert!(
        release.after < GATE_LAG,
        "released {:?} after SIGTERM: the status's word did not end the gate lag\n{}",
        release.after,
        release.gate_log
    );
    // Read every 250 ms: the acknowledgement follows the first answer
    // that says stopped, not a later one.
    let lag = release.at - stopped;
    assert!(
        lag < Duration::from_millis(600),
        "released {lag:?} after the status said stopped"
    );
    assert!(
        release
            .gate_log
            .contains("the status said `libbeat.config.module.running <= before` after it"),
        "{}",
        release.gate_log
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_status_that_never_says_stopped_or_answers_garbage_costs_the_gate_lag() {
    for (test, stop_after, mode, condition, said) in [
        ("fg-status-never", None, StatusMode::Counts, BEFORE, None),
        (
            "fg-status-garbage",
            Some(Duration::ZERO),
            StatusMode::Garbage,
            "libbeat.config.module.running <= 3",
            Some("the status says nothing"),
        ),
    ] {
        let (release, status) =
            release_proven_by_status(test, stop_after, mode, condition, false).await;
        assert!(
            release.after >= GATE_LAG,
            "{test}: released {:?} after SIGTERM, before the gate lag, unproven",
            release.after
        );
        assert!(
            status.reads() >= 3,
            "{test}: the status was read again and again"
        );
        assert!(
            !release.gate_log.contains("told the sidecar that no copy"),
            "{test}: {}",
            release.gate_log
        );
        if let Some(said) = said {
            assert_eq!(
                release.gate_log.matches(said).count(),
                1,
                "{test}: said once per episode\n{}",
                release.gate_log
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn before_is_not_read_for_a_term_that_began_before_a_restarted_file_gate() {
    // The same pod's earlier file gate left its marker, and the term began
    // before this one subscribed: the collector may still run the earlier
    // gate's copy, so a count read now proves nothing.
    let (release, _status) = release_proven_by_status(
        "fg-status-restarted",
        Some(Duration::ZERO),
        StatusMode::Counts,
        BEFORE,
        true,
    )
    .await;
    assert!(
        release.after >= GATE_LAG,
        "released {:?} after SIGTERM on a `before` read after the copy may have loaded",
        release.after
    );
    assert!(
        release.gate_log.contains("cannot be proven stopped"),
        "{}",
        release.gate_log
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_answered_500_is_retried_and_the_release_waits_the_whole_gate_lag() {
    // Prometheus answers 500 "failed to reload config" to a reload that
    // failed: it still runs what it loaded.
    let release = release_with("fg-reload-500", &[], |reloads| {
        reloads.set_answer(500, Duration::ZERO)
    })
    .await;
    assert!(
        release.after >= GATE_LAG,
        "released {:?} after SIGTERM, before the gate lag, on the word of a file gate whose \
         collector refused every reload",
        release.after
    );
    let posts = &release.posts;
    assert!(posts.len() >= 3, "the failed reload is retried: {posts:#?}");
    assert!(
        posts
            .iter()
            .all(|p| p.existed == [false] && p.status == 500),
        "every retry with the copy still removed: {posts:#?}"
    );
    assert!(release.gate_log.contains("answered 500"));
    assert!(release.gate_log.contains("will retry in"));
    assert!(
        !release.gate_log.contains("told the sidecar that no copy"),
        "{}",
        release.gate_log
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_first_2xx_reload_after_the_removal_acknowledges_and_the_release_follows_it() {
    // Three failed reloads, then the collector reloads.
    let release = release_with("fg-reload-500-then-200", &[], |reloads| {
        reloads.fail_next(3, 500)
    })
    .await;
    let posts = &release.posts;
    let statuses: Vec<u16> = posts.iter().map(|p| p.status).collect();
    assert_eq!(
        statuses,
        [500, 500, 500, 200],
        "retried until a 2xx, then no more"
    );
    assert!(posts.iter().all(|p| p.existed == [false]), "{posts:#?}");
    // Causality: the release came after the 2xx reload arrived, and before
    // the gate lag, so the acknowledgement did it.
    assert!(
        release.at > posts[3].at,
        "released before the reload that answered 2xx arrived"
    );
    assert!(
        release.after < GATE_LAG,
        "released {:?} after SIGTERM: the acknowledgement did not end the gate lag",
        release.after
    );
    assert!(
        release.gate_log.contains("told the sidecar that no copy"),
        "{}",
        release.gate_log
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_answered_only_after_its_timeout_does_not_count() {
    // The reload's timeout cut to 400 ms (a debug-build test hook); the
    // collector answers 200, but only after 700 ms.
    let timeout = std::path::Path::new("400");
    let release = release_with(
        "fg-reload-late",
        &[("LEADER_GATE_TEST_RELOAD_TIMEOUT_MS", timeout)],
        |reloads| reloads.set_answer(200, Duration::from_millis(700)),
    )
    .await;
    assert!(
        release.after >= GATE_LAG,
        "released {:?} after SIGTERM: a reload answered after its timeout counted",
        release.after
    );
    assert!(
        release.posts.len() >= 2 && release.posts.iter().all(|p| p.existed == [false]),
        "retried, the copy still removed: {:#?}",
        release.posts
    );
    assert!(release.gate_log.contains("no answer within 400ms"));
    assert!(!release.gate_log.contains("told the sidecar that no copy"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_file_gate_killed_while_leading_tells_its_collector_at_restart_before_it_subscribes() {
    let (_api, mut pods) = start("fg-killed-reload", &["a"], Setup::default()).await;
    let pod = &mut pods[0];
    pod.expect("started-leading", TIMING.lease * 2).await;
    let (n, _) = pod.dst(1, true, TIMING.lease).await;
    pod.reloads.wait_count(2, SECOND * 5).await;

    // The gate alone is killed: its guard removes the copy and reloads
    // the collector (answered 2xx here), but the restarted gate cannot know
    // that: whatever the guard did or not, it tells the collector again.
    pod.gate.signal(libc::SIGKILL);
    pod.gate.wait_exit(SECOND * 5).await.expect("killed");
    let (n, _) = pod.dst(n + 1, false, SECOND).await;
    let posts = pod.reloads.wait_count(3, SECOND * 2).await;
    assert_eq!(posts[2].existed, [false], "the guard's reload: {posts:#?}");
    // The sidecar drops the dead gate's stream at its next event.
    wait_subscribers(&pod.sidecar, 1).await;

    // Restarted while the collector refuses reloads for a while.
    pod.reloads.set_answer(500, Duration::ZERO);
    pod.gate = pod.spawn_gate("a-file-gate-2", &pod.reloads);
    let posts = pod.reloads.wait_count(4, SECOND * 10).await;
    assert_eq!(
        posts[3].existed,
        [false],
        "the first thing the restarted gate does is tell the collector that no copy is \
         there: {posts:#?}\n{}",
        pod.logs()
    );
    // Retried; until one is answered 2xx, it does not subscribe.
    pod.reloads.wait_count(6, SECOND * 5).await;
    assert_eq!(
        subscribers(&pod.sidecar).await,
        Some(1),
        "only the test's own stream while the start-up reload fails\n{}",
        pod.logs()
    );
    let accepted = Instant::now();
    pod.reloads.set_answer(200, Duration::ZERO);
    wait_subscribers(&pod.sidecar, 2).await;
    // Then it leads again: the copy is back, and loaded.
    let (_, back) = pod.dst(n + 1, true, TIMING.lease).await;
    assert!(back.at > accepted);
    let posts = pod.reloads.posts();
    let first_2xx = posts
        .iter()
        .position(|p| p.status == 200 && p.at > accepted);
    assert!(
        first_2xx.is_some_and(|i| posts[i].existed == [false]),
        "the start-up reload answered 2xx with the copy absent: {posts:#?}"
    );
    let last = posts.last().unwrap();
    assert!(last.existed == [true] && last.status == 200, "{posts:#?}");
    assert!(posts[3..].iter().all(|p| p.at > posts[2].at));
}

/// A file gate that cannot put its copy in place at all (here its SRC is
/// missing, a ConfigMap key mistyped; as well a read-only or full volume)
/// gives the term up after three tries: it removes what it can,
/// acknowledges the term once a reload after that answers 2xx, and exits
/// 73 — the kubelet restarts it, and its leader, told that nothing of the
/// term runs, hands the Lease over within `--collector-not-running-after`
/// to a peer whose copy lands. Before, the gate stayed registered as
/// running and the leader kept the Lease while no collector did the work.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_file_gate_that_cannot_write_its_copy_gives_the_term_up_and_the_leader_hands_over() {
    let timing = Timing::GATES;
    let api = FakeApiServer::start("collectors", LEASE).await;
    let dir = test_dir("file-gate-cannot-write");
    let src = dir.join("cluster.yml");
    std::fs::write(&src, b"- targets: ['cluster-metrics:9100']\n").unwrap();
    let flags = ["--collector-not-running-after", "2s"];
    let a = Sidecar::spawn_with(&api, &dir, "a", timing, &flags);
    a.wait_serving().await;
    let term = a.wait_term(timing.lease * 2).await;
    let mut stream = EventClient::connect(a.gate, None).await;
    let missing = dir.join("no-such-source.yml");
    let a_dst = dir.join("a-cluster.yml");
    let a_reloads = Reloads::start_slow(&[&a_dst], Duration::ZERO).await;
    let a_url = a_reloads.url(RELOAD_PATH);
    // The kubelet's restarts of a's file gate (0.5 s, doubling, as
    // CrashLoopBackOff's scaled down); the exit codes seen.
    let kubelet = {
        let (dir, missing, a_dst, gate) = (dir.clone(), missing.clone(), a_dst.clone(), a.gate);
        Kubelet::start(Duration::from_millis(500), SECOND * 4, move |restart| {
            let (dir, missing, a_dst, a_url) =
                (dir.clone(), missing.clone(), a_dst.clone(), a_url.clone());
            async move {
                let mut gate = FileGate::spawn(
                    &dir,
                    &format!("gate-a-{restart}"),
                    gate,
                    &["--reload-url", &a_url],
                    &[(&missing, &a_dst)],
                );
                let status = gate.wait_exit(SECOND * 3600).await?;
                Some(status.code().unwrap_or(-1))
            }
        })
    };
    // b: a peer whose copy can land.
    let b = Sidecar::spawn_with(&api, &dir, "b", timing, &flags);
    b.wait_serving().await;
    let b_dst = dir.join("b-cluster.yml");
    let b_reloads = Reloads::start_slow(&[&b_dst], Duration::ZERO).await;
    let _b_gate = FileGate::spawn(
        &dir,
        "gate-b",
        b.gate,
        &["--reload-url", &b_reloads.url(RELOAD_PATH)],
        &[(&src, &b_dst)],
    );

    let stopped = stream.next_of("stopped-leading", SECOND * 30).await;
    let seen = kubelet.exits();
    let first = std::fs::read_to_string(dir.join("gate-a-0.log")).unwrap_or_default();
    println!("a led term {term}; its file gate exited {seen:?}\ngate-a-0 said:\n{first}");
    let stopped = stopped.unwrap_or_else(|| {
        panic!(
            "a kept the Lease while its file gate could not write (exits {seen:?})\n{}",
            a.log()
        )
    });
    assert_eq!(stopped.data["reason"], "collector-not-running");
    assert!(
        !seen.is_empty() && seen.iter().all(|&code| code == 73),
        "{seen:?}"
    );
    assert!(first.contains("cannot read"), "{first}");
    assert!(first.contains("giving the term up"), "{first}");
    assert!(!a_dst.exists());
    assert!(
        first.contains(&format!(
            "told the sidecar that no copy of term {term} is left"
        )),
        "{first}"
    );
    // The work goes on at b.
    let deadline = Instant::now() + timing.lease * 3;
    while Instant::now() < deadline && !b_dst.exists() {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(b_dst.exists(), "b's copy never landed\n{}", b.log());
    drop(kubelet);
}

/// Without `--reload-url` the sidecar could not hear that a term was given
/// up (the gate never acknowledges), so a gate whose SRC is missing keeps
/// trying instead of exiting: a SRC that comes late still lands.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_file_gate_without_a_reload_url_keeps_trying_a_copy_it_cannot_write() {
    let timing = Timing::GATES;
    let api = FakeApiServer::start("collectors", LEASE).await;
    let dir = test_dir("file-gate-keeps-trying");
    let a = Sidecar::spawn(&api, &dir, "a", timing);
    a.wait_serving().await;
    a.wait_term(timing.lease * 2).await;
    let src = dir.join("late.yml");
    let dst = dir.join("cluster.yml");
    let mut gate = FileGate::spawn(&dir, "gate", a.gate, &[], &[(&src, &dst)]);
    // Five renewals, each a failed try, and more than the three that make
    // a gate with a reload URL give the term up.
    tokio::time::sleep(timing.retry * 5).await;
    assert!(gate.log().contains("cannot read"), "{}", gate.log());
    assert_eq!(gate.wait_exit(Duration::ZERO).await, None, "{}", gate.log());
    std::fs::write(&src, b"- targets: ['late:9100']\n").unwrap();
    let deadline = Instant::now() + timing.retry * 4;
    while !dst.exists() {
        assert!(
            Instant::now() < deadline,
            "the late SRC never landed\n{}",
            gate.log()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
