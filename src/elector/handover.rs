//! `leader-gate handover`: asks the current holder of the Lease to hand it
//! over — to a named candidate (`--to`) or to the successor the Lease names —
//! and waits until a new holder is seen.
//!
//! It writes `leader-gate.dev/handover-to: <identity>` with a CAS PUT of the
//! Lease as read (retried on a 409). The holder closes its gates
//! (`stopped-leading`, reason `handover-requested`), waits its gate lag and
//! releases naming that identity as the successor, which takes the Lease at
//! once; if it never does, the other candidates fall back a retry period
//! later (DESIGN "Named successor"). Kubeconfig as `serve` finds it.
//!
//! It tells the truth about the outcome: exit 0 only when the candidate
//! asked for holds the Lease — also when it already did, so nothing is
//! written ("already holds"); 1 when another one (or nobody) does, naming
//! who. Before writing anything it refuses (exit 64) a `--to` it can tell
//! is no candidate: the Lease keeps no list of candidates — it records only
//! the holder and the named successor — so the check is a `get` of the pod
//! of that name in the Lease's namespace. Without `get` on pods (a 403) it
//! cannot tell, says so at debug level, and asks anyway.
//!
//! Every request is bounded by `--timeout`. Without `list` or `watch` on the
//! Lease the wait reads it every 2 s instead, after saying why at once.

use std::process::ExitCode;
use std::time::Duration;

use clap::Args;
use futures::StreamExt;
use futures::future::BoxFuture;
use kube::api::{Api, ApiResource, DynamicObject};
use tokio::time::{Instant, timeout_at};

use crate::args::{LogArgs, is_dns1123_subdomain, resolve_namespace};
use crate::duration::parse_duration;
use crate::elector::api_error::ApiError;
use crate::elector::lease::{Lease, TermId, set_annotation};
use crate::elector::lease_client::{self, KubeLeaseStore, LeaseStore};
#[cfg(test)]
use crate::elector::machine::SUCCESSOR_ANNOTATION;
use crate::elector::machine::{HANDOVER_ANNOTATION, handover_to, successor_of};
use crate::exit;

/// PUTs answered 409 before giving up (a renew lands every retry period).
const ATTEMPTS: u32 = 5;
/// How often the Lease is read when it cannot be watched: the candidates'
/// default retry period.
const READ_EVERY: Duration = Duration::from_secs(2);
/// Exit status when the hand-over was not seen done: the candidate asked
/// for does not hold the Lease (another one or nobody does), or it could
/// not be asked for at all.
pub const NOT_HANDED_OVER: u8 = 1;

#[derive(Debug, Args)]
pub struct HandoverArgs {
    /// Name of the Lease the candidates contend for.
    #[arg(long, env = "LEADER_GATE_LEASE_NAME")]
    pub lease_name: String,

    /// Namespace of the Lease [default: the kubeconfig context's, then "default"].
    #[arg(long, env = "LEADER_GATE_LEASE_NAMESPACE")]
    pub lease_namespace: Option<String>,

    /// The candidate to hand over to [default: the successor the Lease names].
    /// Refused (exit 64, nothing written) when no pod of that name exists in
    /// the Lease's namespace, where pods may be read.
    #[arg(long)]
    pub to: Option<String>,

    /// Bound on the whole hand-over — reading the Lease, writing the request
    /// and waiting for the new holder — after which it gives up (exit 1).
    #[arg(long, default_value = "30s", value_parser = parse_duration)]
    pub timeout: Duration,

    #[command(flatten)]
    pub log: LogArgs,
}

/// Why the hand-over could not be asked for or was not seen done.
#[derive(Debug)]
struct Failure {
    code: u8,
    message: String,
}

fn fail(message: impl Into<String>) -> Failure {
    Failure {
        code: NOT_HANDED_OVER,
        message: message.into(),
    }
}

/// Whether a pod exists, as far as this user may know.
trait Pods {
    /// GETs the pod `name` of the Lease's namespace: `Ok(false)` for a 404.
    fn exists(&self, name: &str) -> BoxFuture<'static, Result<bool, ApiError>>;
}

/// [`Pods`] through the Lease's client.
struct KubePods(Api<DynamicObject>);

