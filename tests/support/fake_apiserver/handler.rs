//! Connections and requests: routing, authentication, RBAC, faults, the Lease verbs and
//! Event creation.

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use serde_json::{Value, json};
use tokio::io::BufReader;
use tokio::net::tcp::OwnedWriteHalf;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::oneshot;
use tokio::task::JoinSet;

use super::http::{self, Request};
use super::rbac::Attributes;
use super::status::{self, ApiError};
use super::store::{Filter, LabelReq, to_json};
use super::{Conditions, FaultKind, Inner, RequestRecord, Resource, Verb, watch};

/// Accepts connections until told to stop; then closes the listener and every connection.
pub(super) async fn accept_loop(
    inner: Arc<Inner>,
    listener: TcpListener,
    mut stop: oneshot::Receiver<()>,
) {
    let mut conns = JoinSet::new();
    loop {
        tokio::select! {
            _ = &mut stop => break,
            accepted = listener.accept() => {
                if let Ok((stream, _)) = accepted {
                    conns.spawn(serve_conn(inner.clone(), stream));
                }
            }
            Some(_) = conns.join_next(), if !conns.is_empty() => {}
        }
    }
    drop(listener);
    conns.shutdown().await;
}

async fn serve_conn(inner: Arc<Inner>, stream: TcpStream) {
    let _ = stream.set_nodelay(true);
    let (r, mut w) = stream.into_split();
    let mut r = BufReader::new(r);
    loop {
        let req = match http::read_request(&mut r, &mut w).await {
            Ok(Some(req)) => req,
            _ => return,
        };
        let keep_alive = tokio::select! {
            keep = handle(&inner, req, &mut w) => keep,
            // A client that gives up (closes) ends hung requests and watches.
            _ = http::client_gone(&mut r) => false,
        };
        if !keep_alive {
            return;
        }
    }
}

/// What a request addresses.
#[derive(Debug)]
pub(super) struct Route {
    pub verb: Verb,
    /// `None` for a cluster-wide list/watch.
    pub ns: Option<String>,
    /// The name in the path (get/update/patch/delete).
    pub path_name: Option<String>,
    /// The resource of the path; `None` for other paths.
    pub resource: Option<Resource>,
}

const PREFIX: &str = "/apis/coordination.k8s.io/v1/";
const CORE_PREFIX: &str = "/api/v1/";
const DISCOVERY_PREFIX: &str = "/apis/discovery.k8s.io/v1/";

fn route(req: &Request) -> Route {
    let watch = req
        .query_param("watch")
        .is_some_and(|w| w == "true" || w == "1");
    let other = Route {
        verb: Verb::Other,
        ns: None,
        path_name: None,
        resource: None,
    };
    let (resource, rest) = if let Some(rest) = req.path.strip_prefix(PREFIX) {
        (Resource::Leases, rest)
    } else if let Some(rest) = req.path.strip_prefix(CORE_PREFIX) {
        let pods = matches!(
            rest.split('/').collect::<Vec<_>>().as_slice(),
            ["pods", ..] | ["namespaces", _, "pods", ..]
        );
        (
            if pods {
                Resource::Pods
            } else {
                Resource::Events
            },
            rest,
        )
    } else if let Some(rest) = req.path.strip_prefix(DISCOVERY_PREFIX) {
        (Resource::EndpointSlices, rest)
    } else {
        return other;
    };
    let plural = resource.name();
    let segs: Vec<&str> = rest.split('/').collect();
    let (ns, name) = match segs.as_slice() {
        [r] if *r == plural => (None, None),
        ["namespaces", ns, r] if *r == plural => (Some(ns.to_string()), None),
        ["namespaces", ns, r, name] if *r == plural && !name.is_empty() => {
            (Some(ns.to_string()), Some(name.to_string()))
        }
        _ => return other,
    };
    let verb = match (req.method.as_str(), &name) {
        ("GET", None) if watch => Verb::Watch,
        ("GET", None) => Verb::List,
        ("GET", Some(_)) => Verb::Get,
        ("POST", None) if ns.is_some() => Verb::Create,
        ("PUT", Some(_)) => Verb::Update,
        ("PATCH", Some(_)) => Verb::Patch,
        ("DELETE", Some(_)) => Verb::Delete,
        _ => Verb::Other,
    };
    Route {
        verb,
        ns,
        path_name: name,
        resource: Some(resource),
    }
}

