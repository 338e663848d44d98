//! A fake Kubernetes Lease API server that behaves like the real kube-apiserver.
//!
//! It speaks real HTTP/1.1 on a real `127.0.0.1` socket (real time, never tokio's paused
//! time) and serves `coordination.k8s.io/v1` Leases the way the exchanges recorded from a
//! real kube-apiserver v1.36 in `tests/fixtures/apiserver-protocol/` show: `Status` bodies
//! with the real wording, a global resourceVersion, optimistic concurrency, no-op updates
//! that keep the resourceVersion, newline-delimited JSON watches with BOOKMARKs, in-stream
//! 410 `Expired`, streaming lists, RBAC 403s of a least-privilege Role and 401s for bad
//! tokens. It also takes core/v1 Events (`POST /api/v1/namespaces/{ns}/events`, see
//! [`FakeApiServer::events`]) and answers `GET` of core/v1 Pods the test made (see
//! [`FakeApiServer::add_pod`]; the recorded 403 without `get` on pods, else the Pod or a
//! 404). On top of that, tests can inject faults per client (see
//! [`Fault`]), or take the whole endpoint away: refusing connections
//! ([`FakeApiServer::shutdown`]) or black-holed ([`FakeApiServer::black_hole`]).
//!
//! The server runs on its own thread with its own tokio runtime, so it keeps serving
//! whatever the test's runtime does (current-thread, blocked on a child process, ...).
//! It stops when the last [`FakeApiServer`] handle is dropped.
//!
//! ```ignore
//! let api = FakeApiServer::start("proto", "demo").await;
//! let kubeconfig = api.write_kubeconfig("pod-a", &dir);   // client "pod-a"
//! // ... run the sidecar with KUBECONFIG=kubeconfig ...
//! api.set_fault("pod-a", Fault::all(FaultKind::Partition));
//! api.update_lease("demo", |l| l["spec"]["holderIdentity"] = "ghost".into());
//! assert_eq!(lease_holder(&api.lease("demo").unwrap()).as_deref(), Some("ghost"));
//! ```
//!
//! # Authentication and authorization
//!
//! A client is named by its bearer token: `"<client>"` (generation 0) or
//! `"<client>.<generation>"`. Clients are registered by [`FakeApiServer::write_kubeconfig`],
//! [`FakeApiServer::token`] or [`FakeApiServer::add_client`]; any other token, or a token of
//! an older generation (see [`FakeApiServer::rotate_token`]), gets 401 `Unauthorized`.
//! A request without an `Authorization` header is `system:anonymous` and gets 403.
//!
//! Every client is bound (by a RoleBinding in the server's namespace) to one [`Role`],
//! which RBAC applies as the real authorizer does: a request is allowed when a rule lists
//! its verb, API group and resource (`*` matches all) and either has no `resourceNames` or
//! lists the request's name. A `get`, `update`, `patch` or `delete` is named by its path, a
//! `list` or `watch` by its `fieldSelector=metadata.name=...` (none without it), a `create`
//! never; requests in other namespaces or at the cluster scope are 403. The 403 is the real
//! server's (exchanges 10, 11, 15 to 17; `in API group ""` for core resources).
//!
//! By default the Role is the one of the project's `manifests/rbac.yaml`, with its Lease
//! name (`metricbeat-leader`) replaced by the server's lease name, as the manifest tells its
//! users to do: `get`, `update`, `list` and `watch` on that one Lease, `create` on Leases,
//! `create` on Events. So every scenario test runs under exactly the permissions the
//! project ships. [`FakeApiServer::set_role`] swaps in another Role (e.g.
//! `Role::from_repository_manifest(lease).without("coordination.k8s.io", "leases",
//! "update")`). Admin clients ([`FakeApiServer::set_admin`], like `kubectl` as
//! cluster-admin) may do anything; a client whose RoleBinding was removed
//! ([`FakeApiServer::set_role_binding`]) nothing.
//!
//! # Known differences from the real server
//!
//! * Unknown fields are kept (the real server drops fields it does not know, with a
//!   warning): tests can see whether a client preserves what it read.
//! * JSON keys come out in a different order; HTTP/1.1 instead of HTTP/2; no `Audit-Id`
//!   or `Date` headers; no gzip.
//! * managedFields are approximated (one `Update` entry per manager owning the labels,
//!   annotations and top-level spec fields it changed).
//! * BOOKMARKs come every second by default (the real server sends them about once a
//!   minute), so idle watches are visibly alive.
//! * Only equality-based label selectors; only `metadata.name`/`metadata.namespace` field
//!   selectors; no `deletecollection`.
//! * PATCH: JSON merge patches; strategic merge patches are applied as merge patches
//!   (Leases have no lists with merge keys); no JSON patch. Server-side apply
//!   (`application/apply-patch+yaml`) tracks ownership per label, annotation and
//!   top-level spec field (the real server per leaf field), with the real conflict
//!   rules and Status (see `Store::apply`). A `metadata.resourceVersion` in any patch
//!   is a precondition (409 `Conflict`).
#![allow(dead_code)]

mod core_events;
mod endpoint_slices;
mod handler;
mod http;
mod pods;
mod rbac;
mod status;
mod store;
mod watch;

#[allow(unused_imports)]
pub use endpoint_slices::Conditions;
#[allow(unused_imports)] // not every test binary uses every name
pub use rbac::{Attributes, MANIFEST_LEASE_NAME, PolicyRule, RBAC_MANIFEST, Role};
pub use store::StoreSnapshot;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime};

use serde_json::{Value, json};
use tokio::net::{TcpListener, TcpSocket};
use tokio::sync::{oneshot, watch as tokio_watch};
use tokio::task::JoinHandle;