impl Pods for KubePods {
    fn exists(&self, name: &str) -> BoxFuture<'static, Result<bool, ApiError>> {
        let (api, name) = (self.0.clone(), name.to_owned());
        Box::pin(async move {
            api.get_opt(&name)
                .await
                .map(|pod| pod.is_some())
                .map_err(ApiError::from_kube)
        })
    }
}

pub async fn run(args: HandoverArgs) -> ExitCode {
    match hand_over(args).await {
        Ok(line) => {
            println!("{line}");
            ExitCode::SUCCESS
        }
        Err(failure) => {
            tracing::error!("{}", failure.message);
            ExitCode::from(failure.code)
        }
    }
}

/// What the hand-over is about, as the command line and kubeconfig gave it.
struct Request<'a> {
    /// `namespace/name`, for messages.
    lease: String,
    namespace: String,
    /// The namespace came from `--lease-namespace` (or its variable), not
    /// from the kubeconfig context.
    namespace_given: bool,
    to: Option<&'a str>,
    deadline: Instant,
    limit: Duration,
}

async fn hand_over(args: HandoverArgs) -> Result<String, Failure> {
    let usage = |message: String| Failure {
        code: exit::USAGE,
        message,
    };
    if !is_dns1123_subdomain(&args.lease_name) {
        return Err(usage(format!(
            "invalid --lease-name: {:?} must be a DNS-1123 subdomain",
            args.lease_name
        )));
    }
    if args.timeout.is_zero() {
        return Err(usage("invalid --timeout: must be more than 0".into()));
    }
    if args.to.as_deref().is_some_and(|to| to.trim().is_empty()) {
        return Err(usage("invalid --to: must not be empty".into()));
    }
    let config = lease_client::infer_config()
        .await
        .map_err(|error| Failure {
            code: exit::CONFIG,
            message: format!("no kube configuration ({error}): set KUBECONFIG"),
        })?;
    let namespace = resolve_namespace(args.lease_namespace.as_deref(), &config.default_namespace)
        .map_err(|error| usage(error.to_string()))?;
    let store =
        KubeLeaseStore::new(config, &namespace, &args.lease_name).map_err(|error| Failure {
            code: exit::CONFIG,
            message: format!("cannot build a Kubernetes client: {error}"),
        })?;
    let pods = KubePods(Api::namespaced_with(
        store.client(),
        &namespace,
        &ApiResource::erase::<k8s_openapi::api::core::v1::Pod>(&()),
    ));
    let request = Request {
        lease: format!("{namespace}/{}", args.lease_name),
        namespace,
        namespace_given: args.lease_namespace.is_some(),
        to: args.to.as_deref(),
        deadline: Instant::now() + args.timeout,
        limit: args.timeout,
    };
    let lease = &request.lease;
    let (holder, term, target) = match ask(&store, &pods, &request).await? {
        Asked::Written {
            holder,
            term,
            target,
        } => (holder, term, target),
        Asked::AlreadyDone(line) => return Ok(line),
    };
    tracing::info!("asked {holder} to hand lease {lease} over to {target}");
    wait_for_new_holder(&store, &request, &holder, &term, &target).await
}

/// What asking for the hand-over came to.
enum Asked {
    /// The request is in the Lease: `holder` of `term` is to hand over to `target`.
    Written {
        holder: String,
        term: TermId,
        target: String,
    },
    /// The target holds the Lease already, or got it while a 409 was
    /// retried: nothing (more) to ask.
    AlreadyDone(String),
}