/// Parses `fieldSelector`: `metadata.name` and `metadata.namespace` with `=`/`==`.
fn parse_field_selector(sel: &str, filter: &mut Filter) -> Result<(), ApiError> {
    for term in sel.split(',').map(str::trim).filter(|t| !t.is_empty()) {
        let (k, v) = term
            .split_once("==")
            .or_else(|| term.split_once('='))
            .filter(|(k, _)| !k.ends_with('!'))
            .ok_or_else(|| {
                status::bad_request(format!(
                    "unable to parse requirement: fake apiserver supports only = in field selectors: {term}"
                ))
            })?;
        match k.trim() {
            "metadata.name" => filter.name = Some(v.trim().to_string()),
            "metadata.namespace" => filter.field_ns = Some(v.trim().to_string()),
            other => {
                return Err(status::bad_request(format!(
                    "field label not supported: {other}"
                )));
            }
        }
    }
    Ok(())
}

/// Parses an equality-based `labelSelector`.
fn parse_label_selector(sel: &str, filter: &mut Filter) -> Result<(), ApiError> {
    for term in sel.split(',').map(str::trim).filter(|t| !t.is_empty()) {
        let req = if let Some((k, v)) = term.split_once("!=") {
            LabelReq::NotEq(k.trim().into(), v.trim().into())
        } else if let Some((k, v)) = term.split_once("==").or_else(|| term.split_once('=')) {
            LabelReq::Eq(k.trim().into(), v.trim().into())
        } else if let Some(k) = term.strip_prefix('!') {
            LabelReq::NotExists(k.trim().into())
        } else if term.contains(' ') || term.contains('(') {
            return Err(status::bad_request(format!(
                "unable to parse requirement: fake apiserver supports only equality-based label selectors: {term}"
            )));
        } else {
            LabelReq::Exists(term.into())
        };
        filter.labels.push(req);
    }
    Ok(())
}

fn selector_name(req: &Request) -> Option<String> {
    let mut f = Filter::default();
    parse_field_selector(req.query_param("fieldSelector")?, &mut f).ok()?;
    f.name
}

/// The pods an EndpointSlice body lists, for [`RequestRecord::lists`], with
/// their conditions, for [`RequestRecord::conditions`].
fn listed_pods(body: &[u8]) -> (Vec<String>, Vec<Conditions>) {
    let body = serde_json::from_slice::<Value>(body).unwrap_or_default();
    let endpoints = body["endpoints"].as_array().cloned().unwrap_or_default();
    endpoints
        .iter()
        .filter_map(|e| {
            let pod = e["targetRef"]["name"]
                .as_str()
                .or_else(|| e["addresses"][0].as_str())?;
            Some((pod.to_string(), Conditions::of(e)))
        })
        .unzip()
}

/// The identity behind a request.
enum Auth {
    Client { name: String, user: String },
    Anonymous,
    Invalid,
}

fn authenticate(inner: &Inner, req: &Request) -> Auth {
    let Some(authz) = req.header("authorization") else {
        return Auth::Anonymous;
    };
    let Some(token) = authz
        .strip_prefix("Bearer ")
        .or_else(|| authz.strip_prefix("bearer "))
        .map(str::trim)
    else {
        return Auth::Invalid;
    };
    let (client, generation) = match token.rsplit_once('.') {
        Some((c, g)) if g.parse::<u64>().is_ok() => (c, g.parse::<u64>().unwrap_or(0)),
        _ => (token, 0),
    };
    let st = inner.lock();
    match st.clients.get(client) {
        Some(info) if info.generation == generation => Auth::Client {
            name: client.to_string(),
            user: info.user.clone(),
        },
        _ => Auth::Invalid,
    }
}

