//! The named successor (issue 13): which follower takes over next, kept in
//! the Lease itself, and the hand-over an operator asks for.
//!
//! - `leader-gate.dev/successor: <identity>` names the follower that takes a
//!   released Lease at once, and an expired one at expiry without the
//!   spread. Everyone else waits a fallback delay, long enough for the
//!   successor's write to reach them on the watch. The slot is claimed by
//!   one follower with a CAS PUT, spread over a claim window so that
//!   conflicts stay O(1) with thousands of candidates; an acquisition
//!   empties it; a successor that stops (SIGTERM, an unhealthy collector)
//!   clears its own name; a follower of a newer revision takes it from an
//!   older one (see `revision`: a rollout hands over once).
//! - `leader-gate.dev/handover-to: <identity>` (written by `leader-gate
//!   handover`), or `spec.preferredHolder` where the API server keeps it,
//!   asks the holder to step down ([`StopReason::HandoverRequested`]) and to
//!   release naming that identity as the successor.
//!
//! Neither annotation is part of [`Lease::content`]: a claim or a request
//! does not restart the followers' expiry clocks (G3; the view keeps the
//! newer object to write from). A successor is never trusted with anything:
//! it leads only after its own acquisition (G7).
//!
//! How it runs: `successor_turn` comes in `handle` before `next_request`;
//! `acquisition_delay` and `late_draw` time the attempts, `release()`
//! names the successor, `acquired()`/`on_acquired` empty the slot. A claim
//! (purpose `Successor`) PUTs the last object with only the annotation
//! changed and is not remembered as an own write. A hand-over request makes
//! the leader step down, then send the marked release naming the target and
//! clearing `handover-to` after the gate lag. A renew answered 409 because a
//! claim or request landed takes the conflict path (the watch delivers the
//! new object, `conflict_at` clears, `renew_at` has not advanced) and goes
//! again at once. Property tests (`machine/tests/properties.rs`) run three
//! candidates with claims, stale successors, hand-over requests, preferred
//! holders and crashes in any order.

use std::time::Duration;

use kube::api::DynamicObject;
use serde_json::Value;
use tokio::time::Instant;

use super::revision;
use super::view::View;
use super::{Action, Election, Now, Purpose, Settings, StopReason, Write, WriteOp};
use crate::elector::lease::{self, Lease, MAX_IDENTITY_LEN, bounded, set_annotation};

/// Names the follower that takes the Lease over next.
pub const SUCCESSOR_ANNOTATION: &str = "leader-gate.dev/successor";
/// Asks the holder to hand the Lease over to the identity it names.
pub const HANDOVER_ANNOTATION: &str = "leader-gate.dev/handover-to";
/// The default window over which followers spread their claims of an empty
/// slot: with N candidates and a watch latency L, about N × L / window
/// claims collide if drawn uniformly (5,000 × 10 ms / 60 s ≈ 1); skewed
/// as [`claim_delay`] draws them, far fewer.
pub const DEFAULT_CLAIM_WINDOW: Duration = Duration::from_secs(60);

/// The successor named by `lease`, if any.
pub fn successor_of(lease: &Lease) -> Option<String> {
    annotation(lease.object(), SUCCESSOR_ANNOTATION)
}

/// The hand-over asked for in `lease`, if any.
pub fn handover_to(lease: &Lease) -> Option<String> {
    annotation(lease.object(), HANDOVER_ANNOTATION)
}

/// `spec.preferredHolder`, kept only where coordinated leader election is
/// enabled on the API server (it drops the field otherwise).
pub fn preferred_holder(lease: &Lease) -> Option<String> {
    lease
        .object()
        .data
        .get("spec")
        .and_then(|s| s.get("preferredHolder"))
        .and_then(Value::as_str)
        .filter(|h| !h.is_empty())
        .map(|h| bounded(h, MAX_IDENTITY_LEN))
}

fn annotation(object: &DynamicObject, key: &str) -> Option<String> {
    lease::annotation(object, key).map(|v| bounded(v, MAX_IDENTITY_LEN))
}

/// An acquisition empties the slot and answers any hand-over request.
pub(super) fn on_acquired(object: &mut DynamicObject) {
    set_annotation(object, SUCCESSOR_ANNOTATION, None);
    set_annotation(object, HANDOVER_ANNOTATION, None);
}

