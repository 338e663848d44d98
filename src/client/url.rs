//! The sidecar's gate listener as clients address it (`--url`, default
//! `http://127.0.0.1:4040`, also `$LEADER_GATE_URL`), the one of its Leases
//! a client follows (`--lease`, for a sidecar of several), and the few plain
//! HTTP/1.1 requests clients make.

use std::time::Duration;

use http_body_util::{BodyExt, Empty};
use hyper::body::{Bytes, Incoming};
use hyper::{Method, Request, Response, Uri};
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

/// The default gate listener.
pub const DEFAULT_URL: &str = "http://127.0.0.1:4040";

/// An `--url` that is not `http://HOST:PORT[/PREFIX]`.
#[derive(Debug, thiserror::Error)]
#[error("invalid --url {0:?}: must be http://HOST:PORT, the sidecar's gate listener")]
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
    /// The path prefix, without a trailing slash (usually empty).
    prefix: String,
    /// The Lease followed, when the sidecar contends for several.
    lease: Option<String>,
}

impl GateUrl {
    /// Parses `http://HOST:PORT`; a trailing `/events` or `/leader` (the
    /// form `leader-gate watch` used to take) names the same listener.
    pub fn parse(text: &str) -> Result<Self, InvalidUrl> {
        let invalid = || InvalidUrl(text.to_owned());
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

    /// The host (a name or an address, without brackets) and the port.
    pub fn host_port(&self) -> (&str, u16) {
        (&self.host, self.port)
    }

    /// `host:port`, for the `Host` header and messages.
    pub fn authority(&self) -> String {
        if self.host.contains(':') {
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
            let stream = TcpStream::connect((self.host.as_str(), self.port))
                .await
                .map_err(|source| RequestError::Connect {
                    addr: self.authority(),
                    source,
                })?;
            request(stream, method, &path, &self.authority(), headers).await
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

/// A request on an open connection; the connection is driven in the
/// background until the response body is dropped.
async fn request(
    stream: TcpStream,
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
        ] {
            assert!(GateUrl::parse(bad).is_err(), "{bad:?}");
        }
    }
}