use core_events::Events;
use endpoint_slices::EndpointSlices;
use pods::Pods;
use store::Store;

/// The resources the server serves.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Resource {
    /// `coordination.k8s.io/v1` Leases: `/apis/coordination.k8s.io/v1/.../leases`.
    Leases,
    /// core/v1 Events: `/api/v1/namespaces/{ns}/events` (only `create` is served).
    Events,
    /// discovery.k8s.io/v1 EndpointSlices: get, update, create, delete, list by name.
    EndpointSlices,
    /// core/v1 Pods: `/api/v1/namespaces/{ns}/pods/{name}` (only `get` is served; the
    /// pods are the test's, see [`FakeApiServer::add_pod`]).
    Pods,
}

impl Resource {
    /// The API group (`""` for the core group).
    pub fn group(self) -> &'static str {
        match self {
            Resource::Leases => "coordination.k8s.io",
            Resource::Events => "",
            Resource::EndpointSlices => endpoint_slices::GROUP,
            Resource::Pods => "",
        }
    }

    /// The resource as RBAC names it.
    pub fn name(self) -> &'static str {
        match self {
            Resource::Leases => "leases",
            Resource::Events => "events",
            Resource::EndpointSlices => endpoint_slices::RESOURCE,
            Resource::Pods => pods::RESOURCE,
        }
    }
}

/// The API verb of a request, as RBAC names it (derived from method, path and `watch=true`),
/// for any [`Resource`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Verb {
    /// `GET .../leases/{name}`
    Get,
    /// `GET .../leases` (without `watch=true`)
    List,
    /// `GET .../leases?watch=true`
    Watch,
    /// `POST .../leases`, `POST .../events`
    Create,
    /// `PUT .../leases/{name}`
    Update,
    /// `PATCH .../leases/{name}`: JSON merge and strategic merge patches, and server-side
    /// apply (`application/apply-patch+yaml`), which may create the Lease
    Patch,
    /// `DELETE .../leases/{name}`
    Delete,
    /// Anything else: unknown paths, `/version`, `/healthz`, collection deletes, ...
    Other,
}

impl Verb {
    /// The verb as RBAC spells it (`get`, `list`, `watch`, `create`, `update`, ...).
    pub fn rbac_name(self) -> &'static str {
        match self {
            Verb::Get => "get",
            Verb::List => "list",
            Verb::Watch => "watch",
            Verb::Create => "create",
            Verb::Update => "update",
            Verb::Patch => "patch",
            Verb::Delete => "delete",
            Verb::Other => "other",
        }
    }
}

/// A fault injected for one client: which verbs it hits and what it does.
#[derive(Clone, Debug, PartialEq)]
pub struct Fault {
    /// The verbs the fault applies to; empty means every verb.
    pub verbs: Vec<Verb>,
    /// What happens to a request hit by the fault.
    pub kind: FaultKind,
}

impl Fault {
    /// A fault that hits every verb.
    pub fn all(kind: FaultKind) -> Fault {
        Fault {
            verbs: Vec::new(),
            kind,
        }
    }

    /// A fault that hits only the given verbs.
    pub fn on(verbs: &[Verb], kind: FaultKind) -> Fault {
        Fault {
            verbs: verbs.to_vec(),
            kind,
        }
    }

    fn applies_to(&self, verb: Verb) -> bool {
        self.verbs.is_empty() || self.verbs.contains(&verb)
    }
}

/// What a [`Fault`] does to the requests it hits.
#[derive(Clone, Debug, PartialEq)]
pub enum FaultKind {
    /// Answer with this HTTP status and the `Status` body the real server would send for it:
    /// 401 `Unauthorized`; 403 the RBAC message for the request's verb, name and namespace;
    /// 404 `NotFound`; 409 `Conflict`; 410 `Expired` (for a watch: HTTP 200 and an in-stream
    /// ERROR event, as the real server does); 429 `TooManyRequests` with `Retry-After: 1`;
    /// 500 `InternalError`; 503 `ServiceUnavailable`; 504 `Timeout`; others a generic
    /// `Status`. Nothing is applied.
    Status(u16),
    /// 429 with a `Retry-After` header (whole seconds, rounded up) and a `TooManyRequests`
    /// Status, as API Priority and Fairness answers. Note that kube-rs retries 429s itself
    /// (honouring `Retry-After`) up to 15 times.
    TooManyRequests {
        /// The value of the `Retry-After` header and of `details.retryAfterSeconds`.
        retry_after: Duration,
    },
    /// Handle the request normally after this delay.
    Latency(Duration),
    /// Never answer: the request stays unanswered even after the fault is cleared (the
    /// connection stays open until the client gives up or the server shuts down). Use
    /// [`FaultKind::Partition`] for a hang that heals.
    Hang,
    /// Handle the request normally (a write is committed and its watch events are sent),
    /// then send the response head and only half of the body and close the connection:
    /// the client sees a transport error (hyper: "connection closed before message
    /// completed"). On a watch, the stream is cut right after the response head.
    DropResponse,
    /// Like a network partition between this client and the server: new requests wait
    /// (unanswered) until the fault is cleared and are then handled normally; open watches
    /// deliver no events and no bookmarks until it is cleared, then deliver what they
    /// held back, in order.
    Partition,
}