/// The successor state of one candidate.
#[derive(Debug)]
pub(super) struct Slot {
    /// Claims of an empty slot are spread over `[retry_period, window]`.
    pub(super) window: Duration,
    /// When our claim of the empty slot goes out.
    pub(super) claim_at: Option<Instant>,
    /// The successor the last turn saw named (a change re-judges the
    /// acquisition attempt).
    named: Option<String>,
    /// Our name was cleared once in this episode of standing back.
    pub(super) resigned: bool,
    /// Leading a surplus Lease: the successor it steps down for, until the
    /// record is no longer ours or a new term starts (see `spread`).
    pub(super) rebalance_to: Option<String>,
    /// Leading: the `preferredHolder` of the record when the term started.
    /// Only a change of it asks for a hand-over, so a preferred holder that
    /// never takes over cannot make every new holder step down at once.
    preferred_at_start: Option<Option<String>>,
    /// This pod's revision (`--revision`; see `revision`).
    pub(super) revision: Option<String>,
}

impl Slot {
    pub(super) fn new(settings: &Settings) -> Self {
        Self {
            window: DEFAULT_CLAIM_WINDOW.max(settings.retry_period * 2),
            claim_at: None,
            named: None,
            resigned: false,
            rebalance_to: None,
            preferred_at_start: None,
            revision: None,
        }
    }
}

/// How long after the record became free (released, or expired here) this
/// candidate attempts the acquisition. Every path but the named successor's
/// own is one [`late_draw`] over half a retry period — after a release or
/// an expiry naming nobody, for a create after a deletion, and (after a
/// retry period, or half of one at an expiry, for the successor's write to
/// arrive first) as the fallback for a named successor that is gone.
///
/// A pod holding other Leases of its group waits a tier more per Lease (see
/// `spread`), and is no successor while it does.
pub(super) fn acquisition_delay(
    settings: &Settings,
    rng: &mut fastrand::Rng,
    view: &View,
    held_elsewhere: usize,
) -> Duration {
    let retry = settings.retry_period;
    let tier = super::spread::tier_delay(retry, held_elsewhere);
    tier.saturating_add(first_tier_delay(settings, rng, view, held_elsewhere == 0))
}

/// [`acquisition_delay`] for a pod that holds no other Lease of its group
/// (`may_succeed`), or within its own tier.
fn first_tier_delay(
    settings: &Settings,
    rng: &mut fastrand::Rng,
    view: &View,
    may_succeed: bool,
) -> Duration {
    let retry = settings.retry_period;
    let spread = late_draw(retry / 2, rng);
    let Some(lease) = &view.lease else {
        // Absent: a create, whose CAS lets one candidate win. One never
        // created is taken at once (candidates start at their own times);
        // one deleted while we watched is a herd like a release.
        return if view.is_free() {
            Duration::ZERO
        } else {
            spread
        };
    };
    let holder = lease.record().holder;
    match successor_of(lease).filter(|s| Some(s) != holder.as_ref()) {
        // The successor: at once, with no spread.
        Some(s) if s == settings.identity && may_succeed => Duration::ZERO,
        // A fallback for a successor that is gone: late enough for its
        // acquisition to reach us on the watch first.
        Some(_) if view.is_free() => retry + spread,
        Some(_) => retry / 2 + spread,
        None => spread,
    }
}

/// When a claim of the empty slot goes out, after it was seen empty: within
/// `[retry, window]`, the cube root of a uniform draw, so that few claims
/// fall within the watch latency of the first (at 5,000 candidates and a
/// 58 s window: about N × L / W = 43 with a uniform draw and L = 500 ms, 0.5
/// with this one, about 3 (L/W) N^⅓ + 3 (L/W)² N^⅔ + N (L/W)³; at
/// L = 10 ms, 0.01 instead of 0.9). A small group names its successor
/// later (10 candidates: 25 s on average instead of 7 s); until then a
/// release is spread.
pub(super) fn claim_delay(retry: Duration, window: Duration, rng: &mut fastrand::Rng) -> Duration {
    let window = window.max(retry);
    retry + (window - retry).mul_f64(rng.f64().cbrt())
}

/// How sharply [`late_draw`] leans to the end of its window.
const LATE_SKEW: f64 = 10.0;

/// One draw over `[0, window]` from a density that grows exponentially to
/// the window's end, `e^(λ x / window)` with λ = 10 (so 1 in 22,000 draws
/// lands in the first tenth). Only the attempts sent before the first
/// reached them on the watch conflict; with a density this thin at the
/// start, the first of N attempts lands alone. At 5,000 candidates, a
/// watch fan-out of 10–50 ms and a 1 s window (retry 2 s), about 0.4
/// conflicts per hand-over (a uniform draw: about 86; the cube root of one:
/// 2.6), and the first attempt 0.2 s in; with 3 candidates it comes about
/// 0.85 of the window in. Over 40 simulated hand-overs
/// (`every_hand_over_path_costs_at_most_5_conflicts_at_5000_candidates`):
/// 0.6 on average and 2 at worst (the cube root: 10 at worst).
pub(super) fn late_draw(window: Duration, rng: &mut fastrand::Rng) -> Duration {
    window.mul_f64(ln_from_one(1.0 + rng.f64() * LATE_SKEW_EXP_M1) / LATE_SKEW)
}

