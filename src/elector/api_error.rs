//! Classification of API server responses, as DESIGN.md "Contention" lists
//! them, and the words a 403 is explained in.

use std::time::Duration;

use kube::core::Status;

/// What went wrong with one request to the API server.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ApiError {
    /// 401: the token was rejected (rotated?): reload credentials.
    #[error("unauthorized (401): the API server rejected the credentials")]
    Unauthorized,
    /// 403: RBAC denies a verb.
    #[error("{0}")]
    Forbidden(Forbidden),
    /// 404: the Lease does not exist.
    #[error("not found (404)")]
    NotFound,
    /// 409: someone else wrote first (`Conflict`) or created it (`AlreadyExists`).
    #[error("conflict (409): {0}")]
    Conflict(String),
    /// 410: the watch's resourceVersion is too old.
    #[error("expired (410)")]
    Gone,
    /// 400/422: the request itself is wrong — a bug in leader-gate.
    #[error("the API server rejected leader-gate's request as invalid ({code}): {message}")]
    Invalid { code: u16, message: String },
    /// 429: throttled; `Retry-After` if the server said.
    #[error("too many requests (429)")]
    TooManyRequests { retry_after: Option<Duration> },
    /// 5xx and any other status: transient.
    #[error("server error ({code}): {message}")]
    Server { code: u16, message: String },
    /// The request did not finish within its deadline.
    #[error("timed out after {0:?}")]
    Timeout(Duration),
    /// Connection refused, reset, a body cut short, an unreadable answer.
    #[error("transport error: {0}")]
    Transport(String),
}

impl ApiError {
    /// Classifies a kube-rs error.
    pub fn from_kube(error: kube::Error) -> Self {
        match error {
            kube::Error::Api(status) => Self::from_status(&status),
            other => Self::Transport(transport_cause(&other)),
        }
    }

    pub fn from_status(status: &Status) -> Self {
        let message = status.message.clone();
        match status.code {
            401 => Self::Unauthorized,
            403 => Self::Forbidden(Forbidden::parse(&message)),
            404 => Self::NotFound,
            409 => Self::Conflict(status.reason.clone()),
            410 => Self::Gone,
            400 | 422 => Self::Invalid {
                code: status.code,
                message,
            },
            429 => Self::TooManyRequests {
                retry_after: status
                    .details
                    .as_ref()
                    .map(|d| d.retry_after_seconds)
                    .filter(|s| *s > 0)
                    .map(|s| Duration::from_secs(s.into())),
            },
            code => Self::Server { code, message },
        }
    }

    /// A short label for logs and metrics.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Unauthorized => "unauthorized",
            Self::Forbidden(_) => "forbidden",
            Self::NotFound => "not_found",
            Self::Conflict(_) => "conflict",
            Self::Gone => "gone",
            Self::Invalid { .. } => "invalid",
            Self::TooManyRequests { .. } => "throttled",
            Self::Server { .. } => "error",
            Self::Timeout(_) => "timeout",
            Self::Transport(_) => "transport",
        }
    }

    /// True for failures of the API server itself — 5xx, 429, no answer
    /// in time, no connection — as opposed to an answer about the Lease or
    /// the request: while they last, followers back off.
    pub fn is_outage(&self) -> bool {
        matches!(
            self,
            Self::Server { .. }
                | Self::TooManyRequests { .. }
                | Self::Timeout(_)
                | Self::Transport(_)
        )
    }

    /// The wait a 429 asked for.
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            Self::TooManyRequests { retry_after } => *retry_after,
            _ => None,
        }
    }

    /// True for failures that say nothing about the Lease, only that the API
    /// server could not be reached or did not answer in time.
    pub fn is_unreachable(&self) -> bool {
        matches!(self, Self::Timeout(_) | Self::Transport(_))
    }
}

/// A transport error in words an operator acts on: what happened to the
/// connection first (refused, timed out, reset, closed early), then the
/// whole chain of causes, which hyper and kube-rs each wrap once more
/// ("ServiceError: client error (Connect)" alone says none of it).
fn transport_cause(error: &kube::Error) -> String {
    let mut chain = Vec::new();
    let mut what = None;
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(error);
    while let Some(error) = source {
        if what.is_none()
            && let Some(io) = error.downcast_ref::<std::io::Error>()
        {
            what = io_cause(io.kind());
        }
        let text = error.to_string();
        // Wrappers often repeat their source's text: keep each part once.
        if !chain.iter().any(|seen: &String| seen.contains(&text)) {
            chain.push(text);
        }
        source = error.source();
    }
    let chain = chain.join(": ");
    match what {
        Some(what) => format!("{what} ({chain})"),
        None => chain,
    }
}

fn io_cause(kind: std::io::ErrorKind) -> Option<&'static str> {
    use std::io::ErrorKind::*;
    Some(match kind {
        ConnectionRefused => "connection refused",
        TimedOut => "connection timed out",
        ConnectionReset => "connection reset",
        ConnectionAborted => "connection aborted",
        UnexpectedEof | BrokenPipe => "connection closed early",
        HostUnreachable | NetworkUnreachable => "no route to the API server",
        AddrNotAvailable => "address not available",
        _ => return None,
    })
}

