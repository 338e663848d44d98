//! Leader routing (`--route-service`): the EndpointSlice `<service>-leader`
//! of a Service without a selector lists only the current leader, so the
//! Service routes to it while every pod's readiness stays honest.
//!
//! Make before break. Driven by the published state, like the HTTP gates:
//! - while this instance leads, the slice lists this pod (its IP, a Pod
//!   `targetRef`, its node; ready, serving, not terminating) and nothing
//!   else: written at acquisition in one compare-and-swap that *replaces*
//!   the whole list — whoever was listed before, marked terminating or not,
//!   is gone in the same write — and only while the term is current;
//! - when it steps down of its own accord (shutdown, hand-over, unhealthy
//!   collector, rebalance), it stays listed, its entry marked `ready: false,
//!   serving: true, terminating: true`, and only if the slice still lists it
//!   (if the next leader wrote first, nothing is written). kube-proxy keeps
//!   sending to a serving, terminating endpoint while no ready one exists,
//!   so the Service keeps answering until the next leader's write replaces
//!   the entry; the slice is never empty during a graceful hand-over. The
//!   route does not hold the release (it registers no gate): it is the
//!   switch to the peer, not a gate that must close before the peer starts.
//!   If no peer takes over (a single replica), the marked entry stays until
//!   a leader writes the slice again;
//! - after it lost the Lease without stepping down (renew deadline, 403,
//!   another holder, a deleted Lease, or a SIGKILL that left no process to
//!   write) it never writes again in that term: its entry stays as it was,
//!   ready, until the next leader's write replaces it, at most about a lease
//!   duration later.
//!
//! Every write is a compare-and-swap on the slice just read (a PUT without
//! `resourceVersion` would overwrite unconditionally), retried on a 409 by
//! reading again, and only `endpoints` changes: the shipped slice's labels,
//! ports and address type stay. So a stepping-down leader's mark cannot
//! overwrite its successor: the successor's write moves the
//! resourceVersion, the mark's PUT gets 409, the read that follows no longer
//! lists this pod. The slice is not created here (`create` cannot be
//! limited to one name, so the manifests ship it). While leading, the slice
//! is read again about once a lease duration, not at every renew. Failures
//! are retried with backoff; a 403 or a missing slice is logged once per
//! episode, naming verb, resource and name.

use std::net::IpAddr;
use std::time::Duration;

use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::api::discovery::v1::{Endpoint, EndpointConditions, EndpointSlice};
use kube::Api;
use kube::api::PostParams;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::backoff::Backoff;
use crate::elector::api_error::ApiError;
use crate::elector::lease_client::KubeLeaseStore;
use crate::serve::published::LeaderState;

/// Each request is bounded by this.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(3);
/// Conflicts in a row (someone else writes the slice too) before backing off.
const CONFLICTS: u32 = 5;
/// Stop reasons after which this instance released the Lease itself: its
/// entry is marked terminating. After any other, it does not write again.
const STEPPED_DOWN: [&str; 5] = [
    "shutdown",
    "handover-requested",
    "collector-unhealthy",
    "collector-not-running",
    "rebalance",
];

/// `--route-service` and the pod it names.
#[derive(Clone, Debug, PartialEq)]
pub struct Options {
    pub service: String,
    pub pod_ip: IpAddr,
    pub pod_name: String,
    pub node_name: Option<String>,
}

impl Options {
    /// The slice's name: `<service>-leader`.
    pub fn slice_name(&self) -> String {
        format!("{}-leader", self.service)
    }

    /// This pod as the slice lists it while it leads: ready, serving, not
    /// terminating.
    fn endpoint(&self, namespace: &str) -> Endpoint {
        Endpoint {
            addresses: vec![self.pod_ip.to_string()],
            conditions: Some(EndpointConditions {
                ready: Some(true),
                serving: Some(true),
                terminating: Some(false),
            }),
            node_name: self.node_name.clone(),
            target_ref: Some(ObjectReference {
                kind: Some("Pod".into()),
                namespace: Some(namespace.into()),
                name: Some(self.pod_name.clone()),
                ..ObjectReference::default()
            }),
            ..Endpoint::default()
        }
    }

