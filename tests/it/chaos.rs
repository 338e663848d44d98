//! Chaos, one Lease: five real `leader-gate serve` processes contending for
//! `cluster-metrics` under a seeded random mix of faults, run by the chaos
//! harness (`support/chaos/`, which documents the seeds, the draw and the
//! recording) and judged afterwards by the history checker
//! (`support/history.rs`, which documents its rules) from every process's
//! `/events` stream and a sampler of every process's `/leader`.
//!
//! - by default (CI) it runs the fixed [`CI_SEEDS`], schedules that passed:
//!   a test that draws a fresh schedule on every CI run would fail CI on
//!   whatever a new seed finds, not on what the change did;
//! - `LEADER_GATE_CHAOS_SEED=random` draws a fresh seed, for longer local
//!   runs; `LEADER_GATE_CHAOS_SEED=<n>` replays a schedule (the seed is
//!   printed first thing, and again with any failure);
//! - `LEADER_GATE_CHAOS_SECS=<n>` sets how long faults are injected
//!   (default 75 s; the whole test takes about 30 s more).
//!
//! Faults: SIGKILL and restart, SIGTERM and restart (two thirds of them after
//! a pre-stop step-down, `POST /handover` as `leader-gate prestop` sends it,
//! up to 1.5 s before the SIGTERM), SIGSTOP for longer than
//! the lease then SIGCONT, per-client partition, 403 episodes (RBAC binding
//! deleted, or 403 on some verbs), 5xx bursts, 429 with Retry-After, added
//! latency, hung requests, dropped watches, 410 Gone (open watches expired,
//! history compacted, re-watches refused), external holder edits (a ghost,
//! a live peer, a holder cleared without the release mark), Lease deletion,
//! a restart of the fake API server (store kept, every connection and watch
//! cut) and token rotation. Each heals after a bounded time; at most two are
//! active at once.
//!
//! Leader routing: every sidecar runs with `--route-service` (its own pod
//! IP), so the shipped-style slice `collector-leader` is written through all
//! of these faults; the checker holds every write that lists a pod to that
//! pod's own terms (rule 5 of `history.rs`), and at the end the slice must
//! list the final leader within [`SLICE_SETTLES`].
//!
//! State directory: every sidecar runs with `--state-dir` (one per member,
//! kept across its restarts, as a pod's `emptyDir`), and a third of the
//! SIGKILLs restart within a second, so a killed leader may resume its own
//! term; the checker accepts a term held by successive incarnations of one
//! instance only when each was spawned after the previous one was gone.
//!
//! Named successor (issue 13): the candidates claim the successor slot
//! within [`CLAIM_WINDOW`], so a successor is named most of the run, and
//! three kinds of fault aim at it (`support/chaos/successor.rs`): SIGKILL
//! of the candidate the Lease names successor (alone, or just before the
//! leader is SIGTERMed or SIGKILLed), an operator's `leader-gate handover`
//! (the real binary, run as a separate process: to the successor, to a live
//! candidate, to an identity that does not exist), and a hand-over to a
//! candidate SIGSTOPped first (SIGCONT later). A successor kill waits up to
//! two lease durations for a live successor to be named; variants go to the
//! one done least so far. A hand-over never suspends the gap check: by
//! design it leaves the group leaderless no longer than an expiry. The run
//! fails if it killed no successor or saw no hand-over, so these faults
//! cannot silently not happen (a hand-over: a holder stopped with
//! `handover-requested` and the candidate asked for took over); the summary
//! counts both. Clock faults are not injected: the process has no clock
//! seam a test can reach from outside (they are covered by the state-machine
//! tests through the clock seam).

use crate::support;

use std::time::{Duration, Instant};

use serde_json::Value;
use support::chaos::{self, Chaos, EPSILON, Kind, World, bounds};
use support::fake_apiserver::{Conditions, FakeApiServer, Resource, Verb};
use support::history::{
    History, Message, SliceWrite, Verdict, Violation, check, failure_report, rel,
};

const LEASE: &str = "cluster-metrics";
const DEFAULT_SECS: u64 = 75;
/// `--successor-claim-window`: claims land within [retry, window] of a new
/// term, so most faults find a successor named.
const CLAIM_WINDOW: &str = "3s";
/// `--route-service`: a Service without a selector, routed through the
/// EndpointSlice `<SERVICE>-leader`.
const SERVICE: &str = "collector";
const SLICE: &str = "collector-leader";
/// How soon after the cluster settled the slice lists its leader: a write
/// that failed during the last fault is retried within a lease duration
/// (the routing backoff's ceiling).
const SLICE_SETTLES: Duration = Duration::from_secs(5);

/// The schedules CI runs, one after the other: each passed at the default
/// length. A seed that once failed and was fixed makes a good addition.
const CI_SEEDS: [u64; 2] = [12054846638331312591, 1890576493116111142];

