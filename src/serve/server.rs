//! The HTTP/1.1 server under the routers (hyper's), and the limits that keep
//! it standing when clients misbehave: both listeners are reachable by others
//! (the admin one by every pod in the cluster), and `/leader` and the
//! kubelet's probes must stay answered while someone tries to exhaust memory,
//! file descriptors, connection places or subscriber slots.
//!
//! - **Header read timeout**: a request's head must arrive within it, and an
//!   idle keep-alive connection is closed after it too (hyper runs the same
//!   timer while waiting for the next request).
//! - **Header size**: heads larger than [`Limits::max_header_bytes`] get 431.
//! - **Idle until the first byte**: a connection costs a socket and a small
//!   task, not hyper's buffers, until its first byte arrives.
//! - **Bodies**: none of the routes takes one. A body of at most
//!   [`MAX_BODY`] is read and dropped (the connection stays usable); a larger
//!   one gets 413 and the connection closes, lingering so that the answer is
//!   not destroyed by a reset. While a body is read the connection counts as
//!   idle (it may be evicted), and the body must arrive within a second, so
//!   clients that trickle bodies cannot hold the places probes need.
//! - **Connection cap with eviction**: at most [`Limits::max_connections`]
//!   open per listener. When full, a newcomer takes the place of the
//!   connection whose write has waited longest (a client that does not read
//!   its answers), else of the oldest idle one (no request in progress), so a
//!   probe, which sends its request at once and reads the answer, always gets
//!   in. Only when every connection is serving a request whose answer flows
//!   is the newcomer refused.
//! - **Half-closed clients**: a client that shuts its sending side after
//!   its request still gets the answer, or the event stream. Whether it
//!   only half-closed or went away, only a write can tell: its requests
//!   carry a [`ReadClosed`] that says it closed, for a stream to find out.
//! - **Write timeout**: a connection whose socket accepts nothing for
//!   [`Limits::write_timeout`] is closed, so a stalled `/events` subscriber
//!   frees its slot.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::os::fd::{AsRawFd, RawFd};
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, ready};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::http::header::{CONNECTION, CONTENT_LENGTH};
use axum::http::{HeaderValue, Request, StatusCode};
use axum::response::{IntoResponse, Response};
use http_body_util::{BodyExt, Limited};
use hyper::body::{Frame, Incoming, SizeHint};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::io::{Interest, Ready};
use tokio::net::{TcpListener, TcpStream, UnixListener, UnixStream};
use tokio::sync::Semaphore;
use tokio::task::JoinSet;
use tokio::time::{Instant, Sleep};
use tokio_util::sync::CancellationToken;
use tower::ServiceExt;

/// Bounds on what clients may hold.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    pub header_read_timeout: Duration,
    pub max_header_bytes: usize,
    pub max_connections: usize,
    pub write_timeout: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            header_read_timeout: Duration::from_secs(5),
            max_header_bytes: 16 * 1024,
            max_connections: 128,
            write_timeout: Duration::from_secs(30),
        }
    }
}

impl Limits {
    /// The gate listener's limits: it also holds every event stream.
    pub fn for_gate(max_subscribers: usize) -> Self {
        let default = Self::default();
        Self {
            max_connections: default
                .max_connections
                .max(max_subscribers.saturating_add(64)),
            ..default
        }
    }
}

/// After its first, a connection's requests are handled at most this many
/// at a time per listener, in turn: a client that pipelines requests gets
/// one answer made, then queues behind every other connection, and a new
/// connection's first request (a probe's only one) waits for none of them.
/// A lone Lease's `GET /leader` ([`Routes`]' shortcut) takes no turn
/// unless pipelined (made with no read off the socket since the request
/// before it).
const HANDLERS: usize = 2;
/// Each connection's kernel send buffer (the kernel doubles it for its
/// bookkeeping). A client that never reads its answers stalls once this and
/// its own receive buffer are full: without the bound, the kernel grows the
/// buffer to 4 MiB while the server keeps making answers for nobody, which
/// costs the CPU that probes need (and that much kernel memory per
/// connection). Answers are small (`/metrics` is the largest) and an event
/// stream's frames smaller still.
const SEND_BUFFER: usize = 64 * 1024;
/// Request bodies larger than this get 413 (no route takes a body).
pub const MAX_BODY: u64 = 64 * 1024;
/// A body that is announced must arrive whole within this, or the request
/// gets 400 (a client sends its small body with its head).
const BODY_READ_TIMEOUT: Duration = Duration::from_secs(1);
/// After closing its side, the server reads (and drops) what the client
/// still sends for at most this long and this much, so that the close sends
/// no reset that would destroy the answer before the client has read it.
const LINGER: Duration = Duration::from_secs(1);
const LINGER_BYTES: usize = 256 * 1024;