/// One request received by the server, in arrival order (see [`FakeApiServer::requests`]).
#[derive(Clone, Debug)]
pub struct RequestRecord {
    /// When the request head was received (monotonic, the test's clock).
    pub at: Instant,
    /// When the request head was received (wall clock).
    pub wall: SystemTime,
    /// The client named by the bearer token; `""` if there was no valid token.
    pub client: String,
    /// The API verb.
    pub verb: Verb,
    /// The resource addressed; `None` for other paths (`/version`, unknown ones).
    pub resource: Option<Resource>,
    /// The lease name from the path, the `metadata.name` field selector, or a create's body.
    pub name: Option<String>,
    /// The HTTP status, once the response head was sent (`None` while unanswered, for hangs,
    /// partitions not yet healed, and dropped responses).
    pub status: Option<u16>,
    /// The HTTP method.
    pub method: String,
    /// The request target (path and query, as sent).
    pub path: String,
    /// The `Content-Type` header, if any (for a PATCH: which kind of patch, e.g.
    /// `application/apply-patch+yaml` for a server-side apply).
    pub content_type: Option<String>,
    /// For a create or update: the `spec.holderIdentity` its body writes
    /// (`None` for a release, which clears it). Tells a candidate's
    /// acquisitions and renews from its other writes, such as the claim
    /// of the successor slot, which leaves the holder as it was.
    pub holder: Option<String>,
    /// For an EndpointSlice create or update: the pods its body lists, in order (each
    /// endpoint's `targetRef` name, or its first address when it has none); empty when
    /// it lists nobody, and for every other request.
    pub lists: Vec<String>,
    /// For an EndpointSlice create or update: the conditions of each endpoint in
    /// [`Self::lists`], in the same order, as kube-proxy reads them.
    pub conditions: Vec<Conditions>,
}

/// Counters of what the fake API servers sent, see [`FakeApiServer::traffic`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Traffic {
    /// Bytes of responses and watch chunks written.
    pub bytes_written: u64,
    /// Watch events (ADDED/MODIFIED/DELETED/ERROR) written, bookmarks excluded.
    pub watch_events: u64,
    /// BOOKMARK events written.
    pub bookmarks: u64,
}

/// Per-client state: token generation, user name, role binding.
#[derive(Clone, Debug)]
struct ClientInfo {
    generation: u64,
    user: String,
    admin: bool,
    bound: bool,
    token_files: Vec<PathBuf>,
}

/// Everything behind the single lock: the store, the clients, the faults and the log.
struct State {
    store: Store,
    clients: HashMap<String, ClientInfo>,
    /// The Role every bound client has in the server's namespace.
    role: Role,
    /// core/v1 Events created through the API.
    events: Events,
    endpoint_slices: EndpointSlices,
    /// core/v1 Pods the test made.
    pods: Pods,
    faults: HashMap<String, Vec<Fault>>,
    watch_lag: HashMap<String, Duration>,
    bookmark_interval: Duration,
    log: Vec<RequestRecord>,
    /// Number of records forgotten by `clear_requests` (request ids stay stable).
    log_offset: usize,
}

struct Listening {
    stop: oneshot::Sender<()>,
    task: JoinHandle<()>,
    /// Connections are accepted and never answered ([`FakeApiServer::black_hole`]).
    black_hole: bool,
}

/// The shared server state; tasks on the server's runtime hold an `Arc` of it.
struct Inner {
    namespace: String,
    lease_name: String,
    rt: tokio::runtime::Handle,
    addr: Mutex<SocketAddr>,
    state: Mutex<State>,
    /// Bumped whenever faults change (wakes partitioned requests and watches).
    faults_changed: tokio_watch::Sender<u64>,
    listening: tokio::sync::Mutex<Option<Listening>>,
}

impl Inner {
    fn lock(&self) -> MutexGuard<'_, State> {
        // A panicking test thread must not make every later request fail.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn default_user(&self, client: &str) -> String {
        format!("system:serviceaccount:{}:{}", self.namespace, client)
    }

    fn ensure_client<'a>(&self, st: &'a mut State, client: &str) -> &'a mut ClientInfo {
        let user = self.default_user(client);
        st.clients
            .entry(client.to_string())
            .or_insert_with(|| ClientInfo {
                generation: 0,
                user,
                admin: false,
                bound: true,
                token_files: Vec::new(),
            })
    }

    fn notify_faults(&self) {
        self.faults_changed.send_modify(|n| *n += 1);
    }
}

/// Stops the server's runtime thread when the last handle goes away.
struct Shared {
    inner: Arc<Inner>,
    stop_runtime: Mutex<Option<oneshot::Sender<()>>>,
}

impl Drop for Shared {
    fn drop(&mut self) {
        if let Some(tx) = self
            .stop_runtime
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()
        {
            let _ = tx.send(());
        }
    }
}

/// A fake kube-apiserver serving Leases in one namespace; a cheap, clonable handle.
///
/// All methods that change the store (`create_lease`, `update_lease`, `delete_lease`) act
/// like an operator with `kubectl` would: they bump the resourceVersion and emit watch
/// events, bypassing authentication, RBAC and faults.
#[derive(Clone)]
pub struct FakeApiServer {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for FakeApiServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FakeApiServer")
            .field("addr", &self.addr())
            .field("namespace", &self.inner().namespace)
            .field("lease_name", &self.inner().lease_name)
            .finish()
    }
}

/// The default interval between BOOKMARK events on watches with `allowWatchBookmarks=true`.
pub const DEFAULT_BOOKMARK_INTERVAL: Duration = Duration::from_secs(1);

impl FakeApiServer {
    /// Starts a server on `127.0.0.1` on a free port, serving Leases in `namespace`; clients
    /// may get/update/list/watch only `lease_name` (see the module docs).
    pub async fn start(namespace: &str, lease_name: &str) -> FakeApiServer {
        let server = Self::create(SocketAddr::from(([127, 0, 0, 1], 0)), namespace, lease_name);
        server.restart().await;
        server
    }

