//! The HTTP/1.1 server under the routers, and the limits that keep it
//! standing when clients misbehave: both listeners are reachable by others
//! (the admin one by every pod in the cluster), and `/leader` must stay fast
//! while someone tries to exhaust memory, file descriptors or subscriber
//! slots.
//!
//! - **Header read timeout**: a request's head must arrive within it, and an
//!   idle keep-alive connection is closed after it too.
//! - **Header size**: heads larger than [`Limits::max_header_bytes`] get 431.
//! - **Connection cap with eviction**: at most [`Limits::max_connections`]
//!   open per listener; when full, the oldest connection that is not serving
//!   a request or a stream is closed to make room, so a legitimate probe
//!   (which sends its request at once) always gets in; only when every
//!   connection is busy is the newcomer refused.
//! - **Write timeout**: a connection whose socket accepts nothing for
//!   [`Limits::write_timeout`] is closed, so a stalled `/events` subscriber
//!   frees its slot.
//!
//! It is small on purpose, and it owns its buffers: a connection holds no
//! buffer until its first byte arrives; a head is read into a buffer that
//! starts at 1 KiB and may grow to the head limit; a response is written
//! with one `write` where it can be; and a streaming response (`/events`)
//! keeps no buffer between its events, so an open stream costs its task and
//! the stream's own state (a few KiB), not two 8 KiB buffers. Requests with
//! a body (none of the routes takes one) are answered and the connection is
//! then closed, rather than reading a body nobody wants.

use std::collections::BTreeMap;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::Router;
use axum::body::{Body, HttpBody};
use axum::http::header::{CONNECTION, CONTENT_LENGTH, TRANSFER_ENCODING};
use axum::http::{HeaderMap, HeaderName, HeaderValue, Method, Request, StatusCode, Uri, Version};
use axum::response::Response;
use futures::FutureExt;
use http_body_util::BodyExt;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinSet;
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
) -> io::Result<()> {
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
        let connection = Connection {
            stream,
            input: Vec::new(),
            output: Vec::new(),
            read_closed: false,
            limits,
        };
        connections.spawn(connection.run(router.clone(), table.clone(), slot, shutdown.clone()));
    }
    drop(listener);
    while connections.join_next().await.is_some() {}
    Ok(())
}

// === one connection ===

/// Request heads with more header lines than this get 431 (hyper's default).
const MAX_HEADERS: usize = 100;
/// A head is read in steps of at least this much.
const READ_STEP: usize = 1024;
/// A keep-alive connection keeps at most this much output buffer between
/// requests.
const KEEP_OUTPUT: usize = 4096;

struct Connection {
    stream: TcpStream,
    /// Bytes read and not yet used: a head in progress, or pipelined requests.
    input: Vec<u8>,
    /// The response (or the part of a stream) being written.
    output: Vec<u8>,
    /// The client closed its side.
    read_closed: bool,
    limits: Limits,
}

/// A parsed request head and what it says about the connection.
struct Head {
    request: Request<Body>,
    /// The connection may serve another request after this one.
    keep_alive: bool,
    /// HTTP/1.0: no chunked responses, keep-alive only when asked for.
    http10: bool,
}

enum HeadError {
    /// Closed, reset, or timed out: nothing to answer.
    Gone,
    TooLarge,
    Malformed,
}

/// What woke a streaming response.
enum Woke {
    Frame(Option<Result<hyper::body::Frame<hyper::body::Bytes>, axum::Error>>),
    Readable(io::Result<()>),
}

impl Connection {
    async fn run(
        mut self,
        router: Router,
        table: Arc<Table>,
        slot: Arc<Slot>,
        shutdown: CancellationToken,
    ) {
        // Made once, not per request: each registers with its token.
        let evicted = slot.evicted.cancelled();
        let stopped = shutdown.cancelled();
        tokio::pin!(evicted, stopped);
        loop {
            // Waiting for a request: idle, so evictable; the header read
            // timeout covers the whole wait and the head.
            let head = tokio::select! {
                head = tokio::time::timeout(self.limits.header_read_timeout, self.read_head()) => {
                    head.unwrap_or(Err(HeadError::Gone))
                }
                () = &mut evicted => Err(HeadError::Gone),
                () = &mut stopped => Err(HeadError::Gone),
            };
            let head = match head {
                Ok(head) => head,
                Err(HeadError::Gone) => break,
                Err(HeadError::TooLarge) => {
                    let _ = self
                        .error(StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE)
                        .await;
                    break;
                }
                Err(HeadError::Malformed) => {
                    let _ = self.error(StatusCode::BAD_REQUEST).await;
                    break;
                }
            };
            let busy = Busy::new(slot.clone());
            let head_only = head.request.method() == Method::HEAD;
            let response = match router.clone().oneshot(head.request).await {
                Ok(response) => response,
                Err(never) => match never {},
            };
            let keep_alive = self
                .respond(response, head_only, head.keep_alive, head.http10)
                .await
                .unwrap_or(false);
            drop(busy);
            if !keep_alive || shutdown.is_cancelled() {
                break;
            }
        }
        table.release(&slot);
    }

