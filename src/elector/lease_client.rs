//! The lease client adapter: the only code that talks to the API server.
//!
//! [`LeaseStore`] is the seam the election driver calls; [`KubeLeaseStore`]
//! implements it with kube-rs (CAS writes of whole objects, a
//! `kube_runtime::watcher` on the one Lease that retries every error with
//! backoff). Errors come back classified ([`ApiError`]); a 403 is explained
//! once per episode, not once per retry.

use std::collections::HashSet;
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use futures::future::BoxFuture;
use futures::stream::BoxStream;
use futures::{FutureExt, StreamExt};
use kube::api::{Api, DynamicObject, PostParams};
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};

use crate::elector::api_error::ApiError;
use crate::elector::lease::{self, Lease};

/// What the election needs from the API server: one Lease.
pub trait LeaseStore: Send + Sync + 'static {
    /// POST a new Lease.
    fn create(&self, object: DynamicObject) -> BoxFuture<'static, Result<Lease, ApiError>>;
    /// PUT `object`, conditional on the resourceVersion it carries.
    fn replace(&self, object: DynamicObject) -> BoxFuture<'static, Result<Lease, ApiError>>;
    /// GET the Lease; `None` when it does not exist.
    fn get(&self) -> BoxFuture<'static, Result<Option<Lease>, ApiError>>;
    /// The Lease's states as they change (`None`: absent). Errors are reported
    /// and the stream carries on after a backoff; it never ends by itself.
    fn watch(&self) -> BoxStream<'static, Result<Option<Lease>, ApiError>>;
    /// Re-read credentials (the token was rotated).
    fn reload_credentials(&self) -> BoxFuture<'static, ()>;
}

/// Server-side timeout of a watch request; the server ends it cleanly.
const WATCH_TIMEOUT_SECS: u32 = 290;
/// Client-side idle timeout on the connection: a little over the API
/// server's one-minute bookmark interval, so a silently dead watch is noticed.
const IDLE_TIMEOUT: Duration = Duration::from_secs(75);

/// A [`LeaseStore`] backed by the Kubernetes API.
#[derive(Clone)]
pub struct KubeLeaseStore {
    api: Arc<RwLock<Api<DynamicObject>>>,
    namespace: String,
    name: String,
    /// The API server's URL, for the log.
    server: String,
    episodes: Arc<Mutex<HashSet<(&'static str, &'static str)>>>,
}

// === impl KubeLeaseStore ===

impl KubeLeaseStore {
    /// A store for `namespace/name` using `config` (see [`infer_config`]).
    pub fn new(config: kube::Config, namespace: &str, name: &str) -> Result<Self, kube::Error> {
        let server = config
            .cluster_url
            .to_string()
            .trim_end_matches('/')
            .to_owned();
        let client = client(config)?;
        Ok(Self {
            api: Arc::new(RwLock::new(api(client, namespace))),
            namespace: namespace.to_owned(),
            name: name.to_owned(),
            server,
            episodes: Default::default(),
        })
    }

    /// A store for another Lease of the same namespace on the same client
    /// (its connections, and its credentials when they are reloaded); a
    /// missing permission is reported once for each Lease.
    pub fn for_lease(&self, name: &str) -> Self {
        Self {
            name: name.to_owned(),
            episodes: Default::default(),
            ..self.clone()
        }
    }

    fn api(&self) -> Api<DynamicObject> {
        self.api.read().expect("api lock").clone()
    }