/// Kinds and their weights (the order is part of the draw: a seed replays
/// only with the same table).
#[rustfmt::skip]
const KINDS: &[(Kind, u32)] = &[
    // the processes
    (Kind::Kill, 10), (Kind::Term, 8), (Kind::Stop, 7),
    // one client's requests
    (Kind::Partition, 9), (Kind::Forbidden, 7), (Kind::ServerErrors, 8), (Kind::Throttle, 5),
    (Kind::Latency, 7), (Kind::Hang, 7), (Kind::DropWatches, 6), (Kind::Gone, 6),
    // the Lease and the API server
    (Kind::HolderEdit, 7), (Kind::Delete, 5), (Kind::ApiRestart, 5), (Kind::RotateToken, 3),
    // the named successor
    (Kind::SuccessorKill, 14), (Kind::Handover, 12), (Kind::HandoverStopped, 5),
];

/// One Lease, routed, with named successors.
static WORLD: World = World {
    label: "chaos",
    leases: &[LEASE],
    kinds: KINDS,
    sample_every: Duration::from_millis(20),
    // Routing as shipped: the slice exists, and the Role grants get and
    // update on it by name.
    prepare: |api| api.ship_route_slice(SERVICE),
    flags,
    prestop_hook: true,
    forbid_every_verb: true,
    closing: None,
};

/// Member `i`'s flags: its pod IP (kept across its restarts, as a pod's
/// is; the API server refuses loopback endpoints).
fn flags(i: usize) -> Vec<String> {
    let ip = format!("10.42.0.{}", 10 + i);
    [
        "--successor-claim-window",
        CLAIM_WINDOW,
        "--route-service",
        SERVICE,
        "--pod-ip",
        &ip,
    ]
    .map(str::to_owned)
    .to_vec()
}

