//! Pure state-machine tests with explicit instants: every transition of
//! DESIGN.md's testing pyramid, level 1. A tiny in-test "server" stores what
//! the machine writes and bumps the resourceVersion like the API server.

use std::time::Duration;

use serde_json::json;
use tokio::time::Instant;

use super::*;
use crate::elector::api_error::Forbidden;
use crate::elector::lease::fixtures::{LeaseBuilder, stored};
use crate::elector::lease::{self, Lease, RELEASED_TERM_ANNOTATION, set_annotation};

mod properties;
mod spread;
mod spread_group;
mod successor;

const SECOND: i64 = 1_000_000;

struct Harness {
    election: Election,
    t0: Instant,
    /// The last object "stored on the server" and its resourceVersion.
    server: Option<Lease>,
    rv: u64,
    /// Time the machine spent suspended: the boot clock counts it, the
    /// monotonic one does not.
    suspended: Duration,
    /// The acquisitions asked for by the last input other than a tick (a
    /// free Lease is taken in the very step that observes it), for
    /// [`Harness::first_write`].
    stashed: Vec<(f64, Action)>,
}

fn settings(identity: &str) -> Settings {
    Settings {
        identity: identity.into(),
        namespace: "ns".into(),
        lease_name: "demo".into(),
        lease_duration: Duration::from_secs(15),
        renew_deadline: Duration::from_secs(10),
        retry_period: Duration::from_secs(2),
        holder_labels: vec![(lease::HOLDER_LABEL.into(), identity.into())],
    }
}

impl Harness {
    fn new(identity: &str) -> Self {
        // No claims of the successor slot within these histories: the
        // successor's own tests (`successor`) set a short window.
        let mut election = Election::new(settings(identity), 7);
        election.set_successor_claim_window(Duration::from_secs(3600));
        Self {
            election,
            t0: Instant::now(),
            server: None,
            rv: 100,
            suspended: Duration::ZERO,
            stashed: Vec::new(),
        }
    }

    fn now(&self, secs: f64) -> Now {
        Now {
            instant: self.t0 + Duration::from_secs_f64(secs),
            boot: BootInstant::from_since_boot(
                Duration::from_secs(1000) + Duration::from_secs_f64(secs) + self.suspended,
            ),
            wall_micros: 1_800_000_000 * SECOND + (secs * SECOND as f64) as i64,
        }
    }

    fn feed(&mut self, input: Input, secs: f64) -> Vec<Action> {
        let now = self.now(secs);
        let tick = matches!(input, Input::Tick);
        let actions = self.election.handle(input, now);
        if !tick {
            self.stashed = actions
                .iter()
                .filter(|a| {
                    matches!(
                        a,
                        Action::Write(Write {
                            purpose: Purpose::Acquire,
                            ..
                        })
                    )
                })
                .map(|a| (secs, a.clone()))
                .collect();
        }
        actions
    }

    fn tick(&mut self, secs: f64) -> Vec<Action> {
        self.feed(Input::Tick, secs)
    }

    /// Someone else changes the Lease on the server; returns the new object.
    fn server_sets(&mut self, lease: LeaseBuilder) -> Lease {
        self.rv += 1;
        let lease = lease.rv(self.rv).build();
        self.server = Some(lease.clone());
        lease
    }

    /// The server accepts `action` (a write): the stored object.
    fn accept(&mut self, action: &Action) -> Lease {
        self.rv += 1;
        let object = match action {
            Action::Write(Write {
                op: WriteOp::Create(o) | WriteOp::Replace(o),
                ..
            }) => (**o).clone(),
            other => panic!("expected a write, got {other:?}"),
        };
        let lease = stored(object, self.rv);
        self.server = Some(lease.clone());
        lease
    }

    /// The first write from `from` to `to`: an acquisition asked for by the last input
    /// (if at `from` or later), else the first of ticks every 100 ms.
    fn first_write(&mut self, from: f64, to: f64) -> Option<(f64, Action)> {
        let stashed = std::mem::take(&mut self.stashed);
        if let Some((at, action)) = stashed.into_iter().next()
            && at >= from
            && at <= to
        {
            return Some((at, action));
        }
        let mut t = from;
        while t <= to {
            for action in self.tick(t) {
                if matches!(action, Action::Write(_)) {
                    return Some((t, action));
                }
            }
            t += 0.1;
        }
        None
    }

    /// Becomes leader of a fresh Lease at about t=0..1; returns when it wrote.
    fn lead(&mut self) -> f64 {
        self.feed(Input::Observed(None), 0.0);
        let (t, create) = self.first_write(0.0, 1.1).expect("creates the lease");
        assert!(matches!(
            create,
            Action::Write(Write {
                op: WriteOp::Create(_),
                purpose: Purpose::Acquire,
                ..
            })
        ));
        let stored = self.accept(&create);
        self.feed(Input::Written(Ok(stored)), t + 0.01);
        assert!(self.election.is_leading());
        t
    }

    fn snapshot(&self, secs: f64) -> Snapshot {
        self.election.snapshot(self.now(secs).instant)
    }

    fn deadline_secs(&self) -> f64 {
        (self.election.lead_deadline().unwrap() - self.t0).as_secs_f64()
    }
}

fn is_write(actions: &[Action], purpose: Purpose) -> bool {
    actions
        .iter()
        .any(|a| matches!(a, Action::Write(w) if w.purpose == purpose))
}

fn forbidden() -> ApiError {
    ApiError::Forbidden(Forbidden::parse(
        "User \"x\" cannot update resource \"leases\"",
    ))
}

#[test]
fn an_absent_lease_is_created_at_once_and_led() {
    let mut h = Harness::new("me");
    // A Lease that never existed is free: no expiry to wait for and no herd
    // to spread (the create's CAS lets one candidate win), so the create is
    // among the actions of the observation itself.
    let actions = h.feed(Input::Observed(None), 0.0);
    assert!(
        is_write(&actions, Purpose::Acquire),
        "creates without delay: {actions:?}"
    );
    let mut h = Harness::new("me");
    let t = h.lead();
    assert_eq!(t, 0.0, "no acquisition spread for an absent Lease");
    let snapshot = h.snapshot(t + 0.1);
    assert_eq!(snapshot.holder.as_deref(), Some("me"));
    assert_eq!(snapshot.term.unwrap().as_str(), "uid-new/0");
    // Deadline = sent + renew_deadline.
    assert!((h.deadline_secs() - (t + 10.0)).abs() < 1e-6);
}

#[test]
fn nothing_is_written_before_the_api_server_answered() {
    let mut h = Harness::new("me");
    for t in 0..30 {
        assert!(h.tick(t as f64).is_empty());
    }
    assert!(!h.snapshot(30.0).observed);
}

#[test]
fn the_leader_renews_every_retry_period_and_each_success_extends_the_deadline() {
    let mut h = Harness::new("me");
    let t = h.lead();
    assert!(
        h.tick(t + 1.9).is_empty(),
        "no renew before the retry period"
    );
    let renew = h.tick(t + 2.0);
    assert!(is_write(&renew, Purpose::Renew));
    let stored = h.accept(&renew[0]);
    h.feed(Input::Written(Ok(stored)), t + 2.05);
    assert!((h.deadline_secs() - (t + 12.0)).abs() < 1e-6);
}

#[test]
fn validity_is_fixed_on_the_boot_clock_when_the_renew_is_sent_and_a_suspend_ends_it() {
    let mut h = Harness::new("me");
    let t = h.lead();
    let boot = |h: &Harness, secs: f64| h.now(secs).boot;
    // Sent at t: valid until t + renew_deadline on the boot clock.
    let sent = boot(&h, t);
    assert_eq!(
        h.snapshot(t + 0.1).valid_until,
        Some(sent.plus(Duration::from_secs(10)))
    );
    // A renew sent at t+2, answered after a 30 s suspend (the boot clock
    // counted it, the monotonic one did not): it extends validity from when
    // it was *sent*, not from when its answer was handled.
    let renew = h.tick(t + 2.0);
    let renew_sent = boot(&h, t + 2.0);
    h.suspended = Duration::from_secs(30);
    let stored = h.accept(&renew[0]);
    h.feed(Input::Written(Ok(stored)), t + 2.05);
    assert!(
        !h.election.is_leading(),
        "the boot clock passed the deadline during the suspend"
    );
    assert_eq!(
        h.snapshot(t + 2.05).last_stop,
        Some(StopReason::RenewDeadline)
    );
    assert_eq!(h.snapshot(t + 2.05).valid_until, None);
    // Without a suspend the same renew extends validity from its sending.
    let mut h = Harness::new("me");
    let t = h.lead();
    let renew = h.tick(t + 2.0);
    let renew_sent_here = boot(&h, t + 2.0);
    let stored = h.accept(&renew[0]);
    h.feed(Input::Written(Ok(stored)), t + 2.5);
    assert_eq!(
        h.snapshot(t + 2.5).valid_until,
        Some(renew_sent_here.plus(Duration::from_secs(10)))
    );
    assert_eq!(renew_sent_here, renew_sent, "same clocks in both runs");
}

#[test]
fn a_suspend_alone_ends_the_term_at_the_next_input() {
    let mut h = Harness::new("me");
    let t = h.lead();
    h.suspended = Duration::from_secs(11);
    // One monotonic second later, eleven boot seconds later: a peer may
    // already lead, so the first tick after the resume steps down.
    h.tick(t + 1.0);
    assert!(!h.election.is_leading());
}

#[test]
fn the_leader_steps_down_at_the_deadline_while_its_renew_hangs() {
    let mut h = Harness::new("me");
    let t = h.lead();
    let renew = h.tick(t + 2.0);
    assert!(is_write(&renew, Purpose::Renew));
    // The request never answers; the timer alone ends the term (G2).
    assert!(h.tick(t + 9.99).is_empty());
    assert!(h.election.is_leading());
    h.tick(t + 10.0);
    assert!(!h.election.is_leading());
    assert_eq!(
        h.snapshot(t + 10.0).last_stop,
        Some(StopReason::RenewDeadline)
    );
    // A late success of the old renew does not revive the term.
    let stored = h.accept(&renew[0]);
    h.feed(Input::Written(Ok(stored)), t + 11.0);
    assert!(!h.election.is_leading());
}

