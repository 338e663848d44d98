//! Collector health: the small task that asks the collector's own HTTP
//! endpoint (e.g. Metricbeat's `http://127.0.0.1:5066/stats`) every retry
//! period whether it works, feeds the results and this instance's role to
//! the [`collector_policy`], and publishes through a `tokio::sync::watch`
//! whether this instance may lead. The election driver feeds every change to
//! the machine, which neither leads nor contends while it may not.
//!
//! - A check passes on any 2xx; a connection error, no answer within the
//!   retry period, or any other status is a failure.
//! - A collector that passed fails after `failures` failures in a row, and
//!   passes again after one pass; what that means for the Lease (a grace
//!   for a new leader's collector, standing back for a broken one) is the
//!   policy's.
//!
//! The same task feeds the policy the gates' word on whether the collector
//! runs at all ([`GateAcks::running`]) when `--collector-not-running-after`
//! is set (the default): it runs without a health URL too.
//!
//! [`GateAcks::running`]: crate::serve::gate_acks::GateAcks::running
//!
//! One fresh plain-hyper connection per check, driven inside the check and
//! dropped with it: a local endpoint asked once per retry period needs no
//! pool, and nothing of a hung check outlives its timeout.

use std::time::Duration;

use http_body_util::Empty;
use hyper::body::Bytes;
use hyper::{StatusCode, Uri};
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;
use tokio::sync::{mpsc, watch};
use tokio::time::{Instant, MissedTickBehavior, sleep_until};
use tokio_util::sync::CancellationToken;

use crate::elector::machine::CollectorVerdict;
use crate::serve::collector_policy::{self, Policy, Role, Tracker, Verdict};
use crate::serve::published::LeaderState;

/// What to check, and how often.
#[derive(Clone, Debug)]
pub struct Options {
    /// An `http://` URL (see [`parse_url`]).
    pub url: Uri,
    /// Failures in a row after which the collector counts as unhealthy (≥ 1).
    pub failures: u32,
    /// The interval between checks, and the timeout of each.
    pub period: Duration,
    /// Time a new leader's collector has to pass (`--collector-health-grace`).
    pub grace: Duration,
    /// The lease duration: the longest a known broken collector's instance
    /// stands back from a leaderless group.
    pub lease_duration: Duration,
}

/// Everything the policy hears besides the role: the health check, the
/// gates, or both.
pub struct Inputs {
    pub health: Option<Options>,
    /// `--collector-not-running-after`, and the gates' word on whether
    /// anything of the term runs.
    pub not_running: Option<(Duration, watch::Receiver<Option<bool>>)>,
    /// The stand-back wait starts at twice this.
    pub retry_period: Duration,
    pub lease_duration: Duration,
}

