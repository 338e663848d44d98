//! Spreading a group's Leases (see `machine::spread`), transition by
//! transition: who claims, how soon a free Lease is taken, and the graceful
//! hand-over of a surplus Lease.

use super::successor::{
    annotation_of, edit, object_of, released_naming, the_release_naming, with_window, write_of,
};
use super::*;

const HOLDS_ONE: Spread = Spread {
    held_elsewhere: 1,
    surplus: false,
};
const SURPLUS: Spread = Spread {
    held_elsewhere: 1,
    surplus: true,
};

#[test]
fn a_pod_holding_another_lease_claims_no_slot_and_clears_its_name() {
    // Holding another Lease: no claim of the empty slot.
    let mut h = with_window(Harness::new("b"), 4);
    let held = h.server_sets(LeaseBuilder::held_by("a"));
    h.feed(Input::Spread(HOLDS_ONE), 0.0);
    h.feed(Input::Observed(Some(held)), 0.0);
    assert_eq!(h.first_write(0.0, 14.9), None);
    // Named successor, then it comes to hold another Lease: it clears its
    // name, so the slot goes to a pod that holds none.
    let mut h = with_window(Harness::new("b"), 4);
    let named = h.server_sets(LeaseBuilder::held_by("a").annotation(SUCCESSOR_ANNOTATION, "b"));
    h.feed(Input::Observed(Some(named.clone())), 0.0);
    let actions = h.feed(Input::Spread(HOLDS_ONE), 1.0);
    let [clear] = &actions[..] else {
        panic!("one write clearing the slot: {actions:?}")
    };
    let write = write_of(clear);
    assert_eq!(write.purpose, Purpose::Successor);
    assert_eq!(annotation_of(object_of(write), SUCCESSOR_ANNOTATION), None);
    assert_eq!(object_of(write).data["spec"], named.object().data["spec"]);
}

#[test]
fn a_free_lease_is_taken_one_tier_later_per_lease_held_elsewhere() {
    // Released naming nobody: a pod holding none within half a retry
    // period; one holding k others two retry periods per Lease later.
    for held_elsewhere in 0..3usize {
        for seed in 0..20 {
            let mut h = Harness::new("b");
            h.election = Election::new(settings("b"), seed);
            h.feed(
                Input::Spread(Spread {
                    held_elsewhere,
                    surplus: false,
                }),
                0.0,
            );
            released_naming(&mut h, None);
            let released = h.server.clone();
            let from = 1.0;
            h.feed(Input::Observed(released), from);
            let (at, write) = h.first_write(from, from + 20.0).expect("takes it");
            assert_eq!(write_of(&write).purpose, Purpose::Acquire);
            let tier = 4.0 * held_elsewhere as f64;
            assert!(
                at >= from + tier && at <= from + tier + 1.05,
                "holding {held_elsewhere}: attempted {:.2}s after the release",
                at - from
            );
        }
    }
}

#[test]
fn a_named_successor_holding_another_lease_does_not_take_a_release_at_once() {
    let mut h = Harness::new("b");
    h.feed(Input::Spread(HOLDS_ONE), 0.0);
    released_naming(&mut h, Some("b"));
    let released = h.server.clone();
    // It clears its name rather than take the Lease at once, so a pod that
    // holds none takes it (at once, as if none were named) ...
    let actions = h.feed(Input::Observed(released), 1.0);
    let [clear] = &actions[..] else {
        panic!("one write clearing the slot: {actions:?}")
    };
    assert_eq!(write_of(clear).purpose, Purpose::Successor);
    assert_eq!(
        annotation_of(object_of(write_of(clear)), SUCCESSOR_ANNOTATION),
        None
    );
    let cleared = h.accept(clear);
    h.feed(Input::Written(Ok(cleared)), 1.01);
    // ... and takes it itself only a tier later.
    assert_eq!(h.first_write(1.01, 1.0 + 3.95), None);
    let (_, write) = h.first_write(1.0 + 4.0, 1.0 + 5.1).expect("takes it");
    assert_eq!(write_of(&write).purpose, Purpose::Acquire);
}