#[test]
fn renews_that_cannot_reach_the_api_server_end_the_term_as_api_unreachable() {
    let mut h = Harness::new("me");
    let t = h.lead();
    let mut at = t + 2.0;
    while h.election.is_leading() {
        let actions = h.tick(at);
        if is_write(&actions, Purpose::Renew) {
            h.feed(
                Input::Written(Err(ApiError::Transport("connection refused".into()))),
                at,
            );
        }
        at += 0.1;
    }
    assert!(at - t <= 10.2, "stepped down at {at}");
    assert_eq!(h.snapshot(at).last_stop, Some(StopReason::ApiUnreachable));
}

#[test]
fn a_lost_renew_response_does_not_cost_the_lease() {
    let mut h = Harness::new("me");
    let t = h.lead();
    let renew = h.tick(t + 2.0);
    // The server committed the renew, but the response was lost.
    let committed = h.accept(&renew[0]);
    h.feed(
        Input::Written(Err(ApiError::Transport("reset".into()))),
        t + 2.1,
    );
    assert!(h.election.is_leading());
    // The watch shows the committed record: ours (identity + our renewTime),
    // and the deadline counts from when that renew was sent.
    h.feed(Input::Observed(Some(committed.clone())), t + 2.2);
    assert!(h.election.is_leading());
    assert!((h.deadline_secs() - (t + 12.0)).abs() < 1e-6);
    // The next renew builds on the committed resourceVersion.
    let next = h.tick(t + 4.0);
    match &next[..] {
        [Action::Write(w)] => match &w.op {
            WriteOp::Replace(o) => assert_eq!(
                o.metadata.resource_version,
                committed.object().metadata.resource_version
            ),
            other => panic!("{other:?}"),
        },
        other => panic!("{other:?}"),
    }
    assert_eq!(h.snapshot(t + 4.0).last_stop, None, "no transition");
}

#[test]
fn a_label_edit_conflicts_a_renew_but_keeps_the_lease() {
    let mut h = Harness::new("me");
    let t = h.lead();
    let ours = h.server.clone().unwrap();
    // GitOps adds a label: same record, new resourceVersion.
    let mut edited = ours.object().clone();
    edited.metadata.labels = Some([("team".to_owned(), "sre".to_owned())].into());
    h.rv += 1;
    edited.metadata.resource_version = Some(h.rv.to_string());
    let edited = Lease::new(edited);
    let renew = h.tick(t + 2.0);
    h.feed(
        Input::Written(Err(ApiError::Conflict("Conflict".into()))),
        t + 2.05,
    );
    assert!(h.election.is_leading());
    // The watch brings the edit; the renew is retried on top of it.
    let retry = h.feed(Input::Observed(Some(edited)), t + 2.1);
    assert!(is_write(&retry, Purpose::Renew), "{retry:?}");
    let stored = h.accept(&retry[0]);
    assert_eq!(
        stored.object().metadata.labels.as_ref().unwrap()["team"],
        "sre"
    );
    h.feed(Input::Written(Ok(stored)), t + 2.3);
    assert!(h.election.is_leading());
    assert!(h.deadline_secs() > t + 12.0);
    let _ = renew;
}

#[test]
fn another_holder_in_the_record_ends_the_term_at_once() {
    let mut h = Harness::new("me");
    let t = h.lead();
    let ghost = h.server_sets(LeaseBuilder::held_by("ghost").uid("uid-new"));
    h.feed(Input::Observed(Some(ghost)), t + 3.0);
    assert!(!h.election.is_leading());
    let snapshot = h.snapshot(t + 3.0);
    assert_eq!(snapshot.last_stop, Some(StopReason::LostToOtherHolder));
    assert_eq!(snapshot.holder.as_deref(), Some("ghost"));
}

