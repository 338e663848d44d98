//! The election, end to end: real `leader-gate` processes against the fake
//! Lease API server (real HTTP, real time), one scenario per test.
//!
//! Mechanisms are proven by causality from the fake's request log and the
//! monitor's timestamps, not by speed; every scenario also runs the overlap
//! monitor, which fails the test if two instances ever led at once.

use crate::support;

use std::time::{Duration, Instant};

use serde_json::{Value, json};
use support::fake_apiserver::{FakeApiServer, Fault, FaultKind, RequestRecord, Verb, lease_holder};
use support::monitor::{Monitor, Sample, assert_no_overlap};
use support::sidecar::{Probe, Sidecar, Timing, test_dir};

const NAMESPACE: &str = "collectors";
const LEASE: &str = "cluster-metrics";

/// Candidates, the API server they talk to, and the monitor watching them.
struct Cluster {
    api: FakeApiServer,
    sidecars: Vec<Sidecar>,
    monitor: Monitor,
    timing: Timing,
}

impl Cluster {
    async fn start(test: &str, names: &[&str], timing: Timing) -> Cluster {
        let api = FakeApiServer::start(NAMESPACE, LEASE).await;
        Self::start_with(api, test, names, timing).await
    }

    async fn start_with(api: FakeApiServer, test: &str, names: &[&str], timing: Timing) -> Cluster {
        Self::start_extra(api, test, names, timing, &[]).await
    }

    async fn start_extra(
        api: FakeApiServer,
        test: &str,
        names: &[&str],
        timing: Timing,
        extra: &[&str],
    ) -> Cluster {
        let dir = test_dir(test);
        let sidecars = Sidecar::spawn_serving(&api, &dir, names, timing, extra).await;
        let monitor = Monitor::start(&sidecars.iter().collect::<Vec<_>>());
        Cluster {
            api,
            sidecars,
            monitor,
            timing,
        }
    }

    fn sidecar(&self, name: &str) -> &Sidecar {
        self.sidecars
            .iter()
            .find(|s| s.name == name)
            .expect("known sidecar")
    }

    fn sidecar_mut(&mut self, name: &str) -> &mut Sidecar {
        self.sidecars
            .iter_mut()
            .find(|s| s.name == name)
            .expect("known sidecar")
    }

    /// Waits until some candidate answers 200; returns its name and answer.
    async fn wait_leader(&self, timeout: Duration) -> (String, Probe) {
        self.wait_leader_other_than("", timeout).await
    }