/// A 403, explained: which user lacks which verb on what, where.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Forbidden {
    pub user: Option<String>,
    pub verb: Option<String>,
    pub resource: Option<String>,
    pub namespace: Option<String>,
    /// The API server's own message, kept whole.
    pub message: String,
}

impl Forbidden {
    /// Parses the RBAC message of the API server, e.g. `leases.coordination.k8s.io
    /// "demo" is forbidden: User "sidecar" cannot update resource "leases" in API
    /// group "coordination.k8s.io" in the namespace "proto"`. Any part it cannot
    /// find stays `None`; the message is kept whole either way.
    pub fn parse(message: &str) -> Self {
        let quoted_after = |marker: &str| {
            let rest = &message[message.find(marker)? + marker.len()..];
            let rest = rest.strip_prefix('"')?;
            Some(rest[..rest.find('"')?].to_owned())
        };
        let verb = message.find("\" cannot ").and_then(|at| {
            let rest = &message[at + "\" cannot ".len()..];
            rest.split_whitespace().next().map(str::to_owned)
        });
        let resource = quoted_after(" resource ").map(|resource| {
            match quoted_after(" in API group ").filter(|g| !g.is_empty()) {
                Some(group) => format!("{resource}.{group}"),
                None => resource,
            }
        });
        Self {
            user: quoted_after("User "),
            verb,
            resource,
            namespace: quoted_after(" in the namespace "),
            message: message.to_owned(),
        }
    }
}

impl std::fmt::Display for Forbidden {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.verb.is_none() {
            // Not an RBAC denial (a namespace being terminated, a webhook, an
            // admission plugin): the API server's own words say it best.
            return write!(f, "forbidden (403) by the API server: {}", self.message);
        }
        let or = |v: &Option<String>, d: &'static str| v.clone().unwrap_or_else(|| d.to_owned());
        write!(
            f,
            "forbidden (403): {} may not {} {} in namespace {} — grant it with a Role rule for \
             that verb and resource (API server: {})",
            or(&self.user, "this service account"),
            or(&self.verb, "use"),
            or(&self.resource, "leases.coordination.k8s.io"),
            or(&self.namespace, "(unknown)"),
            self.message
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn forbidden_names_user_verb_resource_and_namespace() {
        let f = Forbidden::parse(
            "leases.coordination.k8s.io \"demo\" is forbidden: User \
             \"system:serviceaccount:kube-system:metricbeat\" cannot update resource \"leases\" \
             in API group \"coordination.k8s.io\" in the namespace \"kube-system\"",
        );
        assert_eq!(
            f.user.as_deref(),
            Some("system:serviceaccount:kube-system:metricbeat")
        );
        assert_eq!(f.verb.as_deref(), Some("update"));
        assert_eq!(f.resource.as_deref(), Some("leases.coordination.k8s.io"));
        assert_eq!(f.namespace.as_deref(), Some("kube-system"));
        let text = f.to_string();
        assert!(text.contains(
            "system:serviceaccount:kube-system:metricbeat may not update \
             leases.coordination.k8s.io in namespace kube-system"
        ));
    }

    #[test]
    fn a_forbidden_that_is_no_rbac_denial_is_told_in_the_api_servers_words() {
        let message = "leases.coordination.k8s.io \"demo\" is forbidden: unable to create new \
                       content in namespace monitoring because it is being terminated";
        let f = Forbidden::parse(message);
        assert_eq!(f.verb, None);
        assert_eq!(
            f.to_string(),
            format!("forbidden (403) by the API server: {message}")
        );
        assert!(
            !f.to_string().contains("may not"),
            "not a missing permission"
        );
    }

    /// "ServiceError: client error (Connect)" alone does not say the
    /// connection was refused.
    #[tokio::test]
    async fn a_refused_connection_says_so_first() {
        let closed = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .unwrap();
        let config = kube::Config::new(format!("http://{closed}").parse().unwrap());
        let client = kube::Client::try_from(config).unwrap();
        let error = ApiError::from_kube(client.apiserver_version().await.unwrap_err());
        assert_eq!(error.kind(), "transport");
        assert!(error.is_outage());
        let text = error.to_string();
        assert!(
            text.starts_with("transport error: connection refused ("),
            "{text}"
        );
    }

    #[test]
    fn statuses_are_classified() {
        let status = |code: u16| Status {
            code,
            message: "m".into(),
            reason: "R".into(),
            ..Status::default()
        };
        assert_eq!(ApiError::from_status(&status(401)), ApiError::Unauthorized);
        assert_eq!(ApiError::from_status(&status(404)), ApiError::NotFound);
        assert_eq!(ApiError::from_status(&status(410)), ApiError::Gone);
        assert!(matches!(
            ApiError::from_status(&status(422)),
            ApiError::Invalid { code: 422, .. }
        ));
        assert!(matches!(
            ApiError::from_status(&status(400)),
            ApiError::Invalid { code: 400, .. }
        ));
        assert!(matches!(
            ApiError::from_status(&status(503)),
            ApiError::Server { code: 503, .. }
        ));
        assert_eq!(
            ApiError::from_status(&status(429)),
            ApiError::TooManyRequests { retry_after: None }
        );
    }
}
