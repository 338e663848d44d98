//! The sidecar's gate listener as clients address it (`--url`, default
//! `http://127.0.0.1:4040`, also `$LEADER_GATE_URL`; `unix:/PATH` for the
//! pod-local gate socket of `serve --gate-socket`), the one of its Leases
//! a client follows (`--lease`, for a sidecar of several), and the few plain
//! HTTP/1.1 requests clients make.

use std::time::Duration;

use clap::Args;
use http_body_util::{BodyExt, Empty};
use hyper::body::{Bytes, Incoming};
use hyper::{Method, Request, Response, Uri};
use hyper_util::rt::TokioIo;
use tokio::net::{TcpStream, UnixStream};

use crate::args::{LogArgs, is_dns1123_subdomain};

/// The default gate listener.
pub const DEFAULT_URL: &str = "http://127.0.0.1:4040";

/// What every client takes: the sidecar's gate listener, which of its
/// Leases to follow, and the log format.
#[derive(Debug, Args)]
pub struct ClientArgs {
    /// The sidecar's gate listener (a trailing /events or /leader is accepted).
    #[arg(long, env = "LEADER_GATE_URL", default_value = DEFAULT_URL, value_parser = GateUrl::parse)]
    pub url: GateUrl,

    /// The Lease to follow, when the sidecar contends for several (one of
    /// its --lease-name, or NAME-I of its --shards).
    #[arg(long, env = "LEADER_GATE_LEASE", value_parser = parse_lease)]
    pub lease: Option<String>,

    #[command(flatten)]
    pub log: LogArgs,
}

impl ClientArgs {
    /// The listener, following the Lease asked for.
    pub fn gate(self) -> GateUrl {
        self.url.for_lease(self.lease)
    }
}

/// A `--lease` of a client: a Lease name as `serve` would take it.
fn parse_lease(text: &str) -> Result<String, String> {
    if is_dns1123_subdomain(text) {
        Ok(text.to_owned())
    } else {
        Err(format!(
            "{text:?} is not a Lease name (a DNS-1123 subdomain: lowercase letters, digits, '-' and '.')"
        ))
    }
}

/// An `--url` that is not `http://HOST:PORT[/PREFIX]` or `unix:/PATH`.
#[derive(Debug, thiserror::Error)]
#[error(
    "invalid --url {0:?}: must be http://HOST:PORT or unix:/PATH, the sidecar's gate listener or socket"
)]
pub struct InvalidUrl(pub String);

/// Why a request failed.
#[derive(Debug, thiserror::Error)]
pub enum RequestError {
    #[error("cannot connect to {addr}: {source}")]
    Connect {
        addr: String,
        source: std::io::Error,
    },
    #[error("{0}")]
    Http(#[from] hyper::Error),
    #[error("no answer within {0:?}")]
    Timeout(Duration),
}

/// The gate listener: `/leader` and `/events` below an optional prefix.
#[derive(Clone, Debug)]
pub struct GateUrl {
    host: String,
    port: u16,
    /// `unix:/PATH`: the gate socket (then `host` and `port` are unused).
    socket: Option<std::path::PathBuf>,
    /// The path prefix, without a trailing slash (usually empty).
    prefix: String,
    /// The Lease followed, when the sidecar contends for several.
    lease: Option<String>,
}

impl GateUrl {
    /// Parses `http://HOST:PORT`; a trailing `/events` or `/leader` (the
    /// form `leader-gate watch` used to take) names the same listener.
    /// `unix:/PATH` (also `unix:///PATH`) names the gate socket.
    pub fn parse(text: &str) -> Result<Self, InvalidUrl> {
        let invalid = || InvalidUrl(text.to_owned());
        if let Some(path) = text.strip_prefix("unix:") {
            let path = path.strip_prefix("//").unwrap_or(path);
            if !path.starts_with('/') || path.len() > 107 || path.contains('?') {
                return Err(invalid());
            }
            return Ok(Self {
                host: "localhost".to_owned(),
                port: 80,
                socket: Some(path.into()),
                prefix: String::new(),
                lease: None,
            });
        }
        let uri: Uri = text.parse().map_err(|_| invalid())?;
        if uri.scheme_str() != Some("http") || uri.query().is_some() {
            return Err(invalid());
        }
        let host = uri.host().filter(|h| !h.is_empty()).ok_or_else(invalid)?;
        let path = uri.path().trim_end_matches('/');
        let prefix = path
            .strip_suffix("/events")
            .or_else(|| path.strip_suffix("/leader"))
            .unwrap_or(path);
        Ok(Self {
            host: host
                .trim_start_matches('[')
                .trim_end_matches(']')
                .to_owned(),
            port: uri.port_u16().unwrap_or(80),
            socket: None,
            prefix: prefix.to_owned(),
            lease: None,
        })
    }

