//! The Lease object as leader-gate reads and writes it.
//!
//! Objects are kept whole (`DynamicObject`), so labels, annotations and spec
//! fields this version does not know survive every write (G4). Reading is
//! lenient: a malformed field reads as absent and never panics. The release
//! mark of G6 lives here too.

use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease as TypedLease;
use kube::api::{ApiResource, DynamicObject, ObjectMeta};
use serde_json::{Map, Value, json};

use crate::clock::{format_micro_time, parse_micro_time};

/// Annotation a graceful release writes: the term id that released the
/// Lease. A cleared holder counts as released only if this names the
/// record's own term, so a stale mark from an earlier term is ignored.
pub const RELEASED_TERM_ANNOTATION: &str = "leader-gate.dev/released-term";

/// Annotation every write of ours carries: this process's writer mark, a
/// random 64-bit number drawn once per process. Two processes given the
/// same identity write the same `holderIdentity` and, creating at the same
/// microsecond, the same `renewTime`; the mark tells their writes apart (G7).
pub const WRITER_ANNOTATION: &str = "leader-gate.dev/writer";
/// Labels the holder puts on the Lease when it acquires it, and a release
/// removes, so that `kubectl get lease -L leader-gate.dev/holder-node`
/// shows where the leader runs (as client-go's `NewWithLabels`): its pod
/// (the identity) and its node. Informative only: nothing reads them back
/// (ownership is decided by the spec, G7), and a label edited away stays
/// away until the next acquisition.
pub const HOLDER_LABEL: &str = "leader-gate.dev/holder";
pub const HOLDER_NODE_LABEL: &str = "leader-gate.dev/holder-node";

/// The longest writer mark kept as it is (ours are 16 hex digits).
const MAX_WRITER_LEN: usize = 64;

/// The longest `holderIdentity` kept as it is (a pod name is at most 253).
/// Anyone who may update the Lease controls this string, and every sidecar
/// stores and prints it: a longer one is cut and marked, so it can never
/// equal a valid identity.
pub const MAX_IDENTITY_LEN: usize = 253;
/// Marks a cut `holderIdentity`.
const CUT_MARK: &str = "…[cut]";
/// The longest `leaseDurationSeconds` honoured: the API's field is an int32.
const MAX_DURATION_SECS: i64 = i32::MAX as i64;
/// `leaseTransitions` is an int32 on the server: one past it is a 400 for
/// ever, so it wraps to 0 (term ids stay unique: the uid is part of them and
/// 2^31 acquisitions of one Lease never happen in one history).
const MAX_TRANSITIONS: i64 = i32::MAX as i64;

/// The annotation `key` of `object`, unless absent or empty.
pub fn annotation<'a>(object: &'a DynamicObject, key: &str) -> Option<&'a str> {
    object
        .metadata
        .annotations
        .as_ref()?
        .get(key)
        .map(String::as_str)
        .filter(|v| !v.is_empty())
}

/// Sets (or, with `None`, removes) an annotation of `object`.
pub fn set_annotation(object: &mut DynamicObject, key: &str, value: Option<&str>) {
    match value {
        Some(value) => {
            object
                .metadata
                .annotations
                .get_or_insert_with(Default::default)
                .insert(key.into(), value.into());
        }
        None => {
            if let Some(annotations) = object.metadata.annotations.as_mut() {
                annotations.remove(key);
            }
        }
    }
}

/// `text`, cut to at most `max` bytes (on a char boundary) and marked when
/// it was longer.
pub fn bounded(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_owned();
    }
    let mut end = max - CUT_MARK.len();
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}{CUT_MARK}", &text[..end])
}

/// The `ApiResource` of `coordination.k8s.io/v1` Leases.
pub fn api_resource() -> ApiResource {
    ApiResource::erase::<TypedLease>(&())
}

/// Identifies one leadership term: the Lease's uid plus its
/// `leaseTransitions`, unique even when the Lease is deleted and recreated.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct TermId(String);