    /// Like [`start`](Self::start), on a runtime of `threads` worker threads
    /// (the swarm benchmark: a write is answered while an event goes out to
    /// thousands of watches, as on a real multi-core API server).
    pub async fn start_with_threads(
        namespace: &str,
        lease_name: &str,
        threads: usize,
    ) -> FakeApiServer {
        let server = Self::create_with(
            SocketAddr::from(([127, 0, 0, 1], 0)),
            namespace,
            lease_name,
            threads,
        );
        server.restart().await;
        server
    }

    /// Starts a server listening on `addr` (e.g. an address reserved earlier, for "the API
    /// server comes up later"). Panics if the address cannot be bound.
    pub async fn start_on(addr: SocketAddr, namespace: &str, lease_name: &str) -> FakeApiServer {
        let server = Self::create(addr, namespace, lease_name);
        server.restart().await;
        server
    }

    /// Creates a server that is NOT listening yet, on a free port of `127.0.0.1` picked now:
    /// [`addr`](Self::addr), [`url`](Self::url) and [`write_kubeconfig`](Self::write_kubeconfig)
    /// work, connections are refused until [`restart`](Self::restart) is called.
    pub fn new_offline(namespace: &str, lease_name: &str) -> FakeApiServer {
        Self::create(free_local_addr(), namespace, lease_name)
    }

    fn create(addr: SocketAddr, namespace: &str, lease_name: &str) -> FakeApiServer {
        Self::create_with(addr, namespace, lease_name, 1)
    }

    fn create_with(
        addr: SocketAddr,
        namespace: &str,
        lease_name: &str,
        threads: usize,
    ) -> FakeApiServer {
        let (handle_tx, handle_rx) = std::sync::mpsc::channel();
        let (stop_tx, stop_rx) = oneshot::channel::<()>();
        std::thread::Builder::new()
            .name("fake-apiserver".into())
            .spawn(move || {
                let rt = if threads > 1 {
                    tokio::runtime::Builder::new_multi_thread()
                        .worker_threads(threads)
                        .enable_all()
                        .build()
                } else {
                    tokio::runtime::Builder::new_current_thread()
                        .enable_all()
                        .build()
                }
                .expect("build fake apiserver runtime");
                handle_tx
                    .send(rt.handle().clone())
                    .expect("send runtime handle");
                rt.block_on(async {
                    let _ = stop_rx.await;
                });
                // Dropping the runtime cancels every task: listener and connections close.
                drop(rt);
            })
            .expect("spawn fake apiserver thread");
        let rt = handle_rx.recv().expect("fake apiserver runtime handle");
        let inner = Arc::new(Inner {
            namespace: namespace.to_string(),
            lease_name: lease_name.to_string(),
            rt,
            addr: Mutex::new(addr),
            state: Mutex::new(State {
                store: Store::new(),
                clients: HashMap::new(),
                role: Role::from_repository_manifest(lease_name),
                events: Events::default(),
                endpoint_slices: EndpointSlices::default(),
                pods: Pods::default(),
                faults: HashMap::new(),
                watch_lag: HashMap::new(),
                bookmark_interval: DEFAULT_BOOKMARK_INTERVAL,
                log: Vec::new(),
                log_offset: 0,
            }),
            faults_changed: tokio_watch::channel(0).0,
            listening: tokio::sync::Mutex::new(None),
        });
        FakeApiServer {
            shared: Arc::new(Shared {
                inner,
                stop_runtime: Mutex::new(Some(stop_tx)),
            }),
        }
    }

    fn inner(&self) -> &Arc<Inner> {
        &self.shared.inner
    }