    /// This listener, following Lease `lease` of a sidecar of several
    /// (`None`: the sidecar's only Lease).
    pub fn for_lease(mut self, lease: Option<String>) -> Self {
        self.lease = lease;
        self
    }

    /// The Lease followed, if named.
    pub fn lease(&self) -> Option<&str> {
        self.lease.as_deref()
    }

    /// The endpoint of the followed Lease's `/leader`.
    pub fn leader(&self) -> String {
        match &self.lease {
            Some(lease) => format!("/leader/{lease}"),
            None => "/leader".to_owned(),
        }
    }

    /// `endpoint` (a path, perhaps with a query) for the followed Lease:
    /// `lease=NAME` added to its query.
    pub fn of_lease(&self, endpoint: &str) -> String {
        match &self.lease {
            Some(lease) if endpoint.contains('?') => format!("{endpoint}&lease={lease}"),
            Some(lease) => format!("{endpoint}?lease={lease}"),
            None => endpoint.to_owned(),
        }
    }

    /// Any other plain-HTTP URL, taken as it is (e.g. a collector's
    /// `/-/reload`): request it with the endpoint `""`.
    pub fn parse_exact(text: &str) -> Result<Self, InvalidUrl> {
        if text.starts_with("unix:") {
            return Err(InvalidUrl(text.to_owned()));
        }
        let mut url = Self::parse(text)?;
        let uri: Uri = text.parse().map_err(|_| InvalidUrl(text.to_owned()))?;
        url.prefix = uri.path().to_owned();
        Ok(url)
    }

    /// The path of `endpoint` (`"/leader"`, `"/events"`) on this listener.
    pub fn path(&self, endpoint: &str) -> String {
        let path = format!("{}{endpoint}", self.prefix);
        if path.is_empty() { "/".into() } else { path }
    }

    /// The host (a name or an address, without brackets) and the port
    /// (of a TCP URL; a reload URL is never a socket).
    pub fn host_port(&self) -> (&str, u16) {
        (&self.host, self.port)
    }

    /// `host:port`, for the `Host` header and messages (`localhost` on
    /// the gate socket).
    pub fn authority(&self) -> String {
        if self.socket.is_some() {
            self.host.clone()
        } else if self.host.contains(':') {
            format!("[{}]:{}", self.host, self.port)
        } else {
            format!("{}:{}", self.host, self.port)
        }
    }

    /// Sends one request on a new connection and returns the response head
    /// (the body streams); `timeout` bounds connecting and the head.
    pub async fn send(
        &self,
        method: Method,
        endpoint: &str,
        headers: &[(&str, &str)],
        timeout: Duration,
    ) -> Result<Response<Incoming>, RequestError> {
        let path = self.path(endpoint);
        let exchange = async {
            let connect_error = |source| RequestError::Connect {
                addr: self.to_string(),
                source,
            };
            match &self.socket {
                Some(socket) => {
                    let stream = UnixStream::connect(socket).await.map_err(connect_error)?;
                    request(stream, method, &path, &self.authority(), headers).await
                }
                None => {
                    let stream = TcpStream::connect((self.host.as_str(), self.port))
                        .await
                        .map_err(connect_error)?;
                    request(stream, method, &path, &self.authority(), headers).await
                }
            }
        };
        tokio::time::timeout(timeout, exchange)
            .await
            .unwrap_or(Err(RequestError::Timeout(timeout)))
    }

    /// One whole exchange: the status and the body, bounded by `timeout`.
    pub async fn fetch(
        &self,
        method: Method,
        endpoint: &str,
        timeout: Duration,
    ) -> Result<(u16, Bytes), RequestError> {
        let exchange = async {
            let response = self.send(method, endpoint, &[], timeout).await?;
            let status = response.status().as_u16();
            let body = response.into_body().collect().await?.to_bytes();
            Ok((status, body))
        };
        tokio::time::timeout(timeout, exchange)
            .await
            .unwrap_or(Err(RequestError::Timeout(timeout)))
    }
}

/// The listener as a user names it: `host:port`, or `unix:/PATH`.
impl std::fmt::Display for GateUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.socket {
            Some(socket) => write!(f, "unix:{}", socket.display()),
            None => f.write_str(&self.authority()),
        }
    }
}

