//! `Status` bodies with the wording of the real kube-apiserver (see the recordings).

use serde_json::{Value, json};

/// The group and resource every error talks about.
pub(super) const GROUP: &str = "coordination.k8s.io";
pub(super) const RESOURCE: &str = "leases";
pub(super) const QUALIFIED: &str = "leases.coordination.k8s.io";
pub(super) const API_VERSION: &str = "coordination.k8s.io/v1";

/// An error answer: HTTP status, the `Status` body and extra response headers.
#[derive(Clone, Debug)]
pub(super) struct ApiError {
    pub code: u16,
    pub body: Value,
    pub headers: Vec<(&'static str, String)>,
}

impl ApiError {
    fn new(code: u16, reason: &str, message: String, details: Option<Value>) -> ApiError {
        let mut body = json!({
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": message,
            "reason": reason,
            "code": code,
        });
        if let Some(d) = details {
            body["details"] = d;
        }
        let mut headers = Vec::new();
        if code == 403 {
            // As recorded: the authorization filter adds this header.
            headers.push(("x-content-type-options", "nosniff".to_string()));
        }
        ApiError {
            code,
            body,
            headers,
        }
    }
}

fn name_details(name: &str) -> Value {
    if name.is_empty() {
        json!({ "group": GROUP, "kind": RESOURCE })
    } else {
        json!({ "name": name, "group": GROUP, "kind": RESOURCE })
    }
}

fn qualified_name(name: &str) -> String {
    if name.is_empty() {
        QUALIFIED.to_string()
    } else {
        format!("{QUALIFIED} \"{name}\"")
    }
}

/// 404 (exchanges 01 and 18).
pub(super) fn not_found(name: &str) -> ApiError {
    ApiError::new(
        404,
        "NotFound",
        format!("{} not found", qualified_name(name)),
        Some(name_details(name)),
    )
}

/// 404 for a path the server does not serve.
pub(super) fn path_not_found() -> ApiError {
    ApiError::new(
        404,
        "NotFound",
        "the server could not find the requested resource".to_string(),
        Some(json!({})),
    )
}

/// 405 for a method the resource does not support.
pub(super) fn method_not_allowed(method: &str) -> ApiError {
    method_not_allowed_on(method, RESOURCE)
}

/// 405 for a method `resource` does not support (here).
pub(super) fn method_not_allowed_on(method: &str, resource: &str) -> ApiError {
    ApiError::new(
        405,
        "MethodNotAllowed",
        format!("{method} is not supported on resources of kind \"{resource}\""),
        Some(json!({})),
    )
}

/// 409 `AlreadyExists` (exchange 03).
pub(super) fn already_exists(name: &str) -> ApiError {
    ApiError::new(
        409,
        "AlreadyExists",
        format!("{} already exists", qualified_name(name)),
        Some(name_details(name)),
    )
}

/// 409 `Conflict` with the optimistic-lock message (exchange 06).
pub(super) fn conflict(name: &str) -> ApiError {
    conflict_with(
        name,
        "the object has been modified; please apply your changes to the latest version and try again",
    )
}

/// 409 `Conflict`: `Operation cannot be fulfilled on leases... "name": <why>`.
pub(super) fn conflict_with(name: &str, why: &str) -> ApiError {
    ApiError::new(
        409,
        "Conflict",
        format!(
            "Operation cannot be fulfilled on {}: {why}",
            qualified_name(name)
        ),
        Some(name_details(name)),
    )
}

/// 409 `Conflict` of a server-side apply (`NewApplyConflict` from `NewConflictError` in
/// the apiserver's `managedfields/internal/conflict.go`): `conflicts` are (manager as
/// printed, field path) pairs; details hold only the causes.
pub(super) fn apply_conflict(conflicts: &[(String, String)]) -> ApiError {
    let causes: Vec<Value> = conflicts
        .iter()
        .map(|(m, p)| {
            json!({ "reason": "FieldManagerConflict", "message": format!("conflict with {m}"), "field": p })
        })
        .collect();
    let message = if let [(m, p)] = conflicts {
        format!("Apply failed with 1 conflict: conflict with {m}: {p}")
    } else {
        let mut managers: Vec<&String> = conflicts.iter().map(|(m, _)| m).collect();
        managers.sort();
        managers.dedup();
        let mut lines = Vec::new();
        for m in managers {
            lines.push(format!("conflicts with {m}:"));
            for (_, p) in conflicts.iter().filter(|(cm, _)| cm == m) {
                lines.push(format!("- {p}"));
            }
        }
        format!(
            "Apply failed with {} conflicts: {}",
            conflicts.len(),
            lines.join("\n")
        )
    };
    ApiError::new(409, "Conflict", message, Some(json!({ "causes": causes })))
}

/// 422 for invalid `PatchOptions` (`ValidatePatchOptions`): `PatchOptions.meta.k8s.io ""
/// is invalid: <field>: <message>`.
pub(super) fn invalid_patch_options(field: &str, reason: &'static str, message: &str) -> ApiError {
    ApiError::new(
        422,
        "Invalid",
        format!("PatchOptions.meta.k8s.io \"\" is invalid: {field}: {message}"),
        Some(json!({
            "group": "meta.k8s.io",
            "kind": "PatchOptions",
            "causes": [{ "reason": reason, "message": message, "field": field }],
        })),
    )
}

/// 422 for an update without resourceVersion (exchange 07: kind is the resource here).
pub(super) fn rv_required(name: &str) -> ApiError {
    let detail = "Invalid value: 0: must be specified for an update";
    let mut d = name_details(name);
    d["causes"] = json!([{
        "reason": "FieldValueInvalid",
        "message": detail,
        "field": "metadata.resourceVersion",
    }]);
    ApiError::new(
        422,
        "Invalid",
        format!(
            "{} is invalid: metadata.resourceVersion: {detail}",
            qualified_name(name)
        ),
        Some(d),
    )
}

/// One field error of a validation failure.
pub(super) struct FieldError {
    pub field: String,
    /// `FieldValueInvalid`, `FieldValueRequired`, `FieldValueForbidden`, ...
    pub reason: &'static str,
    /// e.g. `Invalid value: 0: must be greater than 0`
    pub message: String,
}

/// 422 `Invalid` from validation: `Lease.coordination.k8s.io "demo" is invalid: ...`.
pub(super) fn invalid(name: &str, errors: &[FieldError]) -> ApiError {
    invalid_kind(GROUP, "Lease", name, errors)
}

/// 422 `Invalid` from the validation of any kind: `<Kind>.<group> "name" is
/// invalid: <field>: <message>` (several: `[a, b]`; the core group has no
/// suffix and no `details.group`), the causes in `details`.
pub(super) fn invalid_kind(group: &str, kind: &str, name: &str, errors: &[FieldError]) -> ApiError {
    let causes: Vec<Value> = errors
        .iter()
        .map(|e| json!({ "reason": e.reason, "message": e.message, "field": e.field }))
        .collect();
    let parts: Vec<String> = errors
        .iter()
        .map(|e| format!("{}: {}", e.field, e.message))
        .collect();
    let summary = match parts.as_slice() {
        [one] => one.clone(),
        _ => format!("[{}]", parts.join(", ")),
    };
    let mut details = json!({ "kind": kind, "causes": causes });
    let qualified = if group.is_empty() {
        kind.to_owned()
    } else {
        details["group"] = json!(group);
        format!("{kind}.{group}")
    };
    if !name.is_empty() {
        details["name"] = json!(name);
    }
    ApiError::new(
        422,
        "Invalid",
        format!("{qualified} \"{name}\" is invalid: {summary}"),
        Some(details),
    )
}

/// 400 `BadRequest` (exchange 08), no details.
pub(super) fn bad_request(message: impl Into<String>) -> ApiError {
    ApiError::new(400, "BadRequest", message.into(), None)
}

/// 400 for a body the server cannot decode.
pub(super) fn undecodable(err: impl std::fmt::Display) -> ApiError {
    bad_request(format!(
        "Lease in version \"v1\" cannot be handled as a Lease: {err}"
    ))
}

/// 403 from RBAC on Leases (exchanges 10, 11, 15, 16, 17): no name part for collection
/// requests.
pub(super) fn forbidden(user: &str, verb: &str, namespace: Option<&str>, name: &str) -> ApiError {
    forbidden_on(user, verb, GROUP, RESOURCE, namespace, name)
}

/// 403 from RBAC on any resource, in the words of exchanges 16 and 17: for the core group
/// the resource is not qualified (`events is forbidden: ... in API group ""`) and
/// `details` has no group.
pub(super) fn forbidden_on(
    user: &str,
    verb: &str,
    group: &str,
    resource: &str,
    namespace: Option<&str>,
    name: &str,
) -> ApiError {
    let scope = match namespace {
        Some(ns) => format!("in the namespace \"{ns}\""),
        None => "at the cluster scope".to_string(),
    };
    let qualified = if group.is_empty() {
        resource.to_string()
    } else {
        format!("{resource}.{group}")
    };
    let subject = if name.is_empty() {
        qualified
    } else {
        format!("{qualified} \"{name}\"")
    };
    let mut details = json!({ "kind": resource });
    if !name.is_empty() {
        details["name"] = json!(name);
    }
    if !group.is_empty() {
        details["group"] = json!(group);
    }
    ApiError::new(
        403,
        "Forbidden",
        format!(
            "{subject} is forbidden: User \"{user}\" cannot {verb} resource \"{resource}\" in API group \"{group}\" {scope}"
        ),
        Some(details),
    )
}

/// 403 for a non-resource path.
pub(super) fn forbidden_path(user: &str, verb: &str, path: &str) -> ApiError {
    ApiError::new(
        403,
        "Forbidden",
        format!("forbidden: User \"{user}\" cannot {verb} path \"{path}\""),
        Some(json!({})),
    )
}

/// 401 (exchange 19).
pub(super) fn unauthorized() -> ApiError {
    ApiError::new(401, "Unauthorized", "Unauthorized".to_string(), None)
}

/// The 410 `Expired` Status of a too-old resourceVersion (exchange 13), as sent in an
/// ERROR watch event or as the body of a 410 list answer.
pub(super) fn expired(requested: u64, oldest: u64) -> ApiError {
    ApiError::new(
        410,
        "Expired",
        format!("too old resource version: {requested} ({oldest})"),
        None,
    )
}

/// 410 for a list continue token older than the retained history.
pub(super) fn continue_expired() -> ApiError {
    ApiError::new(
        410,
        "Expired",
        "The provided continue parameter is too old to display a consistent list result. You can start a new list without the continue parameter.".to_string(),
        None,
    )
}

/// 429 from API Priority and Fairness.
pub(super) fn too_many_requests(retry_after_secs: u64) -> ApiError {
    let mut e = ApiError::new(
        429,
        "TooManyRequests",
        "Too many requests, please try again later.".to_string(),
        Some(json!({ "retryAfterSeconds": retry_after_secs })),
    );
    e.headers
        .push(("retry-after", retry_after_secs.to_string()));
    e
}

/// 500 `InternalError`.
pub(super) fn internal(message: &str) -> ApiError {
    ApiError::new(
        500,
        "InternalError",
        format!("Internal error occurred: {message}"),
        Some(json!({ "causes": [{ "message": message }] })),
    )
}

/// 500 with reason `Unknown`: what the handler makes of a plain (non-Status) error, e.g.
/// the storage's "resourceVersion should not be set on objects to be created".
pub(super) fn unknown_500(message: &str) -> ApiError {
    ApiError::new(500, "Unknown", message.to_string(), None)
}

/// 504 for a resourceVersion newer than the server's, after waiting for it.
pub(super) fn too_large_rv(requested: u64, current: u64) -> ApiError {
    ApiError::new(
        504,
        "Timeout",
        format!("Timeout: Too large resource version: {requested}, current: {current}"),
        Some(json!({
            "causes": [{ "reason": "ResourceVersionTooLarge", "message": "Too large resource version" }],
            "retryAfterSeconds": 1,
        })),
    )
}

/// The answer a `FaultKind::Status(code)` gives for a request with this user, verb and name.
/// A 403 names the request's `(group, resource)`.
pub(super) fn for_code(
    code: u16,
    user: &str,
    verb: &str,
    (group, resource): (&str, &str),
    namespace: &str,
    name: &str,
) -> ApiError {
    match code {
        400 => bad_request("the server rejected our request for an unknown reason"),
        401 => unauthorized(),
        403 => forbidden_on(user, verb, group, resource, Some(namespace), name),
        404 => not_found(name),
        409 => conflict(name),
        410 => expired(1, 1),
        422 => invalid(
            name,
            &[FieldError {
                field: "spec".to_string(),
                reason: "FieldValueInvalid",
                message: "Invalid value: \"object\": injected fault".to_string(),
            }],
        ),
        429 => too_many_requests(1),
        500 => internal("injected fault"),
        503 => ApiError::new(
            503,
            "ServiceUnavailable",
            "the server is currently unable to handle the request".to_string(),
            Some(json!({ "retryAfterSeconds": 1 })),
        ),
        504 => ApiError::new(
            504,
            "Timeout",
            "Timeout: request did not complete within the allotted timeout".to_string(),
            Some(json!({ "retryAfterSeconds": 1 })),
        ),
        c => ApiError::new(
            c,
            "Unknown",
            format!(
                "the server responded with the status code {c} but did not return more information"
            ),
            Some(json!({})),
        ),
    }
}

/// The `Status` of a successful delete: the generic registry returns this, not the object,
/// for Leases (`ReturnDeletedObject` is off for them).
pub(super) fn delete_success(name: &str, uid: &str) -> Value {
    json!({
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Success",
        "details": { "name": name, "group": GROUP, "kind": RESOURCE, "uid": uid },
    })
}

// ----- core/v1 Events -----

/// 409 `AlreadyExists` for an Event name.
pub(super) fn event_already_exists(name: &str) -> ApiError {
    ApiError::new(
        409,
        "AlreadyExists",
        format!("events \"{name}\" already exists"),
        Some(json!({ "name": name, "kind": "events" })),
    )
}

/// 422 `Invalid` from Event validation: `Event "x" is invalid: ...` (core group: no suffix).
pub(super) fn event_invalid(name: &str, errors: &[FieldError]) -> ApiError {
    invalid_kind("", "Event", name, errors)
}

/// 400 for an Event body the server cannot decode.
pub(super) fn undecodable_event(err: impl std::fmt::Display) -> ApiError {
    bad_request(format!(
        "Event in version \"v1\" cannot be handled as a Event: {err}"
    ))
}