#[test]
fn a_follower_takes_over_only_one_duration_after_it_saw_the_record_change() {
    let mut h = Harness::new("b");
    // The remote renewTime is ancient; it is never compared with our clock (G3).
    let held = h.server_sets(LeaseBuilder::held_by("a").renewed_at(0));
    h.feed(Input::Observed(Some(held)), 1.0);
    assert_eq!(h.first_write(1.0, 15.95), None);
    let (at, acquire) = h.first_write(16.0, 17.1).expect("acquires after expiry");
    assert!(at < 17.05, "spread at most retry/2: {at}");
    match &acquire {
        Action::Write(Write {
            purpose: Purpose::Acquire,
            op: WriteOp::Replace(o),
            ..
        }) => {
            assert_eq!(o.data["spec"]["holderIdentity"], "b");
            assert_eq!(o.data["spec"]["leaseTransitions"], 1);
            assert_eq!(o.metadata.resource_version.as_deref(), Some("101"));
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn each_change_of_the_record_restarts_the_expiry_clock() {
    let mut h = Harness::new("b");
    let first = h.server_sets(LeaseBuilder::held_by("a").renewed_at(1));
    h.feed(Input::Observed(Some(first)), 0.0);
    let renewed = h.server_sets(LeaseBuilder::held_by("a").renewed_at(2));
    h.feed(Input::Observed(Some(renewed)), 10.0);
    assert_eq!(h.first_write(10.0, 24.95), None);
    assert!(h.first_write(25.0, 26.1).is_some());
}

#[test]
fn a_label_edit_on_a_dead_leaders_lease_does_not_keep_it_alive() {
    let mut h = Harness::new("b");
    let held = h.server_sets(LeaseBuilder::held_by("a"));
    h.feed(Input::Observed(Some(held)), 0.0);
    let labelled = h.server_sets(LeaseBuilder::held_by("a").label("x", "y"));
    h.feed(Input::Observed(Some(labelled)), 10.0);
    assert!(
        h.first_write(15.0, 16.1).is_some(),
        "expiry counts from the last record change"
    );
}

#[test]
fn the_record_duration_counts_when_longer_and_the_local_one_when_shorter() {
    let mut h = Harness::new("b");
    let long = h.server_sets(LeaseBuilder::held_by("a").duration_secs(60));
    h.feed(Input::Observed(Some(long)), 0.0);
    assert_eq!(h.first_write(0.0, 59.9), None);
    assert!(h.first_write(60.0, 61.1).is_some());

    let mut h = Harness::new("b");
    let short = h.server_sets(LeaseBuilder::held_by("a").duration_secs(1));
    h.feed(Input::Observed(Some(short)), 0.0);
    assert_eq!(h.first_write(0.0, 14.9), None);
    assert!(h.first_write(15.0, 16.1).is_some());
}

#[test]
fn an_operator_writing_our_name_does_not_make_us_leader() {
    let mut h = Harness::new("me");
    // `me` in holderIdentity, but not a renewTime of ours (G7).
    let named = h.server_sets(LeaseBuilder::held_by("me").transitions(3));
    h.feed(Input::Observed(Some(named)), 0.0);
    assert!(!h.election.is_leading());
    assert_eq!(h.first_write(0.0, 14.9), None);
    let (_, acquire) = h.first_write(15.0, 16.1).unwrap();
    // Taking it is a new term, even from the same name (G5).
    let stored = h.accept(&acquire);
    assert_eq!(stored.record().transitions, 4);
    h.feed(Input::Written(Ok(stored)), 16.2);
    assert!(h.election.is_leading());
}

#[test]
fn an_acquisition_labels_the_lease_with_its_holder_and_a_release_removes_it() {
    let mut h = Harness::new("b");
    let held = h.server_sets(LeaseBuilder::held_by("a").label(lease::HOLDER_LABEL, "a"));
    h.feed(Input::Observed(Some(held)), 0.0);
    let (_, write) = h
        .first_write(0.0, 16.0)
        .expect("takes over once the record expired");
    let taken = h.accept(&write);
    let labels = taken.object().metadata.labels.clone().unwrap_or_default();
    assert_eq!(labels[lease::HOLDER_LABEL], "b");
    let released = Lease::new(taken.released());
    assert_eq!(
        released
            .object()
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get(lease::HOLDER_LABEL)),
        None
    );
}

#[test]
fn a_marked_release_is_taken_without_waiting_for_expiry() {
    // No successor named: the release is free at once, and the watching
    // followers spread their writes over [release, release + retry/2]
    // instead of all writing in the same millisecond (issue 13; the named
    // successor, in `successor`, takes it with no spread at all).
    let mut h = Harness::new("b");
    let held = h.server_sets(LeaseBuilder::held_by("a").transitions(2));
    h.feed(Input::Observed(Some(held.clone())), 0.0);
    let released = h.server_sets(
        LeaseBuilder::unheld()
            .transitions(2)
            .annotation(RELEASED_TERM_ANNOTATION, held.term_id().as_str()),
    );
    h.feed(Input::Observed(Some(released)), 3.0);
    let (at, _) = h
        .first_write(3.0, 4.1)
        .expect("takes the release without waiting for expiry");
    // (+ 1e-9: the ticks every 100 ms from 3.0 add up to 4.000000000000001.)
    assert!(at <= 4.0 + 1e-9, "within the spread, retry/2: {at}");
}

#[test]
fn a_marked_release_naming_no_successor_is_spread_over_half_a_retry_period() {
    let mut attempts = Vec::new();
    for seed in 0..50 {
        let mut h = Harness::new("b");
        h.election = Election::new(settings("b"), seed);
        h.election
            .set_successor_claim_window(Duration::from_secs(3600));
        let held = h.server_sets(LeaseBuilder::held_by("a").transitions(2));
        h.feed(Input::Observed(Some(held.clone())), 0.0);
        let released = h.server_sets(
            LeaseBuilder::unheld()
                .transitions(2)
                .annotation(RELEASED_TERM_ANNOTATION, held.term_id().as_str()),
        );
        h.feed(Input::Observed(Some(released)), 3.0);
        let (at, _) = h.first_write(3.0, 4.1).expect("acquires the release");
        assert!(at <= 4.0 + 1e-9, "seed {seed}: {at}");
        attempts.push(at);
    }
    let distinct: std::collections::HashSet<u64> =
        attempts.iter().map(|a| (a * 10.0).round() as u64).collect();
    assert!(distinct.len() >= 5, "no herd: {attempts:?}");
}

#[test]
fn an_expiry_keeps_the_acquisition_spread() {
    // At an expiry every follower's clock fires at about the same instant
    // and nothing tells them apart: there the herd is spread over
    // [expiry, expiry + retry/2].
    let mut attempts = Vec::new();
    for seed in 0..50 {
        let mut h = Harness::new("b");
        h.election = Election::new(settings("b"), seed);
        h.election
            .set_successor_claim_window(Duration::from_secs(3600));
        let held = h.server_sets(LeaseBuilder::held_by("a"));
        h.feed(Input::Observed(Some(held)), 0.0);
        assert_eq!(h.first_write(0.0, 14.95), None, "seed {seed}");
        let (at, _) = h.first_write(15.0, 16.1).expect("acquires after expiry");
        assert!(at <= 16.05, "spread at most retry/2: {at}");
        attempts.push(at);
    }
    let distinct: std::collections::HashSet<u64> =
        attempts.iter().map(|a| (a * 10.0).round() as u64).collect();
    assert!(
        distinct.len() >= 5,
        "attempts spread over the window: {attempts:?}"
    );
}

#[test]
fn an_unmarked_clear_ends_the_term_and_counts_as_held_for_a_duration() {
    let mut h = Harness::new("me");
    let t = h.lead();
    let uid = h.server.as_ref().unwrap().uid().unwrap().to_owned();
    let cleared = h.server_sets(LeaseBuilder::unheld().uid(&uid));
    h.feed(Input::Observed(Some(cleared)), t + 3.0);
    assert!(!h.election.is_leading());
    let snapshot = h.snapshot(t + 3.0);
    assert_eq!(snapshot.last_stop, Some(StopReason::HolderCleared));
    assert_eq!(
        snapshot.holder.as_deref(),
        Some("me"),
        "still held by the last holder"
    );
    assert_eq!(h.first_write(t + 3.0, t + 17.9), None);
    assert!(h.first_write(t + 18.0, t + 19.1).is_some());
}

#[test]
fn a_deleted_lease_ends_the_term_and_is_recreated_after_a_duration() {
    let mut h = Harness::new("me");
    let t = h.lead();
    h.server = None;
    h.feed(Input::Observed(None), t + 3.0);
    assert!(!h.election.is_leading());
    assert_eq!(
        h.snapshot(t + 3.0).last_stop,
        Some(StopReason::LeaseDeleted)
    );
    assert_eq!(h.first_write(t + 3.0, t + 17.9), None);
    let (_, create) = h.first_write(t + 18.0, t + 19.1).unwrap();
    assert!(matches!(
        create,
        Action::Write(Write {
            op: WriteOp::Create(_),
            ..
        })
    ));
}

/// Found by the chaos test (seed 1890576493116111142): b saw the Lease
/// deleted, then its watch broke (API server restart, then 410s). Meanwhile a
/// created the Lease and led, and an operator deleted it again; b's create,
/// retried from its old view, landed right after that deletion and b led
/// while a, which had not seen the deletion either, still did. A POST only
/// asks "absent now?": absent, created, deleted passes it.
#[test]
fn an_absence_seen_before_the_watch_broke_justifies_no_create() {
    let mut h = Harness::new("b");
    let held = h.server_sets(LeaseBuilder::held_by("a"));
    h.feed(Input::Observed(Some(held)), 0.0);
    h.server = None;
    h.feed(Input::Observed(None), 1.0);
    h.feed(Input::WatchInterrupted, 2.0);
    // Without the interruption it would create at 16 s (deletion + duration).
    assert_eq!(
        h.first_write(2.0, 40.0),
        None,
        "no create from a stale view"
    );
    // A fresh watch lists: still absent — or absent again. Either way it
    // counts as a deletion seen now.
    h.feed(Input::Observed(None), 40.0);
    assert_eq!(h.snapshot(40.0).holder.as_deref(), Some("a"));
    assert_eq!(h.first_write(40.0, 54.95), None);
    let (_, create) = h.first_write(55.0, 56.1).expect("creates a duration later");
    assert!(matches!(
        create,
        Action::Write(Write {
            op: WriteOp::Create(_),
            purpose: Purpose::Acquire,
            ..
        })
    ));
}

#[test]
fn an_absence_never_held_counts_as_held_for_a_duration_after_an_interruption() {
    let mut h = Harness::new("b");
    // Free: created at once, but the answer is lost to an outage, and the
    // watch breaks. The create may have landed and someone may have seen it.
    let actions = h.feed(Input::Observed(None), 0.0);
    assert!(is_write(&actions, Purpose::Acquire), "{actions:?}");
    let unavailable = ApiError::Server {
        code: 503,
        message: "unavailable".into(),
    };
    h.feed(Input::Written(Err(unavailable)), 0.05);
    h.feed(Input::WatchInterrupted, 0.1);
    assert_eq!(h.first_write(0.1, 5.0), None);
    h.feed(Input::Observed(None), 5.0);
    assert_eq!(h.first_write(5.0, 19.95), None);
    assert!(h.first_write(20.0, 21.1).is_some());
}

#[test]
fn an_interrupted_watch_delays_no_acquisition_by_put_and_no_first_look() {
    // A PUT carries the resourceVersion it was built from: a stale view
    // makes it fail, never succeed on something else.
    let mut h = Harness::new("b");
    let held = h.server_sets(LeaseBuilder::held_by("a"));
    h.feed(Input::Observed(Some(held)), 0.0);
    h.feed(Input::WatchInterrupted, 1.0);
    let (at, acquire) = h.first_write(1.0, 16.1).expect("acquires at expiry");
    assert!(at >= 15.0);
    assert!(matches!(
        acquire,
        Action::Write(Write {
            op: WriteOp::Replace(_),
            ..
        })
    ));
    // A process whose watch failed before it ever saw anything creates at
    // once when the API server first answers "absent" (DESIGN G7).
    let mut h = Harness::new("c");
    h.feed(Input::WatchInterrupted, 0.0);
    h.feed(Input::Observed(None), 3.0);
    assert!(h.first_write(3.0, 4.1).is_some());
}

#[test]
fn a_lease_deleted_before_we_ever_saw_it_held_is_free() {
    let mut h = Harness::new("me");
    h.feed(Input::Observed(None), 0.0);
    assert!(h.first_write(0.0, 1.1).is_some());
}

#[test]
fn a_forbidden_renew_ends_the_term_at_once_and_retries_with_backoff() {
    let mut h = Harness::new("me");
    let t = h.lead();
    let renew = h.tick(t + 2.0);
    assert!(is_write(&renew, Purpose::Renew));
    h.feed(Input::Written(Err(forbidden())), t + 2.1);
    assert!(!h.election.is_leading());
    assert_eq!(h.snapshot(t + 2.1).last_stop, Some(StopReason::Forbidden));
    // It keeps contending: after the record expires it tries again (G1),
    // and keeps trying, further apart, while the 403 lasts.
    let (first, action) = h.first_write(t + 2.1, t + 40.0).expect("retries");
    h.feed(Input::Written(Err(forbidden())), first + 0.1);
    let (second, action2) = h
        .first_write(first + 0.1, first + 60.0)
        .expect("retries again");
    h.feed(Input::Written(Err(forbidden())), second + 0.1);
    let (third, _) = h
        .first_write(second + 0.1, second + 60.0)
        .expect("and again");
    assert!(
        third - second > second - first,
        "backoff grows: {first} {second} {third}"
    );
    let _ = (action, action2);
}

/// Found by the property tests: the jitter came on top of the backoff's cap,
/// so a follower that had failed a few times waited up to 1.2 lease
/// durations — past `lease_duration + retry_period` after a fault healed.
#[test]
fn a_follower_that_keeps_failing_tries_again_within_a_lease_duration() {
    let mut h = Harness::new("b");
    h.feed(Input::Observed(None), 0.0);
    let mut failed = 0.0;
    let mut gaps = Vec::new();
    for round in 0..12 {
        let (at, _) = h
            .first_write(failed, failed + 20.0)
            .unwrap_or_else(|| panic!("no attempt in round {round}"));
        if round > 0 {
            gaps.push(at - failed);
        }
        failed = at + 0.1;
        let unavailable = ApiError::Server {
            code: 503,
            message: "unavailable".into(),
        };
        h.feed(Input::Written(Err(unavailable)), failed);
    }
    // Backoff up to the lease duration (15 s), then at most the
    // acquisition spread (half a retry period) and a tick — never more.
    assert!(
        gaps.iter().all(|gap| *gap <= 16.15),
        "waited longer than a lease duration: {gaps:?}"
    );
    // The Lease is free, so no spread is added to the cap: the gaps are the
    // cap itself, up to float rounding of the instants.
    assert!(
        gaps[6..].iter().all(|gap| (*gap - 15.0).abs() < 1e-3),
        "the backoff reached its cap: {gaps:?}"
    );
}

#[test]
fn a_put_that_changes_nothing_does_not_count_as_a_renew() {
    let mut h = Harness::new("me");
    let t = h.lead();
    let before = h.deadline_secs();
    let renew = h.tick(t + 2.0);
    assert!(is_write(&renew, Purpose::Renew));
    // The API server answers 200 with the same resourceVersion (05b).
    let same = h.server.clone().unwrap();
    h.feed(Input::Written(Ok(same)), t + 2.1);
    assert_eq!(h.deadline_secs(), before);
}

#[test]
fn a_stale_watch_event_after_a_write_response_is_ignored() {
    let mut h = Harness::new("me");
    let t = h.lead();
    let old = h.server.clone().unwrap();
    let renew = h.tick(t + 2.0);
    let stored = h.accept(&renew[0]);
    h.feed(Input::Written(Ok(stored.clone())), t + 2.1);
    // The watch lags behind and now delivers the previous version.
    h.feed(Input::Observed(Some(old)), t + 2.2);
    h.feed(Input::Observed(Some(stored)), t + 2.3);
    let next = h.tick(t + 4.0);
    match &next[..] {
        [
            Action::Write(Write {
                op: WriteOp::Replace(o),
                ..
            }),
        ] => {
            assert_eq!(
                o.metadata.resource_version.as_deref(),
                Some(h.rv.to_string().as_str())
            )
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_malformed_lease_is_treated_as_held_and_never_panics() {
    let mut h = Harness::new("b");
    let weird = h.server_sets(
        LeaseBuilder::held_by("a")
            .spec_field("leaseDurationSeconds", json!("soon"))
            .spec_field("renewTime", json!(42))
            .spec_field("leaseTransitions", json!("many")),
    );
    h.feed(Input::Observed(Some(weird)), 0.0);
    assert_eq!(h.snapshot(0.0).holder.as_deref(), Some("a"));
    assert_eq!(h.first_write(0.0, 14.9), None);
    let (_, acquire) = h.first_write(15.0, 16.1).unwrap();
    let stored = h.accept(&acquire);
    assert_eq!(stored.record().transitions, 1);
}

#[test]
fn an_acquisition_whose_response_was_lost_leads_once_the_watch_shows_it() {
    let mut h = Harness::new("me");
    h.feed(Input::Observed(None), 0.0);
    let (t, create) = h.first_write(0.0, 1.1).unwrap();
    let committed = h.accept(&create);
    h.feed(
        Input::Written(Err(ApiError::Timeout(Duration::from_secs(5)))),
        t + 5.0,
    );
    assert!(!h.election.is_leading());
    h.feed(Input::Observed(Some(committed.clone())), t + 5.1);
    assert!(h.election.is_leading());
    assert_eq!(h.snapshot(t + 5.1).term, Some(committed.term_id()));
    assert!(
        (h.deadline_secs() - (t + 10.0)).abs() < 1e-6,
        "counts from when it was sent"
    );
}

/// Found by the property tests: the term id came from the record as last
/// seen, so an edit of `leaseTransitions` between our acquisition and our
/// learning of it could give our term the previous holder's id (G5).
#[test]
fn a_term_keeps_the_id_its_acquisition_wrote_whatever_the_record_says_later() {
    for response_lost in [true, false] {
        let mut h = Harness::new("me");
        let held = h.server_sets(LeaseBuilder::held_by("a").transitions(4));
        let previous = held.term_id();
        h.feed(Input::Observed(Some(held)), 0.0);
        let (at, acquire) = h.first_write(15.0, 16.1).unwrap();
        let committed = h.accept(&acquire);
        assert_eq!(committed.record().transitions, 5);
        // Someone sets leaseTransitions back; holder and renewTime are still
        // ours, so the record is still ours (G7). The watch shows it first.
        let mut edited = committed.object().clone();
        edited.data["spec"]["leaseTransitions"] = json!(4);
        h.rv += 1;
        edited.metadata.resource_version = Some(h.rv.to_string());
        h.feed(Input::Observed(Some(Lease::new(edited))), at + 0.05);
        let answer = if response_lost {
            Err(ApiError::Timeout(Duration::from_secs(5)))
        } else {
            Ok(committed.clone())
        };
        h.feed(Input::Written(answer), at + 0.1);
        assert!(h.election.is_leading(), "the record is ours");
        let term = h.snapshot(at + 0.1).term.unwrap();
        assert_eq!(term, committed.term_id(), "response lost: {response_lost}");
        assert_ne!(term, previous);
    }
}

/// Found by the property tests (two candidates): a create carries no
/// resourceVersion, so one sent while the Lease looked absent can land after
/// a record we saw since was deleted — while its holder, which has not seen
/// the deletion yet, still leads. Such a landing starts no term (G7); the
/// record is left to expire and contention goes on (G1).
#[test]
fn a_create_that_lands_after_a_record_we_saw_was_deleted_starts_no_term() {
    for response_lost in [false, true] {
        let mut h = Harness::new("b");
        h.feed(Input::Observed(None), 0.0);
        let (t, create) = h.first_write(0.0, 1.1).unwrap();
        // a's create wins, and the watch shows it while ours is in flight...
        let a = h.server_sets(LeaseBuilder::held_by("a").uid("uid-a"));
        h.feed(Input::Observed(Some(a)), t + 0.01);
        // ...then an operator deletes the Lease, and ours lands on the absence.
        h.server = None;
        let ours = h.accept(&create);
        if response_lost {
            h.feed(
                Input::Written(Err(ApiError::Timeout(Duration::from_secs(5)))),
                t + 0.02,
            );
            h.feed(Input::Observed(Some(ours)), t + 0.03);
        } else {
            h.feed(Input::Written(Ok(ours)), t + 0.02);
        }
        assert!(
            !h.election.is_leading(),
            "a may lead until it sees the deletion (response lost: {response_lost})"
        );
        let (_, acquire) = h
            .first_write(t + 0.03, t + 16.1)
            .expect("contends again once the record expired");
        assert!(matches!(
            acquire,
            Action::Write(Write {
                purpose: Purpose::Acquire,
                op: WriteOp::Replace(_),
                ..
            })
        ));
    }
}

/// Found by the property tests: the answer to a create arrived after the
/// watch had shown the Lease deleted and recreated by someone else. Taken as
/// news, it moved the view back to the dead Lease; every event of the live
/// one then looked like a repeat and was skipped, and acquisitions built on
/// the dead one conflicted for ever (G1).
#[test]
fn a_late_answer_about_a_since_recreated_lease_does_not_blind_the_election() {
    let mut h = Harness::new("me");
    h.feed(Input::Observed(None), 0.0);
    let (t, create) = h.first_write(0.0, 1.1).unwrap();
    let ours = h.accept(&create);
    let other = h.server_sets(LeaseBuilder::held_by("other").uid("uid-other"));
    h.feed(Input::Observed(Some(other.clone())), t + 0.1);
    h.feed(Input::Written(Ok(ours)), t + 0.2);
    assert!(!h.election.is_leading(), "our Lease is gone");
    assert_eq!(h.snapshot(t + 0.2).holder.as_deref(), Some("other"));
    // Once other's record expired, it acquires the live Lease.
    let (at, acquire) = h
        .first_write(t + 0.2, t + 16.2)
        .expect("acquires after the expiry");
    let Action::Write(Write {
        purpose: Purpose::Acquire,
        op: WriteOp::Replace(object),
        ..
    }) = &acquire
    else {
        panic!("{acquire:?}")
    };
    assert_eq!(object.metadata.uid.as_deref(), Some("uid-other"));
    assert_eq!(
        object.metadata.resource_version.as_deref(),
        other.resource_version()
    );
    let stored = h.accept(&acquire);
    h.feed(Input::Written(Ok(stored)), at + 0.05);
    assert!(h.election.is_leading());
}

#[test]
fn throttling_waits_for_retry_after_and_a_401_reloads_credentials() {
    let mut h = Harness::new("b");
    let held = h.server_sets(LeaseBuilder::held_by("a"));
    h.feed(Input::Observed(Some(held)), 0.0);
    let (at, _) = h.first_write(15.0, 16.1).unwrap();
    let retry_after = Some(Duration::from_secs(7));
    h.feed(
        Input::Written(Err(ApiError::TooManyRequests { retry_after })),
        at + 0.1,
    );
    assert_eq!(h.first_write(at + 0.1, at + 7.05), None);
    let (again, _) = h
        .first_write(at + 7.1, at + 8.2)
        .expect("retries after Retry-After");
    let actions = h.feed(Input::Written(Err(ApiError::Unauthorized)), again + 0.1);
    assert_eq!(actions, vec![Action::ReloadCredentials]);
}

#[test]
fn a_conflict_waits_for_the_watch_and_reads_only_if_it_stays_silent() {
    let mut h = Harness::new("b");
    let held = h.server_sets(LeaseBuilder::held_by("a"));
    h.feed(Input::Observed(Some(held)), 0.0);
    let (at, _) = h.first_write(15.0, 16.1).unwrap();
    h.feed(
        Input::Written(Err(ApiError::Conflict("Conflict".into()))),
        at + 0.1,
    );
    for step in 1..19 {
        let actions = h.tick(at + 0.1 + step as f64 * 0.1);
        assert!(
            actions.is_empty(),
            "no request while waiting for the watch: {actions:?}"
        );
    }
    let actions = h.tick(at + 2.2);
    assert!(matches!(actions[..], [Action::Read { .. }]), "{actions:?}");
}

#[test]
fn a_late_404_of_a_fallback_read_does_not_blind_the_election_to_a_recreated_lease() {
    let mut h = Harness::new("b");
    let held = h.server_sets(LeaseBuilder::held_by("a").uid("old"));
    h.feed(Input::Observed(Some(held)), 0.0);
    let (at, _) = h.first_write(15.0, 16.1).unwrap();
    h.feed(
        Input::Written(Err(ApiError::Conflict("Conflict".into()))),
        at + 0.1,
    );
    let read = h.tick(at + 2.2);
    assert!(matches!(read[..], [Action::Read { .. }]), "{read:?}");
    // While the read is in flight the Lease is deleted and recreated by
    // "c"; the watch shows the new one first, then the read answers 404.
    let recreated = h.server_sets(LeaseBuilder::held_by("c").uid("new"));
    h.feed(Input::Observed(Some(recreated)), at + 2.3);
    h.feed(Input::Read(Ok(None)), at + 2.4);
    assert_eq!(h.snapshot(at + 2.4).holder.as_deref(), Some("c"));
    // The live Lease's events still count: "c" renews, "c" releases with
    // the mark, and "b" takes it at once.
    let renewed = h.server_sets(LeaseBuilder::held_by("c").uid("new").renewed_at(7));
    h.feed(Input::Observed(Some(renewed)), at + 3.0);
    let released = h.server_sets(
        LeaseBuilder::unheld()
            .uid("new")
            .annotation(RELEASED_TERM_ANNOTATION, "new/0"),
    );
    h.feed(Input::Observed(Some(released)), at + 4.0);
    let (_, write) = h
        .first_write(at + 4.0, at + 5.1)
        .expect("acquires the released Lease at once");
    assert!(matches!(
        write,
        Action::Write(Write {
            op: WriteOp::Replace(_),
            purpose: Purpose::Acquire,
            ..
        })
    ));
}

#[test]
fn a_follower_honours_retry_after_only_up_to_a_lease_duration() {
    let mut h = Harness::new("b");
    h.feed(Input::Observed(None), 0.0);
    let (at, _) = h.first_write(0.0, 1.1).unwrap();
    h.feed(
        Input::Written(Err(ApiError::TooManyRequests {
            retry_after: Some(Duration::from_secs(3600)),
        })),
        at + 0.1,
    );
    let (retried, _) = h
        .first_write(at + 0.1, at + 17.0)
        .expect("tries again within a lease duration, not an hour");
    assert!(
        retried >= at + 15.0,
        "Retry-After honoured up to 15 s: {retried}"
    );
}

#[test]
fn shutdown_steps_down_then_releases_with_the_term_mark() {
    let mut h = Harness::new("me");
    let t = h.lead();
    let term = h.snapshot(t).term.unwrap();
    let actions = h.feed(Input::Shutdown, t + 1.0);
    assert!(actions.is_empty());
    assert!(!h.election.is_leading());
    assert_eq!(h.snapshot(t + 1.0).last_stop, Some(StopReason::Shutdown));
    let actions = h.feed(
        Input::Release {
            timeout: Duration::from_secs(5),
        },
        t + 1.0,
    );
    let [
        Action::Write(Write {
            purpose: Purpose::Release,
            op: WriteOp::Replace(object),
            timeout,
        }),
    ] = &actions[..]
    else {
        panic!("one release: {actions:?}")
    };
    assert_eq!(*timeout, Duration::from_secs(5));
    assert_eq!(object.data["spec"].get("holderIdentity"), None);
    assert_eq!(
        object.metadata.annotations.as_ref().unwrap()[RELEASED_TERM_ANNOTATION],
        term.as_str()
    );
    // Never acquires again after shutdown.
    assert!(h.first_write(t + 1.0, t + 40.0).is_none());
}

#[test]
fn shutdown_of_a_follower_releases_nothing() {
    let mut h = Harness::new("b");
    let held = h.server_sets(LeaseBuilder::held_by("a"));
    h.feed(Input::Observed(Some(held)), 0.0);
    h.feed(Input::Shutdown, 1.0);
    let release = Input::Release {
        timeout: Duration::from_secs(5),
    };
    assert_eq!(h.feed(release, 1.0), vec![]);
}

#[test]
fn a_release_waits_for_the_request_in_flight_and_builds_on_its_outcome() {
    let mut h = Harness::new("me");
    let t = h.lead();
    let renew = h.tick(t + 2.0);
    assert!(is_write(&renew, Purpose::Renew));
    h.feed(Input::Shutdown, t + 2.1);
    let release = || Input::Release {
        timeout: Duration::from_secs(5),
    };
    assert_eq!(h.feed(release(), t + 2.2), vec![], "one request at a time");
    // The renew landed: the release is a CAS on the record it wrote.
    let renewed = h.accept(&renew[0]);
    assert_eq!(h.feed(Input::Written(Ok(renewed)), t + 2.3), vec![]);
    let actions = h.feed(release(), t + 2.4);
    let [
        Action::Write(Write {
            purpose: Purpose::Release,
            op: WriteOp::Replace(object),
            ..
        }),
    ] = &actions[..]
    else {
        panic!("one release: {actions:?}")
    };
    assert_eq!(
        object.metadata.resource_version.as_deref(),
        Some(h.rv.to_string().as_str())
    );
    // Its answer goes back through `handle`; nothing follows it.
    let released = h.accept(&actions[0]);
    assert_eq!(h.feed(Input::Written(Ok(released)), t + 2.5), vec![]);
    assert!(!h.election.is_leading());
    assert_eq!(h.first_write(t + 2.5, t + 40.0), None);
}

#[test]
fn it_loses_and_regains_the_lease_any_number_of_times() {
    let mut h = Harness::new("me");
    let mut t = h.lead();
    let uid = h.server.as_ref().unwrap().uid().unwrap().to_owned();
    let mut terms = std::collections::HashSet::new();
    for round in 0..25 {
        terms.insert(h.snapshot(t).term.unwrap());
        // Someone else takes it...
        let other = h.server_sets(
            LeaseBuilder::held_by("other")
                .uid(&uid)
                .transitions(1000 + round),
        );
        h.feed(Input::Observed(Some(other)), t + 1.0);
        assert!(!h.election.is_leading());
        // ...and goes away; we take it back after expiry.
        let (at, acquire) = h.first_write(t + 1.0, t + 17.1).expect("contends again");
        let stored = h.accept(&acquire);
        h.feed(Input::Written(Ok(stored)), at + 0.05);
        assert!(h.election.is_leading(), "round {round}");
        t = at + 0.05;
    }
    assert_eq!(terms.len(), 25, "every term has its own id");
}

#[test]
fn the_next_wakeup_is_always_in_the_future_so_the_driver_never_spins() {
    let mut h = Harness::new("b");
    let held = h.server_sets(LeaseBuilder::held_by("a"));
    h.feed(Input::Observed(Some(held)), 0.0);
    // Waiting for expiry: wake at the expiry, not before.
    assert_eq!(
        h.election.next_wakeup(h.now(0.0).instant),
        Some(h.now(15.0).instant)
    );
    // After an attempt that is now in flight, and after its failure, every
    // wakeup lies strictly after the instant handled.
    let (at, _) = h.first_write(15.0, 16.1).unwrap();
    h.feed(
        Input::Written(Err(ApiError::Server {
            code: 500,
            message: "x".into(),
        })),
        at + 0.1,
    );
    // Every attempt fails the same way: nothing is ever in flight after a
    // step, so there is always a next attempt to wake up for.
    let mut attempts = 0;
    for step in 0..400 {
        let t = at + 0.1 + step as f64 * 0.1;
        if is_write(&h.tick(t), Purpose::Acquire) {
            attempts += 1;
            h.feed(
                Input::Written(Err(ApiError::Server {
                    code: 500,
                    message: "x".into(),
                })),
                t,
            );
        }
        let now = h.now(t).instant;
        let wake = h
            .election
            .next_wakeup(now)
            .unwrap_or_else(|| panic!("no wakeup at {t} with nothing in flight"));
        assert!(
            wake > now,
            "a wakeup at or before {t}: the driver would spin"
        );
    }
    assert!(attempts >= 3, "it kept retrying: {attempts}");
}

#[test]
fn a_throttled_leader_keeps_one_last_try_before_its_deadline() {
    let mut h = Harness::new("me");
    let t = h.lead();
    let renew = h.tick(t + 2.0);
    assert!(is_write(&renew, Purpose::Renew));
    let retry_after = Some(Duration::from_secs(30));
    h.feed(
        Input::Written(Err(ApiError::TooManyRequests { retry_after })),
        t + 2.1,
    );
    assert_eq!(
        h.first_write(t + 2.1, t + 8.95),
        None,
        "Retry-After is honoured..."
    );
    let (at, _) = h
        .first_write(t + 9.0, t + 9.95)
        .expect("...within the deadline");
    assert!(at < t + 10.0);
}

#[test]
fn a_late_acquire_response_does_not_revive_a_term_the_watch_already_ended() {
    let mut h = Harness::new("me");
    h.feed(Input::Observed(None), 0.0);
    let (t, create) = h.first_write(0.0, 1.1).unwrap();
    let committed = h.accept(&create);
    // The watch shows our acquisition first: we lead...
    h.feed(Input::Observed(Some(committed.clone())), t + 0.1);
    assert!(h.election.is_leading());
    // ...then an operator names someone else: we step down...
    let uid = committed.uid().unwrap().to_owned();
    let ghost = h.server_sets(LeaseBuilder::held_by("ghost").uid(&uid));
    h.feed(Input::Observed(Some(ghost)), t + 0.2);
    assert!(!h.election.is_leading());
    // ...and only then does the response of the acquisition arrive.
    h.feed(Input::Written(Ok(committed)), t + 0.3);
    assert!(
        !h.election.is_leading(),
        "a stale response must not start a term"
    );
    assert_eq!(h.snapshot(t + 0.3).holder.as_deref(), Some("ghost"));
}

#[test]
fn a_late_answer_about_a_deleted_lease_is_ignored() {
    let mut h = Harness::new("b");
    let held = h.server_sets(LeaseBuilder::held_by("a").uid("old"));
    h.feed(Input::Observed(Some(held)), 0.0);
    h.feed(Input::Observed(None), 1.0);
    // A read answered before the delete (with a version the watch never
    // showed us) arrives after it.
    let late = h.server_sets(LeaseBuilder::held_by("a").uid("old").renewed_at(5));
    h.feed(Input::Read(Ok(Some(late))), 2.0);
    // The next thing to happen is the expiry one duration after the delete
    // was seen — not one duration after the late answer.
    assert_eq!(
        h.election.next_wakeup(h.now(2.0).instant),
        Some(h.now(16.0).instant)
    );
    let (_, create) = h
        .first_write(16.0, 17.1)
        .expect("creates after one duration from the delete");
    assert!(matches!(
        create,
        Action::Write(Write {
            op: WriteOp::Create(_),
            ..
        })
    ));
}

#[test]
fn a_conflict_the_watch_already_explained_needs_no_read() {
    let mut h = Harness::new("b");
    let held = h.server_sets(LeaseBuilder::held_by("a"));
    h.feed(Input::Observed(Some(held)), 0.0);
    let (at, _) = h.first_write(15.0, 16.1).unwrap();
    // The winner's write reaches us through the watch before our 409 does.
    let winner = h.server_sets(LeaseBuilder::held_by("c").renewed_at(99));
    h.feed(Input::Observed(Some(winner)), at + 0.05);
    h.feed(
        Input::Written(Err(ApiError::Conflict("Conflict".into()))),
        at + 0.1,
    );
    for step in 1..40 {
        let actions = h.tick(at + 0.1 + step as f64 * 0.1);
        assert!(
            actions.is_empty(),
            "no read, no write before c's record expires: {actions:?}"
        );
    }
    assert_eq!(h.snapshot(at + 4.0).holder.as_deref(), Some("c"));
}

#[test]
fn a_throttled_leader_makes_one_last_try_not_a_burst() {
    let mut h = Harness::new("me");
    let t = h.lead();
    let retry_after = Some(Duration::from_secs(30));
    let mut attempts = 0;
    let mut at = t + 2.0;
    let mut actions = Vec::new();
    while h.election.is_leading() {
        actions.extend(h.tick(at));
        // Answer every renew with a 429, and count what that provokes.
        while is_write(&actions, Purpose::Renew) && attempts < 100 {
            attempts += 1;
            let throttled = ApiError::TooManyRequests { retry_after };
            actions = h.feed(Input::Written(Err(throttled)), at + 0.005);
        }
        actions.clear();
        at += 0.01;
    }
    assert_eq!(attempts, 2, "the first renew and one last try");
}

/// The release write among `actions`, checked to be the marked release of
/// `term` (holder cleared, G6).
fn marked_release(actions: &[Action], term: &TermId) -> Option<Action> {
    let release = actions.iter().find(|a| {
        matches!(
            a,
            Action::Write(Write {
                purpose: Purpose::Release,
                ..
            })
        )
    })?;
    let Action::Write(Write {
        op: WriteOp::Replace(object),
        ..
    }) = release
    else {
        panic!("a release replaces the object: {release:?}")
    };
    assert_eq!(object.data["spec"].get("holderIdentity"), None);
    assert_eq!(
        object.metadata.annotations.as_ref().unwrap()[RELEASED_TERM_ANNOTATION],
        term.as_str()
    );
    Some(Action::Write(Write {
        purpose: Purpose::Release,
        op: WriteOp::Replace(object.clone()),
        timeout: Duration::ZERO,
    }))
}

#[test]
fn an_unhealthy_collector_ends_the_term_at_once_with_a_marked_release() {
    let mut h = Harness::new("me");
    h.feed(Input::CollectorHealth(true), 0.0);
    let t = h.lead();
    let term = h.snapshot(t).term.unwrap();
    let actions = h.feed(Input::CollectorHealth(false), t + 1.0);
    assert!(!h.election.is_leading(), "steps down at once");
    let snapshot = h.snapshot(t + 1.0);
    assert_eq!(snapshot.last_stop, Some(StopReason::CollectorUnhealthy));
    assert_eq!(snapshot.collector_healthy, Some(false));
    assert_eq!(
        StopReason::CollectorUnhealthy.as_str(),
        "collector-unhealthy"
    );
    let release = marked_release(&actions, &term).expect("releases at once");
    let stored = h.accept(&release);
    assert!(stored.is_marked_released());
    h.feed(Input::Written(Ok(stored)), t + 1.1);
    // Released and free, but nothing more while the collector is unhealthy.
    assert_eq!(h.snapshot(t + 1.1).holder, None);
    assert_eq!(h.first_write(t + 1.1, t + 60.0), None);
}

#[test]
fn a_collector_that_does_not_run_ends_the_term_with_its_own_reason_and_a_marked_release() {
    let mut h = Harness::new("me");
    let t = h.lead();
    let term = h.snapshot(t).term.unwrap();
    let actions = h.feed(Input::CollectorNotRunning, t + 1.0);
    assert!(!h.election.is_leading(), "steps down at once");
    let snapshot = h.snapshot(t + 1.0);
    assert_eq!(snapshot.last_stop, Some(StopReason::CollectorNotRunning));
    assert_eq!(
        StopReason::CollectorNotRunning.as_str(),
        "collector-not-running"
    );
    let release = marked_release(&actions, &term).expect("releases at once");
    let stored = h.accept(&release);
    h.feed(Input::Written(Ok(stored)), t + 1.1);
    // No contention until the policy says it may lead again.
    assert_eq!(h.first_write(t + 1.1, t + 60.0), None);
    let actions = h.feed(CollectorVerdict::Fit.input(), t + 60.0);
    let contends = actions.iter().any(|a| matches!(a, Action::Write(_)))
        || h.first_write(t + 60.0, t + 120.0).is_some();
    assert!(contends, "contends again");
}

#[test]
fn a_term_that_stepped_down_never_starts_again_from_its_acquisition() {
    // The collector fails before the first renew, and passes again while
    // the release still waits for the gates: the record still shows our
    // acquisition, within its renew deadline. Leading that term again would
    // reopen gates that already said it ended, while the release is due.
    let mut h = Harness::new("me");
    h.feed(Input::CollectorHealth(true), 0.0);
    let t = h.lead();
    let acquired = h.server.clone();
    h.feed(Input::CollectorHealth(false), t + 0.5);
    assert!(!h.election.is_leading());
    h.feed(Input::CollectorHealth(true), t + 1.0);
    // A read after a broken watch shows a released record (a restore to an
    // older version, say), then the watch shows our acquisition again.
    let released_term = LeaseBuilder::held_by("a").transitions(1).build().term_id();
    let released = LeaseBuilder::unheld()
        .transitions(1)
        .annotation(RELEASED_TERM_ANNOTATION, released_term.as_str())
        .rv(5)
        .build();
    assert!(released.is_marked_released());
    h.feed(Input::WatchInterrupted, t + 1.1);
    h.feed(Input::Observed(Some(released)), t + 1.1);
    h.feed(Input::WatchInterrupted, t + 1.2);
    h.feed(Input::Observed(acquired), t + 1.2);
    assert!(
        !h.election.is_leading(),
        "the ended term led again: {:?}",
        h.snapshot(t + 1.2)
    );
}

#[test]
fn an_unhealthy_leader_releases_only_once_its_request_in_flight_answered() {
    let mut h = Harness::new("me");
    let t = h.lead();
    let term = h.snapshot(t).term.unwrap();
    let renew = h.tick(t + 2.0);
    assert!(is_write(&renew, Purpose::Renew));
    let actions = h.feed(Input::CollectorHealth(false), t + 2.1);
    assert!(!h.election.is_leading());
    assert!(actions.is_empty(), "one request at a time: {actions:?}");
    // The renew lands after the step-down: it does not revive the term, and
    // the release is built on the record it wrote.
    let renewed = h.accept(&renew[0]);
    let actions = h.feed(Input::Written(Ok(renewed)), t + 2.2);
    assert!(!h.election.is_leading());
    let Some(Action::Write(Write {
        op: WriteOp::Replace(object),
        ..
    })) = marked_release(&actions, &term)
    else {
        panic!("{actions:?}")
    };
    assert_eq!(
        object.metadata.resource_version.as_deref(),
        Some(h.rv.to_string().as_str())
    );
}

#[test]
fn a_failed_release_for_an_unhealthy_collector_is_not_retried_the_lease_expires() {
    let mut h = Harness::new("me");
    let t = h.lead();
    let actions = h.feed(Input::CollectorHealth(false), t + 1.0);
    assert!(is_write(&actions, Purpose::Release));
    let unavailable = ApiError::Server {
        code: 503,
        message: "unavailable".into(),
    };
    h.feed(Input::Written(Err(unavailable)), t + 1.1);
    assert_eq!(h.first_write(t + 1.1, t + 60.0), None);
}

#[test]
fn an_unhealthy_follower_never_writes_even_when_the_lease_is_free() {
    // Absent Lease: free at once, yet no create.
    let mut h = Harness::new("b");
    h.feed(Input::CollectorHealth(false), 0.0);
    h.feed(Input::Observed(None), 0.0);
    assert_eq!(h.snapshot(0.0).collector_healthy, Some(false));
    assert_eq!(h.first_write(0.0, 60.0), None);

    // A marked release, and an expired holder: no acquisition either.
    let mut h = Harness::new("b");
    let held = h.server_sets(LeaseBuilder::held_by("a").transitions(2));
    h.feed(Input::Observed(Some(held.clone())), 0.0);
    h.feed(Input::CollectorHealth(false), 1.0);
    assert_eq!(h.first_write(1.0, 30.0), None, "expired, not taken");
    let released = h.server_sets(
        LeaseBuilder::unheld()
            .transitions(2)
            .annotation(RELEASED_TERM_ANNOTATION, held.term_id().as_str()),
    );
    h.feed(Input::Observed(Some(released)), 31.0);
    assert_eq!(h.first_write(31.0, 60.0), None, "released, not taken");
    assert!(
        h.election.next_wakeup(h.now(60.0).instant).is_none(),
        "nothing to wake up for"
    );
}

#[test]
fn an_acquisition_that_lands_after_the_collector_failed_is_released_not_led() {
    let mut h = Harness::new("me");
    h.feed(Input::Observed(None), 0.0);
    let (t, create) = h.first_write(0.0, 1.1).unwrap();
    h.feed(Input::CollectorHealth(false), t + 0.05);
    let created = h.accept(&create);
    let term = created.term_id();
    let actions = h.feed(Input::Written(Ok(created)), t + 0.1);
    assert!(
        !h.election.is_leading(),
        "never leads for an unhealthy collector"
    );
    assert!(marked_release(&actions, &term).is_some(), "{actions:?}");
    assert_eq!(h.snapshot(t + 0.1).last_stop, None, "no term, so no stop");
}

#[test]
fn once_the_collector_is_healthy_again_it_acquires_again() {
    let mut h = Harness::new("me");
    h.feed(Input::CollectorHealth(false), 0.0);
    h.feed(Input::Observed(None), 0.0);
    assert_eq!(h.first_write(0.0, 20.0), None);
    h.feed(Input::CollectorHealth(true), 20.0);
    let (at, create) = h.first_write(20.0, 21.1).expect("contends again");
    assert!(at <= 21.0, "within the acquisition spread: {at}");
    let stored = h.accept(&create);
    h.feed(Input::Written(Ok(stored)), at + 0.05);
    assert!(h.election.is_leading());

    // And after a step-down and release for health, it takes its own
    // released Lease back when the collector recovers: a new term.
    let first = h.snapshot(at + 0.05).term.unwrap();
    let release = h.feed(Input::CollectorHealth(false), at + 1.0);
    let stored = h.accept(&release[0]);
    h.feed(Input::Written(Ok(stored)), at + 1.1);
    h.feed(Input::CollectorHealth(true), at + 5.0);
    let (again, acquire) = h.first_write(at + 5.0, at + 6.1).expect("acquires again");
    let stored = h.accept(&acquire);
    h.feed(Input::Written(Ok(stored)), again + 0.05);
    assert!(h.election.is_leading());
    let second = h.snapshot(again + 0.05).term.unwrap();
    assert_ne!(first, second, "a new term");
    assert_eq!(h.snapshot(again + 0.05).collector_healthy, Some(true));
}

// --- one identity, two processes (issue 14 item 2) ---

/// Strips the writer mark from a stored record, as a tool that rewrites
/// annotations would.
fn without_writer_mark(lease: &Lease, rv: u64) -> Lease {
    let mut object = lease.object().clone();
    if let Some(annotations) = object.metadata.annotations.as_mut() {
        annotations.remove(crate::elector::lease::WRITER_ANNOTATION);
    }
    object.metadata.resource_version = Some(rv.to_string());
    Lease::new(object)
}

#[test]
fn twins_with_one_identity_creating_at_one_microsecond_never_both_lead() {
    // Two processes given one identity (a constant --identity in a
    // DaemonSet template) see the Lease absent and create it in the same
    // microsecond: their creates are identical but for the writer mark.
    let mut a = Harness::new("same");
    let mut b = Harness::new("same");
    let create_a = a.feed(Input::Observed(None), 0.0);
    let create_b = b.feed(Input::Observed(None), 0.0);
    assert!(is_write(&create_a, Purpose::Acquire) && is_write(&create_b, Purpose::Acquire));
    // a's create lands; b's is a 409 (AlreadyExists), then b's watch shows a's record.
    let stored = a.accept(&create_a[0]);
    assert_eq!(
        stored.record().renew_micros,
        match &create_b[0] {
            Action::Write(Write {
                op: WriteOp::Create(o),
                ..
            }) => Lease::new((**o).clone()).record().renew_micros,
            other => panic!("{other:?}"),
        },
        "the same renewTime: only the mark tells the writes apart"
    );
    a.feed(Input::Written(Ok(stored.clone())), 0.01);
    b.feed(
        Input::Written(Err(ApiError::Conflict("AlreadyExists".into()))),
        0.01,
    );
    b.feed(Input::Observed(Some(stored.clone())), 0.02);
    a.feed(Input::Observed(Some(stored.clone())), 0.02);
    assert!(
        a.election.is_leading(),
        "the twin whose create landed leads"
    );
    assert!(
        !b.election.is_leading(),
        "the other twin took a's record for its own"
    );
    assert_eq!(
        b.election.identity_conflicts(),
        (1, Some(a.election.writer().as_str()))
    );
    assert_eq!(a.election.identity_conflicts().0, 0);
    // b keeps following: it waits a duration, like for any other holder,
    // and writes nothing meanwhile.
    assert_eq!(b.snapshot(0.02).holder.as_deref(), Some("same"));
    for t in 1..14 {
        assert!(b.tick(t as f64).is_empty());
    }
    // Seeing the same other writer again is not a new conflict.
    let renew = a.tick(2.0);
    let renewed = a.accept(&renew[0]);
    b.feed(Input::Observed(Some(renewed)), 2.1);
    assert_eq!(b.election.identity_conflicts().0, 1);
    assert!(!b.election.is_leading());
}

#[test]
fn a_twin_rewriting_our_record_unchanged_but_its_mark_ends_our_term() {
    let mut h = Harness::new("me");
    let t = h.lead();
    let ours = h.server.clone().unwrap();
    // The same spec, another process's mark: not our write.
    let mut object = ours.object().clone();
    crate::elector::lease::mark_writer(
        &mut object,
        &crate::elector::lease::WriterMark::from_u64(1),
    );
    h.rv += 1;
    object.metadata.resource_version = Some(h.rv.to_string());
    h.feed(Input::Observed(Some(Lease::new(object))), t + 0.5);
    assert!(!h.election.is_leading());
    assert_eq!(
        h.snapshot(t + 0.5).last_stop,
        Some(StopReason::LostToOtherHolder)
    );
    assert_eq!(h.election.identity_conflicts().0, 1);
}

#[test]
fn a_stripped_writer_mark_keeps_a_record_we_saw_stored_but_never_grants_one() {
    // Our own record, stored with our mark and seen so, then stripped of it:
    // still ours (a tool rewriting annotations costs nothing, G7), and the
    // next renew marks it again.
    let mut h = Harness::new("me");
    let t = h.lead();
    let ours = h.server.clone().unwrap();
    h.rv += 1;
    let stripped = without_writer_mark(&ours, h.rv);
    h.server = Some(stripped.clone());
    h.feed(Input::Observed(Some(stripped)), t + 0.5);
    assert!(h.election.is_leading());
    let renew = h.tick(t + 2.0);
    let renewed = h.accept(&renew[0]);
    assert_eq!(
        renewed.record().writer.as_deref(),
        Some(h.election.writer().as_str())
    );
    h.feed(Input::Written(Ok(renewed)), t + 2.1);
    assert!(h.election.is_leading());

    // An unmarked record with our identity and the renewTime of a create we
    // sent but never saw stored (a twin without marks, say an older
    // version, created in the same microsecond): not ours.
    let mut b = Harness::new("same");
    let create = b.feed(Input::Observed(None), 0.0);
    let theirs = b.accept(&create[0]);
    let theirs = without_writer_mark(&theirs, theirs.resource_version().unwrap().parse().unwrap());
    b.feed(
        Input::Written(Err(ApiError::Transport("reset".into()))),
        0.01,
    );
    b.feed(Input::Observed(Some(theirs)), 0.02);
    assert!(!b.election.is_leading());
    assert_eq!(
        b.election.identity_conflicts().0,
        0,
        "no mark, no proof of a twin"
    );
}

/// `builder`'s record as written by another process of our identity (mark 9).
fn marked_by_other(h: &mut Harness, builder: LeaseBuilder) -> Lease {
    let lease = h.server_sets(builder);
    let mut object = lease.object().clone();
    crate::elector::lease::mark_writer(
        &mut object,
        &crate::elector::lease::WriterMark::from_u64(9),
    );
    let lease = Lease::new(object);
    h.server = Some(lease.clone());
    lease
}

#[test]
fn a_restarted_process_finding_its_previous_incarnations_record_counts_no_twin() {
    // Restarted in the same pod (a crash, an OOM kill, a failed liveness
    // probe): the first list shows the record the old process wrote under
    // this identity, with its mark. Nobody writes under our identity while
    // we run: no twin, and the record still expires like anyone's.
    let mut h = Harness::new("me");
    let old = marked_by_other(&mut h, LeaseBuilder::held_by("me").renewed_at(5 * SECOND));
    h.feed(Input::Observed(Some(old.clone())), 0.0);
    assert_eq!(h.election.identity_conflicts().0, 0);
    assert_eq!(h.snapshot(0.0).holder.as_deref(), Some("me"));
    assert!(
        !h.election.is_leading(),
        "the old process's record is not ours"
    );
    // Seen again unchanged (a relist, an annotation edit): still nothing.
    let mut object = old.object().clone();
    h.rv += 1;
    object.metadata.resource_version = Some(h.rv.to_string());
    h.feed(Input::Observed(Some(Lease::new(object))), 3.0);
    assert_eq!(h.election.identity_conflicts().0, 0);
    assert_eq!(h.first_write(3.0, 14.9), None, "held until it expires");
    let (at, acquire) = h.first_write(15.0, 16.1).expect("takes it at expiry");
    let stored = h.accept(&acquire);
    h.feed(Input::Written(Ok(stored)), at + 0.01);
    assert!(h.election.is_leading());
    assert_eq!(h.election.identity_conflicts().0, 0);

    // The old process's last renew, sent before it died (stamped before our
    // first list) but stored after it: no twin either.
    let mut h = Harness::new("me");
    let first_seen = h.now(0.0).wall_micros;
    let old = marked_by_other(
        &mut h,
        LeaseBuilder::held_by("me").renewed_at(first_seen - 3 * SECOND),
    );
    h.feed(Input::Observed(Some(old)), 0.0);
    let late = marked_by_other(
        &mut h,
        LeaseBuilder::held_by("me").renewed_at(first_seen - SECOND),
    );
    h.feed(Input::Observed(Some(late)), 0.5);
    assert_eq!(
        h.election.identity_conflicts().0,
        0,
        "a late write of the old process"
    );

    // The same start, but the other process is alive and renews: a twin,
    // counted on its first write while we run.
    // (Its renewTime is its clock at the write, as ours on the same node.)
    let mut h = Harness::new("me");
    let before = h.now(0.0).wall_micros - SECOND;
    let first = marked_by_other(&mut h, LeaseBuilder::held_by("me").renewed_at(before));
    h.feed(Input::Observed(Some(first)), 0.0);
    let while_we_run = h.now(2.0).wall_micros;
    let renewed = marked_by_other(&mut h, LeaseBuilder::held_by("me").renewed_at(while_we_run));
    h.feed(Input::Observed(Some(renewed)), 2.0);
    assert_eq!(
        h.election.identity_conflicts(),
        (
            1,
            Some(crate::elector::lease::WriterMark::from_u64(9).as_str())
        )
    );
}

/// The resourceVersion an acquisition or renew is built on.
fn built_on(action: &Action) -> Option<String> {
    match action {
        Action::Write(Write {
            op: WriteOp::Replace(object),
            ..
        }) => object.metadata.resource_version.clone(),
        other => panic!("expected a PUT, got {other:?}"),
    }
}

#[test]
fn a_lease_restored_at_an_older_resource_version_is_adopted_from_a_list_or_a_read() {
    // etcd restored from a snapshot without --bump-revision: the same Lease
    // (same uid) is back at revision 500, held by c, after we saw 1000.
    let c_at = |rv: u64, renew: i64| LeaseBuilder::held_by("c").rv(rv).renewed_at(renew).build();

    // The API servers restart onto it: the watch breaks, the fresh one lists.
    let mut h = Harness::new("b");
    h.rv = 999;
    let held = h.server_sets(LeaseBuilder::held_by("a"));
    h.feed(Input::Observed(Some(held)), 0.0);
    h.feed(Input::WatchInterrupted, 1.0);
    h.feed(Input::Observed(Some(c_at(500, 42))), 1.5);
    assert_eq!(
        h.snapshot(1.5).holder.as_deref(),
        Some("c"),
        "the list is the truth"
    );
    // c's renews, newer than the list, count: no attempt while c renews.
    h.feed(Input::Observed(Some(c_at(501, 44))), 3.0);
    assert_eq!(h.snapshot(3.0).holder.as_deref(), Some("c"));
    assert_eq!(h.first_write(3.0, 17.9), None, "c's record is live");
    let (_, acquire) = h.first_write(18.0, 19.1).expect("after c's expiry");
    assert_eq!(
        built_on(&acquire).as_deref(),
        Some("501"),
        "on a revision that exists"
    );

    // The watch goes on without a break: its event at 501 cannot be told from
    // a late repeat and is skipped. The attempt built on 1000 gets a 409; the
    // GET after it is the server's truth. One conflict, then quiet.
    let mut h = Harness::new("b");
    h.rv = 999;
    let held = h.server_sets(LeaseBuilder::held_by("a"));
    h.feed(Input::Observed(Some(held)), 0.0);
    h.feed(Input::Observed(Some(c_at(501, 44))), 1.0);
    assert_eq!(h.snapshot(1.0).holder.as_deref(), Some("a"));
    let (at, acquire) = h.first_write(1.0, 16.1).expect("a's record expires here");
    assert_eq!(built_on(&acquire).as_deref(), Some("1000"));
    let conflict = Input::Written(Err(ApiError::Conflict("Conflict".into())));
    assert!(h.feed(conflict, at + 0.05).is_empty());
    let read = h.tick(at + 2.1);
    assert!(matches!(read[..], [Action::Read { .. }]), "{read:?}");
    assert!(
        h.feed(Input::Read(Ok(Some(c_at(502, 46)))), at + 2.2)
            .is_empty()
    );
    assert_eq!(h.snapshot(at + 2.2).holder.as_deref(), Some("c"));
    h.feed(Input::Observed(Some(c_at(503, 48))), at + 3.0);
    assert_eq!(h.snapshot(at + 3.0).holder.as_deref(), Some("c"));
    assert_eq!(h.first_write(at + 3.0, at + 17.9), None, "no 409 loop");
}

/// A process of this pod resumes its predecessor's term from the write the
/// state directory recorded: it leads at once in the same term while the
/// Lease shows that write, up to that write's renew deadline — and not at
/// all when the record changed since, or the write is too old.
#[test]
fn a_recorded_write_the_lease_still_shows_resumes_its_term_until_its_renew_deadline() {
    let mut old = Harness::new("a");
    old.lead();
    let recorded = old
        .election
        .resumable()
        .expect("a leader's write to resume");
    let server = old.server.clone().expect("the stored Lease");
    let term = old.election.snapshot(old.now(0.1).instant).term;

    // Restarted 1 s later (the clocks of both harnesses agree: same boot).
    let mut new = Harness::new("a");
    new.t0 = old.t0;
    new.election.resume(&recorded, new.now(1.0)).unwrap();
    new.feed(Input::Observed(Some(server.clone())), 1.0);
    let snapshot = new.snapshot(1.0);
    assert!(snapshot.leading, "leads at once");
    assert_eq!(snapshot.term, term, "in the same term");
    assert_eq!(
        new.election.identity_conflicts().0,
        0,
        "its own mark, no twin"
    );
    // Its leadership ends at the old write's renew deadline unless renewed.
    let deadline = new.deadline_secs();
    assert!((deadline - (0.01 + 10.0)).abs() < 0.1, "{deadline}");

    // The record changed since (someone wrote the renewTime): not ours.
    let mut changed = Harness::new("a");
    changed.t0 = old.t0;
    changed
        .election
        .resume(&recorded, changed.now(1.0))
        .unwrap();
    let edited = changed.server_sets(
        LeaseBuilder::held_by("a")
            .uid(server.uid().unwrap())
            .renewed_at(1_900_000_000 * SECOND),
    );
    changed.feed(Input::Observed(Some(edited)), 1.0);
    assert!(
        !changed.snapshot(1.0).leading,
        "a changed record is not resumed"
    );

    // Too old: its renew deadline passed before the restart.
    let mut late = Harness::new("a");
    late.t0 = old.t0;
    assert_eq!(
        late.election.resume(&recorded, late.now(10.5)),
        Err(NotResumed::TooOld)
    );

    // The Lease was deleted and created again with the same record: another
    // Lease (another uid), not the one written to.
    let mut recreated = Harness::new("a");
    recreated.t0 = old.t0;
    recreated
        .election
        .resume(&recorded, recreated.now(1.0))
        .unwrap();
    let mut object = server.object().clone();
    object.metadata.uid = Some("another-uid".into());
    recreated.feed(Input::Observed(Some(stored(object, 999))), 1.0);
    assert!(
        !recreated.snapshot(1.0).leading,
        "a recreated Lease is not resumed"
    );
}

/// The first observation says what became of a resumed write — the term
/// resumed, or why not — once, for the driver to log.
#[test]
fn the_first_observation_says_whether_a_resumed_write_was_taken_and_why_not() {
    let mut old = Harness::new("a");
    old.lead();
    let recorded = old.election.resumable().expect("a write to resume");
    let server = old.server.clone().expect("the stored Lease");
    let uid = server.uid().unwrap().to_owned();
    let term = old.election.snapshot(old.now(0.1).instant).term.unwrap();
    let restarted = |lease: Option<Lease>, at: f64| {
        let mut new = Harness::new("a");
        new.t0 = old.t0;
        new.election.resume(&recorded, new.now(1.0)).unwrap();
        assert_eq!(
            new.election.take_resumption(),
            None,
            "not before it is seen"
        );
        new.feed(Input::Observed(lease), at);
        let said = new.election.take_resumption();
        assert_eq!(new.election.take_resumption(), None, "said once");
        new.feed(Input::Observed(new.server.clone()), at + 0.1);
        assert_eq!(new.election.take_resumption(), None, "only the first");
        said
    };
    assert_eq!(
        restarted(Some(server.clone()), 1.0),
        Some(Resumption::Resumed(term))
    );
    assert_eq!(
        restarted(None, 1.0),
        Some(Resumption::Dropped(Dropped::Deleted))
    );
    let mut object = server.object().clone();
    object.metadata.uid = Some("another-uid".into());
    assert_eq!(
        restarted(Some(stored(object, 999)), 1.0),
        Some(Resumption::Dropped(Dropped::Recreated))
    );
    let held_by_b = LeaseBuilder::held_by("b").uid(&uid).rv(999).build();
    assert_eq!(
        restarted(Some(held_by_b), 1.0),
        Some(Resumption::Dropped(Dropped::OtherHolder(Some("b".into()))))
    );
    let renewed_since = LeaseBuilder::held_by("a")
        .uid(&uid)
        .renewed_at(1_900_000_000 * SECOND)
        .rv(999)
        .build();
    assert_eq!(
        restarted(Some(renewed_since), 1.0),
        Some(Resumption::Dropped(Dropped::OtherRenewTime))
    );
    // Seen only after the write's renew deadline (sent at about 0 s).
    assert_eq!(
        restarted(Some(server.clone()), 10.5),
        Some(Resumption::Dropped(Dropped::TooOld))
    );
    // The words the driver logs.
    assert_eq!(
        Dropped::OtherHolder(Some("b".into())).to_string(),
        "the lease shows another holder (\"b\")"
    );
}

/// What spreading counts as held: a record of this process's own (leading,
/// or stepping down until the release), never one that merely names this
/// identity — a previous process of this pod that died, its term not
/// resumed.
#[test]
fn only_a_record_of_this_process_is_published_as_its_own() {
    let mut restarted = Harness::new("a");
    let dead = restarted.server_sets(
        LeaseBuilder::held_by("a")
            .renewed_at(1_800_000_000 * SECOND)
            .annotation(crate::elector::lease::WRITER_ANNOTATION, "00000000000000dd"),
    );
    restarted.feed(Input::Observed(Some(dead)), 0.0);
    let snapshot = restarted.snapshot(0.5);
    assert_eq!(snapshot.holder.as_deref(), Some("a"), "names this identity");
    assert!(!snapshot.leading && !snapshot.own_record);

    let mut h = Harness::new("a");
    let t = h.lead();
    assert!(h.snapshot(t + 0.1).own_record);
    h.feed(Input::Shutdown, t + 0.2);
    let stepping_down = h.snapshot(t + 0.3);
    assert!(
        !stepping_down.leading && stepping_down.own_record,
        "until its release"
    );
    let release = h.feed(
        Input::Release {
            timeout: Duration::from_secs(1),
        },
        t + 0.4,
    );
    let released = h.accept(&release[0]);
    h.feed(Input::Written(Ok(released)), t + 0.5);
    assert!(!h.snapshot(t + 0.6).own_record);
}
