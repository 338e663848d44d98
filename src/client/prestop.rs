//! `leader-gate prestop`: a collector container's `preStop` hook. It asks
//! this pod's own sidecar to hand the Lease over (`POST /handover` on the
//! gate channel, see [`crate::serve::step_down`]), waits until `/leader`
//! shows that another pod holds the Lease, then waits `--drain` (for
//! kube-proxy and the Service's other clients to see the new endpoint) and
//! returns. A release that nobody takes (a single replica) ends the wait
//! at `--timeout`, without a drain: there is no new endpoint to wait for.
//! It waits for the new holder, not for the release, because a routed
//! Service switches to the peer with the peer's acquisition (make before
//! break): the release alone moves no traffic. The kubelet sends the collector its
//! SIGTERM only after the hook returned, so the collector is stopped when
//! it no longer leads, and its traffic already goes to the peer.
//!
//! It never fails the pod's deletion, and never holds it past its bound:
//! every outcome exits 0. A sidecar that cannot be reached (dead, not yet
//! started, a wrong `--url`) or that refuses (403, 404) ends the hook at
//! once; a slow or stopped one is given `--timeout` in all, for the
//! request and the wait together; the drain follows only a hand-over seen
//! done. Why it ended is said on stderr (the kubelet keeps a hook's output
//! only when it fails, so `kubectl logs` of the sidecar is where the
//! hand-over shows).
//!
//! The binary runs in the collector's container, copied there through a
//! shared volume (`leader-gate install`), so it works with distroless
//! images; nothing here needs a shell.

use std::time::Duration;

use clap::Args;
use hyper::Method;
use serde_json::Value;
use tokio::time::Instant;

use crate::client::url::{ClientArgs, GateUrl, RequestError};
use crate::duration::parse_duration;

/// How often `/leader` is asked while the hand-over is under way.
const POLL: Duration = Duration::from_millis(50);

#[derive(Debug, Args)]
pub struct PrestopArgs {
    #[command(flatten)]
    pub client: ClientArgs,

    /// Bound on the whole hand-over: the request and the wait until another
    /// pod holds the Lease (or this one released it). Past it the hook
    /// returns anyway, exit 0; keep timeout + drain + the collector's own
    /// stop within the pod's terminationGracePeriodSeconds.
    #[arg(long, env = "LEADER_GATE_PRESTOP_TIMEOUT", default_value = "5s", value_parser = parse_duration)]
    pub timeout: Duration,

    /// Time to wait once the hand-over is done, before the hook returns and
    /// the kubelet stops the collector: for kube-proxy on every node to
    /// route the Service to the new leader. 0s for a collector nobody
    /// sends to.
    #[arg(long, env = "LEADER_GATE_PRESTOP_DRAIN", default_value = "1s", value_parser = parse_duration)]
    pub drain: Duration,
}

/// What the sidecar answered to a step-down request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Asked {
    /// 202: it leads and steps down.
    SteppingDown,
    /// 200: it does not lead; nothing to hand over.
    NotLeading,
}

/// How a `prestop` ended (it exits 0 whatever the outcome).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Another pod holds the Lease; the drain followed.
    HandedOver(String),
    /// This pod released the Lease and nobody took it within the timeout.
    Released,
    /// This pod did not lead: nothing to hand over, no drain.
    NotLeading,
    /// The hand-over could not be asked for or seen done: why.
    GaveUp(String),
}

/// Asks the sidecar at `url` to hand over, under `timeout`.
pub async fn ask(url: &GateUrl, timeout: Duration) -> Result<Asked, String> {
    match url
        .fetch(Method::POST, &url.of_lease("/handover"), timeout)
        .await
    {
        Ok((202, _)) => Ok(Asked::SteppingDown),
        Ok((200, _)) => Ok(Asked::NotLeading),
        Ok((status, body)) => Err(format!(
            "the sidecar refused the step-down: HTTP {status}: {}",
            String::from_utf8_lossy(&body).trim()
        )),
        Err(error @ RequestError::Timeout(_)) => {
            Err(format!("the sidecar did not answer the step-down: {error}"))
        }
        Err(error) => Err(format!("cannot ask the sidecar to step down: {error}")),
    }
}

/// The hook: ask, wait (bounded by `timeout`), drain. Says how it ended on
/// stderr and returns it.
pub async fn run(url: GateUrl, timeout: Duration, drain: Duration) -> Outcome {
    let outcome = hand_over(&url, timeout).await;
    match &outcome {
        Outcome::HandedOver(holder) => {
            log(&format!(
                "{holder} holds the Lease now; waiting {drain:?} before the collector is stopped"
            ));
            tokio::time::sleep(drain).await;
        }
        Outcome::Released => log(&format!(
            "released the Lease, and nobody took it within {timeout:?}: letting the collector stop now"
        )),
        Outcome::NotLeading => log("this pod does not lead: nothing to hand over"),
        Outcome::GaveUp(why) => log(&format!("{why}; letting the collector stop now")),
    }
    outcome
}

async fn hand_over(url: &GateUrl, timeout: Duration) -> Outcome {
    let deadline = Instant::now() + timeout;
    match ask(url, timeout).await {
        Ok(Asked::SteppingDown) => {}
        Ok(Asked::NotLeading) => return Outcome::NotLeading,
        Err(why) => return Outcome::GaveUp(why),
    }
    let mut released = false;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() && released {
            return Outcome::Released;
        }
        if left.is_zero() {
            return Outcome::GaveUp(format!("this pod still held the Lease after {timeout:?}"));
        }
        match url.fetch(Method::GET, &url.leader(), left).await {
            Ok((_, body)) => match handed_over(&body) {
                Some(Some(holder)) => return Outcome::HandedOver(holder),
                Some(None) => released = true,
                None => {}
            },
            Err(RequestError::Timeout(_)) => {}
            Err(error) => {
                return Outcome::GaveUp(format!(
                    "the sidecar went away during the hand-over: {error}"
                ));
            }
        }
        let left = deadline.saturating_duration_since(Instant::now());
        tokio::time::sleep(POLL.min(left)).await;
    }
}

/// From a `/leader` body: `Some(holder)` once this pod no longer leads and
/// the record no longer names it (another holder, or `None`: released).
fn handed_over(body: &[u8]) -> Option<Option<String>> {
    let body: Value = serde_json::from_slice(body).ok()?;
    if body["leading"].as_bool()? {
        return None;
    }
    let identity = body["identity"].as_str()?;
    match body["holder"].as_str() {
        Some(holder) if holder == identity => None,
        holder => Some(holder.map(str::to_owned)),
    }
}

fn log(message: &str) {
    // Through tracing: `leader-gate prestop: message` as text, or the pod's
    // JSON lines (main.rs sets the format up).
    tracing::info!("{message}");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn handed_over_once_another_holds_it_or_it_was_released() {
        let body = |leading: bool, holder: Option<&str>| {
            serde_json::json!({"leading": leading, "identity": "me", "holder": holder}).to_string()
        };
        assert_eq!(handed_over(body(true, Some("me")).as_bytes()), None);
        assert_eq!(
            handed_over(body(false, Some("me")).as_bytes()),
            None,
            "stepped down, not yet released"
        );
        assert_eq!(
            handed_over(body(false, Some("peer")).as_bytes()),
            Some(Some("peer".into()))
        );
        assert_eq!(handed_over(body(false, None).as_bytes()), Some(None));
        assert_eq!(handed_over(b"not json"), None);
    }
}
