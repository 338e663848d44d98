//! `leader-gate watch`: a subscriber of `/events` that prints one line per
//! event (human readable, or one JSON object per line with `--json`) and,
//! after a disconnect, reconnects with `Last-Event-ID` so nothing is missed
//! that the server still holds.

use std::io::Write;
use std::time::Duration;

use http_body_util::{BodyExt, Empty};
use hyper::Uri;
use hyper::body::Bytes;
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};
use tokio::net::TcpStream;

/// One parsed server-sent event.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SseMessage {
    pub id: Option<String>,
    pub event: String,
    pub data: String,
}

/// Incremental parser of a `text/event-stream` body.
#[derive(Default)]
pub struct SseParser {
    line: Vec<u8>,
    current: SseMessage,
    has_fields: bool,
}

impl SseParser {
    /// Feeds bytes; returns the events they complete.
    pub fn feed(&mut self, bytes: &[u8]) -> Vec<SseMessage> {
        let mut done = Vec::new();
        for &byte in bytes {
            if byte != b'\n' {
                self.line.push(byte);
                continue;
            }
            let line = String::from_utf8_lossy(&self.line)
                .trim_end_matches('\r')
                .to_owned();
            self.line.clear();
            if line.is_empty() {
                if self.has_fields {
                    done.push(std::mem::take(&mut self.current));
                    self.has_fields = false;
                }
                continue;
            }
            if line.starts_with(':') {
                continue; // a comment: keep-alive
            }
            let (field, value) = line.split_once(':').unwrap_or((&line, ""));
            let value = value.strip_prefix(' ').unwrap_or(value);
            match field {
                "id" => self.current.id = Some(value.to_owned()),
                "event" => self.current.event = value.to_owned(),
                "data" => {
                    if !self.current.data.is_empty() {
                        self.current.data.push('\n');
                    }
                    self.current.data.push_str(value);
                }
                _ => continue,
            }
            self.has_fields = true;
        }
        done
    }
}

/// Reconnect when not even a keep-alive arrived for this long (three of the
/// server's default 15 s keep-alive intervals).
const IDLE_TIMEOUT: Duration = Duration::from_secs(45);

/// Why a subscription ended.
enum Ended {
    /// The connection failed or went quiet: reconnect.
    Connection(String),
    /// Our own output is gone (a closed pipe): stop.
    Output(std::io::Error),
}

/// Why `watch` stopped.
#[derive(Debug, thiserror::Error)]
pub enum WatchError {
    #[error("invalid --url {0:?}: must be http://HOST:PORT/PATH")]
    InvalidUrl(String),
    /// Our output is gone (the reader of a pipe exited): nothing to do.
    #[error("cannot write events: {0}")]
    OutputClosed(std::io::Error),
}

/// Subscribes to `url` until the output closes, printing each event to
/// `out`; reconnects (with `Last-Event-ID`) after anything else.
pub async fn run(url: &str, json: bool, mut out: impl Write) -> Result<(), WatchError> {
    let invalid = || WatchError::InvalidUrl(url.to_owned());
    let uri: Uri = url.parse().map_err(|_| invalid())?;
    if uri.scheme_str() != Some("http") || uri.host().is_none() {
        return Err(invalid());
    }
    let mut last_id: Option<String> = None;
    let mut backoff = Duration::ZERO;
    loop {
        match subscribe(&uri, json, &mut out, &mut last_id, &mut backoff).await {
            Ended::Output(error) => return Err(WatchError::OutputClosed(error)),
            Ended::Connection(why) => eprintln!("leader-gate watch: {why}; reconnecting"),
        }
        backoff = (backoff * 2).clamp(Duration::from_millis(250), Duration::from_secs(5));
        tokio::time::sleep(backoff).await;
    }
}

/// One connection: resumes after `last_id` and keeps it up to date; resets
/// `backoff` once the server accepted the subscription.
async fn subscribe(
    uri: &Uri,
    json: bool,
    out: &mut impl Write,
    last_id: &mut Option<String>,
    backoff: &mut Duration,
) -> Ended {
    let host = uri.host().unwrap_or("127.0.0.1");
    let port = uri.port_u16().unwrap_or(80);
    let connection = |e: &dyn std::fmt::Display| Ended::Connection(e.to_string());
    let stream = match TcpStream::connect((host, port)).await {
        Ok(stream) => stream,
        Err(e) => return Ended::Connection(format!("cannot connect to {host}:{port}: {e}")),
    };
    let (mut sender, conn) = match hyper::client::conn::http1::handshake(TokioIo::new(stream)).await
    {
        Ok(pair) => pair,
        Err(e) => return connection(&e),
    };
    tokio::spawn(conn);
    let path = uri.path_and_query().map_or("/events", |p| p.as_str());
    let mut request = hyper::Request::get(path)
        .header("host", format!("{host}:{port}"))
        .header("accept", "text/event-stream");
    if let Some(id) = last_id.as_deref() {
        request = request.header("last-event-id", id);
    }
    let request = match request.body(Empty::<Bytes>::new()) {
        Ok(request) => request,
        Err(e) => return connection(&e),
    };
    let response = match sender.send_request(request).await {
        Ok(response) => response,
        Err(e) => return connection(&e),
    };
    if !response.status().is_success() {
        return Ended::Connection(format!("the server answered {}", response.status()));
    }
    *backoff = Duration::ZERO;
    let mut body = response.into_body();
    let mut parser = SseParser::default();
    loop {
        let frame = match tokio::time::timeout(IDLE_TIMEOUT, body.frame()).await {
            Err(_) => return Ended::Connection(format!("nothing received for {IDLE_TIMEOUT:?}")),
            Ok(None) => return Ended::Connection("the stream ended".into()),
            Ok(Some(Err(e))) => return connection(&e),
            Ok(Some(Ok(frame))) => frame,
        };
        let Some(bytes) = frame.data_ref() else {
            continue;
        };
        for message in parser.feed(bytes) {
            if message.id.is_some() {
                last_id.clone_from(&message.id);
            }
            let line = if json {
                json_line(&message)
            } else {
                human_line(&message)
            };
            if let Err(error) = writeln!(out, "{line}").and_then(|()| out.flush()) {
                return Ended::Output(error);
            }
        }
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
    for name in [
        "leading",
        "term",
        "reason",
        "holder",
        "missed",
        "may_have_missed_events",
    ] {
        if let Some(value) = field(name) {
            line.push_str(&format!(" {name}={value}"));
        }
    }
    line
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_split_across_reads_and_comments_are_handled() {
        let mut parser = SseParser::default();
        assert!(
            parser
                .feed(b": keep-alive\n\nid: b-1\nevent: started-le")
                .is_empty()
        );
        let done = parser.feed(b"ading\ndata: {\"term\":\"u/1\"}\r\n\r\n");
        assert_eq!(
            done,
            vec![SseMessage {
                id: Some("b-1".into()),
                event: "started-leading".into(),
                data: "{\"term\":\"u/1\"}".into(),
            }]
        );
        assert_eq!(
            human_line(&done[0]),
            " started-leading term=u/1",
            "no time in this data"
        );
        assert_eq!(
            json_line(&done[0]),
            r#"{"data":{"term":"u/1"},"event":"started-leading","id":"b-1"}"#
        );
    }
}
