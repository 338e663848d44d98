//! A test subscriber of `/events`: real HTTP/1.1 over a socket, parsed with
//! the library's own SSE parser, every message stamped on arrival.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use http_body_util::{BodyExt, Empty};
use hyper::body::{Bytes, Incoming};
use hyper_util::rt::TokioIo;
use leader_gate::client::sse_reader::{SseMessage, SseParser};
use serde_json::Value;
use tokio::net::TcpStream;

/// One received event.
#[derive(Clone, Debug)]
pub struct Received {
    pub message: SseMessage,
    pub data: Value,
    pub at: Instant,
    /// Arrival on the wall clock, µs since the epoch (comparable with an
    /// event's `published_at_us`, which shares this machine's clock).
    pub wall_us: i64,
}

impl Received {
    pub fn kind(&self) -> &str {
        &self.message.event
    }

    pub fn term(&self) -> Option<&str> {
        self.data["term"].as_str()
    }
}

pub struct EventClient {
    pub status: u16,
    body: Option<Incoming>,
    parser: SseParser,
    queue: VecDeque<Received>,
    pub ended: bool,
    /// The stream ended with a transport error, not a clean end.
    pub failed: bool,
}

impl EventClient {
    /// Subscribes to `http://addr/events`, resuming after `last_event_id`.
    pub async fn connect(addr: SocketAddr, last_event_id: Option<&str>) -> EventClient {
        Self::try_connect(addr, last_event_id)
            .await
            .unwrap_or_else(|e| panic!("GET /events: {e}"))
    }

    /// Like [`EventClient::connect`], with an error instead of a panic (the
    /// process may be gone).
    pub async fn try_connect(
        addr: SocketAddr,
        last_event_id: Option<&str>,
    ) -> Result<EventClient, Box<dyn std::error::Error + Send + Sync>> {
        Self::try_connect_to(addr, "/events", last_event_id).await
    }

    /// Like [`EventClient::try_connect`], to one Lease's stream of a sidecar
    /// of several Leases (`/events?lease=LEASE`; Lease names are DNS
    /// labels, nothing to escape).
    pub async fn try_connect_lease(
        addr: SocketAddr,
        lease: &str,
        last_event_id: Option<&str>,
    ) -> Result<EventClient, Box<dyn std::error::Error + Send + Sync>> {
        Self::try_connect_to(addr, &format!("/events?lease={lease}"), last_event_id).await
    }

    /// Subscribes as the registered gate `gate` (`/events?gate=GATE`).
    pub async fn connect_as_gate(addr: SocketAddr, gate: &str) -> EventClient {
        Self::try_connect_to(addr, &format!("/events?gate={gate}"), None)
            .await
            .unwrap_or_else(|e| panic!("GET /events?gate={gate}: {e}"))
    }

    /// Subscribes to `path` (`/events?…`) on the gate socket at `socket`
    /// (`serve --gate-socket`).
    pub async fn try_connect_socket(
        socket: &std::path::Path,
        path: &str,
    ) -> Result<EventClient, Box<dyn std::error::Error + Send + Sync>> {
        let stream = tokio::net::UnixStream::connect(socket).await?;
        Self::try_connect_on(stream, "localhost", path, None).await
    }

    async fn try_connect_to(
        addr: SocketAddr,
        path: &str,
        last_event_id: Option<&str>,
    ) -> Result<EventClient, Box<dyn std::error::Error + Send + Sync>> {
        let stream = TcpStream::connect(addr).await?;
        Self::try_connect_on(stream, &addr.to_string(), path, last_event_id).await
    }

    async fn try_connect_on(
        stream: impl tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + Unpin + 'static,
        host: &str,
        path: &str,
        last_event_id: Option<&str>,
    ) -> Result<EventClient, Box<dyn std::error::Error + Send + Sync>> {
        let (mut sender, connection) =
            hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
        tokio::spawn(connection);
        let mut request = hyper::Request::get(path)
            .header("host", host)
            .header("accept", "text/event-stream");
        if let Some(id) = last_event_id {
            request = request.header("last-event-id", id);
        }
        let response = sender
            .send_request(request.body(Empty::<Bytes>::new())?)
            .await?;
        Ok(EventClient {
            status: response.status().as_u16(),
            body: Some(response.into_body()),
            parser: SseParser::default(),
            queue: VecDeque::new(),
            ended: false,
            failed: false,
        })
    }

    /// The whole body as text (a refusal's words), within `timeout`.
    pub async fn body_text(&mut self, timeout: Duration) -> String {
        let Some(body) = self.body.take() else {
            return String::new();
        };
        match tokio::time::timeout(timeout, body.collect()).await {
            Ok(Ok(body)) => String::from_utf8_lossy(&body.to_bytes()).into_owned(),
            _ => String::new(),
        }
    }

    /// The next event within `timeout`; `None` on timeout or end of stream.
    pub async fn next(&mut self, timeout: Duration) -> Option<Received> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            if let Some(received) = self.queue.pop_front() {
                return Some(received);
            }
            let body = self.body.as_mut()?;
            let frame = match tokio::time::timeout_at(deadline, body.frame()).await {
                Err(_) => return None,
                Ok(None) => {
                    self.ended = true;
                    self.body = None;
                    return None;
                }
                Ok(Some(Err(_))) => {
                    self.ended = true;
                    self.failed = true;
                    self.body = None;
                    return None;
                }
                Ok(Some(Ok(frame))) => frame,
            };
            let at = Instant::now();
            let wall_us = leader_gate::clock::wall_micros();
            if let Some(bytes) = frame.data_ref() {
                for message in self.parser.feed(bytes) {
                    let data = serde_json::from_str(&message.data).unwrap_or(Value::Null);
                    self.queue.push_back(Received {
                        message,
                        data,
                        at,
                        wall_us,
                    });
                }
            }
        }
    }

    /// The next event of kind `kind`, skipping others.
    pub async fn next_of(&mut self, kind: &str, timeout: Duration) -> Option<Received> {
        let deadline = Instant::now() + timeout;
        while let Some(left) = deadline.checked_duration_since(Instant::now()) {
            let received = self.next(left).await?;
            if received.kind() == kind {
                return Some(received);
            }
        }
        None
    }

    /// The term of the next `stopped-leading` within `timeout`; panics
    /// without one.
    pub async fn stopped_term(&mut self, timeout: Duration) -> String {
        let stop = self
            .next_of("stopped-leading", timeout)
            .await
            .expect("a stopped-leading event");
        stop.term().expect("the stop names its term").to_owned()
    }

    /// Every event until `quiet` passes without one (or the stream ends).
    pub async fn drain(&mut self, quiet: Duration) -> Vec<Received> {
        let mut all = Vec::new();
        while let Some(received) = self.next(quiet).await {
            all.push(received);
        }
        all
    }

    /// Waits for the end of the stream, collecting what comes before it.
    pub async fn until_end(&mut self, timeout: Duration) -> Vec<Received> {
        let deadline = Instant::now() + timeout;
        let mut all = Vec::new();
        while !self.ended {
            let Some(left) = deadline.checked_duration_since(Instant::now()) else {
                break;
            };
            if let Some(received) = self.next(left).await {
                all.push(received);
            }
        }
        all
    }
}

/// The sequence number in an event id `<boot id>-<seq>`.
pub fn seq_of(id: &str) -> u64 {
    id.rsplit_once('-')
        .expect("an event id")
        .1
        .parse()
        .expect("a seq")
}
