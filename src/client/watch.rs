//! `leader-gate watch`: prints one line per event of a sidecar's `/events`
//! (human readable, or one JSON object per line with `--json`), resuming
//! after a disconnect, and applies the validity rule: when leadership runs
//! out without a renewal it prints a synthetic `stopped-leading` marked as
//! local (`validity-expired`, or `stream-lost` when the stream is gone).

use std::io::Write;

use clap::Args;
use serde_json::{Value, json};

use crate::client::feed::{Feed, LocalStop, Message, Signal};
use crate::client::place::Place;
use crate::client::sse_reader::SseMessage;
use crate::client::url::{ClientArgs, GateUrl};
use crate::clock::{format_micro_time, wall_micros};

#[derive(Debug, Args)]
pub struct WatchArgs {
    #[command(flatten)]
    pub client: ClientArgs,

    /// One JSON object per line instead of human-readable lines.
    #[arg(long)]
    pub json: bool,
}

/// Follows the sidecar at `url`, printing to `out`, until `out` closes
/// (the reader of a pipe went away): that error is returned.
pub async fn run(url: GateUrl, json: bool, mut out: impl Write) -> std::io::Error {
    let mut feed = Feed::new(url);
    loop {
        let line = match feed.next().await {
            Signal::Event(message) => {
                // A renewal every retry period is noise for a person.
                if !json && message.sse.event == "renewed" {
                    continue;
                }
                event_line(&message, json)
            }
            Signal::Expired { term, reason } => local_stop_line(&term, reason, feed.place(), json),
            Signal::Connected | Signal::Resumed(_) => continue,
            Signal::Disconnected(why) => {
                log(&format!("{why}; reconnecting"));
                continue;
            }
        };
        if let Err(error) = writeln!(out, "{line}").and_then(|()| out.flush()) {
            return error;
        }
    }
}

fn event_line(message: &Message, json: bool) -> String {
    if json {
        json_line(&message.sse)
    } else {
        human_line(&message.sse)
    }
}

/// The line for a stop decided here: the same shape as the sidecar's
/// `stopped-leading` (of the Lease its events named), with `"local": true`.
fn local_stop_line(term: &str, reason: LocalStop, place: Option<&Place>, json: bool) -> String {
    let now = wall_micros();
    let mut data = json!({
        "type": "stopped-leading",
        "term": term,
        "reason": reason.as_str(),
        "local": true,
        "published_at_us": now,
        "published_at": format_micro_time(now),
    });
    if let Some(place) = place {
        data["lease"] = json!({"name": place.lease, "shard": place.shard, "shards": place.shards});
    }
    let sse = SseMessage {
        id: None,
        event: "stopped-leading".into(),
        data: data.to_string(),
    };
    if json {
        let mut line: Value = serde_json::from_str(&json_line(&sse)).expect("our own JSON");
        line["local"] = json!(true);
        line.to_string()
    } else {
        human_line(&sse)
    }
}

/// `{"id":…,"event":…,"data":{…}}`.
pub fn json_line(message: &SseMessage) -> String {
    let data: Value = serde_json::from_str(&message.data).unwrap_or(json!(message.data));
    json!({"id": message.id, "event": message.event, "data": data}).to_string()
}

/// `<time> <event> key=value …`, for people.
pub fn human_line(message: &SseMessage) -> String {
    let data: Value = serde_json::from_str(&message.data).unwrap_or(Value::Null);
    let field = |name: &str| {
        data.get(name).filter(|v| !v.is_null()).map(|v| match v {
            Value::String(s) => s.clone(),
            other => other.to_string(),
        })
    };
    let time = field("published_at")
        .or_else(|| field("since"))
        .unwrap_or_default();
    let mut line = format!("{time} {}", message.event);
    // Which Lease, when the sidecar has several.
    if data["lease"]["shards"].as_u64().is_some_and(|n| n > 1)
        && let Some(lease) = data["lease"]["name"].as_str()
    {
        line.push_str(&format!(" lease={lease}"));
    }
    for name in [
        "leading",
        "term",
        "reason",
        "holder",
        "valid_for_ms",
        "missed",
        "may_have_missed_events",
        "local",
    ] {
        if let Some(value) = field(name) {
            line.push_str(&format!(" {name}={value}"));
        }
    }
    line
}

/// Said on stderr (stdout is the events): as text or the pod's JSON lines.
fn log(message: &str) {
    tracing::info!("{message}");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_render_the_event_for_people_and_machines() {
        let message = SseMessage {
            id: Some("b-1".into()),
            event: "started-leading".into(),
            data: "{\"term\":\"u/1\"}".into(),
        };
        assert_eq!(
            human_line(&message),
            " started-leading term=u/1",
            "no time in this data"
        );
        assert_eq!(
            json_line(&message),
            r#"{"data":{"term":"u/1"},"event":"started-leading","id":"b-1"}"#
        );
    }

    #[test]
    fn a_local_stop_is_marked_as_local() {
        let line: Value =
            serde_json::from_str(&local_stop_line("u/1", LocalStop::StreamLost, None, true))
                .unwrap();
        assert_eq!(line["local"], true);
        assert_eq!(line["event"], "stopped-leading");
        assert_eq!(line["id"], Value::Null);
        assert_eq!(line["data"]["reason"], "stream-lost");
        assert_eq!(line["data"]["term"], "u/1");
        let human = local_stop_line("u/1", LocalStop::ValidityExpired, None, false);
        assert!(
            human.ends_with(" stopped-leading term=u/1 reason=validity-expired local=true"),
            "{human}"
        );
    }

    #[test]
    fn a_lease_of_several_is_named_and_a_lease_alone_is_not() {
        let shard = |shards| Place {
            lease: "ksm-1".into(),
            shard: 1,
            shards,
        };
        let line: Value = serde_json::from_str(&local_stop_line(
            "u/1",
            LocalStop::StreamLost,
            Some(&shard(3)),
            true,
        ))
        .unwrap();
        assert_eq!(line["data"]["lease"]["name"], "ksm-1");
        assert_eq!(line["data"]["lease"]["shard"], 1);
        let several = local_stop_line("u/1", LocalStop::StreamLost, Some(&shard(3)), false);
        assert!(
            several.contains(" stopped-leading lease=ksm-1 term=u/1 "),
            "{several}"
        );
        let alone = local_stop_line("u/1", LocalStop::StreamLost, Some(&shard(1)), false);
        assert!(!alone.contains("lease="), "{alone}");
    }
}