impl TermId {
    /// Term `transitions` of the Lease `uid`.
    pub fn new(uid: Option<&str>, transitions: i64) -> Self {
        // The API server makes uids (36 characters); bound a forged one.
        Self(format!(
            "{}/{transitions}",
            bounded(uid.unwrap_or_default(), 64)
        ))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Display for TermId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// The fields of the election record, read leniently from a Lease.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Record {
    /// `holderIdentity`; an empty string reads as `None`.
    pub holder: Option<String>,
    /// `leaseDurationSeconds`, if present and positive.
    pub duration: Option<Duration>,
    /// `renewTime` in microseconds since the epoch, if it parses.
    pub renew_micros: Option<i64>,
    /// `leaseTransitions`, 0 when absent or malformed.
    pub transitions: i64,
    /// The writer mark of the last leader-gate write ([`WRITER_ANNOTATION`]),
    /// if present: absent when written by another client, or stripped.
    pub writer: Option<String>,
}

/// This process's writer mark ([`WRITER_ANNOTATION`]): 64 random bits, from
/// the OS-seeded hasher keys of the standard library mixed with fastrand's
/// generator, the pid and the time, so no twin process can draw the same.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WriterMark(String);

impl WriterMark {
    /// A fresh random mark.
    pub fn random() -> Self {
        use std::hash::BuildHasher;
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        let keyed = std::collections::hash_map::RandomState::new().hash_one((
            std::process::id(),
            nanos,
            fastrand::u64(..),
        ));
        Self::from_u64(keyed ^ fastrand::u64(..))
    }

    pub fn from_u64(mark: u64) -> Self {
        Self(format!("{mark:016x}"))
    }