/// `e^LATE_SKEW - 1`, written out: `f64::exp_m1` and `ln_1p` are libm's, and
/// linking libm.so for this one draw cost an idle sidecar 328 KiB resident.
const LATE_SKEW_EXP_M1: f64 = 22_025.465_794_806_718;

/// The natural logarithm of `y >= 1`, without libm: `y = m 2^k` with `m` in
/// `[1, 2)`, `ln y = k ln 2 + 2 atanh((m - 1) / (m + 1))`, the series of
/// atanh summed until its terms no longer change the sum (`z < 1/3`: at
/// most about 20 terms).
fn ln_from_one(y: f64) -> f64 {
    debug_assert!((1.0..f64::MAX).contains(&y), "{y}");
    let bits = y.to_bits();
    let k = ((bits >> 52) & 0x7ff) as i64 - 1023;
    let m = f64::from_bits((bits & ((1 << 52) - 1)) | (1023 << 52));
    let z = (m - 1.0) / (m + 1.0);
    let (z2, mut power, mut sum) = (z * z, z, 0.0_f64);
    for n in 0..40 {
        let next = sum + power / f64::from(2 * n + 1);
        if next == sum {
            break;
        }
        sum = next;
        power *= z2;
    }
    k as f64 * std::f64::consts::LN_2 + 2.0 * sum
}

// === impl Election ===

impl Election {
    /// Sets the claim window (`--successor-claim-window`).
    pub fn set_successor_claim_window(&mut self, window: Duration) {
        self.successor.window = window;
    }

    /// Sets this pod's revision (`--revision`): followers of the newest
    /// revision take the successor slot from older ones (see `revision`).
    pub fn set_revision(&mut self, revision: Option<String>) {
        self.successor.revision = revision;
    }

    /// The identity a hand-over is asked for in `lease`, other than us.
    fn handover_target(&self, lease: &Lease) -> Option<String> {
        let me = self.settings.identity.as_str();
        if let Some(to) = handover_to(lease).filter(|t| t != me) {
            return Some(to);
        }
        let preferred = preferred_holder(lease);
        let unchanged = matches!(
            &self.successor.preferred_at_start,
            Some(Some(at_start)) if preferred.as_ref() == Some(at_start)
        );
        // An operator's request first; then a rebalance under way.
        preferred
            .filter(|p| p != me && !unchanged)
            .or_else(|| self.successor.rebalance_to.clone())
    }

