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
//! Every request is bounded by `--timeout`. Without `list` or `watch` on the
//! Lease the wait reads it every 2 s instead, after saying why at once.

use std::process::ExitCode;
use std::time::Duration;

use clap::Args;
use futures::StreamExt;
use tokio::time::{Instant, timeout_at};

use crate::config::{is_dns1123_subdomain, parse_duration, resolve_namespace};
use crate::elector::api_error::ApiError;
use crate::elector::lease::{Lease, TermId};
use crate::elector::lease_client::{self, KubeLeaseStore, LeaseStore};
#[cfg(test)]
use crate::elector::machine::SUCCESSOR_ANNOTATION;
use crate::elector::machine::{HANDOVER_ANNOTATION, handover_to, set_annotation, successor_of};
use crate::exit;

/// PUTs answered 409 before giving up (a renew lands every retry period).
const ATTEMPTS: u32 = 5;
/// How often the Lease is read when it cannot be watched: the candidates'
/// default retry period.
const READ_EVERY: Duration = Duration::from_secs(2);

#[derive(Debug, Args)]
pub struct HandoverArgs {
    /// Name of the Lease the candidates contend for.
    #[arg(long, env = "LEADER_GATE_LEASE_NAME")]
    pub lease_name: String,

    /// Namespace of the Lease [default: the kubeconfig context's, then "default"].
    #[arg(long, env = "LEADER_GATE_LEASE_NAMESPACE")]
    pub lease_namespace: Option<String>,

    /// The candidate to hand over to [default: the successor the Lease names].
    #[arg(long)]
    pub to: Option<String>,

    /// Bound on the whole hand-over — reading the Lease, writing the request
    /// and waiting for the new holder — after which it gives up (exit 1).
    #[arg(long, default_value = "30s", value_parser = parse_duration)]
    pub timeout: Duration,
}

/// Why the hand-over could not be asked for or was not seen done.
#[derive(Debug)]
struct Failure {
    code: u8,
    message: String,
}

fn fail(message: impl Into<String>) -> Failure {
    Failure {
        code: 1,
        message: message.into(),
    }
}

pub async fn run(args: HandoverArgs) -> ExitCode {
    match hand_over(args).await {
        Ok(line) => {
            println!("{line}");
            ExitCode::SUCCESS
        }
        Err(failure) => {
            eprintln!("leader-gate handover: {}", failure.message);
            ExitCode::from(failure.code)
        }
    }
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
    let lease = format!("{namespace}/{}", args.lease_name);
    let deadline = Instant::now() + args.timeout;
    let (holder, term, target) =
        match ask(&store, &lease, args.to.as_deref(), deadline, args.timeout).await? {
            Asked::Written {
                holder,
                term,
                target,
            } => (holder, term, target),
            Asked::AlreadyDone(line) => return Ok(line),
        };
    eprintln!("leader-gate handover: asked {holder} to hand lease {lease} over to {target}");
    wait_for_new_holder(&store, &lease, &term, &target, deadline, args.timeout).await
}

/// What asking for the hand-over came to.
enum Asked {
    /// The request is in the Lease: `holder` of `term` is to hand over to `target`.
    Written {
        holder: String,
        term: TermId,
        target: String,
    },
    /// While a 409 was retried, the Lease went to the target anyway.
    AlreadyDone(String),
}

/// Writes the request with a CAS PUT of the Lease as read, every request
/// within `deadline`. A 409 is retried from a fresh read, but only for the
/// holder and the target of the first read: if the Lease changed hands
/// meanwhile, another hand-over (or a failover) happened, and asking the new
/// holder is not what was asked for.
async fn ask(
    store: &impl LeaseStore,
    lease: &str,
    to: Option<&str>,
    deadline: Instant,
    limit: Duration,
) -> Result<Asked, Failure> {
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
            .ok_or_else(|| {
                fail(format!(
                    "lease {lease} does not exist: nobody to hand over from"
                ))
            })?;
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
            None => match to.map(str::to_owned).or_else(|| successor_of(&current)) {
                Some(target) if target == holder => {
                    return Err(fail(format!("{holder} already holds lease {lease}")));
                }
                Some(target) => target,
                None => {
                    return Err(fail(format!(
                        "no successor is named in lease {lease} yet: name a candidate with --to"
                    )));
                }
            },
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

/// Waits until a holder of a term after `term` is seen, on the watch or —
/// when the Lease cannot be watched (no `list` or `watch` granted, a proxy
/// that breaks watches) — by reading it every [`READ_EVERY`]. Says the first
/// watch error at once, and who replaced this request if another one did.
async fn wait_for_new_holder(
    store: &impl LeaseStore,
    lease: &str,
    term: &TermId,
    target: &str,
    deadline: Instant,
    limit: Duration,
) -> Result<String, Failure> {
    let timed_out = || {
        fail(format!(
            "no new holder of lease {lease} within {limit:?} (the request stays in the lease until the next acquisition)"
        ))
    };
    let mut watch = Some(store.watch());
    let mut read_failed = false;
    // Another request's target, once the Lease showed it in place of ours.
    let mut replaced_by: Option<String> = None;
    loop {
        let current = match &mut watch {
            Some(stream) => match timeout_at(deadline, stream.next()).await {
                Err(_) | Ok(None) => return Err(timed_out()),
                Ok(Some(Ok(current))) => current,
                Ok(Some(Err(error))) => {
                    eprintln!(
                        "leader-gate handover: cannot watch lease {lease} ({error}); reading it every {READ_EVERY:?} instead"
                    );
                    watch = None;
                    continue;
                }
            },
            None => match timeout_at(deadline, store.get()).await {
                Err(_) => return Err(timed_out()),
                Ok(Ok(current)) => current,
                Ok(Err(error)) => {
                    if !std::mem::replace(&mut read_failed, true) {
                        eprintln!(
                            "leader-gate handover: cannot read lease {lease} ({error}); trying again every {READ_EVERY:?}"
                        );
                    }
                    if timeout_at(deadline, tokio::time::sleep(READ_EVERY))
                        .await
                        .is_err()
                    {
                        return Err(timed_out());
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
            return Ok(match replaced_by {
                _ if new == target => format!("{new} holds lease {lease}"),
                Some(other) => format!(
                    "{new} holds lease {lease} (another hand-over request, to {other}, replaced this one)"
                ),
                None => format!(
                    "{new} holds lease {lease} ({target} did not take over; the fallback did)"
                ),
            });
        }
        if watch.is_none()
            && timeout_at(deadline, tokio::time::sleep(READ_EVERY))
                .await
                .is_err()
        {
            return Err(timed_out());
        }
    }
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

    async fn ask_b(store: &Scripted) -> Result<Asked, Failure> {
        let limit = Duration::from_secs(5);
        ask(store, "ns/demo", Some("b"), Instant::now() + limit, limit).await
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
        let limit = Duration::from_secs(5);
        let asked = ask(&store, "ns/demo", None, Instant::now() + limit, limit).await;
        let Ok(Asked::Written { target, .. }) = asked else {
            panic!("not written")
        };
        assert_eq!(target, "b");
        let written = store.written.lock().unwrap();
        let last = Lease::new(written.last().unwrap().clone());
        assert_eq!(handover_to(&last).as_deref(), Some("b"));
    }
}