    /// A mark as written (16 hex digits), e.g. by a previous process.
    pub fn parse(text: &str) -> Option<Self> {
        u64::from_str_radix(text, 16)
            .ok()
            .filter(|_| text.len() == 16)
            .map(Self::from_u64)
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Display for WriterMark {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// Sets the writer mark of `object`, a write about to be sent.
pub fn mark_writer(object: &mut DynamicObject, mark: &WriterMark) {
    object
        .metadata
        .annotations
        .get_or_insert_with(Default::default)
        .insert(WRITER_ANNOTATION.into(), mark.0.clone());
}

/// A Lease as observed from the API server.
#[derive(Clone, Debug)]
pub struct Lease {
    object: DynamicObject,
}

// === impl Lease ===

impl Lease {
    pub fn new(object: DynamicObject) -> Self {
        Self { object }
    }

    pub fn object(&self) -> &DynamicObject {
        &self.object
    }

    pub fn resource_version(&self) -> Option<&str> {
        self.object.metadata.resource_version.as_deref()
    }

    pub fn uid(&self) -> Option<&str> {
        self.object.metadata.uid.as_deref()
    }

    fn spec(&self) -> Option<&Map<String, Value>> {
        self.object.data.get("spec").and_then(Value::as_object)
    }

    pub fn record(&self) -> Record {
        let spec = self.spec();
        let field = |name: &str| spec.and_then(|s| s.get(name));
        Record {
            holder: field("holderIdentity")
                .and_then(Value::as_str)
                .filter(|h| !h.is_empty())
                .map(|h| bounded(h, MAX_IDENTITY_LEN)),
            duration: field("leaseDurationSeconds")
                .and_then(Value::as_i64)
                .filter(|s| *s > 0)
                .map(|s| Duration::from_secs(s.min(MAX_DURATION_SECS) as u64)),
            renew_micros: field("renewTime")
                .and_then(Value::as_str)
                .and_then(parse_micro_time),
            transitions: field("leaseTransitions")
                .and_then(Value::as_i64)
                .filter(|n| (0..=MAX_TRANSITIONS).contains(n))
                .unwrap_or(0),
            writer: self
                .object
                .metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(WRITER_ANNOTATION))
                .map(|w| bounded(w, MAX_WRITER_LEN)),
        }
    }

    pub fn term_id(&self) -> TermId {
        TermId::new(self.uid(), self.record().transitions)
    }

    /// The `leaseTransitions` an acquisition of this record writes: one
    /// more, wrapping to 0 past the int32 the server stores.
    pub fn next_transitions(&self) -> i64 {
        match self.record().transitions {
            MAX_TRANSITIONS => 0,
            n => n + 1,
        }
    }

    /// The record content whose change restarts a follower's expiry clock
    /// (G3): the spec, the release mark and the object's identity — not
    /// labels or other metadata, which GitOps may edit at any time.
    pub fn content(&self) -> Value {
        json!([self.uid(), self.spec(), self.released_term()])
    }

    fn released_term(&self) -> Option<&str> {
        self.object
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(RELEASED_TERM_ANNOTATION))
            .map(String::as_str)
    }

    /// True when the holder was cleared by a graceful release of this very
    /// term (G6), which peers may take at once.
    pub fn is_marked_released(&self) -> bool {
        self.record().holder.is_none() && self.released_term() == Some(self.term_id().as_str())
    }

    /// This object with `holderIdentity` taken by `identity`: a new term.
    pub fn acquired(&self, identity: &str, now_micros: i64, duration: Duration) -> DynamicObject {
        let transitions = self.next_transitions();
        let mut object = self.object.clone();
        if let Some(annotations) = object.metadata.annotations.as_mut() {
            annotations.remove(RELEASED_TERM_ANNOTATION);
        }
        let spec = spec_mut(&mut object);
        let now = json!(format_micro_time(now_micros));
        spec.insert("holderIdentity".into(), json!(identity));
        spec.insert("leaseDurationSeconds".into(), json!(duration.as_secs()));
        spec.insert("acquireTime".into(), now.clone());
        spec.insert("renewTime".into(), now);
        spec.insert("leaseTransitions".into(), json!(transitions));
        object
    }

    /// This object with a fresh `renewTime`.
    ///
    /// (Holder labels are left as they are: written on acquisition only.)
    pub fn renewed(&self, now_micros: i64) -> DynamicObject {
        let mut object = self.object.clone();
        spec_mut(&mut object).insert("renewTime".into(), json!(format_micro_time(now_micros)));
        object
    }

    /// This object with the holder cleared and the release mark of the
    /// current term (G6).
    pub fn released(&self) -> DynamicObject {
        let term = self.term_id();
        let mut object = self.object.clone();
        object
            .metadata
            .annotations
            .get_or_insert_with(Default::default)
            .insert(RELEASED_TERM_ANNOTATION.into(), term.0);
        spec_mut(&mut object).remove("holderIdentity");
        label_holder(&mut object, &[]);
        object
    }
}

/// A Lease to create when none exists: term 0 of a new uid.
pub fn created(
    namespace: &str,
    name: &str,
    identity: &str,
    now_micros: i64,
    duration: Duration,
) -> DynamicObject {
    let now = format_micro_time(now_micros);
    let mut object = DynamicObject::new(name, &api_resource()).within(namespace);
    object.metadata = ObjectMeta {
        name: Some(name.into()),
        namespace: Some(namespace.into()),
        ..ObjectMeta::default()
    };
    object.data = json!({
        "spec": {
            "holderIdentity": identity,
            "leaseDurationSeconds": duration.as_secs(),
            "acquireTime": now,
            "renewTime": now,
            "leaseTransitions": 0,
        }
    });
    object
}

/// Puts `labels` ([`HOLDER_LABEL`], [`HOLDER_NODE_LABEL`]) on `object` in
/// place of whatever holder labels it had; with none, removes them. Other
/// labels are left as they are.
pub fn label_holder(object: &mut DynamicObject, labels: &[(String, String)]) {
    let existing = object.metadata.labels.get_or_insert_with(Default::default);
    existing.remove(HOLDER_LABEL);
    existing.remove(HOLDER_NODE_LABEL);
    existing.extend(labels.iter().cloned());
    if existing.is_empty() {
        object.metadata.labels = None;
    }
}

fn spec_mut(object: &mut DynamicObject) -> &mut Map<String, Value> {
    if !object.data.is_object() {
        object.data = json!({});
    }
    let data = object.data.as_object_mut().expect("data is an object");
    let spec = data.entry("spec").or_insert_with(|| json!({}));
    if !spec.is_object() {
        *spec = json!({});
    }
    spec.as_object_mut().expect("spec is an object")
}

#[cfg(test)]
pub mod fixtures {
    //! Builders for Leases in tests: `LeaseBuilder::held_by("a")`.
    use super::*;

    pub struct LeaseBuilder {
        value: Value,
    }

    impl LeaseBuilder {
        pub fn held_by(holder: &str) -> Self {
            Self {
                value: json!({
                    "apiVersion": "coordination.k8s.io/v1",
                    "kind": "Lease",
                    "metadata": {"name": "demo", "namespace": "ns", "uid": "uid-1", "resourceVersion": "1"},
                    "spec": {
                        "holderIdentity": holder,
                        "leaseDurationSeconds": 15,
                        "renewTime": "2026-11-29T17:26:29.727769Z",
                        "leaseTransitions": 0,
                    }
                }),
            }
        }