/// Handles one request and writes its response. Returns whether the connection stays open.
async fn handle(inner: &Arc<Inner>, req: Request, w: &mut OwnedWriteHalf) -> bool {
    let route = route(&req);
    let auth = authenticate(inner, &req);
    let name = match route.verb {
        Verb::List | Verb::Watch => selector_name(&req),
        Verb::Create => serde_json::from_slice::<Value>(&req.body)
            .ok()
            .and_then(|b| b["metadata"]["name"].as_str().map(str::to_string)),
        _ => route.path_name.clone(),
    };
    let client = match &auth {
        Auth::Client { name, .. } => name.clone(),
        _ => String::new(),
    };
    let rec = {
        let mut st = inner.lock();
        let listed = match (route.resource, route.verb) {
            (Some(Resource::EndpointSlices), Verb::Create | Verb::Update) => listed_pods(&req.body),
            _ => (Vec::new(), Vec::new()),
        };
        st.log.push(RequestRecord {
            at: Instant::now(),
            wall: SystemTime::now(),
            client: client.clone(),
            verb: route.verb,
            resource: route.resource,
            name: name.clone(),
            status: None,
            method: req.method.clone(),
            path: req.target.clone(),
            content_type: req.header("content-type").map(str::to_string),
            holder: match route.verb {
                Verb::Create | Verb::Update => serde_json::from_slice::<Value>(&req.body)
                    .ok()
                    .and_then(|b| b["spec"]["holderIdentity"].as_str().map(str::to_string)),
                _ => None,
            },
            lists: listed.0,
            conditions: listed.1,
        });
        st.log_offset + st.log.len() - 1
    };
    let user = match &auth {
        Auth::Client { user, .. } => user.clone(),
        _ => "system:anonymous".to_string(),
    };
    let ns = route.ns.clone().unwrap_or_default();
    let name_str = name.clone().unwrap_or_default();
    // Collection requests carry no name in the RBAC message (create, and list/watch
    // without a name selector).
    let rbac_name = match route.verb {
        Verb::Create => String::new(),
        _ => name_str.clone(),
    };

    // Faults of this client.
    let mut drop_response = false;
    if !client.is_empty() {
        loop {
            let mut changes = inner.faults_changed.subscribe();
            let fault = inner
                .lock()
                .faults
                .get(&client)
                .and_then(|fs| fs.iter().find(|f| f.applies_to(route.verb)).cloned());
            match fault.map(|f| f.kind) {
                None => break,
                Some(FaultKind::Partition) => {
                    let _ = changes.changed().await;
                }
                Some(FaultKind::Hang) => std::future::pending::<()>().await,
                Some(FaultKind::Latency(d)) => {
                    tokio::time::sleep(d).await;
                    break;
                }
                Some(FaultKind::DropResponse) => {
                    drop_response = true;
                    break;
                }
                Some(FaultKind::TooManyRequests { retry_after }) => {
                    let secs = retry_after.as_secs() + u64::from(retry_after.subsec_nanos() > 0);
                    return reply_error(inner, rec, w, status::too_many_requests(secs), &req).await;
                }
                Some(FaultKind::Status(code)) => {
                    if code == 410 && route.verb == Verb::Watch {
                        let oldest = inner.lock().store.oldest();
                        let e = status::expired(oldest.saturating_sub(1), oldest);
                        return watch::reply_expired(inner, rec, w, &e.body, false, req.keep_alive)
                            .await;
                    }
                    let resource = route.resource.unwrap_or(Resource::Leases);
                    let e = status::for_code(
                        code,
                        &user,
                        route.verb.rbac_name(),
                        (resource.group(), resource.name()),
                        &ns,
                        &rbac_name,
                    );
                    return reply_error(inner, rec, w, e, &req).await;
                }
            }
        }
    }

    match auth {
        Auth::Invalid => return reply_error(inner, rec, w, status::unauthorized(), &req).await,
        Auth::Anonymous | Auth::Client { .. } => {}
    }

    let Some(resource) = route.resource else {
        return non_resource(inner, rec, w, &req, &user, matches!(auth, Auth::Anonymous)).await;
    };
    if route.verb == Verb::Other {
        let e = if route.path_name.is_none() && req.method == "DELETE" {
            // deletecollection: only RBAC's answer is modelled.
            status::forbidden_on(
                &user,
                "deletecollection",
                resource.group(),
                resource.name(),
                route.ns.as_deref(),
                "",
            )
        } else {
            status::method_not_allowed(&req.method)
        };
        return reply_error(inner, rec, w, e, &req).await;
    }

    // RBAC: the clients' Role, bound in the server's namespace.
    let allowed = {
        let st = inner.lock();
        match st.clients.get(&client) {
            Some(info) if info.admin => true,
            Some(info) if info.bound => {
                route.ns.as_deref() == Some(inner.namespace.as_str())
                    && st.role.allows(&Attributes {
                        verb: route.verb.rbac_name(),
                        group: resource.group(),
                        resource: resource.name(),
                        name: &rbac_name,
                    })
            }
            _ => false,
        }
    };
    if !allowed {
        let e = status::forbidden_on(
            &user,
            route.verb.rbac_name(),
            resource.group(),
            resource.name(),
            route.ns.as_deref(),
            &rbac_name,
        );
        return reply_error(inner, rec, w, e, &req).await;
    }

    let manager = req
        .query_param("fieldManager")
        .map(str::to_string)
        .or_else(|| {
            req.header("user-agent")
                .and_then(|ua| ua.split('/').next())
                .filter(|m| !m.is_empty())
                .map(str::to_string)
        })
        .unwrap_or_else(|| "unknown".to_string());
    let dry_run = req.query_param("dryRun").is_some_and(|d| d == "All");
    let path_name = route.path_name.clone().unwrap_or_default();

    if resource == Resource::Events {
        let result = match route.verb {
            Verb::Create => decode_event_body(&req).and_then(|body| {
                let mut st = inner.lock();
                let super::State { store, events, .. } = &mut *st;
                events
                    .create(store, &ns, body, &manager, dry_run)
                    .map(|o| (201, o))
            }),
            // Only what a recorder needs is served.
            _ => Err(status::method_not_allowed_on(&req.method, "events")),
        };
        return match result {
            Ok((code, body)) => reply(inner, rec, w, code, &[], &body, &req, drop_response).await,
            Err(e) => {
                reply(
                    inner,
                    rec,
                    w,
                    e.code,
                    &e.headers,
                    &e.body,
                    &req,
                    drop_response,
                )
                .await
            }
        };
    }

    if resource == Resource::Pods {
        let result = match route.verb {
            Verb::Get => inner.lock().pods.get(&ns, &path_name).map(|o| (200, o)),
            _ => Err(status::method_not_allowed_on(
                &req.method,
                "pods (fake apiserver)",
            )),
        };
        let (code, headers, body) = match result {
            Ok((code, body)) => (code, Vec::new(), body),
            Err(e) => (e.code, e.headers, e.body),
        };
        return reply(inner, rec, w, code, &headers, &body, &req, drop_response).await;
    }

    if resource == Resource::EndpointSlices {
        let result = endpoint_slice_verb(inner, &route, &req, &ns, &path_name, name.as_deref());
        let (code, headers, body) = match result {
            Ok((code, body)) => (code, Vec::new(), body),
            Err(e) => (e.code, e.headers, e.body),
        };
        return reply(inner, rec, w, code, &headers, &body, &req, drop_response).await;
    }

    let result: Result<(u16, Value), ApiError> = match route.verb {
        Verb::Get => {
            let st = inner.lock();
            st.store
                .get(&ns, &path_name)
                .cloned()
                .map(|o| (200, o))
                .ok_or_else(|| status::not_found(&path_name))
        }
        Verb::List => list(inner, &req, route.ns.clone()).await.map(|l| (200, l)),
        Verb::Watch => {
            let filter = match make_filter(&req, route.ns.clone()) {
                Ok(f) => f,
                Err(e) => return reply_error(inner, rec, w, e, &req).await,
            };
            return watch::serve(inner, rec, w, &req, &client, filter, drop_response).await;
        }
        Verb::Create => decode_body(&req).and_then(|body| {
            let mut st = inner.lock();
            st.store
                .create(&ns, body, &manager, dry_run)
                .map(|o| (201, o))
        }),
        Verb::Update => decode_body(&req).and_then(|body| {
            let mut st = inner.lock();
            st.store
                .update(&ns, &path_name, body, &manager, dry_run)
                .map(|o| (200, o))
        }),
        Verb::Patch => {
            let ct = req.header("content-type").unwrap_or("");
            let media = ct.split(';').next().unwrap_or("").trim();
            let force = req.query_param("force");
            let known = [
                "application/apply-patch+yaml",
                "application/merge-patch+json",
                "application/strategic-merge-patch+json",
            ];
            if !known.contains(&media) {
                // The media type is checked first (patch.go), then the options.
                Err(ApiError {
                    code: 415,
                    body: json!({
                        "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                        "message": format!("the body of the request was in an unknown format - accepted media types include: {} (fake apiserver); got {ct}", known.join(", ")),
                        "reason": "UnsupportedMediaType", "code": 415,
                    }),
                    headers: Vec::new(),
                })
            } else if media != "application/apply-patch+yaml" && force.is_some() {
                // ValidatePatchOptions, before anything else.
                Err(status::invalid_patch_options(
                    "force",
                    "FieldValueForbidden",
                    "Forbidden: may not be specified for non-apply patch",
                ))
            } else if media == "application/apply-patch+yaml" {
                match req.query_param("fieldManager").filter(|m| !m.is_empty()) {
                    None => Err(status::invalid_patch_options(
                        "fieldManager",
                        "FieldValueRequired",
                        "Required value: is required for apply patch",
                    )),
                    Some(field_manager) => decode_apply_body(&req).and_then(|patch| {
                        let mut st = inner.lock();
                        // Apply creates an absent object: the apiserver then also
                        // authorizes `create` on it (patch.go, createAuthorizerAttributes).
                        let may_create = match st.clients.get(&client) {
                            Some(info) if info.admin => true,
                            Some(info) if info.bound => st.role.allows(&Attributes {
                                verb: "create",
                                group: resource.group(),
                                resource: resource.name(),
                                name: &path_name,
                            }),
                            _ => false,
                        };
                        if st.store.get(&ns, &path_name).is_none() && !may_create {
                            return Err(status::forbidden_on(
                                &user,
                                "create",
                                resource.group(),
                                resource.name(),
                                route.ns.as_deref(),
                                &path_name,
                            ));
                        }
                        st.store.apply(
                            &ns,
                            &path_name,
                            &patch,
                            field_manager,
                            force == Some("true"),
                            dry_run,
                        )
                    }),
                }
            } else {
                decode_body(&req).and_then(|patch| {
                    let mut st = inner.lock();
                    st.store
                        .merge_patch(&ns, &path_name, &patch, &manager, dry_run)
                        .map(|o| (200, o))
                })
            }
        }
        Verb::Delete => {
            let opts: Value = serde_json::from_slice(&req.body).unwrap_or(Value::Null);
            let uid = opts.pointer("/preconditions/uid").and_then(Value::as_str);
            let rv = opts
                .pointer("/preconditions/resourceVersion")
                .and_then(Value::as_str);
            let dry = dry_run
                || opts["dryRun"]
                    .as_array()
                    .is_some_and(|a| a.iter().any(|d| d == "All"));
            let mut st = inner.lock();
            st.store.delete(&ns, &path_name, uid, rv, dry).map(|o| {
                let uid = o["metadata"]["uid"].as_str().unwrap_or("");
                (200, status::delete_success(&path_name, uid))
            })
        }
        Verb::Other => unreachable!("handled above"),
    };
    match result {
        Ok((code, body)) => reply(inner, rec, w, code, &[], &body, &req, drop_response).await,
        Err(e) => {
            let ApiError {
                code,
                body,
                headers,
            } = e;
            reply(inner, rec, w, code, &headers, &body, &req, drop_response).await
        }
    }
}