/// In a request's extensions: cancelled once its client has closed its
/// sending side (it may have gone, or may still read).
#[derive(Clone)]
pub struct ReadClosed(pub CancellationToken);

/// In a request's extensions: where its client came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Peer {
    /// A TCP client, by its address.
    Network(SocketAddr),
    /// A client of a Unix socket: whoever can reach its path (the gate
    /// socket's directory is shared by the pod's own containers only).
    UnixSocket,
}

/// What a server accepts connections on.
pub enum Listener {
    Tcp(TcpListener),
    Unix(UnixListener),
}

impl From<TcpListener> for Listener {
    fn from(listener: TcpListener) -> Self {
        Self::Tcp(listener)
    }
}

impl From<UnixListener> for Listener {
    fn from(listener: UnixListener) -> Self {
        Self::Unix(listener)
    }
}

impl Listener {
    async fn accept(&self) -> io::Result<(Stream, Peer)> {
        match self {
            Self::Tcp(listener) => listener
                .accept()
                .await
                .map(|(stream, peer)| (Stream::Tcp(stream), Peer::Network(peer))),
            Self::Unix(listener) => listener
                .accept()
                .await
                .map(|(stream, _)| (Stream::Unix(stream), Peer::UnixSocket)),
        }
    }
}

/// A request answered before the router, or handed back (`None`): the
/// one route a collector may poll in a tight loop skips the router's
/// matching, extractors and response mapping (see
/// [`crate::serve::routes::shortcut`]) and, unless pipelined, the queue
/// of [`HANDLERS`]: it must answer at once, without waiting for anything.
/// The connection is busy while its answer is sent, as with the router's.
pub type Shortcut = Arc<dyn Fn(&Request<Body>) -> Option<Response> + Send + Sync>;

/// What a listener serves: its router, and a shortcut taken first.
#[derive(Clone)]
pub struct Routes {
    pub router: Router,
    pub shortcut: Option<Shortcut>,
}

impl From<Router> for Routes {
    fn from(router: Router) -> Self {
        Self {
            router,
            shortcut: None,
        }
    }
}

/// Serves `routes` on `listener` until `shutdown`, then lets open requests
/// finish (event streams end on the same token).
pub fn serve(
    listener: impl Into<Listener>,
    routes: impl Into<Routes>,
    shutdown: CancellationToken,
    limits: Limits,
) -> impl Future<Output = io::Result<()>> + Send {
    // One future type for both kinds of listener (see [`Stream`]).
    serve_listener(listener.into(), routes.into(), shutdown, limits)
}