        pub fn unheld() -> Self {
            let mut builder = Self::held_by("");
            builder.spec().remove("holderIdentity");
            builder
        }

        fn spec(&mut self) -> &mut Map<String, Value> {
            self.value["spec"].as_object_mut().unwrap()
        }

        pub fn rv(mut self, rv: u64) -> Self {
            self.value["metadata"]["resourceVersion"] = json!(rv.to_string());
            self
        }

        pub fn uid(mut self, uid: &str) -> Self {
            self.value["metadata"]["uid"] = json!(uid);
            self
        }

        pub fn renewed_at(mut self, micros: i64) -> Self {
            self.spec()
                .insert("renewTime".into(), json!(format_micro_time(micros)));
            self
        }

        pub fn duration_secs(mut self, secs: i64) -> Self {
            self.spec()
                .insert("leaseDurationSeconds".into(), json!(secs));
            self
        }

        pub fn transitions(mut self, n: i64) -> Self {
            self.spec().insert("leaseTransitions".into(), json!(n));
            self
        }

        pub fn spec_field(mut self, name: &str, value: Value) -> Self {
            self.spec().insert(name.into(), value);
            self
        }

        pub fn label(mut self, key: &str, value: &str) -> Self {
            self.value["metadata"]["labels"][key] = json!(value);
            self
        }

        pub fn annotation(mut self, key: &str, value: &str) -> Self {
            self.value["metadata"]["annotations"][key] = json!(value);
            self
        }

        pub fn build(self) -> Lease {
            Lease::new(serde_json::from_value(self.value).unwrap())
        }
    }

    /// The server's answer to a write: `object` stored with a new rv.
    pub fn stored(object: DynamicObject, rv: u64) -> Lease {
        let mut object = object;
        object.metadata.resource_version = Some(rv.to_string());
        if object.metadata.uid.is_none() {
            object.metadata.uid = Some("uid-new".into());
        }
        Lease::new(object)
    }
}

#[cfg(test)]
mod tests {
    use super::fixtures::*;
    use super::*;

    #[test]
    fn malformed_fields_read_as_absent() {
        let lease = LeaseBuilder::held_by("a")
            .spec_field("leaseDurationSeconds", json!("fifteen"))
            .spec_field("renewTime", json!("yesterday"))
            .spec_field("leaseTransitions", json!(null))
            .build();
        let record = lease.record();
        assert_eq!(record.holder.as_deref(), Some("a"));
        assert_eq!(record.duration, None);
        assert_eq!(record.renew_micros, None);
        assert_eq!(record.transitions, 0);
    }

    #[test]
    fn a_spec_that_is_not_an_object_reads_as_empty_and_is_rewritten() {
        let mut object: DynamicObject = serde_json::from_value(json!({
            "metadata": {"name": "demo", "uid": "u", "resourceVersion": "3"},
            "spec": "garbage"
        }))
        .unwrap();
        object.types = None;
        let lease = Lease::new(object);
        assert_eq!(lease.record().holder, None);
        let acquired = Lease::new(lease.acquired("me", 1_000_000, Duration::from_secs(15)));
        assert_eq!(acquired.record().holder.as_deref(), Some("me"));
    }

    #[test]
    fn writes_keep_unknown_fields_labels_and_annotations() {
        let lease = LeaseBuilder::held_by("a")
            .spec_field("strategy", json!("OldestEmulationVersion"))
            .spec_field("futureField", json!({"x": 1}))
            .label("team", "sre")
            .annotation("note", "keep")
            .build();
        for object in [
            lease.acquired("b", 5, Duration::from_secs(15)),
            lease.renewed(5),
            lease.released(),
        ] {
            assert_eq!(object.data["spec"]["futureField"], json!({"x": 1}));
            assert_eq!(
                object.data["spec"]["strategy"],
                json!("OldestEmulationVersion")
            );
            assert_eq!(object.metadata.labels.as_ref().unwrap()["team"], "sre");
            assert_eq!(
                object.metadata.annotations.as_ref().unwrap()["note"],
                "keep"
            );
            assert_eq!(object.metadata.resource_version.as_deref(), Some("1"));
        }
    }