    /// Waits until a candidate other than `old` answers 200.
    async fn wait_leader_other_than(&self, old: &str, timeout: Duration) -> (String, Probe) {
        let deadline = Instant::now() + timeout;
        loop {
            for sidecar in self.sidecars.iter().filter(|s| s.name != old) {
                if let Some(probe) = sidecar.leader().await
                    && probe.leading()
                {
                    return (sidecar.name.clone(), probe);
                }
            }
            if Instant::now() > deadline {
                panic!("nobody led within {timeout:?}\n{}", self.logs());
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    fn requests(&self, client: &str) -> Vec<RequestRecord> {
        self.api
            .requests()
            .into_iter()
            .filter(|r| r.client == client)
            .collect()
    }

    /// Successful writes (acquisitions and renews) of `client`.
    fn writes(&self, client: &str) -> Vec<RequestRecord> {
        self.requests(client)
            .into_iter()
            .filter(|r| {
                matches!(r.verb, Verb::Update | Verb::Create) && matches!(r.status, Some(200 | 201))
            })
            .collect()
    }

    /// Successful writes of `client` that name it the holder: its
    /// acquisitions and renews, not its claims of the successor slot.
    fn holder_writes(&self, client: &str) -> Vec<RequestRecord> {
        self.writes(client)
            .into_iter()
            .filter(|w| w.holder.as_deref() == Some(client))
            .collect()
    }

    /// Waits until `client` has written successfully once more, then returns that write.
    async fn next_write(&self, client: &str) -> RequestRecord {
        let seen = self.writes(client).len();
        let deadline = Instant::now() + self.timing.lease * 2;
        loop {
            let writes = self.writes(client);
            if writes.len() > seen {
                return writes[seen].clone();
            }
            assert!(
                Instant::now() < deadline,
                "{client} stopped writing\n{}",
                self.logs()
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    fn lease(&self) -> Value {
        self.api.lease(LEASE).expect("the lease exists")
    }

    fn edit(&self, edit: impl FnOnce(&mut Value)) -> Instant {
        self.api.update_lease(LEASE, edit);
        Instant::now()
    }

    fn logs(&self) -> String {
        self.sidecars
            .iter()
            .map(|s| format!("--- {} ---\n{}", s.name, tail(&s.log(), 40)))
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// After the record changed at `changed` (an edit, a delete), no new
    /// term may lead before one lease duration has passed: not a peer, and
    /// not the old leader either (`old_term` is the one it held).
    fn assert_no_new_term_before_expiry(&self, changed: Instant, old_term: &str) {
        let early = self.monitor.samples().into_iter().find(|s| {
            s.leading()
                && s.term.as_deref() != Some(old_term)
                && s.received < changed + self.timing.lease
        });
        assert!(
            early.is_none(),
            "a new term led before the record expired: {early:?}"
        );
    }

    /// The end of every scenario: nobody ever overlapped.
    fn assert_no_overlap(&self) {
        assert_no_overlap(&self.monitor.samples());
    }
}

fn tail(text: &str, lines: usize) -> String {
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

fn others<'a>(names: &'a [&'a str], leader: &str) -> Vec<&'a str> {
    names.iter().copied().filter(|n| *n != leader).collect()
}

const ABC: &[&str] = &["a", "b", "c"];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_candidates_elect_exactly_one_leader_and_the_others_name_it() {
    let cluster = Cluster::start("three", ABC, Timing::FAST).await;
    let started = Instant::now();
    let (leader, probe) = cluster.wait_leader(Timing::FAST.lease).await;
    assert!(started.elapsed() <= Timing::FAST.lease);
    assert_eq!(probe.holder(), Some(leader.as_str()));
    for follower in others(ABC, &leader) {
        let seen = cluster
            .sidecar(follower)
            .wait_for(Duration::from_secs(2), |p| {
                p.holder() == Some(leader.as_str())
            })
            .await;
        assert_eq!(seen.status, 503);
        assert_eq!(seen.body["leading"], false);
    }
    tokio::time::sleep(Duration::from_secs(3)).await;
    let leaders: Vec<_> = cluster
        .monitor
        .samples()
        .into_iter()
        .filter(|s| s.received > started + Duration::from_secs(1) && s.leading())
        .map(|s| s.instance)
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .collect();
    assert_eq!(
        leaders,
        vec![leader.clone()],
        "exactly one instance ever led"
    );
    assert_eq!(
        lease_holder(&cluster.lease()).as_deref(),
        Some(leader.as_str())
    );
    cluster.assert_no_overlap();
}

/// The seed scenario: an operator names a holder that no candidate is.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_external_holder_edit_stops_the_leader_through_the_watch_and_nobody_leads_for_a_duration()
 {
    // A long retry period: the leader writes only every 4 s, so a 503 right
    // after the edit can only come from the watch.
    let timing = Timing {
        lease: Duration::from_secs(8),
        renew_deadline: Duration::from_secs(6),
        retry: Duration::from_secs(4),
    };
    let cluster = Cluster::start("seed-ghost", ABC, timing).await;
    let (leader, probe) = cluster.wait_leader(timing.lease).await;
    cluster.next_write(&leader).await;
    tokio::time::sleep(Duration::from_millis(200)).await;

    let edited = cluster.edit(|l| l["spec"]["holderIdentity"] = json!("ghost"));
    let stopped = cluster
        .sidecar(&leader)
        .wait_for(Duration::from_secs(2), |p| !p.leading())
        .await;
    let stopped_at = Instant::now();
    assert_eq!(stopped.body["last_stop_reason"], "lost-to-other-holder");
    // Causality: no request from the old leader between the edit and its 503.
    let between: Vec<_> = cluster
        .requests(&leader)
        .into_iter()
        .filter(|r| r.at >= edited && r.at <= stopped_at && r.verb != Verb::Watch)
        .collect();
    assert!(
        between.is_empty(),
        "the watch, not a request, ended the term: {between:?}"
    );
    tokio::time::sleep(Duration::from_millis(200)).await; // let the monitor sample
    let first_503 = cluster
        .monitor
        .first(&leader, edited, |s| !s.leading())
        .unwrap();
    eprintln!(
        "MEASURE edit-to-503: {:?}",
        first_503.received.saturating_duration_since(edited)
    );

    // Nobody leads until one lease duration after the edit; then someone does.
    let (next, _) = cluster.wait_leader(timing.lease * 2).await;
    cluster.assert_no_new_term_before_expiry(edited, probe.term().unwrap());
    let acquired = cluster
        .holder_writes(&next)
        .into_iter()
        .find(|w| w.at > edited)
        .unwrap();
    assert!(acquired.at >= edited + timing.lease);
    cluster.assert_no_overlap();
}

/// The seed's test with a live peer: holderIdentity names another running candidate.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_edit_naming_a_live_peer_never_gives_two_leaders() {
    let timing = Timing::FAST;
    let cluster = Cluster::start("seed-peer", ABC, timing).await;
    let (leader, probe) = cluster.wait_leader(timing.lease).await;
    let peer = others(ABC, &leader)[0];
    cluster.next_write(&leader).await;

    let edited = cluster.edit(|l| l["spec"]["holderIdentity"] = json!(peer));
    cluster
        .sidecar(&leader)
        .wait_for(Duration::from_secs(2), |p| !p.leading())
        .await;
    // The named peer did not write that record: it is not its lease (G7).
    cluster.wait_leader(timing.lease * 2).await;
    cluster.assert_no_new_term_before_expiry(edited, probe.term().unwrap());
    cluster.assert_no_overlap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_renew_response_does_not_cost_the_lease() {
    let timing = Timing::FAST;
    let cluster = Cluster::start("lost-response", &["a", "b"], timing).await;
    let (leader, probe) = cluster.wait_leader(timing.lease).await;
    let term = probe.term().unwrap().to_owned();

    // Every renew commits, but its response is cut off — for longer than the
    // renew deadline.
    let from = Instant::now();
    cluster
        .api
        .set_fault(&leader, Fault::on(&[Verb::Update], FaultKind::DropResponse));
    tokio::time::sleep(timing.renew_deadline + Duration::from_secs(2)).await;
    cluster.api.clear_faults(&leader);
    tokio::time::sleep(Duration::from_secs(1)).await;

    let dropped = cluster
        .requests(&leader)
        .into_iter()
        .filter(|r| r.at > from && r.verb == Verb::Update && r.status.is_none())
        .count();
    assert!(
        dropped >= 3,
        "renews were answered with a cut-off response ({dropped})"
    );
    let samples = cluster.monitor.samples_of(&leader);
    let lost: Vec<&Sample> = samples
        .iter()
        .filter(|s| s.sent > from && !s.leading())
        .collect();
    assert!(
        lost.is_empty(),
        "the leader stopped leading: {:?}\n{}",
        lost.first(),
        cluster.logs()
    );
    let now = cluster.sidecar(&leader).leader().await.unwrap();
    assert_eq!(now.term(), Some(term.as_str()), "no transition");
    cluster.assert_no_overlap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_label_edit_on_the_held_lease_keeps_the_leader_and_the_metadata() {
    let timing = Timing::FAST;
    let cluster = Cluster::start("label-edit", &["a", "b"], timing).await;
    let (leader, probe) = cluster.wait_leader(timing.lease).await;
    let edited = cluster.edit(|l| {
        l["metadata"]["labels"] = json!({"team": "sre"});
        l["metadata"]["annotations"] = json!({"owner": "gitops"});
    });
    for _ in 0..3 {
        cluster.next_write(&leader).await;
    }
    let samples = cluster.monitor.samples_of(&leader);
    assert!(
        samples
            .iter()
            .filter(|s| s.sent > edited)
            .all(Sample::leading)
    );
    let now = cluster.sidecar(&leader).leader().await.unwrap();
    assert_eq!(now.term(), probe.term(), "no transition");
    let lease = cluster.lease();
    assert_eq!(
        lease["metadata"]["labels"]["team"], "sre",
        "renews keep labels"
    );
    assert_eq!(
        lease["metadata"]["annotations"]["owner"], "gitops",
        "renews keep annotations"
    );
    cluster.assert_no_overlap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_cleared_without_the_release_mark_counts_as_held_for_a_duration() {
    let timing = Timing::FAST;
    let cluster = Cluster::start("cleared", ABC, timing).await;
    let (leader, probe) = cluster.wait_leader(timing.lease).await;
    let edited = cluster.edit(|l| {
        l["spec"].as_object_mut().unwrap().remove("holderIdentity");
    });
    let stopped = cluster
        .sidecar(&leader)
        .wait_for(Duration::from_secs(1), |p| !p.leading())
        .await;
    assert_eq!(stopped.body["last_stop_reason"], "holder-cleared");
    cluster.wait_leader(timing.lease * 2).await;
    cluster.assert_no_new_term_before_expiry(edited, probe.term().unwrap());
    cluster.assert_no_overlap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_lease_stops_the_leader_and_is_recreated_after_a_duration() {
    let timing = Timing::FAST;
    let cluster = Cluster::start("deleted", ABC, timing).await;
    let (leader, probe) = cluster.wait_leader(timing.lease).await;
    // A deleted Lease counts as held by the last holder *observed*: a
    // candidate that never saw this one (its create in flight across the
    // deletion) cannot know better. So delete once everyone names it.
    for name in ABC {
        cluster
            .sidecar(name)
            .wait_for(timing.lease, |p| p.holder() == Some(leader.as_str()))
            .await;
    }
    let old_uid = cluster.lease()["metadata"]["uid"].clone();
    cluster.api.delete_lease(LEASE);
    let deleted = Instant::now();
    let stopped = cluster
        .sidecar(&leader)
        .wait_for(Duration::from_secs(1), |p| !p.leading())
        .await;
    assert_eq!(stopped.body["last_stop_reason"], "lease-deleted");
    let (next, _) = cluster.wait_leader(timing.lease * 2).await;
    cluster.assert_no_new_term_before_expiry(deleted, probe.term().unwrap());
    let lease = cluster.lease();
    assert_ne!(lease["metadata"]["uid"], old_uid, "recreated");
    assert_eq!(lease_holder(&lease).as_deref(), Some(next.as_str()));
    cluster.assert_no_overlap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forbidden_renew_steps_down_at_once_says_why_once_and_recovers() {
    // A long renew deadline: stepping down within a second can only be the 403.
    let timing = Timing {
        lease: Duration::from_secs(12),
        renew_deadline: Duration::from_secs(10),
        retry: Duration::from_millis(800),
    };
    let cluster = Cluster::start("forbidden", &["a"], timing).await;
    cluster.wait_leader(timing.lease).await;
    cluster
        .api
        .set_fault("a", Fault::on(&[Verb::Update], FaultKind::Status(403)));
    let stopped = cluster
        .sidecar("a")
        .wait_for(Duration::from_secs(3), |p| !p.leading())
        .await;
    assert_eq!(stopped.body["last_stop_reason"], "forbidden");
    let first_403 = cluster
        .requests("a")
        .into_iter()
        .find(|r| r.status == Some(403))
        .expect("a 403 was answered");
    tokio::time::sleep(Duration::from_millis(200)).await; // let the monitor sample
    let first_503 = cluster
        .monitor
        .first("a", first_403.at, |s| !s.leading())
        .unwrap();
    assert!(first_503.received - first_403.at < Duration::from_secs(1));

    // It keeps trying (with backoff) while forbidden, and says so only once.
    tokio::time::sleep(timing.lease + Duration::from_secs(2)).await;
    let denied = cluster
        .requests("a")
        .into_iter()
        .filter(|r| r.status == Some(403))
        .count();
    assert!(denied >= 2, "retries while forbidden ({denied})");
    let log = cluster.sidecar("a").log();
    let explained: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("WARN") && l.contains("forbidden (403)"))
        .collect();
    assert_eq!(explained.len(), 1, "one explanation per episode:\n{log}");
    let line = explained[0];
    for words in [
        "system:serviceaccount:collectors:a may not update leases.coordination.k8s.io",
        "in namespace collectors",
    ] {
        assert!(line.contains(words), "{line}");
    }

    cluster.api.clear_faults("a");
    cluster.sidecar("a").wait_leading(timing.lease * 2).await;
    cluster.assert_no_overlap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hanging_requests_end_the_term_by_the_renew_deadline_and_it_leads_again_after() {
    let timing = Timing::FAST;
    let cluster = Cluster::start("hang", &["a"], timing).await;
    cluster.wait_leader(timing.lease).await;
    cluster.next_write("a").await;
    cluster
        .api
        .set_fault("a", Fault::on(&[Verb::Update], FaultKind::Hang));
    cluster
        .sidecar("a")
        .wait_for(timing.lease, |p| !p.leading())
        .await;
    let last_ok = cluster.writes("a").pop().unwrap();
    let deadline = last_ok.at + timing.renew_deadline;
    let late: Vec<Sample> = cluster
        .monitor
        .samples_of("a")
        .into_iter()
        .filter(|s| s.leading() && s.sent > deadline)
        .collect();
    assert!(
        late.is_empty(),
        "200 after the renew deadline: {:?}",
        late.first()
    );
    let stopped = cluster.sidecar("a").leader().await.unwrap();
    assert_eq!(stopped.body["last_stop_reason"], "api-unreachable");

    cluster.api.clear_faults("a");
    cluster.sidecar("a").wait_leading(timing.lease * 3).await;
    cluster.assert_no_overlap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_instance_loses_and_regains_the_lease_twenty_times() {
    let timing = Timing {
        lease: Duration::from_secs(2),
        renew_deadline: Duration::from_millis(1500),
        retry: Duration::from_millis(500),
    };
    let cluster = Cluster::start("re-election", &["a"], timing).await;
    let mut terms = std::collections::HashSet::new();
    for round in 0..21 {
        let probe = cluster.sidecar("a").wait_leading(timing.lease * 4).await;
        assert!(
            terms.insert(probe.term().unwrap().to_owned()),
            "a new term every time"
        );
        // End the term a different way each round.
        match round % 3 {
            0 => {
                cluster.edit(|l| l["spec"]["holderIdentity"] = json!("ghost"));
            }
            1 => {
                cluster.api.delete_lease(LEASE);
            }
            _ => cluster
                .api
                .set_fault("a", Fault::on(&[Verb::Update], FaultKind::Status(403))),
        }
        cluster
            .sidecar("a")
            .wait_for(timing.lease * 2, |p| !p.leading())
            .await;
        cluster.api.clear_faults("a");
    }
    cluster.sidecar("a").wait_leading(timing.lease * 4).await;
    assert!(terms.len() >= 21);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_releases_and_a_watching_peer_takes_over_without_waiting() {
    // Long lease and retry, so that the bound below has margin both ways.
    // A takeover within TAKEOVER can only be the watch seeing the marked
    // release: without it the peer waits for the expiry of the last renew
    // it saw, at least lease − retry = 10 s after the release (a whole
    // lease for a release without the mark). And it is "at once": the
    // acquisition spread, were it added to a marked release, would be
    // uniform over 0–7 s (half a retry), beyond TAKEOVER 6 times in 7.
    // TAKEOVER leaves a loaded 2-core machine a second to deliver one
    // watch event and schedule the peer (a few ms when idle).
    const TAKEOVER: Duration = Duration::from_secs(1);
    let timing = Timing {
        lease: Duration::from_secs(24),
        renew_deadline: Duration::from_secs(18),
        retry: Duration::from_secs(14),
    };
    // Claims within [retry, 16 s] = [14 s, 16 s] of the term's start: a
    // watching peer is the named successor before the SIGTERM (a release
    // naming nobody is spread, issue 13).
    let api = FakeApiServer::start(NAMESPACE, LEASE).await;
    let extra = ["--successor-claim-window", "16s"];
    let mut cluster = Cluster::start_extra(api, "sigterm", ABC, timing, &extra).await;
    let (leader, _) = cluster.wait_leader(timing.lease).await;
    let named = Instant::now() + timing.lease;
    while cluster.lease()["metadata"]["annotations"]["leader-gate.dev/successor"].is_null() {
        assert!(Instant::now() < named, "no successor named");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    cluster.next_write(&leader).await;
    let signalled = Instant::now();
    cluster.sidecar(&leader).signal(libc::SIGTERM);
    let status = cluster
        .sidecar_mut(&leader)
        .wait_exit(Duration::from_secs(10))
        .await;
    assert_eq!(status.and_then(|s| s.code()), Some(0), "clean exit");
    let (next, _) = cluster
        .wait_leader_other_than(&leader, Duration::from_secs(5))
        .await;
    tokio::time::sleep(Duration::from_millis(200)).await; // let the monitor sample
    let took = cluster
        .monitor
        .first(&next, signalled, Sample::leading)
        .unwrap();
    eprintln!(
        "MEASURE sigterm-to-new-leader: {:?}",
        took.received - signalled
    );

    let release = cluster
        .writes(&leader)
        .into_iter()
        .rfind(|w| w.at > signalled)
        .expect("the old leader released");
    let acquire = cluster
        .holder_writes(&next)
        .into_iter()
        .find(|w| w.at > signalled)
        .unwrap();
    assert!(acquire.at > release.at);
    eprintln!(
        "MEASURE sigterm release-to-acquire: {:?}",
        acquire.at - release.at
    );
    // At once (a marked release is free: no acquisition spread), and with
    // no read in between: the watch told it.
    assert!(
        acquire.at - release.at <= TAKEOVER,
        "{:?}",
        acquire.at - release.at
    );
    let reads: Vec<_> = cluster
        .requests(&next)
        .into_iter()
        .filter(|r| r.at > release.at && r.at < acquire.at && r.verb != Verb::Watch)
        .collect();
    assert!(reads.is_empty(), "{reads:?}");
    assert!(
        cluster
            .sidecar(&leader)
            .log()
            .contains("released the lease")
    );
    cluster.assert_no_overlap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_sigkill_of_the_leader_another_leads_once_the_lease_expired_not_before() {
    let timing = Timing::FAST;
    let mut cluster = Cluster::start("sigkill", ABC, timing).await;
    let (leader, _) = cluster.wait_leader(timing.lease).await;
    cluster.sidecar(&leader).signal(libc::SIGKILL);
    cluster
        .sidecar_mut(&leader)
        .wait_exit(Duration::from_secs(5))
        .await
        .unwrap();
    let last_renew = cluster.writes(&leader).pop().unwrap();
    let (next, _) = cluster.wait_leader(timing.lease * 2).await;
    let acquire = cluster
        .holder_writes(&next)
        .into_iter()
        .find(|w| w.at > last_renew.at)
        .unwrap();
    assert!(
        acquire.at >= last_renew.at + timing.lease,
        "took over {:?} after the last renew",
        acquire.at - last_renew.at
    );
    cluster.assert_no_overlap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_candidate_started_without_an_api_server_serves_and_leads_once_it_appears() {
    let api = FakeApiServer::new_offline(NAMESPACE, LEASE);
    let cluster = Cluster::start_with(api, "no-apiserver", &["a"], Timing::FAST).await;
    let sidecar = cluster.sidecar("a");
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(sidecar.leader().await.unwrap().status, 503);
    assert_eq!(sidecar.admin_get("/healthz").await.unwrap().status, 200);
    assert_eq!(sidecar.admin_get("/readyz").await.unwrap().status, 503);
    assert_eq!(sidecar.admin_get("/leader").await.unwrap().status, 503);
    // Several failed watch attempts (backoff from 0.8 s): said once, loudly.
    tokio::time::sleep(Duration::from_secs(4)).await;
    let warned = |log: &str| {
        log.lines()
            .filter(|l| {
                l.contains("WARN")
                    && l.contains("cannot reach the API server at")
                    && l.contains("for watch requests")
            })
            .count()
    };
    assert_eq!(warned(&sidecar.log()), 1, "log:\n{}", sidecar.log());
    cluster.api.restart().await;
    sidecar.wait_leading(Duration::from_secs(40)).await;
    assert_eq!(sidecar.admin_get("/readyz").await.unwrap().status, 200);
    assert_eq!(warned(&sidecar.log()), 1);
    assert!(
        sidecar.log().contains("lease API call succeeds again"),
        "the end of the episode is said too"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partitioned_leader_steps_down_by_its_deadline_and_a_peer_takes_over_after_expiry() {
    let timing = Timing::FAST;
    let cluster = Cluster::start("partition", ABC, timing).await;
    let (leader, _) = cluster.wait_leader(timing.lease).await;
    cluster.next_write(&leader).await;
    cluster
        .api
        .set_fault(&leader, Fault::all(FaultKind::Partition));
    let (next, _) = cluster
        .wait_leader_other_than(&leader, timing.lease * 3)
        .await;
    let last_ok = cluster.writes(&leader).pop().unwrap();
    let late = cluster
        .monitor
        .samples_of(&leader)
        .into_iter()
        .find(|s| s.leading() && s.sent > last_ok.at + timing.renew_deadline);
    assert!(late.is_none(), "200 after the renew deadline: {late:?}");
    let acquire = cluster
        .holder_writes(&next)
        .into_iter()
        .find(|w| w.at > last_ok.at)
        .unwrap();
    assert!(acquire.at >= last_ok.at + timing.lease);
    let stopped = cluster.sidecar(&leader).leader().await.unwrap();
    assert_eq!(stopped.body["last_stop_reason"], "api-unreachable");
    // Healed, the old leader follows the new one.
    cluster.api.clear_faults(&leader);
    cluster
        .sidecar(&leader)
        .wait_for(timing.lease * 2, |p| p.holder() == Some(next.as_str()))
        .await;
    cluster.assert_no_overlap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_of_429s_wedges_nothing() {
    let timing = Timing::FAST;
    let cluster = Cluster::start("throttle", &["a", "b"], timing).await;
    let (leader, _) = cluster.wait_leader(timing.lease).await;
    cluster.next_write(&leader).await;
    let throttled = FaultKind::TooManyRequests {
        retry_after: timing.retry,
    };
    let burst = Instant::now();
    for name in ["a", "b"] {
        cluster.api.set_fault(name, Fault::all(throttled.clone()));
    }
    // Past the leader's renew deadline: every renew of the term is throttled.
    tokio::time::sleep(timing.renew_deadline + timing.retry).await;
    let healed = Instant::now();
    for name in ["a", "b"] {
        cluster.api.clear_faults(name);
    }

    // Pacing, from the fake's log: each candidate honours Retry-After, so
    // its writes are a retry period apart, except for one "last chance"
    // try of the leader before its deadline — no burst of PUTs.
    let window = healed - burst;
    for name in ["a", "b"] {
        let writes: Vec<Instant> = cluster
            .requests(name)
            .into_iter()
            .filter(|r| matches!(r.verb, Verb::Update | Verb::Create))
            .filter(|r| r.at > burst && r.at < healed)
            .map(|r| r.at)
            .collect();
        let quick = writes
            .windows(2)
            .filter(|w| w[1] - w[0] < timing.retry.mul_f64(0.8))
            .count();
        let allowed = (window.as_secs_f64() / timing.retry.as_secs_f64()).ceil() as usize + 1;
        let offsets: Vec<Duration> = writes.iter().map(|at| *at - burst).collect();
        assert!(
            quick <= 1 && writes.len() <= allowed,
            "{name} wrote in a burst while throttled: {offsets:?}\n{}",
            cluster.logs()
        );
    }
    let leader_throttled = cluster
        .requests(&leader)
        .into_iter()
        .filter(|r| r.at > burst && r.status == Some(429))
        .filter(|r| matches!(r.verb, Verb::Update))
        .count();
    assert!(
        leader_throttled >= 2,
        "the leader kept renewing while throttled: {leader_throttled}"
    );
    // And it stopped leading by its deadline: no 200 after the last renew
    // that went through plus the renew deadline.
    let last_ok = cluster
        .writes(&leader)
        .into_iter()
        .rfind(|w| w.at < healed)
        .expect("the leader renewed before the burst");
    let late = cluster
        .monitor
        .samples_of(&leader)
        .into_iter()
        .find(|s| s.leading() && s.sent > last_ok.at + timing.renew_deadline);
    assert!(late.is_none(), "200 after the renew deadline: {late:?}");

    // Healed, someone leads again and every loop is alive.
    cluster.wait_leader(timing.lease * 3).await;
    for sidecar in &cluster.sidecars {
        assert_eq!(sidecar.admin_get("/healthz").await.unwrap().status, 200);
    }
    cluster.assert_no_overlap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rotated_credentials_are_reloaded_without_losing_the_lease() {
    let timing = Timing::FAST;
    let cluster = Cluster::start("rotate", &["a", "b"], timing).await;
    let (leader, probe) = cluster.wait_leader(timing.lease).await;
    cluster.next_write(&leader).await;
    // The token file gets a new token, and the API server refuses the old
    // one at once; kube-rs would keep using its cached token for a minute.
    let rotated = Instant::now();
    cluster.api.rotate_token(&leader);
    tokio::time::sleep(timing.lease).await;

    let refused = cluster
        .api
        .requests()
        .into_iter()
        .filter(|r| r.at > rotated && r.status == Some(401))
        .count();
    assert!(refused >= 1, "the old token was refused");
    let renewed = cluster
        .requests(&leader)
        .into_iter()
        .filter(|r| r.at > rotated && r.verb == Verb::Update && r.status == Some(200))
        .count();
    assert!(
        renewed >= 2,
        "renews succeed with the new token\n{}",
        cluster.logs()
    );
    assert!(
        cluster
            .sidecar(&leader)
            .log()
            .contains("reloaded API credentials")
    );
    let lost = cluster.monitor.first(&leader, rotated, |s| !s.leading());
    assert!(
        lost.is_none(),
        "the leader lost the lease: {lost:?}\n{}",
        cluster.logs()
    );
    let now = cluster.sidecar(&leader).leader().await.unwrap();
    assert_eq!(now.term(), probe.term(), "no transition");
    cluster.assert_no_overlap();
}

/// The monitor itself: a check that could not fail would prove nothing.
#[test]
fn the_overlap_monitor_flags_an_old_leader_answering_after_a_new_one() {
    let t0 = Instant::now();
    let ms = |n: u64| t0 + Duration::from_millis(n);
    let sample = |instance: &str, sent: u64, received: u64, term: &str| Sample {
        instance: instance.into(),
        sent: ms(sent),
        received: ms(received),
        status: 200,
        term: Some(term.into()),
    };
    // A hand-over: a's last 200 was sent before b's first 200 arrived.
    assert_no_overlap(&[sample("a", 0, 5, "u/1"), sample("b", 10, 12, "u/2")]);
    // a answers 200 to a request sent after b's 200 for a newer term arrived.
    let overlap = [
        sample("a", 0, 5, "u/1"),
        sample("b", 10, 12, "u/2"),
        sample("a", 13, 15, "u/1"),
    ];
    let caught = std::panic::catch_unwind(|| assert_no_overlap(&overlap));
    assert!(caught.is_err(), "the monitor must flag two leaders");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_list_and_watch_denied_reads_take_the_watchs_place_and_it_still_leads_and_hands_over()
{
    let api = FakeApiServer::start(NAMESPACE, LEASE).await;
    for name in ["a", "b"] {
        api.set_fault(
            name,
            Fault::on(&[Verb::List, Verb::Watch], FaultKind::Status(403)),
        );
    }
    let timing = Timing::FAST;
    let mut cluster = Cluster::start_with(api, "watch-denied", &["a", "b"], timing).await;
    let (leader, probe) = cluster.wait_leader(timing.lease * 4).await;
    let term = probe.term().unwrap().to_owned();
    let follower = if leader == "a" { "b" } else { "a" };
    // It said loudly what it does instead, once.
    let warned = |log: &str| {
        log.lines()
            .filter(|l| l.contains("reading the lease every retry period instead"))
            .count()
    };
    assert_eq!(warned(&cluster.sidecar(&leader).log()), 1);
    // Reads keep the follower informed: a SIGTERM hand-over still reaches it.
    cluster.sidecar(&leader).signal(libc::SIGTERM);
    cluster
        .sidecar_mut(&leader)
        .wait_exit(Duration::from_secs(10))
        .await
        .expect("the old leader exits");
    let new = cluster
        .sidecar(follower)
        .wait_leading(timing.lease * 3)
        .await;
    assert_ne!(new.term(), Some(term.as_str()));
    assert_eq!(warned(&cluster.sidecar(follower).log()), 1);
    // Fallback reads are paced: at most one per retry period (plus the
    // machine's own reads), not a loop.
    let gets = cluster
        .requests(follower)
        .iter()
        .filter(|r| r.verb == Verb::Get)
        .count();
    let lived = cluster
        .api
        .requests()
        .first()
        .map(|r| r.at.elapsed())
        .unwrap();
    let most = (lived.as_secs_f64() / timing.retry.as_secs_f64()).ceil() as usize + 3;
    assert!(gets <= most, "{gets} GETs in {lived:?}");
    cluster.assert_no_overlap();
}

// --- one identity, two processes (issue 14 item 2) ---

/// The identity two misconfigured processes share (a constant `--identity`
/// in a DaemonSet template).
const TWIN_IDENTITY: &str = "metricbeat-twin";
/// libfaketime: the twins' wall clocks frozen at one instant, so their
/// writes carry the same `renewTime` to the microsecond.
const LIBFAKETIME: &str = "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1";
const FROZEN_AT: &str = "2026-12-01 00:00:00";
const CONFLICT_LOG: &str = "another process is writing the Lease under this pod's identity";

/// `leader_gate_identity_conflicts_total` of `sidecar`.
async fn identity_conflicts(sidecar: &Sidecar) -> u64 {
    let metrics = sidecar.admin_get("/metrics").await.expect("metrics");
    let text = metrics.body.as_str().unwrap_or_default().to_owned();
    text.lines()
        .find_map(|l| l.strip_prefix("leader_gate_identity_conflicts_total{"))
        .and_then(|l| l.split_once("} "))
        .map(|(_, value)| value)
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no identity conflict counter in:\n{text}"))
}

/// Two processes with one identity, through `rounds` of: both watch a Lease
/// held by someone else, which releases it with the mark; both take it at
/// once (a race on one resourceVersion: one 409), the winner renews, is
/// stopped and releases, the other takes over and is stopped too. `/leader`
/// is polled on both throughout: never both 200. The loser says once, in
/// its log and its metrics, that another process writes under its
/// identity. `program`: a wrapper to run instead of the binary (the frozen
/// clock).
async fn twins_never_both_lead(test: &str, program: Option<&std::path::Path>, rounds: usize) {
    let timing = Timing::FAST;
    let api = FakeApiServer::start(NAMESPACE, LEASE).await;
    let dir = test_dir(test);
    let extra = ["--identity", TWIN_IDENTITY];
    for round in 0..rounds {
        // Held by another candidate, for longer than the twins need to start.
        api.delete_lease(LEASE);
        let held = api.create_lease(support::fake_apiserver::lease_object(
            LEASE,
            Some("other"),
            30,
        ));
        let uid = held["metadata"]["uid"].as_str().unwrap().to_owned();
        let spawn = |name: &str| match program {
            Some(program) => Sidecar::spawn_program(program, &api, &dir, name, timing, &extra),
            None => Sidecar::spawn_with(&api, &dir, name, timing, &extra),
        };
        let mut twins = vec![
            spawn(&format!("twin-a{round}")),
            spawn(&format!("twin-b{round}")),
        ];
        for twin in &twins {
            twin.wait_serving().await;
            twin.wait_for(Duration::from_secs(10), |p| p.holder() == Some("other"))
                .await;
        }
        let monitor = Monitor::start(&twins.iter().collect::<Vec<_>>());
        let logs = |twins: &[Sidecar]| {
            twins
                .iter()
                .map(|s| format!("--- {} ---\n{}", s.name, tail(&s.log(), 30)))
                .collect::<Vec<_>>()
                .join("\n")
        };
        // The holder hands over: both twins see it in the same watch event.
        api.update_lease(LEASE, |lease| {
            lease["spec"]
                .as_object_mut()
                .unwrap()
                .remove("holderIdentity");
            lease["metadata"]["annotations"] =
                json!({"leader-gate.dev/released-term": format!("{uid}/0")});
        });
        // Who won the race; both asked at the same time, many times, through
        // renewals: never both.
        let deadline = Instant::now() + timing.lease * 2;
        let mut leader = None;
        let mut polls = 0;
        while leader.is_none() || polls < 300 {
            let (a, b) = tokio::join!(twins[0].leader(), twins[1].leader());
            let (a, b) = (
                a.is_some_and(|p| p.leading()),
                b.is_some_and(|p| p.leading()),
            );
            assert!(
                !(a && b),
                "round {round}: both twins answer 200\n{}",
                logs(&twins)
            );
            if a || b {
                assert!(
                    leader.is_none() || leader == Some(usize::from(b)),
                    "the leader changed hands"
                );
                leader = Some(usize::from(b));
                polls += 1;
            }
            assert!(
                Instant::now() < deadline,
                "round {round}: nobody led\n{}",
                logs(&twins)
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let (won, lost) = match leader {
            Some(0) => (0, 1),
            _ => (1, 0),
        };
        if program.is_some() {
            // The clocks were frozen: both takes carried this renewTime.
            let lease = api.lease(LEASE).expect("the lease exists");
            assert_eq!(lease["spec"]["acquireTime"], "2026-12-01T00:00:00.000000Z");
        }
        // The loser saw the winner's writes under its own identity: said
        // once, counted once; the winner saw nobody else.
        assert_eq!(
            twins[lost].log().matches(CONFLICT_LOG).count(),
            1,
            "round {round}\n{}",
            logs(&twins)
        );
        assert_eq!(identity_conflicts(&twins[lost]).await, 1);
        assert_eq!(identity_conflicts(&twins[won]).await, 0);
        assert!(!twins[won].log().contains(CONFLICT_LOG));
        // The winner hands over with a marked release; its twin takes it.
        twins[won].signal(libc::SIGTERM);
        let status = twins[won].wait_exit(Duration::from_secs(10)).await;
        assert_eq!(status.and_then(|s| s.code()), Some(0), "clean exit");
        twins[lost].wait_leading(Duration::from_secs(5)).await;
        tokio::time::sleep(Duration::from_millis(1500)).await; // a renewal
        assert!(twins[lost].leader().await.is_some_and(|p| p.leading()));
        twins[lost].signal(libc::SIGTERM);
        twins[lost].wait_exit(Duration::from_secs(10)).await;
        assert_no_overlap(&monitor.samples());
        eprintln!(
            "MEASURE twins round {round}: {polls} paired polls while one led, {} monitor samples, never both 200",
            monitor.samples().len()
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_processes_with_one_identity_never_both_answer_200() {
    twins_never_both_lead("twins", None, 2).await;
}

/// etcd restored from a snapshot without `--bump-revision` (the API servers
/// restarted onto it): the Lease is back with its uid at an older
/// resourceVersion than every candidate saw. The fresh watch's list, and a
/// GET after a 409, are the server's truth: the group leads again on the
/// restored history, with a conflict or two in all, not a 409 and a GET per
/// candidate and retry period for as long as the processes live.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_etcd_is_restored_to_an_older_resource_version_the_group_leads_again_without_a_409_loop()
 {
    let timing = Timing::FAST;
    let cluster = Cluster::start("rv-restored", &["a", "b", "c"], timing).await;
    let (leader, _) = cluster.wait_leader(timing.lease * 3).await;
    let rv = |api: &FakeApiServer| -> u64 {
        let lease = api.lease(LEASE).expect("the lease");
        lease["metadata"]["resourceVersion"]
            .as_str()
            .unwrap()
            .parse()
            .unwrap()
    };
    let snapshot = cluster.api.snapshot_store();
    let at_snapshot = rv(&cluster.api);
    // Renewals move the resourceVersion on; every candidate sees them.
    for _ in 0..3 {
        cluster.next_write(&leader).await;
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(rv(&cluster.api) > at_snapshot);
    cluster.api.restore_store(&snapshot);
    let restored = Instant::now();
    assert_eq!(rv(&cluster.api), at_snapshot, "the same Lease, older");
    // Three lease durations: a 409 loop would have left nobody leading.
    tokio::time::sleep(timing.lease * 3).await;
    let (now, _) = cluster.wait_leader(timing.lease).await;
    let renew = cluster.next_write(&now).await;
    assert!(renew.at > restored);
    let after: Vec<RequestRecord> = cluster
        .api
        .requests()
        .into_iter()
        .filter(|r| r.at > restored && r.verb != Verb::Watch)
        .collect();
    let conflicts = after.iter().filter(|r| r.status == Some(409)).count();
    let gets = after.iter().filter(|r| r.verb == Verb::Get).count();
    eprintln!(
        "MEASURE restored etcd: {leader} led before, {now} after; {conflicts} conflicts and {gets} GETs in {:?}",
        restored.elapsed()
    );
    assert!(
        conflicts <= 3,
        "{conflicts} conflicts after the restore\n{}",
        cluster.logs()
    );
    assert!(
        gets <= 3,
        "{gets} GETs after the restore\n{}",
        cluster.logs()
    );
    cluster.assert_no_overlap();
}

/// A leader killed in its pod (SIGKILL, as an OOM kill or a failed liveness
/// probe does) and restarted with the same identity: the record it lists
/// first carries its previous incarnation's writer mark. Nobody writes under
/// its identity while it runs, so it reports no twin, neither in its log nor
/// in its metrics, and leads once that record expired.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_restarted_in_its_pod_reports_no_twin_for_its_previous_incarnation() {
    let timing = Timing::FAST;
    let api = FakeApiServer::start(NAMESPACE, LEASE).await;
    let dir = test_dir("restart-same-identity");
    let mut first = Sidecar::spawn(&api, &dir, "a", timing);
    first.wait_serving().await;
    first.wait_leading(timing.lease * 3).await;
    first.signal(libc::SIGKILL);
    first.wait_exit(Duration::from_secs(5)).await;
    let writer = |lease: &Value| lease["metadata"]["annotations"]["leader-gate.dev/writer"].clone();
    let left = api.lease(LEASE).expect("the killed leader's record");
    assert_eq!(lease_holder(&left).as_deref(), Some("a"));
    let second = Sidecar::spawn_logged(&api, &dir, "a", "a-restarted.log", timing, &[]);
    second.wait_serving().await;
    second.wait_leading(timing.lease * 3).await;
    // A few renewals of its own, each seen on its watch.
    tokio::time::sleep(timing.retry * 3).await;
    let now = api.lease(LEASE).expect("the restarted leader's record");
    assert_eq!(lease_holder(&now).as_deref(), Some("a"));
    assert_ne!(writer(&now), writer(&left), "a new process, a new mark");
    assert_eq!(identity_conflicts(&second).await, 0);
    let log = second.log();
    let errors: Vec<&str> = log.lines().filter(|l| l.contains(" ERROR ")).collect();
    assert!(errors.is_empty(), "error lines: {errors:#?}");
    assert!(!log.contains(CONFLICT_LOG));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_processes_with_one_identity_and_one_frozen_wall_clock_never_both_answer_200() {
    if !std::path::Path::new(LIBFAKETIME).exists() {
        assert!(
            std::env::var("LEADER_GATE_REQUIRE_FAKETIME").as_deref() != Ok("1"),
            "LEADER_GATE_REQUIRE_FAKETIME=1 but {LIBFAKETIME} is missing (apt-get install libfaketime)"
        );
        eprintln!("SKIP: {LIBFAKETIME} is missing (apt-get install libfaketime)");
        return;
    }
    // A wrapper freezing the wall clock only: monotonic and boot clocks run.
    let dir = test_dir("twins-frozen-bin");
    let wrapper = dir.join("leader-gate-frozen");
    std::fs::write(
        &wrapper,
        format!(
            "#!/bin/sh\nexport LD_PRELOAD={LIBFAKETIME} FAKETIME='{FROZEN_AT}' FAKETIME_DONT_FAKE_MONOTONIC=1\nexec '{}' \"$@\"\n",
            env!("CARGO_BIN_EXE_leader-gate")
        ),
    )
    .unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&wrapper, std::fs::Permissions::from_mode(0o755)).unwrap();
    twins_never_both_lead("twins-frozen", Some(&wrapper), 3).await;
}

/// The holder labels the Lease with its pod and node on acquisition
/// (`kubectl get lease -L leader-gate.dev/holder-node` shows where the
/// leader runs), a graceful release removes them, and the next holder
/// writes its own; labels of others are kept.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_lease_names_its_holders_pod_and_node_in_labels() {
    let api = FakeApiServer::start(NAMESPACE, LEASE).await;
    let dir = test_dir("holder-labels");
    let labels = |api: &FakeApiServer| api.lease(LEASE).unwrap()["metadata"]["labels"].clone();
    let mut a = Sidecar::spawn_with(&api, &dir, "a", Timing::FAST, &["--node-name", "node-1"]);
    a.wait_term(Timing::FAST.lease * 2).await;
    assert_eq!(labels(&api)["leader-gate.dev/holder"], json!("a"));
    assert_eq!(labels(&api)["leader-gate.dev/holder-node"], json!("node-1"));
    api.update_lease(LEASE, |l| l["metadata"]["labels"]["team"] = json!("sre"));
    // A graceful stop releases: nobody holds it, no holder labels.
    a.signal(libc::SIGTERM);
    a.wait_exit(Duration::from_secs(15)).await.expect("a exits");
    assert_eq!(lease_holder(&api.lease(LEASE).unwrap()), None);
    assert_eq!(labels(&api).get("leader-gate.dev/holder"), None);
    assert_eq!(labels(&api).get("leader-gate.dev/holder-node"), None);
    // The next holder, on a node whose name is no label value (over 63
    // characters), labels its pod only.
    let long_node = format!("node-{}", "x".repeat(64));
    let b = Sidecar::spawn_with(&api, &dir, "b", Timing::FAST, &["--node-name", &long_node]);
    b.wait_term(Timing::FAST.lease * 2).await;
    assert_eq!(labels(&api)["leader-gate.dev/holder"], json!("b"));
    assert_eq!(labels(&api).get("leader-gate.dev/holder-node"), None);
    assert_eq!(labels(&api)["team"], json!("sre"));
}