/// Writes the request with a CAS PUT of the Lease as read, every request
/// within the deadline, after checking a `--to` other than the named
/// successor ([`vet`]). A 409 is retried from a fresh read, but only for the
/// holder and the target of the first read: if the Lease changed hands
/// meanwhile, another hand-over (or a failover) happened, and asking the new
/// holder is not what was asked for.
async fn ask(
    store: &impl LeaseStore,
    pods: &impl Pods,
    request: &Request<'_>,
) -> Result<Asked, Failure> {
    let Request {
        lease,
        deadline,
        limit,
        ..
    } = request;
    let deadline = *deadline;
    let no_answer = |what: &str| {
        fail(format!(
            "no answer from the API server within --timeout {limit:?} ({what} lease {lease})"
        ))
    };
    let mut first: Option<(String, TermId, String)> = None;
    let mut attempt = 0;
    loop {
        attempt += 1;
        let current = timeout_at(deadline, store.get())
            .await
            .map_err(|_| no_answer("reading"))?
            .map_err(|error| fail(format!("cannot read lease {lease}: {error}")))?
            .ok_or_else(|| fail(missing(request)))?;
        let record = current.record();
        let holder = record
            .holder
            .clone()
            .filter(|_| !current.is_marked_released());
        if let Some((first_holder, first_term, target)) = &first
            && current.term_id() != *first_term
        {
            // Changed hands between our read and our write.
            return match holder {
                Some(new) if new == *target => {
                    Ok(Asked::AlreadyDone(format!("{new} holds lease {lease}")))
                }
                new => Err(fail(format!(
                    "lease {lease} changed hands while asking {first_holder} to hand it over to {target} (now held by {}): not asking the new holder; run again if still wanted",
                    new.as_deref().unwrap_or("nobody")
                ))),
            };
        }
        let Some(holder) = holder else {
            return Err(fail(format!(
                "nobody holds lease {lease}: nothing to hand over"
            )));
        };
        let target = match &first {
            Some((_, _, target)) => target.clone(),
            None => {
                // A slot naming the holder itself names nobody yet.
                let named = successor_of(&current).filter(|n| *n != holder);
                let target = match request.to.map(str::to_owned).or_else(|| named.clone()) {
                    // What was asked for is already so: a drain script goes on.
                    Some(target) if target == holder => {
                        return Ok(Asked::AlreadyDone(format!(
                            "{holder} already holds lease {lease}"
                        )));
                    }
                    Some(target) => target,
                    None => {
                        return Err(fail(format!(
                            "no successor is named in lease {lease} yet: name a candidate with --to"
                        )));
                    }
                };
                // The named successor claimed its slot itself: a candidate.
                if named.as_deref() != Some(target.as_str()) {
                    vet(pods, request, &target, &holder, named.as_deref()).await?;
                }
                target
            }
        };
        first.get_or_insert_with(|| (holder.clone(), current.term_id(), target.clone()));
        let mut object = current.object().clone();
        set_annotation(&mut object, HANDOVER_ANNOTATION, Some(&target));
        match timeout_at(deadline, store.replace(object)).await {
            Err(_) => return Err(no_answer("writing")),
            Ok(Ok(_)) => {
                return Ok(Asked::Written {
                    holder,
                    term: current.term_id(),
                    target,
                });
            }
            Ok(Err(ApiError::Conflict(_))) if attempt < ATTEMPTS => continue,
            Ok(Err(error)) => {
                return Err(fail(format!(
                    "cannot ask {holder} to hand over lease {lease}: {error}"
                )));
            }
        }
    }
}

/// The Lease is missing: in the kubeconfig context's namespace, perhaps
/// only because it lives in another.
fn missing(request: &Request<'_>) -> String {
    let Request {
        lease, namespace, ..
    } = request;
    if request.namespace_given {
        format!("lease {lease} does not exist: nobody to hand over from")
    } else {
        format!(
            "lease {lease} does not exist: nobody to hand over from ({namespace} is the kubeconfig context's namespace; if the lease is in another, name it with --lease-namespace)"
        )
    }
}

/// Refuses, before anything is written, a `--to` that names no pod of the
/// Lease's namespace (exit 64). Only a 404 refuses: the Lease itself lists
/// no candidates, and without `get` on pods (403), for a name that cannot
/// be a pod's, or when the API server fails the request, it cannot tell and
/// lets the hand-over go on (the outcome is still checked).
async fn vet(
    pods: &impl Pods,
    request: &Request<'_>,
    to: &str,
    holder: &str,
    named: Option<&str>,
) -> Result<(), Failure> {
    let Request {
        lease,
        namespace,
        deadline,
        limit,
        ..
    } = request;
    if !is_dns1123_subdomain(to) {
        tracing::debug!(
            to,
            "not a pod name: cannot check that such a candidate runs"
        );
        return Ok(());
    }
    let answer = timeout_at(*deadline, pods.exists(to)).await.map_err(|_| {
        fail(format!(
            "no answer from the API server within --timeout {limit:?} (looking up pod {namespace}/{to}); nothing was written"
        ))
    })?;
    match answer {
        Ok(true) => Ok(()),
        Ok(false) => {
            let instead = match named {
                Some(named) if named != holder => {
                    format!("; the successor the lease names is {named} (run without --to)")
                }
                _ => String::new(),
            };
            Err(Failure {
                code: exit::USAGE,
                message: format!(
                    "invalid --to: no pod {to} in namespace {namespace}, where lease {lease} is \
                     (a typo, or a pod of another namespace?), so it cannot take the lease over; \
                     nothing was written and {holder} keeps leading{instead}"
                ),
            })
        }
        Err(error) => {
            tracing::debug!(
                %error, pod = to, namespace = %namespace,
                "cannot tell whether the pod exists: asking for the hand-over anyway"
            );
            Ok(())
        }
    }
}