    /// Reads until a whole head is buffered, and parses it.
    async fn read_head(&mut self) -> Result<Head, HeadError> {
        loop {
            if !self.input.is_empty() {
                if let Some((head, len)) = parse(&self.input)? {
                    self.input.drain(..len);
                    return Ok(head);
                }
                if self.input.len() >= self.limits.max_header_bytes {
                    return Err(HeadError::TooLarge);
                }
            }
            if self.read_closed {
                return Err(HeadError::Gone);
            }
            self.read_some(self.limits.max_header_bytes)
                .await
                .map_err(|_| HeadError::Gone)?;
        }
    }

    /// One read of up to `limit - input.len()` bytes into `input`, waiting
    /// for the socket first: an idle connection holds no buffer.
    async fn read_some(&mut self, limit: usize) -> io::Result<()> {
        std::future::poll_fn(|cx| self.stream.poll_read_ready(cx)).await?;
        std::future::poll_fn(|cx| self.poll_read(cx, limit)).await
    }

    /// One read without waiting: whether it read something or the end.
    fn try_read(&mut self, limit: usize) -> io::Result<bool> {
        let waker = std::task::Waker::noop();
        match self.poll_read(&mut Context::from_waker(waker), limit) {
            Poll::Ready(result) => result.map(|()| true),
            Poll::Pending => Ok(false),
        }
    }

    /// A read through tokio's `poll_read`, which takes a short read as the
    /// end of what is buffered: no second `read` that would only say so.
    fn poll_read(&mut self, cx: &mut Context<'_>, limit: usize) -> Poll<io::Result<()>> {
        let len = self.input.len();
        let room = READ_STEP.max(self.input.capacity() - len);
        let want = room.min(limit.saturating_sub(len)).max(1);
        self.input.resize(len + want, 0);
        let mut buf = ReadBuf::new(&mut self.input[len..]);
        let polled = Pin::new(&mut self.stream).poll_read(cx, &mut buf);
        let n = match polled {
            Poll::Ready(Ok(())) => buf.filled().len(),
            _ => 0,
        };
        self.input.truncate(len + n);
        if matches!(polled, Poll::Ready(Ok(()))) && n == 0 {
            self.read_closed = true;
        }
        polled
    }