/// The pods a version of the slice lists, by their Pod reference.
fn listed(slice: &Value) -> Vec<String> {
    slice["endpoints"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|e| e["targetRef"]["name"].as_str().unwrap_or("?").to_owned())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn five_candidates_under_random_faults_never_overlap_and_always_recover() {
    chaos::run_each(&WORLD, &CI_SEEDS, DEFAULT_SECS, finish).await;
}

/// The CI seeds still draw the schedules they passed with (the table of
/// kinds and the draw are part of a seed's meaning).
#[test]
fn the_ci_seeds_replay_their_schedules() {
    assert_eq!(
        chaos::drawn(&WORLD, CI_SEEDS[0], 6),
        [
            "handover/0/2/0",
            "partition/0/2/1",
            "latency/0/1/1",
            "sigkill+restart/0/0/1",
            "successor-sigkill/0/1/1",
            "holder-edit/0/2/0",
        ]
    );
    assert_eq!(
        chaos::drawn(&WORLD, CI_SEEDS[1], 6),
        [
            "sigstop+sigcont/0/1/2",
            "hang/0/2/2",
            "handover/0/2/2",
            "successor-sigkill/0/2/0",
            "apiserver-restart/0/2/0",
            "token-rotation/0/1/2",
        ]
    );
}

/// The end: a quiet stretch, liveness checks on the live cluster, then the
/// history check.
async fn finish(mut chaos: Chaos) {
    eprintln!(
        "chaos: faults ended at {}; quiet for {:?}",
        rel(chaos.origin, Instant::now()),
        bounds().max_gap() * 2
    );
    chaos.idle(bounds().max_gap() * 2).await;
    chaos.poll_handovers(true).await;
    // Every process healthy, exactly one leader, and every follower
    // names it — within one more gap bound, or something is wedged.
    let deadline = Instant::now() + bounds().max_gap();
    loop {
        let mut leaders = Vec::new();
        let mut views = Vec::new();
        let mut healthy = true;
        for m in &chaos.members {
            let Some(s) = &m.sidecar else { continue };
            healthy &= s
                .admin_get("/healthz")
                .await
                .is_some_and(|p| p.status == 200);
            let probe = s.leader().await;
            if probe.as_ref().is_some_and(|p| p.leading()) {
                leaders.push(m.name);
            }
            views.push((m.name, probe.and_then(|p| p.holder().map(str::to_owned))));
        }
        let agreed = leaders.len() == 1
            && views
                .iter()
                .all(|(_, holder)| holder.as_deref() == Some(leaders[0]));
        if healthy && agreed {
            break;
        }
        if Instant::now() > deadline {
            let last = format!("healthy {healthy}, leading {leaders:?}, holders seen {views:?}");
            chaos.violated(
                "wedged",
                format!("the cluster did not settle on one leader: {last}"),
            );
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    slice_lists_the_leader(&mut chaos).await;
    let end = chaos.stop_recording().await;

    let mut history = chaos.history(0, end);
    history.slice_writes = slice_writes(&chaos.api);
    let mut verdict = check(&history, &bounds());
    verdict.violations.extend(chaos.violations.iter().cloned());
    // The named-successor faults happened: a run without them proves
    // nothing about them.
    let stats = &chaos.successor;
    let kills: usize = stats.kills.values().sum();
    if kills == 0 {
        verdict.violations.push(Violation {
            at: end,
            rule: "unexercised",
            detail: format!(
                "no named successor was SIGKILLed ({} tries found none live)",
                stats.kills_skipped
            ),
        });
    }
    // A new holder after a request may be another fault's doing: a
    // hand-over happened when a holder stepped down on the request and
    // the candidate asked for took over.
    let stepped_down = chaos::stop_reasons(&history)
        .get("handover-requested")
        .copied()
        .unwrap_or(0);
    if stepped_down == 0 || stats.by_target == 0 {
        verdict.violations.push(Violation {
            at: end,
            rule: "unexercised",
            detail: format!(
                "no hand-over happened: {stepped_down} stopped-leading handover-requested, \
                 {} taken by the candidate asked for (asked for {:?}; completed {:?}; \
                 refused {:?})",
                stats.by_target, stats.requested, stats.completed, stats.refused
            ),
        });
    }
    // Rule 5 judged writes of the slice: a run without any proves
    // nothing about routing.
    if verdict.slice_writes_listing == 0 {
        verdict.violations.push(Violation {
            at: end,
            rule: "unexercised",
            detail: "no write of the slice listed a pod".to_owned(),
        });
    }
    verdict.violations.sort_by_key(|v| v.at);
    let report = if verdict.violations.is_empty() {
        String::new()
    } else {
        failure_report(&history, &verdict, &bounds())
    };
    chaos.publish(&summary(&chaos, &history, &verdict), &report);
}

/// The slice lists the one leader (and nobody else) within
/// [`SLICE_SETTLES`] of the cluster settling.
async fn slice_lists_the_leader(chaos: &mut Chaos) {
    let settled = Instant::now();
    let deadline = settled + SLICE_SETTLES;
    loop {
        let mut leaders = Vec::new();
        for m in &chaos.members {
            if let Some(s) = &m.sidecar
                && s.leader().await.is_some_and(|p| p.leading())
            {
                leaders.push(m.name.to_owned());
            }
        }
        let slice = chaos.api.endpoint_slice(SLICE).map(|s| listed(&s));
        if leaders.len() == 1 && slice.as_deref() == Some(&leaders[..]) {
            eprintln!(
                "chaos: the slice lists the final leader {} ({:?} after the cluster settled)",
                leaders[0],
                settled.elapsed()
            );
            return;
        }
        if Instant::now() > deadline {
            chaos.violated(
                "routing",
                format!(
                    "{SLICE_SETTLES:?} after the cluster settled the slice lists {slice:?}, \
                     the leader is {leaders:?}"
                ),
            );
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Every successful write of the slice, from the API server's log.
fn slice_writes(api: &FakeApiServer) -> Vec<SliceWrite> {
    api.requests()
        .into_iter()
        .filter(|r| r.resource == Some(Resource::EndpointSlices))
        .filter(|r| r.name.as_deref() == Some(SLICE))
        .filter(|r| matches!(r.verb, Verb::Create | Verb::Update))
        .filter(|r| matches!(r.status, Some(200 | 201)))
        .map(|r| SliceWrite {
            instance: r.client,
            received: r.at,
            marked: !r.conditions.is_empty()
                && r.conditions.iter().all(|c| *c == Conditions::TERMINATING),
            lists: r.lists,
        })
        .collect()
}

fn summary(chaos: &Chaos, history: &History, verdict: &Verdict) -> String {
    let reasons = chaos::stop_reasons(history);
    let count = |kind: &str| verdict.transitions.get(kind).copied().unwrap_or(0);
    let rule = |rule: &str| verdict.violations.iter().filter(|v| v.rule == rule).count();
    let total: usize = chaos.counts.values().sum();
    let stats = &chaos.successor;
    format!(
        "chaos summary (seed {seed}, {dur:.0} s checked)\n\
         faults injected: {total} {counts:?} (skipped, no eligible target: {skipped})\n\
         transitions observed: started-leading {started}, stopped-leading {stopped} {reasons:?}, \
         new-leader {new_leader}, renewed {renewed}, state {state}\n\
         terms: {probed} seen leading by the sampler, {announced} announced on streams, \
         {resumed} resumed by a restarted process; \
         processes: {procs}; probes: {probes} ({unanswered} unanswered)\n\
         overlaps: {overlaps}\n\
         slice writes: {listing} listing a pod, each checked against its terms ({margin:?} \
         of the {eps:?} allowed used), {marked} marking its writer terminating, {empty} listing nobody; \
         routing violations: {routing}\n\
         starts blind to a just-deleted Lease (counted apart, see history.rs): {blind:?}\n\
         longest leaderless gap after healing: {gap} (bound {bound:?}); longest gap overall: {raw}\n\
         successor crashes: {kills} {kill_kinds:?} (skipped, no live successor named: {kills_skipped})\n\
         hand-overs: asked {asked} {asked_kinds:?}, completed {completed:?}: taken by the one asked {by_target}, by the fallback {by_fallback}; \
         refused {refused} {refusals:?}\n\
         violations: {violations}",
        kills = stats.kills.values().sum::<usize>(),
        kill_kinds = stats.kills,
        kills_skipped = stats.kills_skipped,
        asked = stats.requested.values().sum::<usize>(),
        asked_kinds = stats.requested,
        completed = stats.completed,
        by_target = stats.by_target,
        by_fallback = stats.by_fallback,
        refused = stats.refused.len(),
        refusals = stats.refused,
        seed = chaos.seed,
        listing = verdict.slice_writes_listing,
        empty = verdict.slice_writes_empty,
        marked = verdict.slice_writes_marked,
        margin = verdict.slice_write_margin_used,
        eps = EPSILON,
        blind = verdict.blind_after_deletion,
        dur = (history.end - history.check_from).as_secs_f64(),
        counts = chaos.counts,
        skipped = chaos.skipped,
        started = count("started-leading"),
        stopped = count("stopped-leading"),
        new_leader = count("new-leader"),
        renewed = count("renewed"),
        state = count("state"),
        probed = verdict.terms_probed,
        announced = verdict.terms_announced,
        resumed = verdict.terms_resumed,
        procs = history.incarnations.len(),
        probes = verdict.probes,
        unanswered = verdict.unanswered,
        overlaps = rule("overlap"),
        routing = rule("routing"),
        gap = chaos::stretch(history.origin, verdict.longest_gap),
        bound = bounds().max_gap(),
        raw = chaos::stretch(history.origin, verdict.longest_raw_gap),
        violations = verdict.violations.len(),
    )
}

// === the checker catches what it must (synthetic histories) ===

mod history_checker {
    use super::*;
    use support::history::{
        End, FaultSpan, Incarnation, LEASE_DELETED, Probe, StreamEnd, StreamEvent,
    };

    /// A synthetic history on a millisecond grid.
    struct Synth {
        h: History,
        /// The incarnation the next probes and events come from.
        incarnation: u32,
    }

    impl Synth {
        fn new() -> Synth {
            let origin = Instant::now();
            Synth {
                h: History {
                    seed: 7,
                    origin,
                    check_from: origin,
                    end: origin + Duration::from_secs(60),
                    probes: Vec::new(),
                    events: Vec::new(),
                    incarnations: Vec::new(),
                    faults: Vec::new(),
                    slice_writes: Vec::new(),
                },
                incarnation: 1,
            }
        }

        /// The probes and events that follow come from incarnation `n`.
        fn in_incarnation(mut self, n: u32) -> Synth {
            self.incarnation = n;
            self
        }

        fn at(&self, ms: u64) -> Instant {
            self.h.origin + Duration::from_millis(ms)
        }

        fn end_at(mut self, ms: u64) -> Synth {
            self.h.end = self.at(ms);
            self
        }

        /// A history of streams only: no sampler, so no gap to check.
        fn streams_only(mut self) -> Synth {
            self.h.check_from = self.h.end;
            self
        }

        fn process(
            mut self,
            name: &str,
            number: u32,
            spawned: u64,
            end: Option<(u64, End)>,
        ) -> Synth {
            let ended = end.map(|(ms, e)| (self.at(ms), e));
            self.h.incarnations.push(Incarnation {
                instance: name.into(),
                number,
                spawned: self.at(spawned),
                ended,
                stream_from: None,
                stream_end: None,
            });
            self
        }

        /// The test's reader of `name`'s stream connected at `ms`.
        fn stream(mut self, name: &str, ms: u64) -> Synth {
            let at = self.at(ms);
            for i in self
                .h
                .incarnations
                .iter_mut()
                .filter(|i| i.instance == name)
            {
                i.stream_from = Some(i.stream_from.map_or(at, |f| f.min(at)));
            }
            self
        }

        /// Probes every 20 ms over `[from, to)`, each answered in 5 ms.
        fn probes(
            mut self,
            name: &str,
            from: u64,
            to: u64,
            status: u16,
            term: Option<&str>,
        ) -> Synth {
            let mut t = from;
            while t < to {
                self.h.probes.push(Probe {
                    instance: name.into(),
                    incarnation: self.incarnation,
                    sent: self.at(t),
                    received: self.at(t + 5),
                    status,
                    term: term.map(str::to_owned),
                    holder: None,
                    valid_for: Duration::from_millis(if status == 200 { 3000 } else { 0 }),
                });
                t += 20;
            }
            self
        }

        fn probe(mut self, name: &str, sent: u64, received: u64, term: &str) -> Synth {
            self.h.probes.push(Probe {
                instance: name.into(),
                incarnation: self.incarnation,
                sent: self.at(sent),
                received: self.at(received),
                status: 200,
                term: Some(term.into()),
                holder: None,
                valid_for: Duration::from_millis(3000),
            });
            self
        }

        fn event(
            self,
            name: &str,
            ms: u64,
            message: Message,
            term: Option<&str>,
            valid_ms: Option<u64>,
        ) -> Synth {
            let mut s = self.stream(name, ms.saturating_sub(5));
            s.h.events.push(StreamEvent {
                instance: name.into(),
                incarnation: s.incarnation,
                arrived: s.at(ms + 2),
                published: s.at(ms),
                message,
                id: None,
                term: term.map(str::to_owned),
                valid_for: valid_ms.map(Duration::from_millis),
            });
            s
        }

        fn fault(mut self, from: u64, to: u64, suspends: bool) -> Synth {
            self.h.faults.push(FaultSpan {
                kind: "test".into(),
                target: "a".into(),
                detail: String::new(),
                injected: self.at(from),
                healed: Some(self.at(to)),
                suspends_gap_check: suspends,
            });
            self
        }

        /// The chaos's Lease deletion at `at` (instantaneous).
        fn deletion(mut self, at: u64) -> Synth {
            self.h.faults.push(FaultSpan {
                kind: LEASE_DELETED.into(),
                target: "cluster".into(),
                detail: String::new(),
                injected: self.at(at),
                healed: Some(self.at(at)),
                suspends_gap_check: true,
            });
            self
        }

        /// `name` wrote the slice at `ms`, listing `lists`.
        fn slice_write(mut self, name: &str, ms: u64, lists: &[&str]) -> Synth {
            self.h.slice_writes.push(SliceWrite {
                instance: name.into(),
                received: self.at(ms),
                lists: lists.iter().map(|p| (*p).to_owned()).collect(),
                marked: false,
            });
            self
        }

        /// `name` marked itself terminating in the slice at `ms` (a step-down).
        fn slice_mark(mut self, name: &str, ms: u64) -> Synth {
            self.h.slice_writes.push(SliceWrite {
                instance: name.into(),
                received: self.at(ms),
                lists: vec![name.to_owned()],
                marked: true,
            });
            self
        }

        fn rules(&self) -> Vec<&'static str> {
            let verdict = check(&self.h, &bounds());
            verdict.violations.iter().map(|v| v.rule).collect()
        }
    }

    fn stopped(reason: &str) -> Message {
        Message::Stopped {
            reason: Some(reason.into()),
        }
    }

    /// A clean hand-over by expiry: a leads until 3 s, b from 5 s, on both
    /// sources; 10 s of history.
    fn handover() -> Synth {
        Synth::new()
            .end_at(10_000)
            .process("a", 1, 0, None)
            .process("b", 1, 0, None)
            .probes("a", 20, 3_000, 200, Some("u/1"))
            .probes("a", 3_000, 10_000, 503, None)
            .probes("b", 20, 5_000, 503, None)
            .probes("b", 5_000, 10_000, 200, Some("u/2"))
            .event("a", 15, Message::Started, Some("u/1"), Some(3000))
            .event("a", 1_000, Message::Renewed, Some("u/1"), Some(3000))
            .event("a", 2_990, stopped("renew-deadline"), Some("u/1"), None)
            .event("b", 4_990, Message::Started, Some("u/2"), Some(3000))
    }

    #[test]
    fn a_clean_handover_breaks_no_rule() {
        assert_eq!(handover().rules(), Vec::<&str>::new());
    }

    #[test]
    fn two_leaders_answering_at_once_are_an_overlap() {
        // a still answers 200 after b's first 200 had arrived.
        let s = handover().probes("a", 5_100, 5_200, 200, Some("u/1"));
        assert!(s.rules().contains(&"overlap"), "{:?}", s.rules());
    }

    #[test]
    fn answers_that_could_have_been_computed_in_order_are_no_overlap() {
        // Two single 200s whose requests were in flight at the same time:
        // either could have been computed first. monitor.rs's asymmetric rule
        // would call this an overlap; nothing proves it.
        let s = Synth::new()
            .end_at(1_000)
            .probe("a", 100, 300, "u/1")
            .probe("b", 200, 250, "u/2");
        assert!(!s.rules().contains(&"overlap"), "{:?}", s.rules());
        // A later 200 of a alone proves nothing either: a's answers may all
        // have been computed after b's.
        let s = s.probe("a", 260, 270, "u/1");
        assert!(!s.rules().contains(&"overlap"), "{:?}", s.rules());
        // With one computed before b's request was even sent, a's term spans
        // b's answer.
        let s = s.probe("a", 50, 60, "u/1");
        assert!(s.rules().contains(&"overlap"), "{:?}", s.rules());
    }

    #[test]
    fn one_term_answered_by_two_processes_is_an_overlap() {
        let s = Synth::new()
            .end_at(1_000)
            .probe("a", 100, 110, "u/1")
            .probe("b", 500, 510, "u/1");
        assert!(s.rules().contains(&"overlap"), "{:?}", s.rules());
    }

    /// a leads u/1 from 0; at 2 s it is SIGKILLed (its validity runs to 4 s),
    /// and its next incarnation, spawned at `respawn`, resumes u/1 at 2.1 s.
    fn resumed(respawn: u64, instance: &str) -> Synth {
        Synth::new()
            .end_at(6_000)
            .streams_only()
            .process("a", 1, 0, Some((2_000, End::Killed)))
            .process(instance, 2, respawn, None)
            .probes("a", 20, 2_000, 200, Some("u/1"))
            .event("a", 15, Message::Started, Some("u/1"), Some(3000))
            .event("a", 1_000, Message::Renewed, Some("u/1"), Some(3000))
            .in_incarnation(2)
            .probes(instance, 2_100, 6_000, 200, Some("u/1"))
            .event(instance, 2_100, Message::Started, Some("u/1"), Some(3000))
    }

    #[test]
    fn a_term_resumed_by_the_next_incarnation_after_the_old_one_ended_breaks_no_rule() {
        assert_eq!(resumed(2_050, "a").rules(), Vec::<&str>::new());
        // Spawned before the old process was gone: two live processes held it.
        let early = resumed(1_500, "a").rules();
        assert!(early.contains(&"overlap"), "{early:?}");
        assert!(early.contains(&"repeated-term"), "{early:?}");
        assert!(early.contains(&"pairing"), "{early:?}");
        // Another instance cannot resume it.
        let other = resumed(2_050, "b").rules();
        assert!(
            other.contains(&"overlap") && other.contains(&"pairing"),
            "{other:?}"
        );
        // The old process's 200s must still not overlap the new one's.
        let late =
            resumed(2_050, "a")
                .in_incarnation(1)
                .probes("a", 2_200, 2_300, 200, Some("u/1"));
        assert!(late.rules().contains(&"overlap"), "{:?}", late.rules());
    }

    #[test]
    fn a_long_gap_in_fault_free_time_is_caught() {
        // Nobody leads from 3 s to 10 s: 7 s > 6 s.
        let s = Synth::new()
            .end_at(12_000)
            .process("a", 1, 0, None)
            .probes("a", 20, 3_000, 200, Some("u/1"))
            .probes("a", 3_000, 10_000, 503, None)
            .probes("a", 10_000, 12_000, 200, Some("u/2"));
        assert_eq!(s.rules(), ["leaderless"]);
        // Nobody at the end counts too.
        let s = Synth::new()
            .end_at(12_000)
            .process("a", 1, 0, None)
            .probes("a", 20, 3_000, 200, Some("u/1"))
            .probes("a", 3_000, 12_000, 503, None);
        assert_eq!(s.rules(), ["leaderless"]);
    }

    #[test]
    fn a_gap_is_measured_from_the_last_heal_and_not_excused_by_harmless_faults() {
        let base = || {
            Synth::new()
                .end_at(12_000)
                .process("a", 1, 0, None)
                .probes("a", 20, 3_000, 200, Some("u/1"))
                .probes("a", 3_000, 10_000, 503, None)
                .probes("a", 10_000, 12_000, 200, Some("u/2"))
        };
        // A fault from 2 s to 5 s: 5 s of fault-free leaderless time.
        assert_eq!(base().fault(2_000, 5_000, true).rules(), Vec::<&str>::new());
        // Healed at 3.5 s: 6.5 s after it.
        assert_eq!(base().fault(2_000, 3_500, true).rules(), ["leaderless"]);
        // A fault that starts late leaves the stretch before it to check.
        assert_eq!(base().fault(9_500, 11_000, true).rules(), ["leaderless"]);
        // Dropped watches never excuse a gap.
        assert_eq!(base().fault(2_000, 5_000, false).rules(), ["leaderless"]);
    }

    #[test]
    fn a_killed_leader_counts_until_its_validity_or_its_death() {
        // a is killed at 2 s after a 200 with 3 s of validity; b leads at
        // 8.5 s: 6.5 s leaderless after the kill, which healed at 2 s.
        let s = Synth::new()
            .end_at(12_000)
            .process("a", 1, 0, Some((2_000, End::Killed)))
            .process("b", 1, 0, None)
            .probes("a", 20, 2_000, 200, Some("u/1"))
            .probes("b", 20, 8_500, 503, None)
            .probes("b", 8_500, 12_000, 200, Some("u/2"))
            .fault(2_000, 2_000, true);
        assert_eq!(s.rules(), ["leaderless"]);
        // Leading from 7.5 s is within the bound.
        let s = Synth::new()
            .end_at(12_000)
            .process("a", 1, 0, Some((2_000, End::Killed)))
            .process("b", 1, 0, None)
            .probes("a", 20, 2_000, 200, Some("u/1"))
            .probes("b", 20, 7_500, 503, None)
            .probes("b", 7_500, 12_000, 200, Some("u/2"))
            .fault(2_000, 2_000, true);
        assert_eq!(s.rules(), Vec::<&str>::new());
    }

    #[test]
    fn a_start_before_the_previous_term_stopped_is_unpaired() {
        // a never says it stopped, and its last renew (2.5 s + 3 s of
        // validity) runs past b's start at 4.99 s.
        let s = handover().event("a", 2_500, Message::Renewed, Some("u/1"), Some(3000));
        let s = Synth {
            h: History {
                events: s
                    .h
                    .events
                    .into_iter()
                    .filter(|e| !matches!(e.message, Message::Stopped { .. }))
                    .collect(),
                ..s.h
            },
            incarnation: 1,
        };
        assert!(s.rules().contains(&"pairing"), "{:?}", s.rules());
    }

    #[test]
    fn a_killed_leaders_term_ends_by_its_validity() {
        let killed = |b_starts: u64| {
            Synth::new()
                .end_at(10_000)
                .streams_only()
                .process("a", 1, 0, Some((1_500, End::Killed)))
                .process("b", 1, 0, None)
                .event("a", 15, Message::Started, Some("u/1"), Some(3000))
                .event("a", 1_000, Message::Renewed, Some("u/1"), Some(3000))
                .event("b", b_starts, Message::Started, Some("u/2"), Some(3000))
        };
        assert_eq!(killed(5_000).rules(), Vec::<&str>::new());
        assert_eq!(killed(3_500).rules(), ["pairing"]);
    }

    /// A killed leader's validity runs to 4 s; the Lease is deleted at
    /// 3.2 s; a restarted b, which never saw the Lease held, creates it at
    /// 3.3 s. Nothing b could have seen shows the old term: counted apart,
    /// and only in exactly that case.
    #[test]
    fn a_start_blind_to_a_deleted_lease_is_counted_apart_not_excused_otherwise() {
        let base = |b_saw_holder: bool| {
            let s = Synth::new()
                .end_at(10_000)
                .streams_only()
                .process("a", 1, 0, Some((1_500, End::Killed)))
                .process("b", 1, 3_100, None)
                .event("a", 15, Message::Started, Some("u/1"), Some(3000))
                .event("a", 1_000, Message::Renewed, Some("u/1"), Some(3000))
                .event(
                    "b",
                    3_150,
                    Message::State {
                        leading: false,
                        since: None,
                        holder: b_saw_holder.then(|| "a".to_owned()),
                    },
                    None,
                    None,
                );
            s.event("b", 3_300, Message::Started, Some("v/0"), Some(3000))
        };
        let blind = base(false).deletion(3_200);
        assert_eq!(blind.rules(), Vec::<&str>::new());
        let verdict = check(&blind.h, &bounds());
        assert_eq!(verdict.blind_after_deletion.len(), 1, "{verdict:?}");
        // Having seen the holder, b had to wait a duration: a violation.
        assert_eq!(base(true).deletion(3_200).rules(), ["pairing"]);
        // Without a deletion, nothing excuses it.
        assert_eq!(base(false).rules(), ["pairing"]);
        // Nor with a deletion after the start.
        assert_eq!(base(false).deletion(3_400).rules(), ["pairing"]);
    }

    #[test]
    fn a_stop_naming_another_term_is_unpaired() {
        // The Beats bug: the stop carries an id that matches nothing.
        let s = Synth::new()
            .end_at(10_000)
            .streams_only()
            .process("a", 1, 0, None)
            .event("a", 15, Message::Started, Some("u/1"), Some(3000))
            .event("a", 2_000, stopped("forbidden"), Some("u/9"), None);
        assert!(s.rules().contains(&"pairing"), "{:?}", s.rules());
        // And a stop without a reason.
        let s = Synth::new()
            .end_at(10_000)
            .streams_only()
            .process("a", 1, 0, None)
            .event("a", 15, Message::Started, Some("u/1"), Some(3000))
            .event(
                "a",
                2_000,
                Message::Stopped { reason: None },
                Some("u/1"),
                None,
            );
        assert_eq!(s.rules(), ["pairing"]);
        // A renew of a term that is not open.
        let s = Synth::new()
            .end_at(10_000)
            .streams_only()
            .process("a", 1, 0, None)
            .event("a", 2_000, Message::Renewed, Some("u/1"), Some(3000));
        assert_eq!(s.rules(), ["pairing"]);
    }

    #[test]
    fn a_stream_that_ends_cleanly_with_its_term_open_is_unpaired() {
        let mut s = Synth::new()
            .end_at(10_000)
            .streams_only()
            .process("a", 1, 0, Some((2_100, End::Terminated)))
            .event("a", 15, Message::Started, Some("u/1"), Some(3000));
        s.h.incarnations[0].stream_end = Some((s.at(2_050), StreamEnd::Clean));
        assert_eq!(s.rules(), ["pairing"]);
    }

    #[test]
    fn a_term_that_starts_twice_repeats() {
        let s = Synth::new()
            .end_at(10_000)
            .streams_only()
            .process("a", 1, 0, None)
            .process("b", 1, 0, None)
            .event("a", 15, Message::Started, Some("u/1"), Some(3000))
            .event(
                "a",
                1_000,
                stopped("lost-to-other-holder"),
                Some("u/1"),
                None,
            )
            .event("b", 6_000, Message::Started, Some("u/1"), Some(3000));
        assert!(s.rules().contains(&"repeated-term"), "{:?}", s.rules());
    }

    #[test]
    fn a_term_answered_but_never_announced_is_caught() {
        let s = Synth::new()
            .end_at(1_000)
            .process("a", 1, 0, None)
            .stream("a", 10)
            .probes("a", 20, 1_000, 200, Some("u/1"));
        assert_eq!(s.rules(), ["unannounced-term"]);
    }

    #[test]
    fn slice_writes_within_the_writers_terms_break_no_rule() {
        // a lists itself in its term, takes itself out as it steps down, b
        // lists itself once it leads; a write ε after the term's end is
        // within the checker's resolution.
        let s = handover()
            .slice_write("a", 100, &["a"])
            .slice_write("a", 2_995, &[])
            .slice_write("b", 5_050, &["b"])
            .slice_write("a", 3_500, &["a"]);
        assert_eq!(s.rules(), Vec::<&str>::new());
        let verdict = check(&s.h, &bounds());
        assert_eq!(
            (verdict.slice_writes_listing, verdict.slice_writes_empty),
            (3, 1)
        );
        // The write at 3.5 s came 0.5 s after a's stop and last 200 (3 s).
        let margin = verdict.slice_write_margin_used;
        assert!(
            margin > Duration::from_millis(450) && margin < Duration::from_millis(550),
            "{margin:?}"
        );
    }

    #[test]
    fn a_slice_write_naming_a_non_leader_is_caught() {
        // b lists itself while a leads, 3 s before its own term.
        assert_eq!(
            handover().slice_write("b", 2_000, &["b"]).rules(),
            ["routing"]
        );
        // a lists itself 1.5 s after its term ended (stop and last 200 at 3 s).
        assert_eq!(
            handover().slice_write("a", 4_500, &["a"]).rules(),
            ["routing"]
        );
        // A stream alone shows the term: the validity of a leader that went
        // silent (frozen from 1 s, killed at 9 s) ends it.
        let silent = |write_at: u64| {
            Synth::new()
                .end_at(10_000)
                .streams_only()
                .process("a", 1, 0, Some((9_000, End::Killed)))
                .event("a", 15, Message::Started, Some("u/1"), Some(3000))
                .event("a", 1_000, Message::Renewed, Some("u/1"), Some(3000))
                .slice_write("a", write_at, &["a"])
        };
        assert_eq!(silent(3_500).rules(), Vec::<&str>::new());
        assert_eq!(silent(5_500).rules(), ["routing"]);
    }

    #[test]
    fn a_step_down_mark_after_a_term_breaks_no_rule_one_before_any_term_does() {
        // a marks itself terminating as it steps down, and again long after
        // (a retried write): the next leader's compare-and-swap replaces it.
        let s = handover()
            .slice_write("a", 100, &["a"])
            .slice_mark("a", 3_000)
            .slice_mark("a", 9_000)
            .slice_write("b", 5_050, &["b"]);
        assert_eq!(s.rules(), Vec::<&str>::new());
        assert_eq!(check(&s.h, &bounds()).slice_writes_marked, 2);
        // b never led before this mark.
        assert_eq!(handover().slice_mark("b", 2_000).rules(), ["routing"]);
    }

    #[test]
    fn a_slice_write_naming_another_pod_or_two_is_caught() {
        // a lists b, while b leads: only a pod itself lists itself.
        assert_eq!(
            handover().slice_write("a", 6_000, &["b"]).rules(),
            ["routing"]
        );
        // b lists itself and a.
        assert_eq!(
            handover().slice_write("b", 6_000, &["b", "a"]).rules(),
            ["routing", "routing"]
        );
    }

    #[test]
    fn a_crash_is_a_violation() {
        let s = Synth::new().end_at(1_000).process(
            "a",
            1,
            0,
            Some((500, End::Crashed("exit status: 101".into()))),
        );
        assert!(s.rules().contains(&"crash"), "{:?}", s.rules());
    }

    #[test]
    fn the_failure_report_names_the_seed_and_interleaves_both_sources() {
        let s = handover().probes("a", 5_100, 5_200, 200, Some("u/1"));
        let verdict = check(&s.h, &bounds());
        let report = failure_report(&s.h, &verdict, &bounds());
        assert!(report.contains("LEADER_GATE_CHAOS_SEED=7"), "{report}");
        assert!(report.contains("PROBE  a#1 200 term=u/1"), "{report}");
        assert!(
            report.contains("EVENT  b#1 started-leading term=u/2"),
            "{report}"
        );
    }
}
