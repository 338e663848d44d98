//! A rollout hands over once (issue 38): the successor slot prefers a pod
//! of the revision being rolled out, so that the leader's replacement hands
//! over to a pod the rollout keeps, not to one it replaces next.
//!
//! Each candidate may know its pod's revision (`--revision`, from the
//! `controller-revision-hash` or `pod-template-hash` label). Two
//! annotations carry what the group needs, written only with writes it makes
//! anyway or with the claims it already makes:
//!
//! - `leader-gate.dev/revisions`: the revisions that led, oldest first (the
//!   last [`KEEP`]), appended by each acquisition whose revision is not yet
//!   listed;
//! - `leader-gate.dev/successor-revision`: the named successor's revision,
//!   written with its claim.
//!
//! A revision ranks by where it is listed: one that never led (a rollout's
//! new pods) above every listed one, a later-listed one above an earlier
//! one, and an unknown one (no `--revision`, or an older leader-gate) below
//! all. A follower that outranks the named successor claims the slot from
//! it within half a retry period (drawn in `successor`, late-skewed as a
//! release's herd is: at 5,000 candidates and a 10–50 ms watch, under one
//! conflict) — at most a few claims per rollout, whatever the number of
//! pods, as the first new pod's claim reaches the others on the watch and
//! they no longer outrank it. Nothing else changes: a successor is a
//! preference, never trusted (G7).
//!
//! This module reads and writes the two annotations only; `successor` asks
//! it how pods rank, and imports it (not the other way round).
//!
//! Where it cannot help: the rollout replaces the leader before any new pod
//! runs (a DaemonSet's first replaced pod, one chance in the number of
//! nodes); a rollback to a revision that led before ranks below the one it
//! replaces (the hand-over then goes as without revisions); candidates of
//! one Lease from different workloads rank by which led last.

use kube::api::DynamicObject;

use crate::elector::lease::{Lease, MAX_IDENTITY_LEN, annotation, bounded, set_annotation};

/// The revisions that led, oldest first, separated by spaces.
pub const REVISIONS_ANNOTATION: &str = "leader-gate.dev/revisions";
/// The named successor's revision.
pub const SUCCESSOR_REVISION_ANNOTATION: &str = "leader-gate.dev/successor-revision";
/// Revisions kept in [`REVISIONS_ANNOTATION`]: a pod of a revision older
/// than these many rollouts ranks as new (harmless: a preference).
pub const KEEP: usize = 8;

/// How a revision ranks as a successor (see the module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(super) enum Rank {
    Unknown,
    Led(usize),
    New,
}

/// The revisions that led, oldest first.
fn revisions_of(object: &DynamicObject) -> Vec<&str> {
    annotation(object, REVISIONS_ANNOTATION)
        .map(|v| v.split_whitespace().collect())
        .unwrap_or_default()
}

/// How `revision` ranks in `lease`.
pub(super) fn rank(lease: &Lease, revision: Option<&str>) -> Rank {
    let Some(revision) = revision else {
        return Rank::Unknown;
    };
    revisions_of(lease.object())
        .iter()
        .position(|r| *r == revision)
        .map_or(Rank::New, Rank::Led)
}

/// The rank of the successor named in `lease`.
pub(super) fn successor_rank(lease: &Lease) -> Rank {
    let revision = annotation(lease.object(), SUCCESSOR_REVISION_ANNOTATION)
        .map(|r| bounded(r, MAX_IDENTITY_LEN));
    rank(lease, revision.as_deref())
}

/// An acquisition by a pod of `revision`: listed if it is not yet; the slot
/// it empties loses its revision too.
pub(super) fn on_acquired(object: &mut DynamicObject, revision: Option<&str>) {
    set_annotation(object, SUCCESSOR_REVISION_ANNOTATION, None);
    let Some(revision) = revision else {
        return;
    };
    let mut listed: Vec<String> = revisions_of(object)
        .into_iter()
        .filter(|r| *r != revision)
        .map(str::to_owned)
        .collect();
    listed.push(revision.to_owned());
    let skip = listed.len().saturating_sub(KEEP);
    let value = listed[skip..].join(" ");
    set_annotation(object, REVISIONS_ANNOTATION, Some(&value));
}

/// A claim of the slot (or clearing it) carries the claimant's revision
/// (`None`: clearing it, or a claimant without one).
pub(super) fn on_claim(object: &mut DynamicObject, revision: Option<&str>) {
    set_annotation(object, SUCCESSOR_REVISION_ANNOTATION, revision);
}

/// A hand-over's release names a target whose revision it does not know.
pub(super) fn on_named(object: &mut DynamicObject) {
    set_annotation(object, SUCCESSOR_REVISION_ANNOTATION, None);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lease_with(annotations: &[(&str, &str)]) -> Lease {
        let mut object =
            crate::elector::lease::created("ns", "l", "a", 0, std::time::Duration::from_secs(15));
        for (k, v) in annotations {
            set_annotation(&mut object, k, Some(v));
        }
        Lease::new(object)
    }

    #[test]
    fn a_revision_that_never_led_outranks_every_listed_one_and_the_last_listed_the_earlier() {
        let lease = lease_with(&[(REVISIONS_ANNOTATION, "r1 r2")]);
        assert_eq!(rank(&lease, Some("r3")), Rank::New);
        assert_eq!(rank(&lease, Some("r2")), Rank::Led(1));
        assert_eq!(rank(&lease, Some("r1")), Rank::Led(0));
        assert_eq!(rank(&lease, None), Rank::Unknown);
        assert!(Rank::New > Rank::Led(1) && Rank::Led(1) > Rank::Led(0));
        assert!(Rank::Led(0) > Rank::Unknown);
        // No list yet: every known revision is new, so none outranks another.
        let bare = lease_with(&[]);
        assert_eq!(rank(&bare, Some("r1")), rank(&bare, Some("r2")));
    }

    #[test]
    fn an_acquisition_lists_its_revision_once_keeping_the_last_few() {
        let mut object = lease_with(&[(REVISIONS_ANNOTATION, "r1 r2")])
            .object()
            .clone();
        on_acquired(&mut object, Some("r1"));
        assert_eq!(revisions_of(&object), ["r2", "r1"], "moved to the end");
        on_acquired(&mut object, None);
        assert_eq!(revisions_of(&object), ["r2", "r1"], "unknown: unchanged");
        for n in 3..=12 {
            on_acquired(&mut object, Some(&format!("r{n}")));
        }
        let listed = revisions_of(&object);
        assert_eq!(listed.len(), KEEP);
        assert_eq!(listed.last(), Some(&"r12"));
    }

    #[test]
    fn the_successors_revision_goes_with_its_name() {
        let mut object = lease_with(&[]).object().clone();
        on_claim(&mut object, Some("r2"));
        let lease = Lease::new(object.clone());
        assert_eq!(successor_rank(&lease), Rank::New);
        on_claim(&mut object, None);
        assert_eq!(annotation(&object, SUCCESSOR_REVISION_ANNOTATION), None);
        on_claim(&mut object, Some("r2"));
        on_acquired(&mut object, Some("r2"));
        assert_eq!(annotation(&object, SUCCESSOR_REVISION_ANNOTATION), None);
    }
}