    /// One turn of the successor duties, after the input and before the
    /// next request: re-judge the attempt when the named successor changed,
    /// step down when a hand-over is asked for, then at most one write —
    /// the hand-over's release, clearing our own name when we stop, or a
    /// claim of the empty slot.
    pub(super) fn successor_turn(&mut self, now: Now, actions: &mut Vec<Action>) {
        let Some(lease) = self.view.as_ref().and_then(|v| v.lease.clone()) else {
            self.successor.claim_at = None;
            self.successor.rebalance_to = None;
            return;
        };
        let named = successor_of(&lease);
        if named != self.successor.named {
            self.acquire_at = None;
            if named.as_deref() != Some(self.settings.identity.as_str()) {
                self.successor.resigned = false;
            }
            self.successor.named = named.clone();
        }
        let own = self.is_own(&lease.record());
        if !own {
            self.successor.rebalance_to = None;
        }
        if self.is_leading() {
            self.successor.claim_at = None;
            if self.successor.preferred_at_start.is_none() {
                self.successor.preferred_at_start = Some(preferred_holder(&lease));
            }
            let aside = self.standing_aside(now.instant);
            if own && (aside || self.handover_target(&lease).is_some()) {
                self.step_down(StopReason::HandoverRequested);
            } else if own && let Some(to) = self.rebalance_target(named.as_deref()) {
                self.successor.rebalance_to = Some(to);
                self.step_down(StopReason::Rebalance);
            } else {
                return;
            }
        }
        let busy = self.pending.is_some()
            || self.conflict_at.is_some()
            || self.not_before.is_some_and(|nb| now.instant < nb);
        // Once our record has expired for every peer, a release would only
        // restart their wait (a fallback for the target): the Lease is free,
        // and the request lapsed with our term.
        let live = self
            .view
            .as_ref()
            .is_some_and(|view| view.live_holder(now.instant).is_some());
        let aside = self.standing_aside(now.instant);
        if own && live && (aside || self.handover_target(&lease).is_some()) {
            // Asked to hand over a record still ours: the release names the
            // target (the driver sends it once the gates had their lag).
            if !busy && let Some(release) = self.release(now, self.request_timeout(now.instant)) {
                actions.push(Action::Write(release));
            }
            return;
        }
        self.successor.preferred_at_start = None;
        let me = self.settings.identity.as_str();
        // A pod that stops, or holds another Lease of its group, stands back.
        let standing_back =
            self.shutting_down || !self.collector_healthy() || self.holds_elsewhere() || aside;
        if named.as_deref() == Some(me) {
            self.successor.claim_at = None;
            if standing_back && !self.successor.resigned && !busy {
                // A successor that stands back gives up its slot, once.
                self.successor.resigned = true;
                actions.push(self.successor_write(&lease, None, now));
            }
            return;
        }
        let holder = self
            .view
            .as_ref()
            .and_then(|view| view.live_holder(now.instant));
        let empty = named.is_none() || named == lease.record().holder;
        // A pod of a newer revision than the named successor's takes the
        // slot from it, sooner (see `revision`).
        let outranks = !empty
            && revision::rank(&lease, self.successor.revision.as_deref())
                > revision::successor_rank(&lease);
        let may_claim =
            !standing_back && (empty || outranks) && holder.as_deref().is_some_and(|h| h != me);
        if !may_claim {
            self.successor.claim_at = None;
            return;
        }
        let retry = self.settings.retry_period;
        // Taking the slot from an older revision is urgent (the rollout
        // replaces the leader as soon as this pod is ready): within half
        // a retry period, late-skewed like a release's herd, so that of
        // many new pods at once the first claim lands alone.
        let at = match self.successor.claim_at {
            Some(at) if !outranks || at <= now.instant + retry / 2 => at,
            _ if outranks => now.instant + late_draw(retry / 2, &mut self.rng),
            _ => now.instant + claim_delay(retry, self.successor.window, &mut self.rng),
        };
        self.successor.claim_at = Some(at);
        if now.instant >= at && !busy {
            self.successor.claim_at = None;
            actions.push(self.successor_write(&lease, Some(me.to_owned()), now));
        }
    }

    /// A CAS PUT of `lease` with only the successor slot changed (the name,
    /// and our revision with it).
    fn successor_write(&mut self, lease: &Lease, successor: Option<String>, now: Now) -> Action {
        let mut object = lease.object().clone();
        set_annotation(&mut object, SUCCESSOR_ANNOTATION, successor.as_deref());
        revision::on_claim(
            &mut object,
            successor.as_ref().and(self.successor.revision.as_deref()),
        );
        let base_rv = lease.resource_version().map(str::to_owned);
        self.write_in_flight(Purpose::Successor, now, base_rv);
        Action::Write(Write {
            purpose: Purpose::Successor,
            op: WriteOp::Replace(Box::new(object)),
            timeout: self.request_timeout(now.instant),
        })
    }

    /// The release of our record names the successor: the hand-over's
    /// target if one was asked for, else the successor already named; the
    /// request is answered.
    pub(super) fn release_names_successor(&self, lease: &Lease, object: &mut DynamicObject) {
        if let Some(target) = self.handover_target(lease) {
            set_annotation(object, SUCCESSOR_ANNOTATION, Some(&target));
            revision::on_named(object);
        }
        set_annotation(object, HANDOVER_ANNOTATION, None);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_late_draw_needs_no_libm_and_draws_as_exp_m1_and_ln_1p_would() {
        assert_eq!(LATE_SKEW_EXP_M1, LATE_SKEW.exp_m1());
        let mut rng = fastrand::Rng::with_seed(7);
        for y in (0..20_000)
            .map(|_| 1.0 + rng.f64() * LATE_SKEW_EXP_M1)
            .chain([
                1.0,
                f64::from_bits(1f64.to_bits() + 1),
                1.5,
                2.0,
                std::f64::consts::E,
            ])
            .chain([1.0 + LATE_SKEW_EXP_M1, 1e12])
        {
            let (ours, libm) = (ln_from_one(y), y.ln());
            assert!(
                (ours - libm).abs() <= 4.0 * f64::EPSILON * libm.max(1.0),
                "ln({y}): {ours} against {libm}"
            );
        }
        let window = Duration::from_secs(1);
        let (mut a, mut b) = (fastrand::Rng::with_seed(3), fastrand::Rng::with_seed(3));
        for _ in 0..1_000 {
            let ours = late_draw(window, &mut a);
            let libm = window.mul_f64((b.f64() * LATE_SKEW.exp_m1()).ln_1p() / LATE_SKEW);
            assert!(
                ours.abs_diff(libm) <= Duration::from_nanos(2),
                "{ours:?} {libm:?}"
            );
        }
    }
}