    /// The address the server listens on (also while it is shut down).
    pub fn addr(&self) -> SocketAddr {
        *self.inner().addr.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// `http://127.0.0.1:PORT`
    pub fn url(&self) -> String {
        format!("http://{}", self.addr())
    }

    /// The namespace the server's clients are bound in.
    pub fn namespace(&self) -> &str {
        &self.inner().namespace
    }

    /// The one lease name the clients' Role allows.
    pub fn lease_name(&self) -> &str {
        &self.inner().lease_name
    }

    /// Whether the server is currently listening.
    pub async fn is_listening(&self) -> bool {
        self.inner().listening.lock().await.is_some()
    }

    /// The API server goes down: stops listening and drops every open connection (watches
    /// end abruptly, pending requests get no answer). The store is kept; when this returns
    /// the port refuses connections. No-op if not listening.
    pub async fn shutdown(&self) {
        let mut listening = self.inner().listening.lock().await;
        if let Some(l) = listening.take() {
            let _ = l.stop.send(());
            let _ = l.task.await;
        }
    }

    /// The API server's address becomes a black hole, as behind a dead load balancer or a
    /// dropped route: every open connection is dropped, new ones are accepted and never
    /// answered (clients see their own timeouts), for every client. [`restart`](Self::restart)
    /// serves again; [`shutdown`](Self::shutdown) makes the port refuse connections instead.
    pub async fn black_hole(&self) {
        self.shutdown().await;
        let inner = self.inner().clone();
        let mut listening = inner.listening.lock().await;
        let listener = self.bind(&inner).await;
        let (stop, mut stop_rx) = oneshot::channel::<()>();
        let task = inner.rt.spawn(async move {
            let mut held = Vec::new();
            loop {
                tokio::select! {
                    _ = &mut stop_rx => break,
                    accepted = listener.accept() => {
                        if let Ok((stream, _)) = accepted {
                            held.push(stream);
                        }
                    }
                }
            }
        });
        *listening = Some(Listening {
            stop,
            task,
            black_hole: true,
        });
    }

    /// (Re)starts listening on [`addr`](Self::addr) with the same store, clients and faults:
    /// the API server comes back after [`shutdown`](Self::shutdown) or
    /// [`black_hole`](Self::black_hole), or comes up for the first time for a server made by
    /// [`new_offline`](Self::new_offline). No-op if already serving. Panics if the address
    /// cannot be bound.
    pub async fn restart(&self) {
        if self
            .inner()
            .listening
            .lock()
            .await
            .as_ref()
            .is_some_and(|l| l.black_hole)
        {
            self.shutdown().await;
        }
        let inner = self.inner().clone();
        let mut listening = inner.listening.lock().await;
        if listening.is_some() {
            return;
        }
        let listener = self.bind(&inner).await;
        let (stop, stop_rx) = oneshot::channel();
        let task = inner
            .rt
            .spawn(handler::accept_loop(inner.clone(), listener, stop_rx));
        *listening = Some(Listening {
            stop,
            task,
            black_hole: false,
        });
    }

    /// Binds [`addr`](Self::addr) on the server's runtime (the first time: a port the
    /// kernel picks, remembered).
    async fn bind(&self, inner: &Arc<Inner>) -> TcpListener {
        let addr = self.addr();
        let bind = inner.rt.spawn(async move {
            let socket = if addr.is_ipv4() {
                TcpSocket::new_v4()
            } else {
                TcpSocket::new_v6()
            }?;
            socket.set_reuseaddr(true)?;
            socket.bind(addr)?;
            socket.listen(1024)
        });
        let listener: TcpListener = bind
            .await
            .expect("bind task")
            .unwrap_or_else(|e| panic!("fake apiserver cannot listen on {addr}: {e}"));
        let local = listener.local_addr().expect("local_addr");
        *inner.addr.lock().unwrap_or_else(|e| e.into_inner()) = local;
        listener
    }

    // ----- clients and tokens -----

    /// Registers `client` (if new) and returns its current bearer token.
    pub fn token(&self, client: &str) -> String {
        let inner = self.inner();
        let mut st = inner.lock();
        let generation = inner.ensure_client(&mut st, client).generation;
        token_string(client, generation)
    }

    /// Registers `client` with the user name `user` (the name RBAC messages show) and returns
    /// its current token. The default user name is `system:serviceaccount:<ns>:<client>`.
    pub fn add_client(&self, client: &str, user: &str) -> String {
        self.set_user_name(client, user);
        self.token(client)
    }

    /// Sets the user name of `client` (registering it if new).
    pub fn set_user_name(&self, client: &str, user: &str) {
        let inner = self.inner();
        let mut st = inner.lock();
        inner.ensure_client(&mut st, client).user = user.to_string();
    }

    /// Binds every client to `role` from now on (the next request is authorized by it),
    /// in place of the default Role of `manifests/rbac.yaml`.
    pub fn set_role(&self, role: Role) {
        self.inner().lock().role = role;
    }

    /// The Role the clients are bound to.
    pub fn role(&self) -> Role {
        self.inner().lock().role.clone()
    }

    /// Grants the candidates' verbs on the Leases `names` too (the Role of
    /// `manifests/rbac.yaml` names one Lease), as a Role for a sidecar of
    /// several Leases does.
    pub fn grant_leases(&self, names: &[&str]) {
        let mut role = self.role();
        role.rules.push(PolicyRule::new(
            &["coordination.k8s.io"],
            &["leases"],
            names,
            &["get", "list", "watch", "update"],
        ));
        self.set_role(role);
    }

    /// Whether the clients' Role allows this request in the server's namespace (the
    /// authorization the server applies to a bound, non-admin client).
    pub fn role_allows(&self, verb: Verb, resource: Resource, name: &str) -> bool {
        self.inner().lock().role.allows(&Attributes {
            verb: verb.rbac_name(),
            group: resource.group(),
            resource: resource.name(),
            name,
        })
    }

    /// Makes `client` a cluster admin (RBAC allows everything, like `kubectl` as admin), or
    /// takes that back.
    pub fn set_admin(&self, client: &str, admin: bool) {
        let inner = self.inner();
        let mut st = inner.lock();
        inner.ensure_client(&mut st, client).admin = admin;
    }

    /// Deletes (`false`) or restores (`true`) the RoleBinding of `client`: while it is
    /// deleted every request of the client gets the RBAC 403 (exchanges 16 and 17), create
    /// included. Admins are not affected.
    pub fn set_role_binding(&self, client: &str, bound: bool) {
        let inner = self.inner();
        let mut st = inner.lock();
        inner.ensure_client(&mut st, client).bound = bound;
    }

    /// Writes `<dir>/<client>.token` (the client's current token) and `<dir>/<client>.kubeconfig`
    /// (server [`url`](Self::url), the server's namespace, `tokenFile` = the absolute token
    /// path) and returns the kubeconfig path. Registers the client if new.
    /// [`rotate_token`](Self::rotate_token) rewrites the token file.
    pub fn write_kubeconfig(&self, client: &str, dir: &Path) -> PathBuf {
        std::fs::create_dir_all(dir).expect("create kubeconfig dir");
        let dir = std::fs::canonicalize(dir).expect("canonicalize kubeconfig dir");
        let token_path = dir.join(format!("{client}.token"));
        let kubeconfig_path = dir.join(format!("{client}.kubeconfig"));
        let token = {
            let inner = self.inner();
            let mut st = inner.lock();
            let info = inner.ensure_client(&mut st, client);
            if !info.token_files.contains(&token_path) {
                info.token_files.push(token_path.clone());
            }
            token_string(client, info.generation)
        };
        std::fs::write(&token_path, &token).expect("write token file");
        let yaml = format!(
            "apiVersion: v1\n\
             kind: Config\n\
             clusters:\n\
             - name: fake\n\
             \x20 cluster:\n\
             \x20   server: {url}\n\
             contexts:\n\
             - name: fake\n\
             \x20 context:\n\
             \x20   cluster: fake\n\
             \x20   namespace: {ns}\n\
             \x20   user: {client}\n\
             current-context: fake\n\
             users:\n\
             - name: {client}\n\
             \x20 user:\n\
             \x20   tokenFile: {token}\n",
            url = self.url(),
            ns = self.namespace(),
            token = token_path.display(),
        );
        std::fs::write(&kubeconfig_path, yaml).expect("write kubeconfig");
        kubeconfig_path
    }

    /// Rotates the token of `client`: its generation is bumped, so every earlier token of the
    /// client now gets 401, and the token files written by
    /// [`write_kubeconfig`](Self::write_kubeconfig) for it are rewritten with the new token
    /// (like the kubelet refreshing a projected service account token; kube-rs re-reads a
    /// `tokenFile` about once a minute). Returns the new token.
    pub fn rotate_token(&self, client: &str) -> String {
        let (token, files) = {
            let inner = self.inner();
            let mut st = inner.lock();
            let info = inner.ensure_client(&mut st, client);
            info.generation += 1;
            (
                token_string(client, info.generation),
                info.token_files.clone(),
            )
        };
        for f in files {
            // Write atomically so a reader never sees a half-written token.
            let tmp = f.with_extension("token.tmp");
            std::fs::write(&tmp, &token).expect("write rotated token");
            std::fs::rename(&tmp, &f).expect("rename rotated token");
        }
        token
    }

    // ----- direct store access (an operator with kubectl) -----

    /// The Lease `name` in the server's namespace as a GET would return it.
    pub fn lease(&self, name: &str) -> Option<Value> {
        let ns = self.namespace().to_string();
        self.inner().lock().store.get(&ns, name).cloned()
    }

    /// All Leases in the server's namespace, sorted by name.
    pub fn leases(&self) -> Vec<Value> {
        let ns = self.namespace().to_string();
        self.inner().lock().store.list_namespace(&ns)
    }

    /// Edits the Lease `name` like `kubectl edit` (field manager `kubectl-edit`): the edited
    /// object is stored with a new resourceVersion and a MODIFIED event is sent. An edit that
    /// changes nothing changes nothing (no new resourceVersion, no event), like the real
    /// server. `metadata.resourceVersion` in the edited object is ignored (the edit always
    /// applies). Returns the stored object. Panics if the Lease does not exist or the edit is
    /// invalid.
    pub fn update_lease(&self, name: &str, edit: impl FnOnce(&mut Value)) -> Value {
        let ns = self.namespace().to_string();
        let mut obj = self
            .lease(name)
            .unwrap_or_else(|| panic!("update_lease: no lease {ns}/{name}"));
        // The closure runs without the lock held (it may call back into the server).
        edit(&mut obj);
        self.inner()
            .lock()
            .store
            .operator_update(&ns, name, obj, "kubectl-edit")
            .unwrap_or_else(|e| panic!("update_lease {name}: {}", e.body))
    }

    /// Creates a Lease like `kubectl create` (field manager `kubectl-create`): `obj` needs at
    /// least `metadata.name`; `kind`, `apiVersion` and the namespace are filled in. Sends an
    /// ADDED event and returns the stored object. Panics if it exists or is invalid.
    pub fn create_lease(&self, obj: Value) -> Value {
        let inner = self.inner();
        let ns = inner.namespace.clone();
        let mut st = inner.lock();
        st.store
            .create(&ns, obj, "kubectl-create", false)
            .unwrap_or_else(|e| panic!("create_lease: {}", e.body))
    }

    /// Deletes the Lease `name` like `kubectl delete`: sends a DELETED event (with the last
    /// state of the object and a new resourceVersion) and returns the deleted object, or
    /// `None` if there was none.
    pub fn delete_lease(&self, name: &str) -> Option<Value> {
        let inner = self.inner();
        let ns = inner.namespace.clone();
        inner.lock().store.delete(&ns, name, None, None, false).ok()
    }

    /// Forgets the watch history (like an etcd compaction plus a watch-cache restart): a
    /// watch or exact list from any resourceVersion older than the current one gets 410
    /// `Expired`. Open watches are not affected.
    pub fn compact(&self) {
        self.inner().lock().store.compact();
    }

    /// The store as it is now, like an etcd snapshot, for
    /// [`FakeApiServer::restore_store`].
    pub fn snapshot_store(&self) -> StoreSnapshot {
        self.inner().lock().store.snapshot()
    }

    /// Restores `snapshot` as etcd restored without `--bump-revision` would:
    /// the same objects (same uids) with their older resourceVersions, the
    /// counter going on from there; open watches end (the API servers
    /// restart onto the restored etcd).
    pub fn restore_store(&self, snapshot: &StoreSnapshot) {
        self.inner().lock().store.restore(snapshot);
    }

    /// Keeps at most `n` events of watch history (default 1000); older resourceVersions get
    /// 410 `Expired`.
    pub fn set_history_limit(&self, n: usize) {
        self.inner().lock().store.set_history_limit(n);
    }

    /// Turns the CoordinatedLeaderElection feature gate on or off (default
    /// off): off, `spec.strategy` and `spec.preferredHolder` are dropped from
    /// creates and from updates of an object that lacks them, as the real
    /// API server does.
    pub fn set_coordinated_leader_election(&self, enabled: bool) {
        self.inner().lock().store.coordinated_leader_election = enabled;
    }

    /// The current global resourceVersion. The first server of a test process starts at
    /// 1000, every later one 1,000,000 higher, so a resourceVersion carried over from an
    /// earlier server is "too old" (410, re-list) on a new one, never "too large".
    pub fn resource_version(&self) -> u64 {
        self.inner().lock().store.rv()
    }

    /// Every core/v1 Event created through the API so far (in every namespace), in
    /// creation order, as stored (with uid, resourceVersion, creationTimestamp).
    pub fn events(&self) -> Vec<Value> {
        self.inner().lock().events.all()
    }

    // ----- Pods -----

    /// A running pod `name` in the server's namespace (as a kubelet would report one);
    /// only `get` of it is served, under the Role's RBAC.
    pub fn add_pod(&self, name: &str) -> Value {
        let namespace = self.inner().namespace.clone();
        self.add_pod_in(&namespace, name)
    }

    /// A running pod `name` in `namespace`.
    pub fn add_pod_in(&self, namespace: &str, name: &str) -> Value {
        let mut st = self.inner().lock();
        let State { store, pods, .. } = &mut *st;
        pods.add(store, namespace, name)
    }

    /// Deletes the pod `name` of the server's namespace; whether it existed.
    pub fn delete_pod(&self, name: &str) -> bool {
        let inner = self.inner();
        let mut st = inner.lock();
        let State { store, pods, .. } = &mut *st;
        pods.delete(store, &inner.namespace, name)
    }

    // ----- EndpointSlices -----

    /// Creates an EndpointSlice in the server's namespace as an admin would (`kubectl
    /// apply` of a shipped manifest); panics if it is invalid or exists.
    pub fn create_endpoint_slice(&self, obj: Value) -> Value {
        let inner = self.inner();
        let mut st = inner.lock();
        let State {
            store,
            endpoint_slices,
            ..
        } = &mut *st;
        endpoint_slices
            .create(store, &inner.namespace, obj)
            .unwrap_or_else(|e| panic!("create_endpoint_slice: {}", e.body))
    }

    /// Leader routing for `service` as the manifests ship it: the EndpointSlice
    /// `<service>-leader` (a `metrics` port, no endpoints) exists, and the Role
    /// grants get and update on it by name.
    pub fn ship_route_slice(&self, service: &str) {
        let slice = format!("{service}-leader");
        self.create_endpoint_slice(json!({
            "apiVersion": "discovery.k8s.io/v1",
            "kind": "EndpointSlice",
            "metadata": {
                "name": slice,
                "labels": {
                    "kubernetes.io/service-name": service,
                    "endpointslice.kubernetes.io/managed-by": "leader-gate.dev",
                },
            },
            "addressType": "IPv4",
            "endpoints": [],
            "ports": [{ "name": "metrics", "port": 9102, "protocol": "TCP" }],
        }));
        let mut role = self.role();
        role.rules.push(PolicyRule::new(
            &["discovery.k8s.io"],
            &["endpointslices"],
            &[&slice],
            &["get", "update"],
        ));
        self.set_role(role);
    }

    /// The EndpointSlice `name` of the server's namespace, as stored.
    pub fn endpoint_slice(&self, name: &str) -> Option<Value> {
        let inner = self.inner();
        let st = inner.lock();
        st.endpoint_slices.get(&inner.namespace, name).ok()
    }

    /// Every version of every EndpointSlice stored so far, oldest first, with when it
    /// was stored.
    pub fn endpoint_slice_history(&self) -> Vec<(Instant, Value)> {
        self.inner().lock().endpoint_slices.history()
    }

    // ----- faults -----

    /// Sets a fault for `client`: it replaces the client's fault for the verbs it covers
    /// (a fault for all verbs replaces all of them). Takes effect on the next request; a
    /// [`FaultKind::Partition`] also on open watches, at once.
    pub fn set_fault(&self, client: &str, fault: Fault) {
        let inner = self.inner();
        {
            let mut st = inner.lock();
            let list = st.faults.entry(client.to_string()).or_default();
            if fault.verbs.is_empty() {
                list.clear();
            } else {
                for f in list.iter_mut() {
                    if f.verbs.is_empty() {
                        // An all-verbs fault keeps applying to the verbs not replaced.
                        f.verbs = all_verbs()
                            .into_iter()
                            .filter(|v| !fault.verbs.contains(v))
                            .collect();
                    } else {
                        f.verbs.retain(|v| !fault.verbs.contains(v));
                    }
                }
                list.retain(|f| !f.verbs.is_empty());
            }
            list.push(fault);
        }
        inner.notify_faults();
    }

    /// Clears every fault of `client` (a partition heals: held requests are answered and
    /// watches deliver again). Does not reset the watch lag.
    pub fn clear_faults(&self, client: &str) {
        let inner = self.inner();
        inner.lock().faults.remove(client);
        inner.notify_faults();
    }

    /// The faults currently set for `client`.
    pub fn faults(&self, client: &str) -> Vec<Fault> {
        self.inner()
            .lock()
            .faults
            .get(client)
            .cloned()
            .unwrap_or_default()
    }

    /// Ends the open watch streams of `client` now, like a dropped connection: events not yet
    /// delivered are lost and the connection is closed without the terminating chunk (kube-rs
    /// sees the stream end and re-watches from its last resourceVersion).
    pub fn drop_watches(&self, client: &str) {
        self.inner()
            .lock()
            .store
            .signal_watches(client, store::WatchSignal::Drop);
    }

    /// Sends an in-stream ERROR event with a 410 `Expired` Status on the open watches of
    /// `client` (after the events already sent to them) and ends them; a kube-rs watcher
    /// re-lists.
    pub fn expire_watches(&self, client: &str) {
        self.inner()
            .lock()
            .store
            .signal_watches(client, store::WatchSignal::Expire);
    }

    /// Delays every watch event, bookmark and stream end sent to `client` by `lag`, order
    /// preserved (applies to what is sent from now on, on open and new watches).
    /// `Duration::ZERO` removes the lag.
    pub fn set_watch_lag(&self, client: &str, lag: Duration) {
        self.inner()
            .lock()
            .watch_lag
            .insert(client.to_string(), lag);
        // Open watches read their lag again on this signal.
        self.inner().notify_faults();
    }

    /// Sets the interval between BOOKMARK events (default 1 s) for all watches with
    /// `allowWatchBookmarks=true`, from their next bookmark on.
    pub fn set_bookmark_interval(&self, interval: Duration) {
        self.inner().lock().bookmark_interval = interval;
    }

    /// Number of watch streams currently open for `client` (`None` = all clients).
    pub fn open_watches(&self, client: Option<&str>) -> usize {
        self.inner().lock().store.open_watches(client)
    }

    // ----- request log -----

    /// Every request received so far, in arrival order.
    pub fn requests(&self) -> Vec<RequestRecord> {
        self.inner().lock().log.clone()
    }

    /// When `client`'s release (an update that clears the holder, stored)
    /// arrived; panics if none arrives within `within`.
    pub async fn release_of(&self, client: &str, within: Duration) -> Instant {
        let deadline = Instant::now() + within;
        loop {
            let release = self
                .requests_of(client, Verb::Update)
                .into_iter()
                .find(|r| r.holder.is_none() && r.status == Some(200));
            if let Some(release) = release {
                return release.at;
            }
            assert!(Instant::now() < deadline, "{client} never released");
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }

    /// The requests of `client` with `verb`, on any resource, in arrival order.
    pub fn requests_of(&self, client: &str, verb: Verb) -> Vec<RequestRecord> {
        self.inner()
            .lock()
            .log
            .iter()
            .filter(|r| r.client == client && r.verb == verb)
            .cloned()
            .collect()
    }

    /// What the fake API servers of this process have sent so far (process-wide
    /// counters: meaningful when one server runs at a time, as in the benchmarks).
    pub fn traffic(&self) -> Traffic {
        use std::sync::atomic::Ordering::Relaxed;
        Traffic {
            bytes_written: http::BYTES_WRITTEN.load(Relaxed),
            watch_events: watch::EVENTS_SENT.load(Relaxed),
            bookmarks: watch::BOOKMARKS_SENT.load(Relaxed),
        }
    }

    /// How many requests each client sent with their head received in `[from, to)`, by
    /// client (`""`: no valid token): the load a candidate puts on the server over time.
    pub fn requests_per_client(&self, from: Instant, to: Instant) -> HashMap<String, usize> {
        let mut counts = HashMap::new();
        for record in self.inner().lock().log.iter() {
            if record.at >= from && record.at < to {
                *counts.entry(record.client.clone()).or_insert(0) += 1;
            }
        }
        counts
    }

    /// Forgets the request log.
    pub fn clear_requests(&self) {
        let mut st = self.inner().lock();
        st.log_offset += st.log.len();
        st.log.clear();
    }
}

fn all_verbs() -> Vec<Verb> {
    vec![
        Verb::Get,
        Verb::List,
        Verb::Watch,
        Verb::Create,
        Verb::Update,
        Verb::Patch,
        Verb::Delete,
        Verb::Other,
    ]
}

fn token_string(client: &str, generation: u64) -> String {
    if generation == 0 {
        client.to_string()
    } else {
        format!("{client}.{generation}")
    }
}

/// Picks a free port on 127.0.0.1 (by binding port 0 and letting it go again).
pub fn free_local_addr() -> SocketAddr {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0");
    l.local_addr().expect("local_addr")
}

// ----- small helpers for tests -----

/// `spec.holderIdentity` of a Lease, if set and not empty.
pub fn lease_holder(v: &Value) -> Option<String> {
    v.pointer("/spec/holderIdentity")
        .and_then(Value::as_str)
        .filter(|s| !s.is_empty())
        .map(str::to_string)
}

/// `metadata.resourceVersion` of an object, parsed.
pub fn resource_version_of(v: &Value) -> Option<u64> {
    v.pointer("/metadata/resourceVersion")
        .and_then(Value::as_str)
        .and_then(|s| s.parse().ok())
}

/// `spec.leaseTransitions` of a Lease (0 when absent).
pub fn lease_transitions(v: &Value) -> i64 {
    v.pointer("/spec/leaseTransitions")
        .and_then(Value::as_i64)
        .unwrap_or(0)
}

/// Now as a Kubernetes MicroTime (`2026-11-29T17:26:29.727769Z`).
pub fn micro_time_now() -> String {
    micro_time(SystemTime::now())
}

/// A time as a Kubernetes MicroTime (RFC 3339, UTC, six fractional digits).
pub fn micro_time(t: SystemTime) -> String {
    let ts = k8s_openapi::jiff::Timestamp::try_from(t).expect("time in range");
    ts.strftime("%Y-%m-%dT%H:%M:%S%.6fZ").to_string()
}

/// A Lease object (`kind`, `apiVersion`, `metadata.name`, `spec`), e.g. for
/// [`FakeApiServer::create_lease`]. With a holder, `acquireTime` and `renewTime` are now and
/// `leaseTransitions` 0.
pub fn lease_object(name: &str, holder: Option<&str>, duration_seconds: i64) -> Value {
    let mut spec = json!({ "leaseDurationSeconds": duration_seconds });
    if let Some(h) = holder {
        let now = micro_time_now();
        spec["holderIdentity"] = json!(h);
        spec["acquireTime"] = json!(now);
        spec["renewTime"] = json!(now);
        spec["leaseTransitions"] = json!(0);
    }
    json!({
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": { "name": name },
        "spec": spec,
    })
}