/// Why one check failed.
#[derive(Debug, thiserror::Error)]
pub enum CheckError {
    #[error("cannot connect to {addr}: {source}")]
    Connect {
        addr: String,
        source: std::io::Error,
    },
    #[error("HTTP error: {0}")]
    Http(#[from] hyper::Error),
    #[error("answered {0}")]
    Status(StatusCode),
    #[error("no answer within {0:?}")]
    Timeout(Duration),
}

/// Parses a health URL: `http://HOST[:PORT][/PATH]`, nothing else.
pub fn parse_url(text: &str) -> Result<Uri, String> {
    let rule = || format!("{text:?} must be an http:// URL, like http://127.0.0.1:5066/stats");
    let uri: Uri = text.parse().map_err(|_| rule())?;
    if uri.scheme_str() != Some("http") || uri.host().is_none_or(str::is_empty) {
        return Err(rule());
    }
    Ok(uri)
}

/// Starts the policy's task, which ends with `shutdown`. The receiver holds
/// whether this instance may lead (see [`collector_policy`]), judged from
/// the inputs and this instance's role as `state` publishes it: fit at
/// first, since a follower's collector may not run before it leads.
pub fn spawn(
    inputs: Inputs,
    state: watch::Receiver<LeaderState>,
    shutdown: CancellationToken,
) -> watch::Receiver<CollectorVerdict> {
    let (tx, rx) = watch::channel(CollectorVerdict::Fit);
    tokio::spawn(run(inputs, state, tx, shutdown));
    rx
}

/// Checks every period, feeds the results, the gates' word and the role to
/// the policy, and publishes its verdict on change, until `shutdown`.
pub async fn run(
    inputs: Inputs,
    mut state: watch::Receiver<LeaderState>,
    tx: watch::Sender<CollectorVerdict>,
    shutdown: CancellationToken,
) {
    let Inputs {
        health,
        not_running,
        retry_period,
        lease_duration,
    } = inputs;
    let (not_running, mut running) = match not_running {
        Some((bound, running)) => (Some(bound), Some(running)),
        None => (None, None),
    };
    if let Some(Options {
        url,
        failures,
        period,
        grace,
        ..
    }) = &health
    {
        tracing::info!(%url, failures, ?period, ?grace, "checking the collector's health: a new leader gives its collector --collector-health-grace to pass, and releases the lease when it does not or when it fails --collector-health-failures times in a row");
    }
    let mut policy = Policy::new(
        collector_policy::Settings {
            health_checks: health.is_some(),
            failures: health.as_ref().map_or(1, |h| h.failures),
            grace: health.as_ref().map_or(Duration::ZERO, |h| h.grace),
            first_wait: 2 * retry_period,
            lease_duration,
            not_running,
        },
        Instant::now(),
    );
    let (results, mut checked) = mpsc::channel(1);
    // Checks run on their own schedule: a change of role never cuts one short.
    let _stop_checker = health.as_ref().map(|health| {
        AbortOnDrop(tokio::spawn(check_every(
            health.url.clone(),
            health.period,
            results,
        )))
    });
    let url = health.map(|h| h.url);
    let mut verdict = Verdict::MayLead;
    loop {
        let change = policy.next_change(Instant::now());
        tokio::select! {
            biased;
            () = shutdown.cancelled() => return,
            changed = state.changed() => {
                if changed.is_err() {
                    return;
                }
                let role = {
                    let published = state.borrow_and_update();
                    Role {
                        leading: published.leading,
                        leaderless: published.holder.is_none(),
                    }
                };
                policy.role(role, Instant::now());
            }
            now = gates_change(&mut running) => match now {
                Some(now) => policy.gates_running(now, Instant::now()),
                // The registry is gone: nothing more to hear from it.
                None => running = None,
            },
            result = checked.recv(), if url.is_some() => {
                let Some(result) = result else { return };
                let was_passing = policy.tracker().healthy();
                policy.checked(result.is_ok(), Instant::now());
                if let Some(url) = &url {
                    log_check(url, &result, was_passing, policy.tracker());
                }
            }
            () = sleep_until(change.unwrap_or_else(Instant::now)), if change.is_some() => {}
        }
        let now = policy.verdict(Instant::now());
        if now != verdict {
            log_verdict(verdict, now, not_running, policy.not_running_episode());
            verdict = now;
        }
        let published = match verdict {
            Verdict::MayLead => CollectorVerdict::Fit,
            Verdict::NotRunning => CollectorVerdict::NotRunning,
            Verdict::StandingBack { .. } if policy.not_running_episode() => {
                CollectorVerdict::NotRunning
            }
            Verdict::NoPassWithinGrace
            | Verdict::FailedWhileLeading
            | Verdict::StandingBack { .. } => CollectorVerdict::Unhealthy,
        };
        tx.send_if_modified(|before| std::mem::replace(before, published) != published);
    }
}

/// The gates' next word on whether anything runs (`None`: the registry is
/// gone), or never without them.
async fn gates_change(running: &mut Option<watch::Receiver<Option<bool>>>) -> Option<Option<bool>> {
    match running {
        Some(rx) => match rx.changed().await {
            Ok(()) => Some(*rx.borrow_and_update()),
            Err(_) => None,
        },
        None => std::future::pending().await,
    }
}

/// One check every `period` (a slow check delays the next one rather than
/// causing a burst), each result sent to `results`.
async fn check_every(
    url: Uri,
    period: Duration,
    results: mpsc::Sender<Result<StatusCode, CheckError>>,
) {
    let mut ticks = tokio::time::interval(period);
    ticks.set_missed_tick_behavior(MissedTickBehavior::Delay);
    loop {
        ticks.tick().await;
        if results.send(check(&url, period).await).await.is_err() {
            return;
        }
    }
}

/// The first failures of a collector never seen passing.
const NOT_PASSED_YET: &str = "the collector has not passed its health check yet: contending anyway \
     (usual before it has started, and on a follower whose collector runs only while it leads)";

/// Says what a check showed, once per change of episode.
fn log_check(
    url: &Uri,
    result: &Result<StatusCode, CheckError>,
    was_passing: bool,
    tracker: &Tracker,
) {
    match result {
        Ok(_) if !was_passing => tracing::info!(%url, "the collector passes its health check"),
        Ok(_) => {}
        Err(error)
            if tracker.failures_in_a_row() == tracker.threshold() && !tracker.ever_passed() =>
        {
            // Expected before the collector starts, and on every follower
            // whose collector runs only while it leads: said once, not as a
            // warning, in words true in every pod (with or without a gate).
            tracing::info!(%url, %error, "{NOT_PASSED_YET}");
        }
        Err(error) if tracker.failures_in_a_row() == tracker.threshold() => {
            // Once per episode.
            tracing::warn!(%url, %error, failures = tracker.threshold(), "the collector failed its health check too many times in a row");
        }
        Err(error) => {
            tracing::debug!(%url, %error, in_a_row = tracker.failures_in_a_row(), "collector health check failed");
        }
    }
}

/// Says why this instance stops or starts being fit to lead.
fn log_verdict(
    before: Verdict,
    now: Verdict,
    not_running: Option<Duration>,
    not_running_episode: bool,
) {
    match (before, now) {
        (Verdict::StandingBack { wait }, Verdict::MayLead) if not_running_episode => {
            tracing::warn!(
                ?wait,
                "the group has had no leader for the wait: contending although this pod's collector did not run while it last led"
            )
        }
        (_, Verdict::NotRunning) => tracing::warn!(
            bound = ?not_running.unwrap_or_default(),
            "the gates have said for --collector-not-running-after that nothing of this pod's term runs (the collector exited and was not started again, e.g. it crash-loops): releasing the lease for a peer"
        ),
        (Verdict::NotRunning, Verdict::StandingBack { wait }) => tracing::info!(
            ?wait,
            "the collector did not run while this pod led: standing back, contending only once the group has had no leader for the wait"
        ),
        (_, Verdict::NoPassWithinGrace) => tracing::warn!(
            "the collector did not pass its health check within --collector-health-grace of this pod starting to lead: releasing the lease for a peer"
        ),
        (_, Verdict::FailedWhileLeading) => tracing::warn!(
            "the collector stopped passing its health check while this pod leads: releasing the lease for a peer"
        ),
        (Verdict::NoPassWithinGrace, Verdict::StandingBack { wait }) => tracing::info!(
            ?wait,
            "the collector never passed its health check while this pod led: standing back, contending only once the group has had no leader for the wait"
        ),
        (_, Verdict::StandingBack { wait }) => tracing::info!(
            ?wait,
            "the collector failed its health check: standing back, contending only once the group has had no leader for the wait"
        ),
        (Verdict::StandingBack { wait }, Verdict::MayLead) => tracing::warn!(
            ?wait,
            "the group has had no leader for the wait: contending although this pod's collector failed its health check"
        ),
        (_, Verdict::MayLead) => {
            tracing::info!("the collector no longer keeps this pod from leading")
        }
    }
}

/// Aborts the task when dropped: the checker ends with the policy's task.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// One check: a GET of `url` answered 2xx within `timeout`.
pub async fn check(url: &Uri, timeout: Duration) -> Result<StatusCode, CheckError> {
    tokio::time::timeout(timeout, request(url))
        .await
        .unwrap_or(Err(CheckError::Timeout(timeout)))
}

async fn request(url: &Uri) -> Result<StatusCode, CheckError> {
    // An IPv6 literal comes bracketed in the URL, bare to connect().
    let host = url.host().unwrap_or_default();
    let host = host.trim_start_matches('[').trim_end_matches(']');
    let port = url.port_u16().unwrap_or(80);
    let stream = TcpStream::connect((host, port))
        .await
        .map_err(|source| CheckError::Connect {
            addr: format!("{host}:{port}"),
            source,
        })?;
    let (mut sender, connection) =
        hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
    let request = hyper::Request::get(url.path_and_query().map_or("/", |p| p.as_str()))
        .header(
            hyper::header::HOST,
            url.authority().map_or(host, |a| a.as_str()),
        )
        .header(hyper::header::USER_AGENT, "leader-gate")
        .body(Empty::<Bytes>::new())
        .expect("a GET of a parsed URL is a valid request");
    // The connection is driven here, not in a task of its own: whatever the
    // outcome, it is dropped (and the socket closed) with this future.
    let response = sender.send_request(request);
    tokio::pin!(response);
    let response = tokio::select! {
        biased;
        response = &mut response => response?,
        ended = connection => {
            // A server that answers and closes ends the connection in the
            // same poll that delivered the answer: take it, or the error.
            ended?;
            response.await?
        }
    };
    let status = response.status();
    if status.is_success() {
        Ok(status)
    } else {
        Err(CheckError::Status(status))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;

    /// A collector not passing yet is said in words true in every pod:
    /// they do not claim a gate (`exec`) the pod may not have.
    #[test]
    fn a_collector_not_passing_yet_is_said_without_claiming_a_gate() {
        #[derive(Clone, Default)]
        struct Lines(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);
        impl std::io::Write for Lines {
            fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
                self.0.lock().unwrap().extend_from_slice(buf);
                Ok(buf.len())
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        let lines = Lines::default();
        let writer = lines.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_writer(move || writer.clone())
            .with_ansi(false)
            .finish();
        let url = parse_url("http://127.0.0.1:5066/stats").unwrap();
        let mut tracker = Tracker::new(2);
        tracing::subscriber::with_default(subscriber, || {
            for _ in 0..3 {
                tracker.record(false);
                log_check(
                    &url,
                    &Err(CheckError::Status(StatusCode::SERVICE_UNAVAILABLE)),
                    false,
                    &tracker,
                );
            }
        });
        let text = String::from_utf8(lines.0.lock().unwrap().clone()).unwrap();
        assert_eq!(text.matches(NOT_PASSED_YET).count(), 1, "said once: {text}");
        assert!(!text.contains("exec"), "{text}");
        assert!(text.contains(" INFO "), "not a warning: {text}");
    }

    #[test]
    fn only_http_urls_with_a_host_are_accepted() {
        let uri = parse_url("http://127.0.0.1:5066/stats").unwrap();
        assert_eq!(uri.port_u16(), Some(5066));
        assert!(parse_url("http://collector/").is_ok());
        for bad in [
            "https://127.0.0.1:5066/stats",
            "127.0.0.1:5066",
            "/stats",
            "http://",
            "not a url",
            "",
        ] {
            assert!(parse_url(bad).is_err(), "{bad:?}");
        }
    }

    /// A one-shot server answering every connection with `answer` (raw
    /// bytes; `None`: close without answering, `Some("")`: never answer).
    async fn endpoint(answer: Option<&'static str>) -> Uri {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            while let Ok((mut socket, _)) = listener.accept().await {
                tokio::spawn(async move {
                    let mut buf = [0u8; 1024];
                    let _ = socket.read(&mut buf).await;
                    match answer {
                        None => {}
                        Some("") => std::future::pending().await,
                        Some(raw) => {
                            let _ = socket.write_all(raw.as_bytes()).await;
                        }
                    }
                });
            }
        });
        format!("http://{addr}/stats").parse().unwrap()
    }