    /// Runs one request, classifies its outcome and logs what needs saying.
    fn call<T: Send + 'static>(
        &self,
        verb: &'static str,
        request: impl Future<Output = Result<T, kube::Error>> + Send + 'static,
    ) -> BoxFuture<'static, Result<T, ApiError>> {
        let this = self.clone();
        async move {
            let result = request.await.map_err(ApiError::from_kube);
            this.note(verb, result.as_ref().err());
            result
        }
        .boxed()
    }

    /// Logs a 401, 403 or bug once per episode of that verb, and its end.
    fn note(&self, verb: &'static str, error: Option<&ApiError>) {
        let mut episodes = self.episodes.lock().expect("episodes lock");
        let Some(error) = error else {
            let ended: Vec<_> = episodes
                .iter()
                .filter(|(v, _)| *v == verb)
                .copied()
                .collect();
            for key in ended {
                episodes.remove(&key);
                tracing::info!(verb, was = key.1, lease = %self.name, "lease API call succeeds again");
            }
            return;
        };
        let key = (verb, error.kind());
        // Contention (409, 404) and relists (410) are the normal course.
        let ordinary = matches!(
            error,
            ApiError::Conflict(_) | ApiError::NotFound | ApiError::Gone
        );
        if ordinary || !episodes.insert(key) {
            tracing::debug!(verb, %error, "lease API call failed");
            return;
        }
        match error {
            ApiError::Invalid { .. } => tracing::error!(
                verb, %error,
                "BUG: the API server rejected leader-gate's request; please report this"
            ),
            // The Lease is absent and the Role has no `create`: as intended
            // with manifests/lease-protection, whose shipped Lease is missing.
            ApiError::Forbidden(forbidden) if verb == "create" && forbidden.verb.is_some() => {
                tracing::warn!(
                    verb, namespace = %self.namespace, lease = %self.name, %error,
                    "{}", create_forbidden_hint(&self.namespace, &self.name)
                )
            }
            ApiError::Forbidden(_) | ApiError::Unauthorized => tracing::warn!(
                verb, namespace = %self.namespace, lease = %self.name, %error,
                "cannot {verb} the lease; retrying with backoff and never leading meanwhile"
            ),
            _ => {
                let what = match error {
                    ApiError::TooManyRequests {
                        retry_after: Some(wait),
                    } => format!(
                        "the API server at {} throttles {verb} requests (429, retry after {:.1}s)",
                        self.server,
                        wait.as_secs_f64()
                    ),
                    ApiError::TooManyRequests { retry_after: None } => format!(
                        "the API server at {} throttles {verb} requests (429)",
                        self.server
                    ),
                    ApiError::Server { .. } => format!(
                        "the API server at {} fails {verb} requests ({error})",
                        self.server
                    ),
                    _ => format!(
                        "cannot reach the API server at {} for {verb} requests ({error})",
                        self.server
                    ),
                };
                tracing::warn!(
                    verb, namespace = %self.namespace, lease = %self.name, server = %self.server,
                    "{what}; trying again, a follower waiting longer each time, a leader every retry period until its renew deadline"
                )
            }
        }
    }
}

/// What to do when the Lease is absent and may not be created: apply it
/// (manifests/lease-protection ships it), or grant `create`.
pub fn create_forbidden_hint(namespace: &str, name: &str) -> String {
    format!(
        "the lease {namespace}/{name} does not exist and this service account may not create it: \
         apply the shipped Lease (manifests/lease-protection/leases.yaml, named as --lease-name) \
         before the pods, or grant `create` on leases; retrying with backoff and never leading meanwhile"
    )
}

