//! The HTTP server under the routers, and the limits that keep it standing
//! when clients misbehave: both listeners are reachable by others (the admin
//! one by every pod in the cluster), and `/leader` must stay fast while
//! someone tries to exhaust memory, file descriptors or subscriber slots.
//!
//! - **Header read timeout**: a request's head must arrive within it, and an
//!   idle keep-alive connection is closed after it too (hyper runs the same
//!   timer while waiting for the next request).
//! - **Header size**: heads larger than [`Limits::max_header_bytes`] get 431.
//! - **Connection cap with eviction**: at most [`Limits::max_connections`]
//!   open per listener; when full, the oldest connection that is not serving
//!   a request or a stream is closed to make room, so a legitimate probe
//!   (which sends its request at once) always gets in; only when every
//!   connection is busy is the newcomer refused.
//! - **Write timeout**: a connection whose socket accepts nothing for
//!   [`Limits::write_timeout`] is closed, so a stalled `/events` subscriber
//!   frees its slot.

use std::collections::VecDeque;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, ready};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::Request;
use std::convert::Infallible;

use hyper::body::{Frame, Incoming, SizeHint};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
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

/// Serves `router` on `listener` until `shutdown`, then lets open requests
/// finish (event streams end on the same token).
pub async fn serve(
    listener: TcpListener,
    router: Router,
    shutdown: CancellationToken,
    limits: Limits,
) -> std::io::Result<()> {
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(limits.header_read_timeout)
        .max_header_size(limits.max_header_bytes)
        .max_buf_size(limits.max_header_bytes.max(8192));
    let table = Arc::new(Table::default());
    let mut connections = JoinSet::new();
    loop {
        let (stream, _) = tokio::select! {
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
            drop(stream); // every connection is busy: refuse this one
            continue;
        };
        let _ = stream.set_nodelay(true);
        let header_read_timeout = limits.header_read_timeout;
        // The router, marking the connection busy while a request is served,
        // including while its body (a stream) is being sent.
        let (router, busy_slot) = (router.clone(), slot.clone());
        let service = hyper::service::service_fn(move |request: Request<Incoming>| {
            let (router, busy) = (router.clone(), Busy::new(busy_slot.clone()));
            async move {
                let response = router.oneshot(request.map(Body::new)).await?;
                Ok::<_, Infallible>(response.map(|body| Body::new(Tracked { body, _busy: busy })))
            }
        });
        let (http, shutdown) = (http.clone(), shutdown.clone());
        connections.spawn(async move {
            // Until the first byte, a connection costs a socket and this
            // small task, not hyper's buffers.
            let first_byte = tokio::time::timeout(header_read_timeout, stream.readable());
            let readable = tokio::select! {
                readable = first_byte => matches!(readable, Ok(Ok(()))),
                () = slot.evicted.cancelled() => false,
                () = shutdown.cancelled() => false,
            };
            if !readable {
                return slot.close();
            }
            let io = TokioIo::new(WriteTimeout::new(stream, limits.write_timeout));
            let connection = http.serve_connection(io, service);
            let mut connection = std::pin::pin!(connection);
            tokio::select! {
                _ = connection.as_mut() => {}
                () = slot.evicted.cancelled() => {}
                () = shutdown.cancelled() => {
                    connection.as_mut().graceful_shutdown();
                    let _ = connection.await;
                }
            }
            slot.close();
        });
    }
    drop(listener);
    while connections.join_next().await.is_some() {}
    Ok(())
}

// === the connection table ===

/// One open connection.
#[derive(Default)]
struct Slot {
    /// Requests (or their bodies) in progress on it.
    busy: AtomicUsize,
    evicted: CancellationToken,
    closed: AtomicBool,
}

#[derive(Default)]
struct Table {
    /// Open connections, oldest first.
    open: Mutex<VecDeque<Arc<Slot>>>,
}

impl Table {
    /// A slot for a new connection, evicting the oldest idle one if full;
    /// `None` when every open connection is busy.
    fn admit(&self, max: usize) -> Option<Arc<Slot>> {
        let mut open = self.open.lock().expect("connection table");
        open.retain(|slot| !slot.closed.load(Ordering::Relaxed));
        if open.len() >= max {
            let idle = open
                .iter()
                .position(|slot| slot.busy.load(Ordering::Relaxed) == 0)?;
            let evicted = open.remove(idle).expect("an index in range");
            evicted.evicted.cancel();
        }
        let slot = Arc::new(Slot::default());
        open.push_back(slot.clone());
        Some(slot)
    }
}

impl Slot {
    fn close(&self) {
        self.closed.store(true, Ordering::Relaxed);
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

/// A socket whose writes fail once one has been pending for `limit`.
struct WriteTimeout {
    stream: TcpStream,
    limit: Duration,
    /// Armed while a write is pending.
    stalled: Option<Pin<Box<Sleep>>>,
}

impl WriteTimeout {
    fn new(stream: TcpStream, limit: Duration) -> Self {
        Self {
            stream,
            limit,
            stalled: None,
        }
    }

    fn poll_progress<T>(
        &mut self,
        cx: &mut Context<'_>,
        result: Poll<std::io::Result<T>>,
    ) -> Poll<std::io::Result<T>> {
        if result.is_ready() {
            self.stalled = None;
            return result;
        }
        let limit = self.limit;
        let stalled = self
            .stalled
            .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(Instant::now() + limit)));
        ready!(stalled.as_mut().poll(cx));
        Poll::Ready(Err(std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            "the client accepted nothing for the write timeout",
        )))
    }
}

impl AsyncRead for WriteTimeout {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.stream).poll_read(cx, buf)
    }
}

impl AsyncWrite for WriteTimeout {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let result = Pin::new(&mut self.stream).poll_write(cx, buf);
        self.poll_progress(cx, result)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        let result = Pin::new(&mut self.stream).poll_flush(cx);
        self.poll_progress(cx, result)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }
}