/// A request on an open connection; the connection is driven in the
/// background until the response body is dropped.
async fn request(
    stream: impl tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + Unpin + 'static,
    method: Method,
    path: &str,
    authority: &str,
    headers: &[(&str, &str)],
) -> Result<Response<Incoming>, RequestError> {
    let (mut sender, connection) =
        hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
    tokio::spawn(connection);
    let mut builder = Request::builder()
        .method(method)
        .uri(path)
        .header("host", authority);
    for (name, value) in headers {
        builder = builder.header(*name, *value);
    }
    let request = builder
        .body(Empty::<Bytes>::new())
        .expect("a request of valid parts");
    Ok(sender.send_request(request).await?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_listener_and_the_old_events_form_name_the_same_endpoints() {
        for text in [
            "http://127.0.0.1:4040",
            "http://127.0.0.1:4040/",
            "http://127.0.0.1:4040/events",
            "http://127.0.0.1:4040/leader",
        ] {
            let url = GateUrl::parse(text).unwrap();
            assert_eq!(url.path("/events"), "/events", "{text}");
            assert_eq!(url.authority(), "127.0.0.1:4040", "{text}");
        }
        let url = GateUrl::parse("http://127.0.0.1:4040").unwrap();
        assert_eq!(url.leader(), "/leader");
        assert_eq!(url.of_lease("/events?gate=g"), "/events?gate=g");
        let shard = url.for_lease(Some("ksm-2".into()));
        assert_eq!(shard.leader(), "/leader/ksm-2");
        assert_eq!(shard.of_lease("/events"), "/events?lease=ksm-2");
        assert_eq!(
            shard.of_lease("/events?gate=g"),
            "/events?gate=g&lease=ksm-2"
        );
        let prefixed = GateUrl::parse("http://gate.local/pod-a/events").unwrap();
        assert_eq!(prefixed.path("/leader"), "/pod-a/leader");
        assert_eq!(prefixed.authority(), "gate.local:80");
        assert_eq!(
            GateUrl::parse("http://[::1]:4040").unwrap().authority(),
            "[::1]:4040"
        );
        let reload = GateUrl::parse_exact("http://127.0.0.1:9090/-/reload").unwrap();
        assert_eq!(reload.path(""), "/-/reload");
        let events = GateUrl::parse_exact("http://127.0.0.1:9090/events").unwrap();
        assert_eq!(events.path(""), "/events", "taken as it is");
    }

    #[test]
    fn only_plain_http_urls_are_accepted() {
        for bad in [
            "https://127.0.0.1:4040",
            "127.0.0.1:4040",
            "http://",
            "",
            "http://h:1/?x=1",
            "unix:relative.sock",
            "unix:",
        ] {
            assert!(GateUrl::parse(bad).is_err(), "{bad:?}");
        }
        // A collector's reload endpoint is plain HTTP.
        assert!(GateUrl::parse_exact("unix:/run/prometheus.sock").is_err());
    }

    #[test]
    fn the_gate_socket_is_named_unix_and_a_path() {
        for text in [
            "unix:/run/leader-gate/gate.sock",
            "unix:///run/leader-gate/gate.sock",
        ] {
            let url = GateUrl::parse(text).unwrap();
            assert_eq!(url.to_string(), "unix:/run/leader-gate/gate.sock");
            assert_eq!(url.path("/events"), "/events");
            assert_eq!(url.authority(), "localhost", "the Host header");
            let shard = url.for_lease(Some("ksm-2".into()));
            assert_eq!(shard.leader(), "/leader/ksm-2");
        }
    }

    #[tokio::test]
    async fn a_request_on_the_gate_socket_reaches_it() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let path = std::env::temp_dir().join(format!("lg-url-{}.sock", std::process::id()));
        let _ = std::fs::remove_file(&path);
        let listener = tokio::net::UnixListener::bind(&path).unwrap();
        let server = tokio::spawn(async move {
            let (mut stream, _) = listener.accept().await.unwrap();
            let mut head = Vec::new();
            let mut buf = [0u8; 512];
            while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                let n = stream.read(&mut buf).await.unwrap();
                head.extend_from_slice(&buf[..n]);
            }
            stream
                .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
                .await
                .unwrap();
            String::from_utf8(head).unwrap()
        });
        let url = GateUrl::parse(&format!("unix:{}", path.display())).unwrap();
        let (status, body) = url
            .fetch(Method::GET, "/leader", Duration::from_secs(5))
            .await
            .unwrap();
        assert_eq!((status, &body[..]), (200, &b"ok"[..]));
        let head = server.await.unwrap();
        assert!(head.starts_with("GET /leader HTTP/1.1\r\n"), "{head}");
        assert!(head.to_lowercase().contains("host: localhost"), "{head}");
        let _ = std::fs::remove_file(&path);
    }
}