/// The EndpointSlice verbs (see `endpoint_slices`); RBAC has been checked.
fn endpoint_slice_verb(
    inner: &Inner,
    route: &Route,
    req: &Request,
    ns: &str,
    path_name: &str,
    selected: Option<&str>,
) -> Result<(u16, Value), ApiError> {
    let mut st = inner.lock();
    let super::State {
        store,
        endpoint_slices,
        ..
    } = &mut *st;
    match route.verb {
        Verb::Get => endpoint_slices.get(ns, path_name).map(|o| (200, o)),
        Verb::List => Ok((200, endpoint_slices.list(store, ns, selected))),
        Verb::Create => {
            decode_body(req).and_then(|b| endpoint_slices.create(store, ns, b).map(|o| (201, o)))
        }
        Verb::Update => decode_body(req).and_then(|b| {
            endpoint_slices
                .update(store, ns, path_name, b)
                .map(|o| (200, o))
        }),
        Verb::Delete => endpoint_slices.delete(ns, path_name).map(|o| {
            let uid = o["metadata"]["uid"].as_str().unwrap_or("");
            (200, status::delete_success(path_name, uid))
        }),
        Verb::Watch | Verb::Patch | Verb::Other => Err(status::method_not_allowed_on(
            &req.method,
            "endpointslices (fake apiserver)",
        )),
    }
}