/// Waits until a holder of a term after `term` is seen, on the watch or —
/// when the Lease cannot be watched (no `list` or `watch` granted, a proxy
/// that breaks watches) — by reading it every [`READ_EVERY`]. Says the first
/// watch error at once, and who replaced this request if another one did.
/// Only `target` holding the Lease is success; anything else fails, saying
/// who holds it now.
async fn wait_for_new_holder(
    store: &impl LeaseStore,
    request: &Request<'_>,
    holder: &str,
    term: &TermId,
    target: &str,
) -> Result<String, Failure> {
    let Request {
        lease,
        deadline,
        limit,
        ..
    } = request;
    let deadline = *deadline;
    // The Lease as last seen (`None` inside: deleted), for the timeout's message.
    let mut last: Option<Option<Lease>> = None;
    let timed_out = |last: &Option<Option<Lease>>| {
        let now = match last {
            Some(None) => "the lease was deleted".to_owned(),
            Some(Some(seen)) if seen.is_marked_released() => {
                format!("nobody holds it ({holder} released it)")
            }
            Some(Some(seen)) => match seen.record().holder {
                Some(h) if h == holder => format!("{holder} still holds it"),
                Some(h) => format!("{h} holds it"),
                None => "nobody holds it".to_owned(),
            },
            None => format!("{holder} held it when asked"),
        };
        fail(format!(
            "no new holder of lease {lease} within {limit:?}: {now}; {target} did not take over (the request stays in the lease until the next acquisition)"
        ))
    };
    let mut watch = Some(store.watch());
    let mut read_failed = false;
    // Another request's target, once the Lease showed it in place of ours.
    let mut replaced_by: Option<String> = None;
    loop {
        let current = match &mut watch {
            Some(stream) => match timeout_at(deadline, stream.next()).await {
                Err(_) | Ok(None) => return Err(timed_out(&last)),
                Ok(Some(Ok(current))) => current,
                Ok(Some(Err(error))) => {
                    tracing::warn!(
                        "cannot watch lease {lease} ({error}); reading it every {READ_EVERY:?} instead"
                    );
                    watch = None;
                    continue;
                }
            },
            None => match timeout_at(deadline, store.get()).await {
                Err(_) => return Err(timed_out(&last)),
                Ok(Ok(current)) => current,
                Ok(Err(error)) => {
                    if !std::mem::replace(&mut read_failed, true) {
                        tracing::warn!(
                            "cannot read lease {lease} ({error}); trying again every {READ_EVERY:?}"
                        );
                    }
                    if timeout_at(deadline, tokio::time::sleep(READ_EVERY))
                        .await
                        .is_err()
                    {
                        return Err(timed_out(&last));
                    }
                    continue;
                }
            },
        };
        if let Some(other) = other_request(current.as_ref(), term, target) {
            replaced_by = Some(other);
        }
        if let Some(current) = &current
            && let Some(new) = new_holder(current, term)
        {
            return outcome(lease, holder, target, &new, replaced_by.as_deref());
        }
        last = Some(current);
        if watch.is_none()
            && timeout_at(deadline, tokio::time::sleep(READ_EVERY))
                .await
                .is_err()
        {
            return Err(timed_out(&last));
        }
    }
}