    #[test]
    fn the_holder_labels_follow_the_holder_and_leave_other_labels_alone() {
        let lease = LeaseBuilder::held_by("a")
            .label("team", "sre")
            .label(HOLDER_LABEL, "a")
            .label(HOLDER_NODE_LABEL, "node-a")
            .build();
        let labels = |object: &DynamicObject| object.metadata.labels.clone().unwrap_or_default();
        let mut taken = lease.acquired("b", 5, Duration::from_secs(15));
        label_holder(&mut taken, &[(HOLDER_LABEL.into(), "b".into())]);
        let taken = labels(&taken);
        assert_eq!(taken.get(HOLDER_LABEL).map(String::as_str), Some("b"));
        assert_eq!(taken.get(HOLDER_NODE_LABEL), None, "not a's node");
        assert_eq!(taken["team"], "sre");
        // A release says nobody holds it: no holder labels left.
        let released = labels(&lease.released());
        assert_eq!(released.get(HOLDER_LABEL), None);
        assert_eq!(released.get(HOLDER_NODE_LABEL), None);
        assert_eq!(released["team"], "sre");
        // A renew leaves them as they are (an edit stays until the next term).
        assert_eq!(labels(&lease.renewed(6))[HOLDER_NODE_LABEL], "node-a");
        // And an object with no labels gets none from a release.
        let bare = LeaseBuilder::held_by("a").build().released();
        assert_eq!(bare.metadata.labels, None);
    }

    #[test]
    fn hostile_values_are_bounded_and_never_stall_an_acquisition() {
        let huge = "h".repeat(200_000);
        let lease = LeaseBuilder::held_by(&huge)
            .duration_secs(i64::MAX)
            .transitions(i32::MAX as i64)
            .build();
        let record = lease.record();
        let holder = record.holder.unwrap();
        assert!(holder.len() <= MAX_IDENTITY_LEN, "{}", holder.len());
        assert!(holder.ends_with(CUT_MARK));
        assert_eq!(record.duration, Some(Duration::from_secs(i32::MAX as u64)));
        // One past int32 would be a 400 for ever: wrap to 0 instead.
        let acquired = Lease::new(lease.acquired("me", 0, Duration::from_secs(15)));
        assert_eq!(acquired.record().transitions, 0);
        // Out-of-range transitions read as 0, like other malformed fields.
        let negative = LeaseBuilder::held_by("a").transitions(-5).build();
        assert_eq!(negative.record().transitions, 0);
        assert_eq!(bounded("ééé", 9), "ééé");
        let cut = bounded(&"é".repeat(300), MAX_IDENTITY_LEN);
        assert!(cut.len() <= MAX_IDENTITY_LEN && cut.ends_with(CUT_MARK));
    }

    #[test]
    fn acquiring_increments_transitions_even_from_the_same_name() {
        let lease = LeaseBuilder::held_by("me").transitions(4).build();
        let acquired = Lease::new(lease.acquired("me", 7, Duration::from_secs(15)));
        assert_eq!(acquired.record().transitions, 5);
        assert_ne!(acquired.term_id(), lease.term_id());
    }

    #[test]
    fn release_is_marked_with_the_released_term_only() {
        let lease = LeaseBuilder::held_by("me").transitions(2).build();
        let released = Lease::new(lease.released());
        assert!(released.is_marked_released());
        assert_eq!(released.record().holder, None);
        // The same mark on a later term (or a cleared holder without it) is no release.
        let later = LeaseBuilder::unheld()
            .transitions(3)
            .annotation(RELEASED_TERM_ANNOTATION, lease.term_id().as_str())
            .build();
        assert!(!later.is_marked_released());
        assert!(!LeaseBuilder::unheld().build().is_marked_released());
        // Acquiring drops the mark.
        let reacquired = released.acquired("b", 9, Duration::from_secs(15));
        assert!(
            !reacquired
                .metadata
                .annotations
                .unwrap()
                .contains_key(RELEASED_TERM_ANNOTATION)
        );
    }

    #[test]
    fn content_ignores_labels_and_resource_version() {
        let a = LeaseBuilder::held_by("a").build();
        let b = LeaseBuilder::held_by("a").label("x", "y").rv(9).build();
        assert_eq!(a.content(), b.content());
        let c = LeaseBuilder::held_by("a").renewed_at(5).build();
        assert_ne!(a.content(), c.content());
    }
}