    /// Writes `response`; whether the connection may serve another request.
    async fn respond(
        &mut self,
        response: Response,
        head_only: bool,
        keep_alive: bool,
        http10: bool,
    ) -> io::Result<bool> {
        let (parts, mut body) = response.into_parts();
        let no_body = head_only
            || parts.status.is_informational()
            || parts.status == StatusCode::NO_CONTENT
            || parts.status == StatusCode::NOT_MODIFIED;
        let declared = parts
            .headers
            .get(CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
        let length = declared.or_else(|| body.size_hint().exact());
        // Without a length, a body is chunked (HTTP/1.1) or ends with the
        // connection (HTTP/1.0).
        let chunked = !no_body && length.is_none() && !http10;
        let keep_alive = keep_alive && (no_body || length.is_some() || chunked);

        let out = &mut self.output;
        out.clear();
        out.extend_from_slice(b"HTTP/1.1 ");
        out.extend_from_slice(parts.status.as_str().as_bytes());
        out.push(b' ');
        out.extend_from_slice(
            parts
                .status
                .canonical_reason()
                .unwrap_or("Unknown")
                .as_bytes(),
        );
        out.extend_from_slice(b"\r\n");
        for (name, value) in &parts.headers {
            if name == CONNECTION || name == TRANSFER_ENCODING {
                continue;
            }
            header_line(out, name.as_str().as_bytes(), value.as_bytes());
        }
        if declared.is_none()
            && let Some(length) = length.filter(|_| !parts.status.is_informational())
        {
            header_line(
                out,
                b"content-length",
                itoa::Buffer::new().format(length).as_bytes(),
            );
        }
        if chunked {
            header_line(out, b"transfer-encoding", b"chunked");
        }
        if !keep_alive {
            header_line(out, b"connection", b"close");
        } else if http10 {
            header_line(out, b"connection", b"keep-alive");
        }
        date::header(out);
        out.extend_from_slice(b"\r\n");
        // Not held for the life of a stream.
        drop(parts);

        if no_body {
            self.flush().await?;
            return Ok(keep_alive);
        }
        match length {
            // A body of known length: with the head, in one write.
            Some(length) => {
                let mut written = 0u64;
                while let Some(frame) = body.frame().await {
                    let frame = frame.map_err(io::Error::other)?;
                    if let Some(data) = frame.data_ref() {
                        written += data.len() as u64;
                        if written > length {
                            return Err(io::Error::other("the body is longer than its length"));
                        }
                        self.output.extend_from_slice(data);
                        if self.output.len() >= 64 * 1024 {
                            self.flush().await?;
                        }
                    }
                }
                self.flush().await?;
                Ok(keep_alive && written == length)
            }
            None => {
                self.flush().await?;
                self.stream_body(body, chunked).await?;
                Ok(keep_alive)
            }
        }
    }

    /// A body of unknown length (an event stream), as its frames come: each
    /// batch of ready frames in one write, no buffer kept in between. Ends
    /// when the body does or the client closes its side.
    async fn stream_body(&mut self, mut body: Body, chunked: bool) -> io::Result<()> {
        self.output = Vec::new();
        if self.input.is_empty() {
            self.input = Vec::new();
        }
        loop {
            // Bytes the client sends meanwhile are kept (up to the head
            // limit) for the next request; a close ends the stream.
            let watch_reads = !self.read_closed && self.input.len() < self.limits.max_header_bytes;
            // Polled by hand: no future to make and drop per event.
            let woke = std::future::poll_fn(|cx| {
                if let Poll::Ready(frame) = Pin::new(&mut body).poll_frame(cx) {
                    return Poll::Ready(Woke::Frame(frame));
                }
                if watch_reads && let Poll::Ready(ready) = self.stream.poll_read_ready(cx) {
                    return Poll::Ready(Woke::Readable(ready));
                }
                Poll::Pending
            })
            .await;
            let mut frame = match woke {
                Woke::Readable(readable) => {
                    readable?;
                    self.try_read(self.limits.max_header_bytes)?;
                    if self.input.is_empty() {
                        self.input = Vec::new();
                    }
                    if self.read_closed {
                        return Err(io::ErrorKind::ConnectionAborted.into());
                    }
                    continue;
                }
                Woke::Frame(frame) => frame,
            };
            // This frame and every other one ready now, in one write.
            let mut ended = false;
            loop {
                match frame {
                    None => {
                        ended = true;
                        break;
                    }
                    Some(Err(error)) => return Err(io::Error::other(error)),
                    Some(Ok(frame)) => {
                        if let Some(data) = frame.data_ref().filter(|d| !d.is_empty()) {
                            if chunked {
                                let mut size = [0u8; 16];
                                self.output.extend_from_slice(hex(data.len(), &mut size));
                                self.output.extend_from_slice(b"\r\n");
                                self.output.extend_from_slice(data);
                                self.output.extend_from_slice(b"\r\n");
                            } else {
                                self.output.extend_from_slice(data);
                            }
                        }
                    }
                }
                match body.frame().now_or_never() {
                    Some(next) => frame = next,
                    None => break,
                }
            }
            if ended && chunked {
                self.output.extend_from_slice(b"0\r\n\r\n");
            }
            self.flush().await?;
            self.output = Vec::new();
            if ended {
                return Ok(());
            }
        }
    }

    /// A bodiless error answer; the connection closes after it.
    async fn error(&mut self, status: StatusCode) -> io::Result<()> {
        let out = &mut self.output;
        out.clear();
        out.extend_from_slice(b"HTTP/1.1 ");
        out.extend_from_slice(status.as_str().as_bytes());
        out.push(b' ');
        out.extend_from_slice(status.canonical_reason().unwrap_or("").as_bytes());
        out.extend_from_slice(b"\r\ncontent-length: 0\r\nconnection: close\r\n");
        date::header(out);
        out.extend_from_slice(b"\r\n");
        self.flush().await
    }

    /// Writes all of `output`, failing once the socket has accepted nothing
    /// for the write timeout; keeps a small buffer for the next response.
    async fn flush(&mut self) -> io::Result<()> {
        let mut at = 0;
        while at < self.output.len() {
            let write = std::future::poll_fn(|cx| {
                Pin::new(&mut self.stream).poll_write(cx, &self.output[at..])
            });
            // The timer is armed only if the write has to wait.
            match write.now_or_never() {
                Some(Ok(0)) => return Err(io::ErrorKind::WriteZero.into()),
                Some(written) => at += written?,
                None => {
                    let write = std::future::poll_fn(|cx| {
                        Pin::new(&mut self.stream).poll_write(cx, &self.output[at..])
                    });
                    at += tokio::time::timeout(self.limits.write_timeout, write)
                        .await
                        .map_err(|_| {
                            io::Error::new(
                                io::ErrorKind::TimedOut,
                                "the client accepted nothing for the write timeout",
                            )
                        })??;
                }
            }
        }
        self.output.clear();
        if self.output.capacity() > KEEP_OUTPUT {
            self.output = Vec::new();
        }
        Ok(())
    }
}

fn header_line(out: &mut Vec<u8>, name: &[u8], value: &[u8]) {
    out.extend_from_slice(name);
    out.extend_from_slice(b": ");
    out.extend_from_slice(value);
    out.extend_from_slice(b"\r\n");
}

/// `n` in lower-case hex, in `buf`.
fn hex(mut n: usize, buf: &mut [u8; 16]) -> &[u8] {
    let mut at = buf.len();
    loop {
        at -= 1;
        buf[at] = b"0123456789abcdef"[n & 15];
        n >>= 4;
        if n == 0 {
            return &buf[at..];
        }
    }
}

/// Parses a complete head at the start of `input`: the request and the
/// head's length; `None` while incomplete.
fn parse(input: &[u8]) -> Result<Option<(Head, usize)>, HeadError> {
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut parsed = httparse::Request::new(&mut headers);
    let len = match parsed.parse(input) {
        Ok(httparse::Status::Complete(len)) => len,
        Ok(httparse::Status::Partial) => return Ok(None),
        Err(httparse::Error::TooManyHeaders) => return Err(HeadError::TooLarge),
        Err(_) => return Err(HeadError::Malformed),
    };
    let (Some(method), Some(path), Some(minor)) = (parsed.method, parsed.path, parsed.version)
    else {
        return Err(HeadError::Malformed);
    };
    let method = Method::from_bytes(method.as_bytes()).map_err(|_| HeadError::Malformed)?;
    let uri = Uri::try_from(path).map_err(|_| HeadError::Malformed)?;
    let http10 = minor == 0;
    let mut map = HeaderMap::with_capacity(parsed.headers.len());
    let (mut close, mut keep_alive_asked, mut has_body) = (false, false, false);
    let mut content_length = None;
    for header in parsed.headers.iter() {
        let name =
            HeaderName::from_bytes(header.name.as_bytes()).map_err(|_| HeadError::Malformed)?;
        let value = HeaderValue::from_bytes(header.value).map_err(|_| HeadError::Malformed)?;
        if name == CONNECTION {
            for token in header.value.split(|b| *b == b',') {
                let token = token.trim_ascii();
                close |= token.eq_ignore_ascii_case(b"close");
                keep_alive_asked |= token.eq_ignore_ascii_case(b"keep-alive");
            }
        } else if name == TRANSFER_ENCODING {
            has_body = true;
        } else if name == CONTENT_LENGTH {
            let n: u64 = std::str::from_utf8(header.value)
                .ok()
                .and_then(|v| v.trim().parse().ok())
                .ok_or(HeadError::Malformed)?;
            // Several lengths must agree.
            if content_length.is_some_and(|m| m != n) {
                return Err(HeadError::Malformed);
            }
            content_length = Some(n);
            has_body |= n > 0;
        }
        map.append(name, value);
    }
    let mut request = Request::new(Body::empty());
    *request.method_mut() = method;
    *request.uri_mut() = uri;
    *request.version_mut() = if http10 {
        Version::HTTP_10
    } else {
        Version::HTTP_11
    };
    *request.headers_mut() = map;
    // A body is not read: answer, then close rather than resynchronise.
    let keep_alive = !close && !has_body && (!http10 || keep_alive_asked);
    Ok(Some((
        Head {
            request,
            keep_alive,
            http10,
        },
        len,
    )))
}

/// The `date` header, formatted once a second.
mod date {
    use std::cell::RefCell;
    use std::time::{SystemTime, UNIX_EPOCH};

