//! discovery.k8s.io/v1 EndpointSlices, as kube-apiserver v1.36 answers a client that keeps
//! one slice of a Service without a selector (recordings under
//! `apiserver-protocol/endpointslices/`): `GET` and `PUT` of one slice, `POST` (`create`),
//! `DELETE`, and a list by `metadata.name` field selector.
//!
//! What the real server does and this copies:
//! * a PUT with the current `resourceVersion` stores the object (rv + 1, `generation` + 1);
//!   one that changes nothing keeps both (07b); a stale one is 409 `Conflict` (08);
//! * a PUT **without** `resourceVersion` is an unconditional overwrite (09: the strategy
//!   allows it, unlike Leases);
//! * `"endpoints": []` is stored and read back as `null` (18c); a missing `conditions` is
//!   stored as `{}` (18b);
//! * `conditions` {`ready`, `serving`, `terminating`} are stored and returned as sent,
//!   key for key: contradictory ones are accepted (15: `ready` and `terminating` both
//!   true), and one that names only some is not completed (10: `{"ready": false}` comes
//!   back alone). [`Conditions::of`] reads them as kube-proxy does (a missing `ready` or
//!   `serving` is true, a missing `terminating` false), for tests to judge what a
//!   version of the slice routes to;
//! * validation (422 `Invalid`, details kind `EndpointSlice`): `addressType` required (18)
//!   and immutable (18d); addresses must be IPs of the slice's family without leading zeros
//!   (13, 13b, 13c) and not loopback (12); port names must be RFC 1123 labels (16). A port
//!   name the Service lacks (17), a targetRef to a missing Pod (07) and contradictory
//!   conditions (15) are accepted;
//! * RBAC by resourceNames is the handler's (19, 20, 27, 31).
//!
//! No watch, no patch: nothing leader-gate sends. No controller runs here either, as none
//! ran in the recordings: nothing but clients changes a slice.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::time::Instant;

use serde_json::{Value, json};

use super::status::{ApiError, FieldError};
use super::store::{Store, k8s_time_now, random_uid};

pub(super) const GROUP: &str = "discovery.k8s.io";
pub(super) const RESOURCE: &str = "endpointslices";
const QUALIFIED: &str = "endpointslices.discovery.k8s.io";

/// An endpoint's conditions as kube-proxy reads them
/// (`pkg/proxy/endpointslicecache.go:211-213`, in the recordings' README): a missing
/// `ready` or `serving` is true, a missing `terminating` false.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Conditions {
    pub ready: bool,
    pub serving: bool,
    pub terminating: bool,
}

impl Conditions {
    /// A leader's own entry: ready, serving, not terminating.
    pub const READY: Self = Self {
        ready: true,
        serving: true,
        terminating: false,
    };
    /// A stepped-down leader's entry: not ready, still serving, terminating.
    pub const TERMINATING: Self = Self {
        ready: false,
        serving: true,
        terminating: true,
    };

    /// The conditions of `endpoint` (one element of a slice's `endpoints`).
    pub fn of(endpoint: &Value) -> Self {
        let conditions = &endpoint["conditions"];
        let flag = |name: &str, missing: bool| conditions[name].as_bool().unwrap_or(missing);
        Self {
            ready: flag("ready", true),
            serving: flag("serving", true),
            terminating: flag("terminating", false),
        }
    }

    /// Whether kube-proxy sends traffic to it in a slice with these
    /// `others` (`pkg/proxy/topology.go:41-42`): a ready endpoint always, a
    /// serving and terminating one only while no endpoint is ready.
    pub fn used_among(self, all: &[Self]) -> bool {
        self.ready || (self.serving && self.terminating && !all.iter().any(|c| c.ready))
    }
}

/// The slices, by namespace and name, and every version each one had.
#[derive(Default)]
pub(super) struct EndpointSlices {
    stored: BTreeMap<(String, String), Value>,
    history: Vec<(Instant, Value)>,
}

impl EndpointSlices {
    pub(super) fn get(&self, ns: &str, name: &str) -> Result<Value, ApiError> {
        self.stored
            .get(&(ns.to_string(), name.to_string()))
            .cloned()
            .ok_or_else(|| not_found(name))
    }

    /// Every version stored so far, oldest first, with when it was stored.
    pub(super) fn history(&self) -> Vec<(Instant, Value)> {
        self.history.clone()
    }