#[test]
fn a_surplus_lease_goes_to_its_named_successor_and_a_kept_one_stays() {
    // Kept: a named successor changes nothing.
    let mut h = Harness::new("me");
    let t = h.lead();
    h.feed(Input::Spread(HOLDS_ONE), t + 0.1);
    let named = edit(&mut h, |o| {
        set_annotation(o, SUCCESSOR_ANNOTATION, Some("z"));
    });
    assert!(h.feed(Input::Observed(Some(named)), t + 0.5).is_empty());
    assert!(h.election.is_leading());
    // Surplus but nobody named: it keeps leading (the Lease is never left
    // without a leader for the sake of the spread).
    let mut h = Harness::new("me");
    let t = h.lead();
    assert!(h.feed(Input::Spread(SURPLUS), t + 0.1).is_empty());
    assert!(h.election.is_leading());
    // Named: it steps down, and the release (which the driver sends once
    // the gates closed) names that successor.
    let term = h.snapshot(t).term.unwrap();
    let named = edit(&mut h, |o| {
        set_annotation(o, SUCCESSOR_ANNOTATION, Some("z"));
    });
    let actions = h.feed(Input::Observed(Some(named)), t + 0.5);
    assert!(!h.election.is_leading());
    assert_eq!(h.snapshot(t + 0.5).last_stop, Some(StopReason::Rebalance));
    the_release_naming(&actions, &term, "z");
}

/// `h` leads a surplus Lease; while a renew is in flight "z" is named
/// successor, and it steps down for the rebalance (the release waits for
/// the renew's answer). When it led, and the term.
fn rebalancing_to_z_with_a_renew_in_flight(h: &mut Harness) -> (f64, TermId) {
    let t = h.lead();
    let term = h.snapshot(t).term.unwrap();
    h.feed(Input::Spread(SURPLUS), t + 0.1);
    let renew = h.tick(t + 2.0);
    assert!(is_write(&renew, Purpose::Renew));
    let named = edit(h, |o| {
        set_annotation(o, SUCCESSOR_ANNOTATION, Some("z"));
    });
    assert!(h.feed(Input::Observed(Some(named)), t + 2.01).is_empty());
    assert!(!h.election.is_leading());
    assert_eq!(h.snapshot(t + 2.01).last_stop, Some(StopReason::Rebalance));
    (t, term)
}

#[test]
fn a_rebalance_releases_even_once_the_lease_no_longer_counts_as_surplus() {
    // A renew is in flight when the successor is named; by its answer the
    // sidecar no longer counts this Lease as held (it stepped down), so it
    // is surplus no more: the release still follows, naming the successor.
    let mut h = Harness::new("me");
    let (t, _) = rebalancing_to_z_with_a_renew_in_flight(&mut h);
    assert!(h.feed(Input::Spread(HOLDS_ONE), t + 2.02).is_empty());
    let actions = h.feed(
        Input::Written(Err(ApiError::Conflict("Conflict".into()))),
        t + 2.03,
    );
    let [release] = &actions[..] else {
        panic!("the release, once nothing is in flight: {actions:?}")
    };
    assert_eq!(write_of(release).purpose, Purpose::Release);
    assert_eq!(
        annotation_of(object_of(write_of(release)), SUCCESSOR_ANNOTATION),
        Some("z")
    );
}

#[test]
fn an_operators_hand_over_outranks_a_rebalance_under_way() {
    let mut h = Harness::new("me");
    let (t, term) = rebalancing_to_z_with_a_renew_in_flight(&mut h);
    // Before the release could go out, an operator asks for "c".
    let asked = edit(&mut h, |o| {
        set_annotation(o, HANDOVER_ANNOTATION, Some("c"));
    });
    h.feed(Input::Observed(Some(asked)), t + 2.02);
    let actions = h.feed(
        Input::Written(Err(ApiError::Conflict("Conflict".into()))),
        t + 2.03,
    );
    the_release_naming(&actions, &term, "c");
}

#[test]
fn a_successor_holding_another_lease_clears_its_name_again_after_a_failed_write() {
    let mut h = with_window(Harness::new("b"), 4);
    let named = h.server_sets(LeaseBuilder::held_by("a").annotation(SUCCESSOR_ANNOTATION, "b"));
    h.feed(Input::Observed(Some(named)), 0.0);
    let actions = h.feed(Input::Spread(HOLDS_ONE), 1.0);
    assert!(is_write(&actions, Purpose::Successor), "{actions:?}");
    h.feed(
        Input::Written(Err(ApiError::Server {
            code: 500,
            message: "x".into(),
        })),
        1.1,
    );
    let (_, again) = h
        .first_write(1.2, 16.0)
        .expect("clears its name again after the backoff");
    assert_eq!(write_of(&again).purpose, Purpose::Successor);
    assert_eq!(
        annotation_of(object_of(write_of(&again)), SUCCESSOR_ANNOTATION),
        None
    );
}