    thread_local! {
        static CACHED: RefCell<(u64, String)> = const { RefCell::new((u64::MAX, String::new())) };
    }

    pub fn header(out: &mut Vec<u8>) {
        let now = SystemTime::now();
        let second = now.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
        CACHED.with_borrow_mut(|(at, text)| {
            if *at != second {
                *at = second;
                *text = httpdate::fmt_http_date(now);
            }
            out.extend_from_slice(b"date: ");
            out.extend_from_slice(text.as_bytes());
            out.extend_from_slice(b"\r\n");
        });
    }
}

// === the connection table ===

/// One open connection.
#[derive(Default)]
struct Slot {
    /// Its key in the table: the order of admission.
    id: u64,
    /// Requests (or their bodies) in progress on it.
    busy: AtomicUsize,
    evicted: CancellationToken,
}

#[derive(Default)]
struct Table {
    /// Open connections by order of admission (oldest first), and the next id.
    open: Mutex<(BTreeMap<u64, Arc<Slot>>, u64)>,
}

impl Table {
    /// A slot for a new connection, evicting the oldest idle one if full;
    /// `None` when every open connection is busy.
    fn admit(&self, max: usize) -> Option<Arc<Slot>> {
        let mut guard = self.open.lock().expect("connection table");
        let (open, next_id) = &mut *guard;
        if open.len() >= max {
            let idle = open
                .iter()
                .find(|(_, slot)| slot.busy.load(Ordering::Relaxed) == 0)
                .map(|(id, _)| *id)?;
            let evicted = open.remove(&idle).expect("a key in the table");
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

#[cfg(test)]
mod tests {
    use super::*;

    fn head(text: &str) -> Result<Option<(Head, usize)>, HeadError> {
        parse(text.as_bytes())
    }

    #[test]
    fn heads_parse_with_keep_alive_by_version_and_connection() {
        let (h, len) = head("GET /leader HTTP/1.1\r\nHost: x\r\n\r\nGET /next")
            .ok()
            .flatten()
            .unwrap();
        assert_eq!(len, "GET /leader HTTP/1.1\r\nHost: x\r\n\r\n".len());
        assert_eq!(h.request.uri().path(), "/leader");
        assert!(h.keep_alive && !h.http10);
        let (h, _) = head("GET / HTTP/1.1\r\nConnection: Close\r\n\r\n")
            .ok()
            .flatten()
            .unwrap();
        assert!(!h.keep_alive);
        let (h, _) = head("GET / HTTP/1.0\r\n\r\n").ok().flatten().unwrap();
        assert!(!h.keep_alive && h.http10);
        let (h, _) = head("GET / HTTP/1.0\r\nConnection: keep-alive\r\n\r\n")
            .ok()
            .flatten()
            .unwrap();
        assert!(h.keep_alive && h.http10);
        // A request with a body is answered, then the connection closes.
        let (h, _) = head("GET / HTTP/1.1\r\nContent-Length: 3\r\n\r\nabc")
            .ok()
            .flatten()
            .unwrap();
        assert!(!h.keep_alive);
        let (h, _) = head("GET / HTTP/1.1\r\nContent-Length: 0\r\n\r\n")
            .ok()
            .flatten()
            .unwrap();
        assert!(h.keep_alive);
    }

    #[test]
    fn incomplete_malformed_and_crowded_heads_are_told_apart() {
        assert!(matches!(head("GET /leader HTTP/1.1\r\nHost"), Ok(None)));
        assert!(matches!(
            head("GET /leader HTTP/1.1\r\nHo st: x\r\n\r\n"),
            Err(HeadError::Malformed)
        ));
        assert!(matches!(
            head("GET / HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n"),
            Err(HeadError::Malformed)
        ));
        let crowded = format!(
            "GET / HTTP/1.1\r\n{}\r\n",
            "a: b\r\n".repeat(MAX_HEADERS + 1)
        );
        assert!(matches!(head(&crowded), Err(HeadError::TooLarge)));
    }

    #[test]
    fn chunk_sizes_are_lower_case_hex() {
        let mut buf = [0u8; 16];
        assert_eq!(hex(0, &mut buf), b"0");
        assert_eq!(hex(255, &mut buf), b"ff");
        assert_eq!(hex(4096, &mut buf), b"1000");
    }
}