    /// The endpoint list to write, from the one just read, for `want`.
    fn next_endpoints(&self, want: Want, namespace: &str, read: &[Endpoint]) -> Vec<Endpoint> {
        match want {
            // The whole list, replaced: a stepped-down leader goes in the
            // same write that names this one.
            Want::Listed => vec![self.endpoint(namespace)],
            // This pod's entry marked, the others as they are; nothing to
            // write (the same list) when the next leader already replaced it.
            Want::Terminating => read
                .iter()
                .cloned()
                .map(|mut e| {
                    if self.is_me(&e) {
                        e.conditions = Some(terminating());
                    }
                    e
                })
                .collect(),
        }
    }

    /// Whether `endpoint` is this pod (by address, or by its Pod reference).
    fn is_me(&self, endpoint: &Endpoint) -> bool {
        let ip = self.pod_ip.to_string();
        endpoint.addresses.contains(&ip)
            || endpoint.target_ref.as_ref().is_some_and(|target| {
                target.kind.as_deref() == Some("Pod")
                    && target.name.as_deref() == Some(self.pod_name.as_str())
            })
    }
}

/// The conditions of a stepped-down leader's entry: not ready, still serving,
/// terminating. kube-proxy uses such an endpoint only while no ready one
/// exists, which in this slice is until the next leader's write.
fn terminating() -> EndpointConditions {
    EndpointConditions {
        ready: Some(false),
        serving: Some(true),
        terminating: Some(true),
    }
}

/// What the slice should say of this pod.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Want {
    /// Only this pod (it leads).
    Listed,
    /// This pod marked terminating, if it is still listed (it stepped down of
    /// its own accord; the next leader's write replaces it).
    Terminating,
}

/// Starts the task; it ends once the publisher is gone (the election ended)
/// and what was due is written, or when aborted.
pub fn spawn(
    store: KubeLeaseStore,
    namespace: String,
    options: Options,
    state: watch::Receiver<LeaderState>,
    retry_period: Duration,
    lease_duration: Duration,
) -> JoinHandle<()> {
    let router = Router {
        store,
        name: options.slice_name(),
        namespace,
        options,
        backoff: Backoff {
            first: retry_period,
            max: lease_duration,
            jitter: 0.5,
        },
        recheck: lease_duration,
        reported: None,
    };
    tokio::spawn(router.run(state))
}

struct Router {
    store: KubeLeaseStore,
    namespace: String,
    name: String,
    options: Options,
    backoff: Backoff,
    /// How long a slice seen right is trusted before it is read again.
    recheck: Duration,
    /// The failure of the current episode, already logged.
    reported: Option<&'static str>,
}

/// Why a write did not happen.
enum Interrupted {
    /// The published state changed: decide again.
    StateChanged,
    Failed(Failure),
}

/// A failed attempt, to be retried with backoff.
enum Failure {
    Api(ApiError),
    /// The shipped slice cannot list this pod (its address type).
    Unusable(String),
}

impl Failure {
    fn kind(&self) -> &'static str {
        match self {
            Self::Api(error) => error.kind(),
            Self::Unusable(_) => "unusable",
        }
    }
}