impl LeaseStore for KubeLeaseStore {
    fn create(&self, object: DynamicObject) -> BoxFuture<'static, Result<Lease, ApiError>> {
        let api = self.api();
        self.call("create", async move {
            api.create(&PostParams::default(), &object)
                .await
                .map(Lease::new)
        })
    }

    fn replace(&self, object: DynamicObject) -> BoxFuture<'static, Result<Lease, ApiError>> {
        let (api, name) = (self.api(), self.name.clone());
        self.call("update", async move {
            api.replace(&name, &PostParams::default(), &object)
                .await
                .map(Lease::new)
        })
    }

    fn get(&self) -> BoxFuture<'static, Result<Option<Lease>, ApiError>> {
        let (api, name) = (self.api(), self.name.clone());
        self.call("get", async move {
            api.get_opt(&name).await.map(|l| l.map(Lease::new))
        })
    }

    fn watch(&self) -> BoxStream<'static, Result<Option<Lease>, ApiError>> {
        let config = watcher::Config::default()
            .fields(&format!("metadata.name={}", self.name))
            .timeout(WATCH_TIMEOUT_SECS);
        let this = self.clone();
        // The watcher reports a relist as Init, InitApply.., InitDone: the Lease
        // is whatever the relist held, absent if nothing.
        let mut relisted: Option<Lease> = None;
        // The field selector names one Lease; anything else a server or a
        // proxy sends is not ours to act on.
        let name = self.name.clone();
        let ours = move |object: &DynamicObject| {
            object.metadata.name.as_deref() == Some(name.as_str())
                && object.types.as_ref().is_none_or(|t| t.kind == "Lease")
        };
        watcher::watcher(self.api(), config)
            .default_backoff()
            .filter_map(move |event| {
                let update = match event {
                    Ok(Event::Init) => {
                        relisted = None;
                        None
                    }
                    Ok(Event::InitApply(object)) => {
                        if ours(&object) {
                            relisted = Some(Lease::new(object));
                        }
                        None
                    }
                    Ok(Event::InitDone) => Some(Ok(relisted.take())),
                    Ok(Event::Apply(object)) if ours(&object) => Some(Ok(Some(Lease::new(object)))),
                    Ok(Event::Delete(object)) if ours(&object) => Some(Ok(None)),
                    Ok(Event::Apply(_) | Event::Delete(_)) => None,
                    Err(error) => Some(Err(watch_error(error))),
                };
                if let Some(result) = &update {
                    this.note("watch", result.as_ref().err());
                }
                futures::future::ready(update)
            })
            .boxed()
    }

    fn reload_credentials(&self) -> BoxFuture<'static, ()> {
        let this = self.clone();
        async move {
            let client = infer_config()
                .await
                .map_err(kube::Error::InferConfig)
                .and_then(client);
            match client {
                Ok(client) => {
                    *this.api.write().expect("api lock") = api(client, &this.namespace);
                    tracing::info!("reloaded API credentials after a 401");
                }
                Err(error) => tracing::warn!(%error, "could not reload API credentials"),
            }
        }
        .boxed()
    }
}

impl KubeLeaseStore {
    /// The API server's URL.
    pub fn server(&self) -> &str {
        &self.server
    }

    /// Creates a Kubernetes Event on the Lease's client (credentials reloaded
    /// with it), in the Lease's namespace: the serving side's recorder
    /// ([`crate::serve::kube_events`]) times and explains them.
    pub fn create_event(
        &self,
        event: k8s_openapi::api::core::v1::Event,
    ) -> BoxFuture<'static, Result<(), ApiError>> {
        let events: Api<k8s_openapi::api::core::v1::Event> =
            Api::namespaced(self.api().into(), &self.namespace);
        async move {
            events
                .create(&PostParams::default(), &event)
                .await
                .map(drop)
                .map_err(ApiError::from_kube)
        }
        .boxed()
    }
}

impl KubeLeaseStore {
    /// The Lease's client, for other requests of this instance (credentials
    /// reloaded with it after a 401).
    pub fn client(&self) -> kube::Client {
        self.api().into()
    }
}

/// The kube configuration as kube-rs infers it: `KUBECONFIG` or
/// `~/.kube/config`, else the in-cluster service account.
pub async fn infer_config() -> Result<kube::Config, kube::config::InferConfigError> {
    kube::Config::infer().await
}

fn client(mut config: kube::Config) -> Result<kube::Client, kube::Error> {
    config.read_timeout = Some(IDLE_TIMEOUT);
    // Retries are the election's to classify and time (429 within the
    // deadline, 5xx with backoff); a retry hidden in the client would let a
    // renew sit out its deadline.
    config.default_retry = false;
    config.reset_reader_on_write = true;
    kube::Client::try_from(config)
}

fn api(client: kube::Client, namespace: &str) -> Api<DynamicObject> {
    Api::namespaced_with(client, namespace, &lease::api_resource())
}

fn watch_error(error: watcher::Error) -> ApiError {
    match error {
        watcher::Error::InitialListFailed(e)
        | watcher::Error::WatchStartFailed(e)
        | watcher::Error::WatchFailed(e) => ApiError::from_kube(e),
        watcher::Error::WatchError(status) => ApiError::from_status(&status),
        other => ApiError::Transport(other.to_string()),
    }
}