fn decode_body(req: &Request) -> Result<Value, ApiError> {
    serde_json::from_slice(&req.body).map_err(|e| status::undecodable(format!("json: {e}")))
}

/// A server-side apply body: YAML (JSON is YAML too; kube-rs sends JSON).
fn decode_apply_body(req: &Request) -> Result<Value, ApiError> {
    if let Ok(v) = serde_json::from_slice::<Value>(&req.body) {
        return Ok(v);
    }
    let text = std::str::from_utf8(&req.body)
        .map_err(|e| status::bad_request(format!("error decoding YAML: {e}")))?;
    serde_saphyr::from_str::<Value>(text)
        .map_err(|e| status::bad_request(format!("error decoding YAML: {e}")))
}

fn decode_event_body(req: &Request) -> Result<Value, ApiError> {
    serde_json::from_slice(&req.body).map_err(|e| status::undecodable_event(format!("json: {e}")))
}

pub(super) fn make_filter(req: &Request, ns: Option<String>) -> Result<Filter, ApiError> {
    let mut filter = Filter {
        ns,
        ..Filter::default()
    };
    if let Some(sel) = req.query_param("fieldSelector") {
        parse_field_selector(sel, &mut filter)?;
    }
    if let Some(sel) = req.query_param("labelSelector") {
        parse_label_selector(sel, &mut filter)?;
    }
    Ok(filter)
}