impl Router {
    async fn run(mut self, mut state: watch::Receiver<LeaderState>) {
        // Whether this process may have listed itself in the current (or
        // last) term: only then is there an entry of ours to mark.
        let mut listed = false;
        let mut failures = 0;
        let mut open = true;
        // What the slice was last seen to say, for which term, and when: the
        // state changes at every renew, and a GET per renew would double
        // the leader's requests; the slice is read again after a while.
        let mut converged: Option<(Want, Option<String>, Instant)> = None;
        // After a failure: what was wanted, and not before when to try again
        // (a renew's state change is no reason to).
        let mut backing_off: Option<(Want, Option<String>, Instant)> = None;
        loop {
            let want = {
                let now = state.borrow_and_update();
                if now.leading && !now.valid_for().is_zero() {
                    Some((Want::Listed, now.term.clone()))
                } else if listed && now.last_stop.is_some_and(|r| STEPPED_DOWN.contains(&r)) {
                    Some((Want::Terminating, None))
                } else {
                    // Lost, not released: never write in that term again.
                    listed = false;
                    None
                }
            };
            let fresh = |(want, term): &(Want, Option<String>)| {
                converged
                    .as_ref()
                    .is_some_and(|(w, t, at)| w == want && t == term && at.elapsed() < self.recheck)
            };
            let mut retry_in = None;
            let waiting = |(want, term): &(Want, Option<String>)| {
                backing_off
                    .as_ref()
                    .filter(|(w, t, _)| w == want && t == term)
                    .map(|(_, _, at)| *at)
                    .filter(|at| Instant::now() < *at)
            };
            if let Some(at) = want.as_ref().and_then(waiting) {
                retry_in = Some(at.saturating_duration_since(Instant::now()));
            } else if let Some((want, term)) = want.filter(|w| !fresh(w)) {
                listed = true;
                match self.converge(want, &term, &state).await {
                    Ok(()) => {
                        failures = 0;
                        self.episode_ended();
                        listed = want == Want::Listed;
                        converged = Some((want, term, Instant::now()));
                        backing_off = None;
                    }
                    Err(Interrupted::StateChanged) => continue,
                    Err(Interrupted::Failed(error)) => {
                        failures += 1;
                        self.report(&error);
                        let delay = self.backoff.delay(failures, fastrand::f64());
                        backing_off = Some((want, term, Instant::now() + delay));
                        retry_in = Some(delay);
                    }
                }
            }
            if !open && retry_in.is_none() {
                return; // the election ended and nothing is due
            }
            let retry = async {
                match retry_in {
                    Some(delay) => tokio::time::sleep(delay).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                changed = state.changed(), if open => open = changed.is_ok(),
                () = retry => {}
            }
        }
    }

    /// Reads the slice and writes it until it says what `want` says, or the
    /// state changes under it (checked before every write).
    async fn converge(
        &self,
        want: Want,
        term: &Option<String>,
        state: &watch::Receiver<LeaderState>,
    ) -> Result<(), Interrupted> {
        let still = || {
            let now = state.borrow();
            let leading = now.leading && !now.valid_for().is_zero();
            match want {
                Want::Listed => leading && now.term == *term,
                Want::Terminating => !leading,
            }
        };
        let api: Api<EndpointSlice> = Api::namespaced(self.store.client(), &self.namespace);
        let mut conflicts = 0;
        loop {
            if !still() {
                return Err(Interrupted::StateChanged);
            }
            let mut slice = bounded(api.get(&self.name)).await?;
            let endpoints = slice.endpoints.clone();
            let next = self
                .options
                .next_endpoints(want, &self.namespace, &endpoints);
            if endpoints == next {
                return Ok(());
            }
            if want == Want::Listed && !family_matches(&slice.address_type, self.options.pod_ip) {
                return Err(Interrupted::Failed(Failure::Unusable(format!(
                    "its addressType is {} and --pod-ip is {}: ship the slice with the pods' address family",
                    slice.address_type, self.options.pod_ip
                ))));
            }
            slice.endpoints = next;
            slice.metadata.managed_fields = None;
            if !still() {
                return Err(Interrupted::StateChanged);
            }
            match bounded(api.replace(&self.name, &PostParams::default(), &slice)).await {
                Ok(_) => {
                    match want {
                        Want::Listed => tracing::info!(
                            slice = %format!("{}/{}", self.namespace, self.name),
                            pod_ip = %self.options.pod_ip,
                            "routing: the EndpointSlice lists this pod"
                        ),
                        Want::Terminating => tracing::info!(
                            slice = %format!("{}/{}", self.namespace, self.name),
                            "routing: the EndpointSlice lists this pod as terminating (still serving) until the next leader replaces it"
                        ),
                    }
                    return Ok(());
                }
                Err(Interrupted::Failed(Failure::Api(ApiError::Conflict(_))))
                    if conflicts < CONFLICTS =>
                {
                    conflicts += 1; // written meanwhile: read it again
                }
                Err(other) => return Err(other),
            }
        }
    }

    /// Logs a failure once per episode of its kind, in words that say what
    /// to do.
    fn report(&mut self, failure: &Failure) {
        if self.reported == Some(failure.kind()) {
            tracing::debug!("routing: the EndpointSlice write failed again");
            return;
        }
        self.reported = Some(failure.kind());
        let slice = format!("{}/{}", self.namespace, self.name);
        let error = match failure {
            Failure::Api(error) => error,
            Failure::Unusable(why) => {
                return tracing::error!(%slice, "routing: the EndpointSlice {slice} cannot list this pod: {why}");
            }
        };
        match error {
            ApiError::NotFound => tracing::warn!(
                %slice,
                "routing: the EndpointSlice {slice} does not exist: apply it with the manifests (leader-gate does not create it); retrying with backoff"
            ),
            ApiError::Forbidden(_) => tracing::warn!(
                %slice, %error,
                "routing: cannot read or update the EndpointSlice {slice}: grant get and update on endpointslices.discovery.k8s.io named {} in namespace {}; retrying with backoff",
                self.name, self.namespace
            ),
            _ => tracing::warn!(
                %slice, %error,
                "routing: cannot write the EndpointSlice {slice}; retrying with backoff"
            ),
        }
    }

    fn episode_ended(&mut self) {
        if let Some(was) = self.reported.take() {
            tracing::info!(was, slice = %self.name, "routing: the EndpointSlice is written again");
        }
    }
}

/// One request, bounded by [`REQUEST_TIMEOUT`].
async fn bounded<T>(
    request: impl Future<Output = Result<T, kube::Error>>,
) -> Result<T, Interrupted> {
    match tokio::time::timeout(REQUEST_TIMEOUT, request).await {
        Ok(result) => result.map_err(|e| Interrupted::Failed(Failure::Api(ApiError::from_kube(e)))),
        Err(_) => Err(Interrupted::Failed(Failure::Api(ApiError::Timeout(
            REQUEST_TIMEOUT,
        )))),
    }
}

fn family_matches(address_type: &str, ip: IpAddr) -> bool {
    matches!(
        (address_type, ip),
        ("IPv4", IpAddr::V4(_)) | ("IPv6", IpAddr::V6(_))
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn options() -> Options {
        Options {
            service: "statsd".into(),
            pod_ip: "10.244.1.7".parse().unwrap(),
            pod_name: "statsd-0".into(),
            node_name: Some("node-1".into()),
        }
    }

    #[test]
    fn this_pod_is_known_by_its_address_or_its_pod_reference() {
        let me = options();
        let listed = me.endpoint("monitoring");
        assert!(me.is_me(&listed));
        let same_ip = Endpoint {
            addresses: vec!["10.244.1.7".into()],
            ..Endpoint::default()
        };
        assert!(me.is_me(&same_ip), "a restarted pod kept its IP");
        let other = Options {
            pod_ip: "10.244.2.9".parse().unwrap(),
            pod_name: "statsd-1".into(),
            ..options()
        };
        assert!(!me.is_me(&other.endpoint("monitoring")));
        assert_eq!(me.slice_name(), "statsd-leader");
    }

    #[test]
    fn a_new_leader_replaces_the_whole_list_a_stepped_down_one_only_marks_itself() {
        let me = options();
        let other = Options {
            pod_ip: "10.244.2.9".parse().unwrap(),
            pod_name: "statsd-1".into(),
            ..options()
        };
        let mut old = other.endpoint("monitoring");
        old.conditions = Some(terminating());
        // Leading: only this pod, ready, whoever was listed.
        let listed = me.next_endpoints(Want::Listed, "monitoring", &[old.clone()]);
        assert_eq!(listed, [me.endpoint("monitoring")]);
        let conditions = listed[0].conditions.clone().unwrap();
        assert_eq!(
            (conditions.ready, conditions.serving, conditions.terminating),
            (Some(true), Some(true), Some(false))
        );
        // Stepped down, still listed: the same entry, marked terminating
        // (not ready, still serving), nothing else changed.
        let marked = me.next_endpoints(Want::Terminating, "monitoring", &listed);
        let mut expected = me.endpoint("monitoring");
        expected.conditions = Some(terminating());
        assert_eq!(marked, [expected]);
        // Stepped down after the next leader wrote: the list as read, so
        // nothing is written; an empty slice stays empty.
        let replaced = [other.endpoint("monitoring")];
        assert_eq!(
            me.next_endpoints(Want::Terminating, "monitoring", &replaced),
            replaced
        );
        assert!(
            me.next_endpoints(Want::Terminating, "monitoring", &[])
                .is_empty()
        );
    }

    #[test]
    fn an_ipv6_pod_cannot_go_into_an_ipv4_slice() {
        assert!(family_matches("IPv4", "10.0.0.1".parse().unwrap()));
        assert!(!family_matches("IPv4", "fd00::1".parse().unwrap()));
        assert!(family_matches("IPv6", "fd00::1".parse().unwrap()));
        assert!(!family_matches("FQDN", "10.0.0.1".parse().unwrap()));
    }
}