    /// A list of the slices of `ns` named `name` (the field selector RBAC lets through).
    pub(super) fn list(&self, store: &Store, ns: &str, name: Option<&str>) -> Value {
        let items: Vec<Value> = self
            .stored
            .iter()
            .filter(|((n, slice), _)| n == ns && name.is_none_or(|name| name == slice))
            .map(|(_, obj)| {
                let mut item = obj.clone();
                let item_map = item.as_object_mut().expect("an object");
                item_map.remove("kind");
                item_map.remove("apiVersion");
                item
            })
            .collect();
        json!({
            "kind": "EndpointSliceList",
            "apiVersion": "discovery.k8s.io/v1",
            "metadata": { "resourceVersion": store.rv().to_string() },
            "items": items,
        })
    }

    /// POST: 201 with the stored object, 409 `AlreadyExists` for a taken name.
    pub(super) fn create(
        &mut self,
        store: &mut Store,
        ns: &str,
        body: Value,
    ) -> Result<Value, ApiError> {
        let mut obj = decode(body)?;
        let name = obj["metadata"]["name"].as_str().unwrap_or("").to_string();
        validate(&name, &obj, None)?;
        let key = (ns.to_string(), name.clone());
        if self.stored.contains_key(&key) {
            return Err(already_exists(&name));
        }
        let meta = obj["metadata"].as_object_mut().expect("decoded metadata");
        meta.insert("namespace".into(), json!(ns));
        meta.insert("uid".into(), json!(random_uid()));
        meta.insert("generation".into(), json!(1));
        meta.insert("creationTimestamp".into(), json!(k8s_time_now()));
        meta.insert("resourceVersion".into(), json!(store.bump_rv().to_string()));
        normalize(&mut obj);
        self.store(key, obj.clone());
        Ok(obj)
    }

    /// PUT: a compare-and-swap when the body carries `resourceVersion`, an unconditional
    /// overwrite when it does not.
    pub(super) fn update(
        &mut self,
        store: &mut Store,
        ns: &str,
        name: &str,
        body: Value,
    ) -> Result<Value, ApiError> {
        let mut obj = decode(body)?;
        let key = (ns.to_string(), name.to_string());
        let Some(current) = self.stored.get(&key).cloned() else {
            return Err(not_found(name));
        };
        validate(name, &obj, Some(&current))?;
        let sent_rv = obj["metadata"]["resourceVersion"]
            .as_str()
            .filter(|rv| !rv.is_empty());
        if sent_rv.is_some_and(|rv| Some(rv) != current["metadata"]["resourceVersion"].as_str()) {
            return Err(conflict(name));
        }
        // The server keeps what a client may not set.
        let meta = obj["metadata"].as_object_mut().expect("decoded metadata");
        for kept in ["uid", "creationTimestamp", "generation", "resourceVersion"] {
            meta.insert(kept.into(), current["metadata"][kept].clone());
        }
        meta.insert("namespace".into(), json!(ns));
        normalize(&mut obj);
        let unchanged = |v: &Value| {
            let mut v = v.clone();
            v["metadata"]
                .as_object_mut()
                .map(|m| m.remove("resourceVersion"));
            v
        };
        if unchanged(&obj) == unchanged(&current) {
            return Ok(current); // 07b: same resourceVersion, same generation
        }
        let generation = current["metadata"]["generation"].as_u64().unwrap_or(1) + 1;
        obj["metadata"]["generation"] = json!(generation);
        obj["metadata"]["resourceVersion"] = json!(store.bump_rv().to_string());
        self.store(key, obj.clone());
        Ok(obj)
    }

    pub(super) fn delete(&mut self, ns: &str, name: &str) -> Result<Value, ApiError> {
        self.stored
            .remove(&(ns.to_string(), name.to_string()))
            .ok_or_else(|| not_found(name))
    }

    fn store(&mut self, key: (String, String), obj: Value) {
        self.history.push((Instant::now(), obj.clone()));
        self.stored.insert(key, obj);
    }
}

fn decode(body: Value) -> Result<Value, ApiError> {
    if !body.is_object() || !body["metadata"].is_object() {
        return Err(super::status::bad_request(
            "EndpointSlice in version \"v1\" cannot be handled as a EndpointSlice: the body is not an object with metadata",
        ));
    }
    let mut obj = body;
    obj["kind"] = json!("EndpointSlice");
    obj["apiVersion"] = json!("discovery.k8s.io/v1");
    Ok(obj)
}

/// As the server stores it: `endpoints: []` becomes `null`, an endpoint without
/// conditions gets `{}`, ports in the order name, protocol, port.
fn normalize(obj: &mut Value) {
    match obj.get_mut("endpoints") {
        Some(Value::Array(endpoints)) if endpoints.is_empty() => obj["endpoints"] = Value::Null,
        Some(Value::Array(endpoints)) => {
            for endpoint in endpoints {
                if endpoint.get("conditions").is_none() {
                    endpoint["conditions"] = json!({});
                }
            }
        }
        None => obj["endpoints"] = Value::Null,
        Some(_) => {}
    }
}