async fn serve_listener(
    listener: Listener,
    routes: Routes,
    shutdown: CancellationToken,
    limits: Limits,
) -> io::Result<()> {
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new())
        // A client may shut its sending side once its request is written
        // (`printf … | nc`): its answer (or stream) must still go out.
        .half_close(true)
        .header_read_timeout(limits.header_read_timeout)
        .max_header_size(limits.max_header_bytes)
        .max_buf_size(limits.max_header_bytes.max(8192));
    let listener_state = Arc::new(Shared {
        http,
        router: routes.router,
        shortcut: routes.shortcut,
        handlers: Arc::new(Semaphore::new(HANDLERS)),
        table: Table::default(),
        limits,
    });
    let table = &listener_state.table;
    let mut connections = JoinSet::new();
    loop {
        let (stream, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                // EMFILE and friends: wait a little rather than spin.
                Err(error) => {
                    tracing::warn!(%error, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            () = shutdown.cancelled() => break,
            Some(_) = connections.join_next() => continue,
        };
        let Some(slot) = table.admit(limits.max_connections) else {
            drop(stream); // every connection is serving a flowing answer
            continue;
        };
        if let Stream::Tcp(tcp) = &stream {
            let _ = tcp.set_nodelay(true);
        }
        limit_send_buffer(&stream);
        let (state, shutdown) = (listener_state.clone(), shutdown.clone());
        connections.spawn(connection(stream, peer, state, slot, shutdown));
    }
    drop(listener);
    while connections.join_next().await.is_some() {}
    Ok(())
}

/// Fixes the socket's send buffer at [`SEND_BUFFER`], so that the kernel
/// does not grow it (up to 4 MiB by default) for a client that does not read.
fn limit_send_buffer(stream: &impl AsRawFd) {
    let size = SEND_BUFFER as libc::c_int;
    // SAFETY: a valid socket, and a pointer to an int of the length given.
    unsafe {
        libc::setsockopt(
            stream.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_SNDBUF,
            (&size as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        );
    }
}

/// What a listener's connections share.
struct Shared {
    http: hyper::server::conn::http1::Builder,
    router: Router,
    shortcut: Option<Shortcut>,
    handlers: Arc<Semaphore>,
    table: Table,
    limits: Limits,
}

type Answer = Pin<Box<dyn Future<Output = Result<Response, Infallible>> + Send>>;

/// One connection, from its admission to its close.
async fn connection(
    stream: Stream,
    peer: Peer,
    shared: Arc<Shared>,
    slot: Arc<Slot>,
    shutdown: CancellationToken,
) {
    let (limits, table) = (shared.limits, &shared.table);
    let (router, handlers) = (shared.router.clone(), shared.handlers.clone());
    let shortcut = shared.shortcut.clone();
    // Until the first byte, a connection costs a socket and this small
    // task, not hyper's buffers. A peek, not readiness: a freshly accepted
    // socket can be reported readable before any byte has come (the idle
    // connections of an attack would each get hyper's buffers), and a peek
    // that finds nothing waits again.
    let mut byte = [0u8; 1];
    let first_byte = tokio::time::timeout(limits.header_read_timeout, peek(&stream, &mut byte));
    let readable = tokio::select! {
        peeked = first_byte => matches!(peeked, Ok(Ok(1))),
        () = slot.evicted.cancelled() => false,
        () = shutdown.cancelled() => false,
    };
    if !readable {
        return table.release(&slot);
    }
    // The router, marking the connection busy while a request is served,
    // including while its body (a stream) is being sent.
    let busy_slot = slot.clone();
    let first = std::cell::Cell::new(true);
    // The socket's reads when the request before was made: a request with
    // none since came with it or behind it, pipelined.
    let reads_before = std::cell::Cell::new(0);
    let service = hyper::service::service_fn(move |request: Request<Incoming>| -> Answer {
        let (router, busy_slot) = (router.clone(), busy_slot.clone());
        let shortcut = shortcut.clone();
        let handlers = (!first.replace(false)).then(|| handlers.clone());
        let reads = busy_slot.reads.load(Ordering::Relaxed);
        let pipelined = reads_before.replace(reads) == reads;
        Box::pin(async move {
            // Idle (evictable) while a body it announced is read: no route
            // takes one, and clients that trickle bodies must not hold the
            // places a probe needs. Busy (not evictable) from its turn to the
            // end of its answer, unless its write stalls.
            let mut request = match without_body(request).await {
                Ok(request) => request,
                Err(refusal) => return Ok(refusal),
            };
            // A lone Lease's `GET /leader` (the route collectors poll) read
            // off the socket is answered at once: made in microseconds, it
            // waits for nothing, and the queue below cost it a quarter of
            // its throughput (docs/BENCHMARKS.md). One pipelined (no read
            // since the request before) takes its turn like any other,
            // so that clients pipelining it cannot hold a probe for the
            // 16 answers hyper makes per poll of each connection.
            let answer_now =
                |request: &Request<Body>| shortcut.as_ref().and_then(|answer| answer(request));
            if !pipelined && let Some(response) = answer_now(&request) {
                return Ok(tracked(response, Busy::new(busy_slot)));
            }
            request
                .extensions_mut()
                .insert(ReadClosed(busy_slot.read_closed.clone()));
            request.extensions_mut().insert(peer);
            let busy = Busy::new(busy_slot.clone());
            // A connection's first request is answered at once (a probe's
            // only one); every later one takes its turn in a fair queue,
            // behind every other connection's, and idle (evictable) while
            // it waits. With its turn it also lets the runtime look at the
            // sockets first (a yield waits for the next poll of the I/O
            // driver), so a newcomer is accepted and answered between two
            // such answers.
            let (busy, permit) = match &handlers {
                Some(handlers) => {
                    drop(busy);
                    let permit = handlers.acquire().await;
                    tokio::task::yield_now().await;
                    (Busy::new(busy_slot), Some(permit))
                }
                None => (busy, None),
            };
            // Judged after its turn, never before it.
            let response = match answer_now(&request) {
                Some(response) => response,
                None => router.oneshot(request).await?,
            };
            drop(permit);
            Ok(tracked(response, busy))
        })
    });
    let stream = Arc::new(stream);
    let io = TokioIo::new(WriteTimeout::new(
        stream.clone(),
        limits.write_timeout,
        slot.clone(),
        table.epoch,
    ));
    let mut connection = shared.http.serve_connection(io, service);
    let mut stopping = false;
    let finished = loop {
        tokio::select! {
            _ = std::future::poll_fn(|cx| connection.poll_without_shutdown(cx)) => break true,
            () = slot.evicted.cancelled() => break false,
            () = shutdown.cancelled(), if !stopping => {
                Pin::new(&mut connection).graceful_shutdown();
                stopping = true;
            }
            () = client_closed(&stream), if !slot.read_closed.is_cancelled() => {
                slot.read_closed.cancel();
            }
        }
    };
    drop(connection);
    if finished {
        linger(&stream, &slot.evicted, &shutdown).await;
    }
    table.release(&slot);
}

/// `response`, with the connection kept busy (not evictable) until its
/// body has been sent.
fn tracked(response: Response, busy: Busy) -> Response {
    response.map(|body| Body::new(Tracked { body, _busy: busy }))
}

/// Reads and drops a request's body, if any: 413 when it is larger than
/// [`MAX_BODY`], 400 when it is malformed or does not arrive whole within
/// [`BODY_READ_TIMEOUT`] (both close the connection).
async fn without_body(request: Request<Incoming>) -> Result<Request<Body>, Response> {
    let (parts, body) = request.into_parts();
    let refuse = |status: StatusCode| {
        let mut response = status.into_response();
        response
            .headers_mut()
            .insert(CONNECTION, HeaderValue::from_static("close"));
        response
            .headers_mut()
            .insert(CONTENT_LENGTH, HeaderValue::from_static("0"));
        response
    };
    if !hyper::body::Body::is_end_stream(&body) {
        if hyper::body::Body::size_hint(&body).lower() > MAX_BODY {
            return Err(refuse(StatusCode::PAYLOAD_TOO_LARGE));
        }
        let read = Limited::new(body, MAX_BODY as usize).collect();
        match tokio::time::timeout(BODY_READ_TIMEOUT, read).await {
            Ok(Ok(_)) => {}
            Ok(Err(error)) if error.is::<http_body_util::LengthLimitError>() => {
                return Err(refuse(StatusCode::PAYLOAD_TOO_LARGE));
            }
            Ok(Err(_)) | Err(_) => return Err(refuse(StatusCode::BAD_REQUEST)),
        }
    }
    Ok(Request::from_parts(parts, Body::empty()))
}

/// Resolves once the client has closed its sending side (its FIN arrived),
/// whether or not hyper has read up to it: hyper does not read while it
/// answers a request from a client that may have only half-closed. Input
/// that waits unread is hyper's to read (and its readiness hyper's to
/// clear), so then this only looks again a little later.
async fn client_closed(stream: &Stream) {
    // From 100 ms, doubling to a second while input stays unread (a client
    // pipelining requests it does not read the answers of).
    let mut again = Duration::from_millis(100);
    loop {
        match stream.ready(Interest::READABLE).await {
            Ok(ready) if ready.is_read_closed() => return,
            Ok(_) => {
                tokio::time::sleep(again).await;
                again = (again * 2).min(Duration::from_secs(1));
            }
            Err(_) => std::future::pending().await,
        }
    }
}

/// Shuts the socket's sending side (a FIN after what was written).
fn shutdown_write(stream: &impl AsRawFd) -> io::Result<()> {
    // SAFETY: shutdown(2) on a socket we own.
    if unsafe { libc::shutdown(stream.as_raw_fd(), libc::SHUT_WR) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Closes the connection's sending side and drops what the client still
/// sends (a body that was not read, pipelined requests) until it closes
/// too, for at most [`LINGER`] and [`LINGER_BYTES`]: closing a socket with
/// unread input sends a reset, which may destroy the answer in flight.
async fn linger(stream: &Stream, evicted: &CancellationToken, shutdown: &CancellationToken) {
    if shutdown_write(stream).is_err() {
        return;
    }
    let drain = async {
        let mut buf = vec![0u8; 4096];
        let mut left = LINGER_BYTES;
        while left > 0 {
            if stream.readable().await.is_err() {
                return;
            }
            match stream.try_read(&mut buf) {
                Ok(0) => return,
                Ok(n) => left = left.saturating_sub(n),
                Err(error) if error.kind() == io::ErrorKind::WouldBlock => {}
                Err(_) => return,
            }
        }
    };
    tokio::select! {
        _ = tokio::time::timeout(LINGER, drain) => {}
        () = evicted.cancelled() => {}
        () = shutdown.cancelled() => {}
    }
}

// === the connection table ===

/// One open connection.
#[derive(Default)]
struct Slot {
    /// Its key in the table: the order of admission.
    id: u64,
    /// Requests in progress on it (from their turn to the end of their answer).
    busy: AtomicUsize,
    /// Since when its pending write has waited (microseconds since the
    /// table's epoch, plus one); 0 while no write waits.
    stalled_since: AtomicU64,
    evicted: CancellationToken,
    /// The client closed its sending side.
    read_closed: CancellationToken,
    /// Reads off the socket that brought bytes: a request made with no read
    /// since the one before it was in hyper's buffer already (pipelined).
    reads: AtomicU64,
}

struct Table {
    /// Open connections by order of admission (oldest first), and the next id.
    open: Mutex<(BTreeMap<u64, Arc<Slot>>, u64)>,
    epoch: Instant,
}

impl Default for Table {
    fn default() -> Self {
        Self {
            open: Mutex::default(),
            epoch: Instant::now(),
        }
    }
}

impl Table {
    /// A slot for a new connection. When full, the connection whose write
    /// has waited longest is evicted, else the oldest idle one; `None` when
    /// every open connection is serving a request whose answer flows.
    fn admit(&self, max: usize) -> Option<Arc<Slot>> {
        let mut guard = self.open.lock().expect("connection table");
        let (open, next_id) = &mut *guard;
        if open.len() >= max {
            let stalled = open
                .iter()
                .map(|(id, slot)| (slot.stalled_since.load(Ordering::Relaxed), *id))
                .filter(|(since, _)| *since != 0)
                .min()
                .map(|(_, id)| id);
            let idle = || {
                open.iter()
                    .find(|(_, slot)| slot.busy.load(Ordering::Relaxed) == 0)
                    .map(|(id, _)| *id)
            };
            let victim = stalled.or_else(idle)?;
            let evicted = open.remove(&victim).expect("a key in the table");
            evicted.evicted.cancel();
        }
        let slot = Arc::new(Slot {
            id: *next_id,
            ..Slot::default()
        });
        *next_id += 1;
        open.insert(slot.id, slot.clone());
        Some(slot)
    }

    /// Forgets a closed connection at once: a slot left behind would also
    /// pin its page of the heap, keeping the memory of a burst of
    /// connections resident after they are gone.
    fn release(&self, slot: &Slot) {
        self.open
            .lock()
            .expect("connection table")
            .0
            .remove(&slot.id);
    }
}

impl Slot {
    fn stalled(&self, since: Option<Instant>, epoch: Instant) {
        let mark = since.map_or(0, |at| {
            u64::try_from(at.saturating_duration_since(epoch).as_micros()).unwrap_or(u64::MAX - 1)
                + 1
        });
        self.stalled_since.store(mark, Ordering::Relaxed);
    }
}

/// Marks a slot busy for as long as it lives.
struct Busy(Arc<Slot>);

impl Busy {
    fn new(slot: Arc<Slot>) -> Self {
        slot.busy.fetch_add(1, Ordering::Relaxed);
        Self(slot)
    }
}

impl Drop for Busy {
    fn drop(&mut self) {
        self.0.busy.fetch_sub(1, Ordering::Relaxed);
    }
}

/// A response body that keeps its connection marked busy until it is sent.
struct Tracked {
    body: Body,
    _busy: Busy,
}

impl hyper::body::Body for Tracked {
    type Data = hyper::body::Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

// === the write timeout ===

/// A socket whose writes fail once one has been pending for `limit`; while
/// one is pending, its slot says since when (the eviction order). It shares
/// the socket with the connection's [`client_closed`] watch.
struct WriteTimeout {
    stream: Arc<Stream>,
    limit: Duration,
    slot: Arc<Slot>,
    /// The table's, from which stalls are counted.
    epoch: Instant,
    /// Armed while a write is pending.
    stalled: Option<(Instant, Pin<Box<Sleep>>)>,
}

impl WriteTimeout {
    fn new(stream: Arc<Stream>, limit: Duration, slot: Arc<Slot>, epoch: Instant) -> Self {
        Self {
            stream,
            limit,
            slot,
            epoch,
            stalled: None,
        }
    }

    fn poll_progress<T>(
        &mut self,
        cx: &mut Context<'_>,
        result: Poll<io::Result<T>>,
    ) -> Poll<io::Result<T>> {
        if result.is_ready() {
            if self.stalled.take().is_some() {
                self.slot.stalled(None, self.epoch);
            }
            return result;
        }
        if self.stalled.is_none() {
            let now = Instant::now();
            self.slot.stalled(Some(now), self.epoch);
            self.stalled = Some((now, Box::pin(tokio::time::sleep_until(now + self.limit))));
        }
        let (_, timer) = self.stalled.as_mut().expect("armed above");
        ready!(timer.as_mut().poll(cx));
        Poll::Ready(Err(io::Error::new(
            io::ErrorKind::TimedOut,
            "the client accepted nothing for the write timeout",
        )))
    }
}

impl AsyncRead for WriteTimeout {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        loop {
            ready!(self.stream.poll_read_ready(cx))?;
            match recv_into(&self.stream, buf, 0) {
                Err(error) if error.kind() == io::ErrorKind::WouldBlock => continue,
                result => {
                    if matches!(result, Ok(n) if n > 0) {
                        self.slot.reads.fetch_add(1, Ordering::Relaxed);
                    }
                    return Poll::Ready(result.map(drop));
                }
            }
        }
    }
}

/// One recv(2) with `flags` into the unfilled part of `buf`, as it is: hyper
/// reads into an 8 KiB buffer per connection that a request head barely
/// starts to fill, and zeroing it first (`ReadBuf::initialize_unfilled`)
/// would make the whole of it resident, 4 KiB more per open connection (an
/// `/events` subscriber holds its connection's buffer for as long as it
/// stays). `Ok(0)` at the end of the stream.
fn recv_into(stream: &Stream, buf: &mut ReadBuf<'_>, flags: libc::c_int) -> io::Result<usize> {
    // SAFETY: the bytes are only written, by recv(2), never de-initialized.
    let unfilled = unsafe { buf.unfilled_mut() };
    let n = stream.try_io(Interest::READABLE, || {
        // SAFETY: recv(2) into the unfilled part, of the length given, on
        // a socket we own.
        let n = unsafe {
            libc::recv(
                stream.as_raw_fd(),
                unfilled.as_mut_ptr().cast(),
                unfilled.len(),
                flags,
            )
        };
        usize::try_from(n).map_err(|_| io::Error::last_os_error())
    })?;
    // SAFETY: recv(2) wrote the first `n` bytes of the unfilled part.
    unsafe { buf.assume_init(n) };
    buf.advance(n);
    Ok(n)
}

impl AsyncWrite for WriteTimeout {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let result = poll_write_with(&self.stream, cx, |stream| stream.try_write(buf));
        self.poll_progress(cx, result)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let result = poll_write_with(&self.stream, cx, |stream| stream.try_write_vectored(bufs));
        self.poll_progress(cx, result)
    }

    fn is_write_vectored(&self) -> bool {
        true
    }

    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(())) // a socket buffers nothing of its own
    }

    fn poll_shutdown(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(shutdown_write(&self.stream))
    }
}

/// One write through a shared socket, waiting for it to accept one.
fn poll_write_with(
    stream: &Stream,
    cx: &mut Context<'_>,
    mut write: impl FnMut(&Stream) -> io::Result<usize>,
) -> Poll<io::Result<usize>> {
    loop {
        ready!(stream.poll_write_ready(cx))?;
        match write(stream) {
            Err(error) if error.kind() == io::ErrorKind::WouldBlock => continue,
            result => return Poll::Ready(result),
        }
    }
}

// === the sockets served ===

/// An accepted socket, TCP or Unix, as one type rather than a type
/// parameter: hyper's connection code, most of the server's, is then
/// compiled once and not once per kind of socket (the binary's code pages
/// are most of the sidecar's resident memory).
enum Stream {
    Tcp(TcpStream),
    Unix(UnixStream),
}

/// `$body` with `$s` bound to the socket, whichever its kind.
macro_rules! either {
    ($stream:expr, $s:ident => $body:expr) => {
        match $stream {
            Stream::Tcp($s) => $body,
            Stream::Unix($s) => $body,
        }
    };
}

impl Stream {
    fn poll_read_ready(&self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        either!(self, s => s.poll_read_ready(cx))
    }

    fn poll_write_ready(&self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        either!(self, s => s.poll_write_ready(cx))
    }

    fn try_read(&self, buf: &mut [u8]) -> io::Result<usize> {
        either!(self, s => s.try_read(buf))
    }

    fn try_write(&self, buf: &[u8]) -> io::Result<usize> {
        either!(self, s => s.try_write(buf))
    }

    fn try_write_vectored(&self, bufs: &[io::IoSlice<'_>]) -> io::Result<usize> {
        either!(self, s => s.try_write_vectored(bufs))
    }

    async fn ready(&self, interest: Interest) -> io::Result<Ready> {
        either!(self, s => s.ready(interest).await)
    }

    async fn readable(&self) -> io::Result<()> {
        either!(self, s => s.readable().await)
    }

    fn try_io<R>(&self, interest: Interest, f: impl FnOnce() -> io::Result<R>) -> io::Result<R> {
        either!(self, s => s.try_io(interest, f))
    }
}

impl AsRawFd for Stream {
    fn as_raw_fd(&self) -> RawFd {
        either!(self, s => s.as_raw_fd())
    }
}

/// Waits until at least one byte can be read and copies it to `buf`
/// without consuming it (`MSG_PEEK`: Unix streams have no `peek` of their
/// own). Resolves `Ok(0)` at the end of the stream.
async fn peek(stream: &Stream, buf: &mut [u8]) -> io::Result<usize> {
    loop {
        stream.readable().await?;
        match recv_into(stream, &mut ReadBuf::new(buf), libc::MSG_PEEK) {
            Err(error) if error.kind() == io::ErrorKind::WouldBlock => continue,
            result => return result,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn full(table: &Table, n: usize) -> Vec<Arc<Slot>> {
        (0..n).map(|_| table.admit(n).expect("room")).collect()
    }

    #[test]
    fn a_full_table_evicts_the_longest_write_stalled_then_the_oldest_idle() {
        let table = Table::default();
        let slots = full(&table, 4);
        for slot in &slots {
            slot.busy.fetch_add(1, Ordering::Relaxed);
        }
        let now = Instant::now();
        // Busy ones whose writes wait: the one waiting longest goes first,
        // even though an older one is merely busy.
        slots[1].stalled(Some(now + Duration::from_millis(5)), table.epoch);
        slots[2].stalled(Some(now), table.epoch);
        assert!(table.admit(4).is_some());
        assert!(slots[2].evicted.is_cancelled(), "the longest stalled");
        assert!(!slots[0].evicted.is_cancelled() && !slots[1].evicted.is_cancelled());
        // No write waits any more: the oldest idle one goes.
        for slot in &slots {
            slot.stalled(None, table.epoch);
        }
        slots[1].busy.fetch_sub(1, Ordering::Relaxed);
        assert!(table.admit(4).is_some());
        assert!(slots[1].evicted.is_cancelled());
        assert!(!slots[0].evicted.is_cancelled());
    }

    #[test]
    fn a_newcomer_is_refused_only_when_every_answer_flows() {
        let table = Table::default();
        let slots = full(&table, 2);
        for slot in &slots {
            slot.busy.fetch_add(1, Ordering::Relaxed);
        }
        assert!(table.admit(2).is_none());
        slots[1].stalled(Some(Instant::now()), table.epoch);
        assert!(table.admit(2).is_some());
        assert!(slots[1].evicted.is_cancelled() && !slots[0].evicted.is_cancelled());
    }
}
