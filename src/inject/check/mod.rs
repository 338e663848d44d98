//! `inject --check`: what would break in a leader-gate setup, one line per
//! finding, `KIND/NAME container C: what is wrong, and what to do`.
//!
//! It finds the pods of a stream ([`workload`]), reads every leader-gate
//! command line in them as start-up reads it ([`line`]), and holds each
//! gated pod to the wiring rules ([`pod`]: native sidecars, the downward
//! API, the timing rules of [`crate::timing`], the gate socket, preStop
//! hooks and installed binaries; [`rbac`]: what the pod's service account
//! may do to its Leases; [`metricbeat`]: Metricbeat's modules glob and
//! reload period against a file gate, and its strict.perms against the
//! file gate's user and mode; [`agent`]: Elastic Agent's inputs.d, reload
//! period and own leader election against a file gate). The project's own policy for its
//! shipped manifests (user, image pin, resources…) stays in
//! scripts/check_manifests.py, which runs this check for the wiring.

use super::yaml::{Map, Node};

mod agent;
mod line;
mod metricbeat;
mod otel;
mod pod;
mod rbac;
mod workload;

/// The objects of the stream the rules look up by kind.
pub struct Stream<'a> {
    pub docs: &'a [Node],
}

impl Stream<'_> {
    /// Every object of `kind` (any apiVersion) in `namespace`.
    fn objects<'s>(&'s self, kind: &'s str) -> impl Iterator<Item = &'s Map> + 's {
        self.docs
            .iter()
            .filter_map(Node::as_map)
            .filter(move |d| d.str("kind") == Some(kind))
    }

    /// An object's `metadata.name` and `metadata.namespace` (`""` unset).
    fn name_of(object: &Map) -> (&str, &str) {
        let meta = object.map("metadata");
        (
            meta.and_then(|m| m.str("name")).unwrap_or(""),
            meta.and_then(|m| m.str("namespace")).unwrap_or(""),
        )
    }

    /// The ConfigMap `name` of `namespace`, if the stream holds it.
    fn config_map(&self, namespace: &str, name: &str) -> Option<Map> {
        self.objects("ConfigMap")
            .find(|cm| Self::name_of(cm) == (name, namespace))
            .cloned()
    }
}

/// Every finding in the stream, as `KIND/NAME container C: what is wrong`.
pub fn check_stream(docs: &[Node]) -> Vec<String> {
    let mut out = Vec::new();
    let stream = Stream { docs };
    let pods = workload::pods(docs, &mut out);
    let mut gated = 0;
    for pod in &pods {
        if pod::check(&stream, pod, &mut out) {
            gated += 1;
        }
    }
    if !pods.is_empty() && gated == 0 {
        out.push(format!(
            "stream: nothing here runs leader-gate ({} workloads, none with a leader-gate container): gate them with `leader-gate inject`",
            pods.len()
        ));
    }
    out
}