    const SECOND: Duration = Duration::from_secs(1);

    #[tokio::test]
    async fn any_2xx_passes_and_anything_else_fails() {
        let ok = "HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n{}";
        let no_content = "HTTP/1.1 204 No Content\r\n\r\n";
        assert_eq!(check(&endpoint(Some(ok)).await, SECOND).await.unwrap(), 200);
        assert_eq!(
            check(&endpoint(Some(no_content)).await, SECOND)
                .await
                .unwrap(),
            204
        );
        for (raw, status) in [
            (
                "HTTP/1.1 500 Internal Server Error\r\ncontent-length: 0\r\n\r\n",
                500,
            ),
            (
                "HTTP/1.1 301 Moved\r\nlocation: /x\r\ncontent-length: 0\r\n\r\n",
                301,
            ),
            ("HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\n\r\n", 404),
        ] {
            match check(&endpoint(Some(raw)).await, SECOND).await {
                Err(CheckError::Status(s)) => assert_eq!(s, status),
                other => panic!("{raw:?}: {other:?}"),
            }
        }
    }

    #[tokio::test]
    async fn a_refused_a_closed_and_a_hung_connection_fail() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let refused: Uri = format!("http://{}/", listener.local_addr().unwrap())
            .parse()
            .unwrap();
        drop(listener);
        assert!(matches!(
            check(&refused, SECOND).await,
            Err(CheckError::Connect { .. })
        ));
        let closed = check(&endpoint(None).await, SECOND).await;
        assert!(matches!(closed, Err(CheckError::Http(_))), "{closed:?}");
        let limit = Duration::from_millis(200);
        let started = std::time::Instant::now();
        let hung = check(&endpoint(Some("")).await, limit).await;
        assert!(matches!(hung, Err(CheckError::Timeout(_))), "{hung:?}");
        assert!(started.elapsed() < limit * 5, "bounded by the timeout");
    }
}