/// Parses a `resourceVersion` query parameter (`None` for unset or `"0"`).
pub(super) fn parse_rv(req: &Request) -> Result<Option<u64>, ApiError> {
    match req.query_param("resourceVersion") {
        None | Some("") | Some("0") => Ok(None),
        Some(s) => s.parse::<u64>().map(Some).map_err(|_| {
            status::bad_request(format!(
                "resourceVersion: Invalid value: \"{s}\": must be a valid resource version"
            ))
        }),
    }
}

/// Waits (up to 3 s, like the watch cache) until the store has reached `rv`; 504 if not.
pub(super) async fn wait_for_rv(inner: &Inner, rv: u64) -> Result<(), ApiError> {
    let mut changes = inner.lock().store.subscribe();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(3);
    loop {
        let current = *changes.borrow_and_update();
        if current >= rv {
            return Ok(());
        }
        if tokio::time::timeout_at(deadline, changes.changed())
            .await
            .is_err()
        {
            return Err(status::too_large_rv(rv, inner.lock().store.rv()));
        }
    }
}

async fn list(inner: &Inner, req: &Request, ns: Option<String>) -> Result<Value, ApiError> {
    let filter = make_filter(req, ns)?;
    let rv = parse_rv(req)?;
    let exact = req.query_param("resourceVersionMatch") == Some("Exact");
    if let Some(rv) = rv {
        wait_for_rv(inner, rv).await?;
    }
    let limit = req
        .query_param("limit")
        .and_then(|l| l.parse::<usize>().ok());
    let cont = req.query_param("continue").filter(|c| !c.is_empty());
    let st = inner.lock();
    st.store
        .list(&filter, if exact { rv } else { None }, limit, cont)
}

