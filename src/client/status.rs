//! `leader-gate status` (one question: does this pod lead right now?) and
//! `leader-gate wait` (block until it does), for scripts and for images
//! without curl.

use std::time::Duration;

use clap::Args;
use hyper::Method;
use serde_json::Value;
use tokio::time::Instant;

use crate::client::feed::{Feed, Signal};
use crate::client::url::{ClientArgs, GateUrl};
use crate::duration::parse_duration;

/// How long `status` waits for an answer.
const STATUS_TIMEOUT: Duration = Duration::from_secs(2);

/// `wait`'s flags (`status` takes only [`ClientArgs`]).
#[derive(Debug, Args)]
pub struct WaitArgs {
    #[command(flatten)]
    pub client: ClientArgs,

    /// Give up after this long (exit 1) [default: wait for ever].
    #[arg(long, value_parser = parse_duration)]
    pub timeout: Option<Duration>,
}

/// The answer to `status`, which is also its exit code.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Status {
    /// 200 with a body that says leading.
    Leading = 0,
    /// 503 with a valid body that says not leading.
    NotLeading = 1,
    /// No answer, or not one a sidecar gives.
    Unknown = 2,
}

/// Asks `GET /leader` once; returns the verdict and what to print.
pub async fn status(url: &GateUrl) -> (Status, String) {
    let (status, body) = match url.fetch(Method::GET, &url.leader(), STATUS_TIMEOUT).await {
        Ok(answer) => answer,
        Err(error) => return (Status::Unknown, format!("cannot ask the sidecar: {error}")),
    };
    let text = String::from_utf8_lossy(&body).trim().to_owned();
    // Asked of one Lease, the answer must be about it.
    let leading = serde_json::from_str::<Value>(&text)
        .ok()
        .filter(|body| url.lease().is_none_or(|name| body["lease"]["name"] == name))
        .and_then(|body| body["leading"].as_bool());
    let verdict = match (status, leading) {
        (200, Some(true)) => Status::Leading,
        (503, Some(false)) => Status::NotLeading,
        _ => {
            return (
                Status::Unknown,
                format!("not a leader-gate answer: HTTP {status}: {text}"),
            );
        }
    };
    (verdict, text)
}

/// Waits until this pod leads (by the validity rule), or `timeout` passes;
/// an unreachable sidecar is waited for like a follower. Returns whether it
/// leads.
pub async fn wait(url: GateUrl, timeout: Option<Duration>) -> bool {
    let give_up = timeout.map(|t| Instant::now() + t);
    let mut feed = Feed::new(url);
    let until_leading = async {
        loop {
            if feed.leading().is_some() {
                return;
            }
            if let Signal::Disconnected(why) = feed.next().await {
                log(&format!("{why}; retrying"));
            }
        }
    };
    match give_up {
        Some(at) => tokio::time::timeout_at(at, until_leading).await.is_ok(),
        None => {
            until_leading.await;
            true
        }
    }
}

/// Said on stderr (stdout is the answer): as text or the pod's JSON lines.
fn log(message: &str) {
    tracing::info!("{message}");
}