/// The hand-over of `lease` from `holder` to `target` ended with `new`
/// holding it: done only if `new` is `target`.
fn outcome(
    lease: &str,
    holder: &str,
    target: &str,
    new: &str,
    replaced_by: Option<&str>,
) -> Result<String, Failure> {
    if new == target {
        return Ok(format!("{new} holds lease {lease}"));
    }
    let why = format!(
        "{target} is not a running candidate of this lease, or could not take it \
         (stopped, its collector unhealthy, or leading another lease of its group)"
    );
    Err(fail(match replaced_by {
        Some(other) => format!(
            "{new} holds lease {lease}, not {target} (another hand-over request, to {other}, replaced this one)"
        ),
        None if new == holder => format!(
            "{target} did not take over lease {lease}: {holder} holds it again \
             (the fallback, after the group had no leader for a retry period or more), \
             so leadership did not move; {why}"
        ),
        None => format!(
            "{target} did not take over lease {lease}: {new} holds it now \
             (the fallback, after the group had no leader for a retry period or more); {why}"
        ),
    }))
}

/// Another hand-over's target, if `lease` (still of `term`) asks for or
/// names one other than `target`: another request overwrote ours.
fn other_request(lease: Option<&Lease>, term: &TermId, target: &str) -> Option<String> {
    let lease = lease.filter(|l| l.term_id() == *term)?;
    let named = if lease.is_marked_released() {
        successor_of(lease)
    } else {
        handover_to(lease)
    };
    named.filter(|n| n != target)
}

/// The holder of a term after `old`, if `lease` shows one.
fn new_holder(lease: &Lease, old: &TermId) -> Option<String> {
    if lease.is_marked_released() || &lease.term_id() == old {
        return None;
    }
    lease.record().holder
}

#[cfg(test)]
mod tests {
    use std::collections::VecDeque;
    use std::sync::{Arc, Mutex};

    use futures::future::BoxFuture;
    use futures::stream::BoxStream;
    use kube::api::DynamicObject;

    use super::*;

    /// A store that answers GETs and PUTs from a script, and keeps the PUTs.
    #[derive(Clone, Default)]
    struct Scripted {
        gets: Arc<Mutex<VecDeque<Option<Lease>>>>,
        puts: Arc<Mutex<VecDeque<Result<(), ApiError>>>>,
        written: Arc<Mutex<Vec<DynamicObject>>>,
    }

    impl LeaseStore for Scripted {
        fn create(&self, _: DynamicObject) -> BoxFuture<'static, Result<Lease, ApiError>> {
            // `handover` never creates; a create would be a bug the test shows.
            let bug = ApiError::Invalid {
                code: 400,
                message: "handover created a Lease".into(),
            };
            Box::pin(async move { Err(bug) })
        }