async fn non_resource(
    inner: &Inner,
    rec: usize,
    w: &mut OwnedWriteHalf,
    req: &Request,
    user: &str,
    anonymous: bool,
) -> bool {
    let path = req.path.as_str();
    let public = matches!(path, "/version" | "/healthz" | "/livez" | "/readyz");
    if !public && (path == "/api" || path == "/apis" || path.starts_with("/apis/")) && anonymous {
        let e = status::forbidden_path(user, "get", path);
        return reply_error(inner, rec, w, e, req).await;
    }
    match path {
        "/version" => {
            let v = json!({
                "major": "1", "minor": "36", "gitVersion": "v1.36.2",
                "goVersion": "go1.26", "compiler": "gc", "platform": "linux/amd64",
            });
            reply(inner, rec, w, 200, &[], &v, req, false).await
        }
        "/healthz" | "/livez" | "/readyz" => {
            inner.set_status(rec, 200);
            http::write_full(w, 200, &[], b"ok", req.keep_alive)
                .await
                .is_ok()
                && req.keep_alive
        }
        _ => reply_error(inner, rec, w, status::path_not_found(), req).await,
    }
}

async fn reply_error(
    inner: &Inner,
    rec: usize,
    w: &mut OwnedWriteHalf,
    e: ApiError,
    req: &Request,
) -> bool {
    reply(inner, rec, w, e.code, &e.headers, &e.body, req, false).await
}

#[allow(clippy::too_many_arguments)]
async fn reply(
    inner: &Inner,
    rec: usize,
    w: &mut OwnedWriteHalf,
    code: u16,
    headers: &[(&'static str, String)],
    body: &Value,
    req: &Request,
    drop_response: bool,
) -> bool {
    let pretty = req.query_param("pretty") == Some("true")
        || req
            .header("user-agent")
            .is_some_and(|ua| ua.starts_with("curl"));
    let mut bytes = if pretty {
        serde_json::to_vec_pretty(body).expect("serialize")
    } else {
        to_json(body).into_bytes()
    };
    bytes.push(b'\n');
    if drop_response {
        let _ = http::write_truncated(w, code, headers, &bytes).await;
        return false;
    }
    inner.set_status(rec, code);
    http::write_full(w, code, headers, &bytes, req.keep_alive)
        .await
        .is_ok()
        && req.keep_alive
}

impl Inner {
    /// Records the status of an answered request.
    pub(super) fn set_status(&self, rec: usize, code: u16) {
        let mut st = self.lock();
        let Some(i) = rec.checked_sub(st.log_offset) else {
            return;
        };
        if let Some(r) = st.log.get_mut(i) {
            r.status = Some(code);
        }
    }
}
