//! core/v1 Pods, as far as `leader-gate handover` looks them up: `GET` of one pod by
//! name, to tell whether a `--to` can be a candidate at all.
//!
//! What the real server does and this copies: RBAC comes first, so without `get` on
//! pods the answer is the 403 of `apiserver-protocol/endpointslices/29` (a pod that
//! exists) and `29b` (one that does not) alike — it does not reveal whether the pod
//! exists; the handler gives it (`in API group ""`, `details` without `group`). Allowed,
//! a missing pod is the standard 404 `Status` of the recorded 404s (`01`, `18`), with
//! the core resource's details: `{"name", "kind": "pods"}`, no `group` (as the
//! recordings' README says of core resources). No recording shows a pod read with the
//! right granted, so the 200 body is a minimal Pod (metadata, one container, phase
//! `Running`). Pods are made by the test ([`super::FakeApiServer::add_pod`]); no other
//! verb is served.

use std::collections::BTreeMap;

use serde_json::{Value, json};

use super::status::ApiError;
use super::store::{Store, k8s_time_now, random_uid};

pub(super) const RESOURCE: &str = "pods";

/// The pods, by namespace and name.
#[derive(Default)]
pub(super) struct Pods {
    stored: BTreeMap<(String, String), Value>,
}

impl Pods {
    pub(super) fn get(&self, ns: &str, name: &str) -> Result<Value, ApiError> {
        self.stored
            .get(&(ns.to_string(), name.to_string()))
            .cloned()
            .ok_or_else(|| not_found(name))
    }

    /// A running pod `ns/name` (replaces one of that name).
    pub(super) fn add(&mut self, store: &mut Store, ns: &str, name: &str) -> Value {
        let pod = json!({
            "kind": "Pod",
            "apiVersion": "v1",
            "metadata": {
                "name": name,
                "namespace": ns,
                "uid": random_uid(),
                "resourceVersion": store.bump_rv().to_string(),
                "creationTimestamp": k8s_time_now(),
            },
            "spec": { "containers": [{ "name": "leader-gate", "image": "leader-gate" }] },
            "status": { "phase": "Running" },
        });
        self.stored
            .insert((ns.to_string(), name.to_string()), pod.clone());
        pod
    }

    /// Removes `ns/name`; whether it existed.
    pub(super) fn delete(&mut self, store: &mut Store, ns: &str, name: &str) -> bool {
        let existed = self
            .stored
            .remove(&(ns.to_string(), name.to_string()))
            .is_some();
        if existed {
            store.bump_rv();
        }
        existed
    }
}

/// 404 for a missing pod: the recorded 404 `Status`, for a core resource.
fn not_found(name: &str) -> ApiError {
    ApiError {
        code: 404,
        body: json!({
            "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": format!("{RESOURCE} \"{name}\" not found"), "reason": "NotFound",
            "details": { "name": name, "kind": RESOURCE }, "code": 404,
        }),
        headers: Vec::new(),
    }
}