        fn replace(&self, object: DynamicObject) -> BoxFuture<'static, Result<Lease, ApiError>> {
            self.written.lock().unwrap().push(object.clone());
            let answer = self
                .puts
                .lock()
                .unwrap()
                .pop_front()
                .expect("a scripted PUT");
            Box::pin(async move { answer.map(|()| Lease::new(object)) })
        }

        fn get(&self) -> BoxFuture<'static, Result<Option<Lease>, ApiError>> {
            let answer = self
                .gets
                .lock()
                .unwrap()
                .pop_front()
                .expect("a scripted GET");
            Box::pin(async move { Ok(answer) })
        }

        fn watch(&self) -> BoxStream<'static, Result<Option<Lease>, ApiError>> {
            Box::pin(futures::stream::pending())
        }

        fn reload_credentials(&self) -> BoxFuture<'static, ()> {
            Box::pin(async {})
        }
    }

    fn lease(holder: &str, transitions: i64, rv: u32) -> Lease {
        Lease::new(
            serde_json::from_value(serde_json::json!({
                "apiVersion": "coordination.k8s.io/v1",
                "kind": "Lease",
                "metadata": {"name": "demo", "namespace": "ns", "uid": "u-1", "resourceVersion": rv.to_string()},
                "spec": {"holderIdentity": holder, "leaseDurationSeconds": 15, "leaseTransitions": transitions},
            }))
            .unwrap(),
        )
    }

    /// Pods answered from a script: `Ok(true)` exists, `Ok(false)` 404.
    #[derive(Default)]
    struct ScriptedPods {
        answer: Option<Result<bool, ApiError>>,
        asked: Mutex<Vec<String>>,
    }

    impl Pods for ScriptedPods {
        fn exists(&self, name: &str) -> BoxFuture<'static, Result<bool, ApiError>> {
            self.asked.lock().unwrap().push(name.to_owned());
            let answer = self.answer.clone().expect("no pod lookup expected");
            Box::pin(async move { answer })
        }
    }

    fn pods(answer: Result<bool, ApiError>) -> ScriptedPods {
        ScriptedPods {
            answer: Some(answer),
            ..Default::default()
        }
    }

    fn request(to: Option<&str>) -> Request<'_> {
        let limit = Duration::from_secs(5);
        Request {
            lease: "ns/demo".into(),
            namespace: "ns".into(),
            namespace_given: true,
            to,
            deadline: Instant::now() + limit,
            limit,
        }
    }

    async fn ask_b(store: &Scripted) -> Result<Asked, Failure> {
        ask(store, &pods(Ok(true)), &request(Some("b"))).await
    }

    fn named(holder: &str, successor: &str, rv: u32) -> Lease {
        let mut lease = lease(holder, 1, rv).object().clone();
        set_annotation(&mut lease, SUCCESSOR_ANNOTATION, Some(successor));
        Lease::new(lease)
    }

    #[tokio::test]
    async fn a_to_naming_no_pod_is_refused_before_anything_is_written() {
        let store = Scripted::default();
        store
            .gets
            .lock()
            .unwrap()
            .push_back(Some(named("a", "b", 10)));
        let pods = pods(Ok(false));
        let Err(failure) = ask(&store, &pods, &request(Some("ghost"))).await else {
            panic!("asked for a hand-over to ghost")
        };
        assert_eq!(failure.code, exit::USAGE);
        assert_eq!(
            failure.message,
            "invalid --to: no pod ghost in namespace ns, where lease ns/demo is (a typo, or a pod of \
             another namespace?), so it cannot take the lease over; nothing was written and a keeps \
             leading; the successor the lease names is b (run without --to)"
        );
        assert!(store.written.lock().unwrap().is_empty(), "nothing written");
    }

    #[tokio::test]
    async fn a_to_whose_pod_may_not_be_read_is_asked_for() {
        let store = Scripted::default();
        store
            .gets
            .lock()
            .unwrap()
            .push_back(Some(lease("a", 1, 10)));
        store.puts.lock().unwrap().push_back(Ok(()));
        let forbidden = ApiError::from_status(&kube::core::Status {
            code: 403,
            reason: "Forbidden".into(),
            message: "pods \"c\" is forbidden: User \"op\" cannot get resource \"pods\" in API group \"\" in the namespace \"ns\"".into(),
            ..Default::default()
        });
        let pods = pods(Err(forbidden));
        let asked = ask(&store, &pods, &request(Some("c"))).await;
        let Ok(Asked::Written { target, .. }) = asked else {
            panic!("not asked")
        };
        assert_eq!(target, "c");
        assert_eq!(*pods.asked.lock().unwrap(), ["c"]);
    }

    #[tokio::test]
    async fn the_named_successor_and_names_no_pod_can_have_are_not_looked_up() {
        for (to, lease) in [("b", named("a", "b", 10)), ("B_b", lease("a", 1, 10))] {
            let store = Scripted::default();
            store.gets.lock().unwrap().push_back(Some(lease));
            store.puts.lock().unwrap().push_back(Ok(()));
            let pods = ScriptedPods::default();
            let asked = ask(&store, &pods, &request(Some(to))).await;
            assert!(matches!(asked, Ok(Asked::Written { .. })), "{to}");
            assert!(pods.asked.lock().unwrap().is_empty(), "{to}");
        }
    }

    #[tokio::test]
    async fn a_missing_lease_suggests_the_namespace_flag_unless_it_was_given() {
        for given in [false, true] {
            let store = Scripted::default();
            store.gets.lock().unwrap().push_back(None);
            let mut request = request(Some("b"));
            request.namespace_given = given;
            let Err(failure) = ask(&store, &ScriptedPods::default(), &request).await else {
                panic!("asked")
            };
            assert_eq!(failure.code, NOT_HANDED_OVER);
            assert!(failure.message.starts_with("lease ns/demo does not exist"));
            assert_eq!(
                failure.message.contains(
                    "ns is the kubeconfig context's namespace; if the lease is in another, name it with --lease-namespace"
                ),
                !given,
                "{}",
                failure.message
            );
        }
    }

    #[test]
    fn only_the_target_holding_the_lease_is_success() {
        assert_eq!(
            outcome("ns/demo", "a", "b", "b", None).unwrap(),
            "b holds lease ns/demo"
        );
        let back = outcome("ns/demo", "a", "ghost", "a", None).unwrap_err();
        assert_eq!(back.code, NOT_HANDED_OVER);
        assert!(
            back.message
                .starts_with("ghost did not take over lease ns/demo: a holds it again"),
            "{}",
            back.message
        );
        assert!(back.message.contains("leadership did not move"));
        let other = outcome("ns/demo", "a", "ghost", "c", None).unwrap_err();
        assert!(
            other
                .message
                .starts_with("ghost did not take over lease ns/demo: c holds it now"),
            "{}",
            other.message
        );
        let replaced = outcome("ns/demo", "a", "b", "c", Some("c")).unwrap_err();
        assert_eq!(
            replaced.message,
            "c holds lease ns/demo, not b (another hand-over request, to c, replaced this one)"
        );
    }

    #[tokio::test]
    async fn a_retry_after_the_lease_changed_hands_never_asks_the_new_holder() {
        let store = Scripted::default();
        store
            .gets
            .lock()
            .unwrap()
            .extend([Some(lease("a", 1, 10)), Some(lease("c", 2, 12))]);
        store
            .puts
            .lock()
            .unwrap()
            .push_back(Err(ApiError::Conflict("Conflict".into())));
        let Err(failure) = ask_b(&store).await else {
            panic!("asked the new holder")
        };
        assert!(
            failure
                .message
                .contains("changed hands while asking a to hand it over to b (now held by c)"),
            "{}",
            failure.message
        );
        assert_eq!(store.written.lock().unwrap().len(), 1, "one PUT, to a");
    }

    #[tokio::test]
    async fn a_retry_that_finds_the_target_holding_the_lease_is_done() {
        let store = Scripted::default();
        store
            .gets
            .lock()
            .unwrap()
            .extend([Some(lease("a", 1, 10)), Some(lease("b", 2, 12))]);
        store
            .puts
            .lock()
            .unwrap()
            .push_back(Err(ApiError::Conflict("Conflict".into())));
        let Ok(Asked::AlreadyDone(line)) = ask_b(&store).await else {
            panic!("not done")
        };
        assert_eq!(line, "b holds lease ns/demo");
    }

    #[tokio::test]
    async fn a_to_naming_the_holder_is_done_without_a_write() {
        let store = Scripted::default();
        store
            .gets
            .lock()
            .unwrap()
            .push_back(Some(named("b", "c", 10)));
        let Ok(Asked::AlreadyDone(line)) = ask_b(&store).await else {
            panic!("not done")
        };
        assert_eq!(line, "b already holds lease ns/demo");
        assert!(store.written.lock().unwrap().is_empty(), "nothing written");
    }

    #[tokio::test]
    async fn a_slot_naming_the_holder_names_no_successor() {
        let store = Scripted::default();
        store
            .gets
            .lock()
            .unwrap()
            .push_back(Some(named("a", "a", 10)));
        let Err(failure) = ask(&store, &ScriptedPods::default(), &request(None)).await else {
            panic!("asked, or said done")
        };
        assert_eq!(failure.code, NOT_HANDED_OVER);
        assert!(
            failure.message.starts_with("no successor is named"),
            "{}",
            failure.message
        );
    }

    #[tokio::test]
    async fn a_retry_of_the_same_term_keeps_the_first_target() {
        let store = Scripted::default();
        // No --to: the target is the successor the first read names.
        let named = |successor: &str, rv| {
            let mut lease = lease("a", 1, rv).object().clone();
            set_annotation(&mut lease, SUCCESSOR_ANNOTATION, Some(successor));
            Some(Lease::new(lease))
        };
        store
            .gets
            .lock()
            .unwrap()
            .extend([named("b", 10), named("c", 11)]);
        store
            .puts
            .lock()
            .unwrap()
            .extend([Err(ApiError::Conflict("Conflict".into())), Ok(())]);
        let asked = ask(&store, &ScriptedPods::default(), &request(None)).await;
        let Ok(Asked::Written { target, .. }) = asked else {
            panic!("not written")
        };
        assert_eq!(target, "b");
        let written = store.written.lock().unwrap();
        let last = Lease::new(written.last().unwrap().clone());
        assert_eq!(handover_to(&last).as_deref(), Some("b"));
    }
}