fn validate(name: &str, obj: &Value, current: Option<&Value>) -> Result<(), ApiError> {
    let mut errors = Vec::new();
    let address_type = obj["addressType"].as_str().unwrap_or("");
    if address_type.is_empty() {
        errors.push(FieldError {
            field: "addressType".into(),
            reason: "FieldValueRequired",
            message: "Required value".into(),
        });
    } else if let Some(current) = current
        && current["addressType"].as_str() != Some(address_type)
    {
        errors.push(FieldError {
            field: "addressType".into(),
            reason: "FieldValueInvalid",
            message: format!("Invalid value: \"{address_type}\": field is immutable"),
        });
    }
    let endpoints = obj["endpoints"].as_array().cloned().unwrap_or_default();
    for (i, endpoint) in endpoints.iter().enumerate() {
        let addresses = endpoint["addresses"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        for (j, address) in addresses.iter().enumerate() {
            let text = address.as_str().unwrap_or("");
            let field = format!("endpoints[{i}].addresses[{j}]");
            let invalid = |message: String| FieldError {
                field: field.clone(),
                reason: "FieldValueInvalid",
                message: format!("Invalid value: \"{text}\": {message}"),
            };
            match (address_type, text.parse::<IpAddr>()) {
                ("FQDN", _) => {}
                (_, Err(_)) if looks_like_leading_zero(text) => {
                    errors.push(invalid("must not have leading 0s".into()));
                }
                (_, Err(_)) => errors.push(invalid(
                    "must be a valid IP address, (e.g. 10.9.8.7 or 2001:db8::ffff)".into(),
                )),
                (_, Ok(ip)) if ip.is_loopback() => errors.push(invalid(
                    "may not be in the loopback range (127.0.0.0/8, ::1/128)".into(),
                )),
                ("IPv4", Ok(IpAddr::V6(_))) => errors.push(FieldError {
                    field: format!("endpoints[{i}].addresses"),
                    reason: "FieldValueInvalid",
                    message: format!("Invalid value: \"{text}\": must be an IPv4 address"),
                }),
                ("IPv6", Ok(IpAddr::V4(_))) => errors.push(FieldError {
                    field: format!("endpoints[{i}].addresses"),
                    reason: "FieldValueInvalid",
                    message: format!("Invalid value: \"{text}\": must be an IPv6 address"),
                }),
                _ => {}
            }
        }
    }
    let ports = obj["ports"].as_array().cloned().unwrap_or_default();
    for (i, port) in ports.iter().enumerate() {
        let Some(port_name) = port["name"].as_str() else {
            continue;
        };
        if !is_rfc1123_label(port_name) {
            errors.push(FieldError {
                field: format!("ports[{i}].name"),
                reason: "FieldValueInvalid",
                message: format!(
                    "Invalid value: \"{port_name}\": a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')"
                ),
            });
        }
    }
    if errors.is_empty() {
        return Ok(());
    }
    Err(invalid(name, &errors))
}

fn looks_like_leading_zero(text: &str) -> bool {
    let parts: Vec<&str> = text.split('.').collect();
    parts.len() == 4
        && parts
            .iter()
            .all(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()))
        && parts.iter().any(|p| p.len() > 1 && p.starts_with('0'))
}

fn is_rfc1123_label(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

fn details(name: &str) -> Value {
    json!({ "name": name, "group": GROUP, "kind": RESOURCE })
}

fn failure(code: u16, reason: &str, message: String, details: Value) -> ApiError {
    ApiError {
        code,
        body: json!({
            "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": message, "reason": reason, "details": details, "code": code,
        }),
        headers: Vec::new(),
    }
}

fn not_found(name: &str) -> ApiError {
    failure(
        404,
        "NotFound",
        format!("{QUALIFIED} \"{name}\" not found"),
        details(name),
    )
}

fn already_exists(name: &str) -> ApiError {
    failure(
        409,
        "AlreadyExists",
        format!("{QUALIFIED} \"{name}\" already exists"),
        details(name),
    )
}

fn conflict(name: &str) -> ApiError {
    failure(
        409,
        "Conflict",
        format!(
            "Operation cannot be fulfilled on {QUALIFIED} \"{name}\": the object has been modified; please apply your changes to the latest version and try again"
        ),
        details(name),
    )
}

/// 422 as exchange 12 words it: the Kind in the message and in details.
fn invalid(name: &str, errors: &[FieldError]) -> ApiError {
    super::status::invalid_kind(GROUP, "EndpointSlice", name, errors)
}
