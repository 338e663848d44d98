//! core/v1 Events: `POST /api/v1/namespaces/{ns}/events` stores them (201 with the stored
//! object, as the real server answers a create), and tests read them back.
//!
//! Modelled on a Lease create (exchange 02): the server fills `uid`, `resourceVersion`
//! (from the one global counter), `creationTimestamp` and `managedFields`. Validation is
//! the part of the real server's that a recorder can get wrong: a name, the namespace of
//! the URL, `involvedObject.namespace` equal to the Event's, a `type` of `Normal` or
//! `Warning`. Events are not served to lists or watches.

use serde_json::{Value, json};

use super::status::{self, ApiError, FieldError};
use super::store::{Store, field_paths, k8s_time_now, managed_entry, random_uid, to_json};

/// The Events created so far, in creation order.
#[derive(Default)]
pub(super) struct Events {
    stored: Vec<Value>,
}

impl Events {
    pub(super) fn all(&self) -> Vec<Value> {
        self.stored.clone()
    }

    /// POST: validates and stores one Event in `ns`.
    pub(super) fn create(
        &mut self,
        store: &mut Store,
        ns: &str,
        body: Value,
        manager: &str,
        dry_run: bool,
    ) -> Result<Value, ApiError> {
        let mut obj = decode_event(body)?;
        let meta = obj["metadata"].as_object_mut().expect("decoded metadata");
        match meta.get("namespace").and_then(Value::as_str) {
            Some(n) if !n.is_empty() && n != ns => {
                return Err(status::bad_request(
                    "the namespace of the provided object does not match the namespace sent on the request",
                ));
            }
            _ => {
                meta.insert("namespace".into(), json!(ns));
            }
        }
        let name = meta
            .get("name")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string();
        let mut errors = Vec::new();
        if name.is_empty() {
            errors.push(FieldError {
                field: "metadata.name".into(),
                reason: "FieldValueRequired",
                message: "Required value: name or generateName is required".into(),
            });
        }
        let involved_ns = obj["involvedObject"]["namespace"].as_str().unwrap_or("");
        if involved_ns != ns {
            errors.push(FieldError {
                field: "involvedObject.namespace".into(),
                reason: "FieldValueInvalid",
                message: format!(
                    "Invalid value: \"{involved_ns}\": does not match event.namespace"
                ),
            });
        }
        match obj["type"].as_str() {
            None | Some("Normal") | Some("Warning") => {}
            Some(other) => errors.push(FieldError {
                field: "type".into(),
                reason: "FieldValueNotSupported",
                message: format!(
                    "Unsupported value: \"{other}\": supported values: \"Normal\", \"Warning\""
                ),
            }),
        }
        if !errors.is_empty() {
            return Err(status::event_invalid(&name, &errors));
        }
        if obj["metadata"]["resourceVersion"]
            .as_str()
            .is_some_and(|rv| !rv.is_empty())
        {
            return Err(status::unknown_500(
                "resourceVersion should not be set on objects to be created",
            ));
        }
        if self
            .stored
            .iter()
            .any(|e| e["metadata"]["namespace"] == ns && e["metadata"]["name"] == name.as_str())
        {
            return Err(status::event_already_exists(&name));
        }
        let now = k8s_time_now();
        let meta = obj["metadata"].as_object_mut().expect("decoded metadata");
        meta.insert("uid".into(), json!(random_uid()));
        meta.insert("creationTimestamp".into(), json!(now));
        let fields = field_paths(&obj);
        obj["metadata"]["managedFields"] = json!([managed_entry(manager, &now, &fields)]);
        let rv = if dry_run { store.rv() } else { store.bump_rv() };
        obj["metadata"]["resourceVersion"] = json!(rv.to_string());
        if !dry_run {
            self.stored.push(obj.clone());
        }
        Ok(obj)
    }
}

/// Decodes a create body: a JSON object of `kind: Event`, `apiVersion: v1`.
fn decode_event(body: Value) -> Result<Value, ApiError> {
    let Value::Object(mut map) = body else {
        return Err(status::undecodable_event(format!(
            "json: cannot unmarshal {} into Go value of type core.Event",
            to_json(&body).chars().take(20).collect::<String>()
        )));
    };
    match map.get("kind").and_then(Value::as_str) {
        Some("Event") | None => {}
        Some(other) => {
            return Err(status::bad_request(format!(
                "Event in version \"v1\" cannot be handled as a Event: kind {other:?} is not Event"
            )));
        }
    }
    map.insert("kind".into(), json!("Event"));
    map.insert("apiVersion".into(), json!("v1"));
    if !map.get("metadata").is_some_and(Value::is_object) {
        map.insert("metadata".into(), json!({}));
    }
    Ok(Value::Object(map))
}
