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

/// Subscribes to `url` forever, printing each event to `out`.
pub async fn run(url: &str, json: bool, mut out: impl Write) -> Result<(), String> {
    let uri: Uri = url
        .parse()
        .map_err(|e| format!("invalid --url {url:?}: {e}"))?;
    if uri.scheme_str() != Some("http") || uri.host().is_none() {
        return Err(format!(
            "invalid --url {url:?}: must be http://HOST:PORT/PATH"
        ));
    }
    let mut last_id: Option<String> = None;
    let mut backoff = Duration::from_millis(250);
    loop {
        match subscribe(&uri, json, &mut out, &mut last_id).await {
            Ok(()) => eprintln!("leader-gate watch: stream ended; reconnecting"),
            Err(error) => eprintln!("leader-gate watch: {error}; reconnecting in {backoff:?}"),
        }
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(Duration::from_secs(5));
    }
}

/// One connection: resumes after `last_id` and keeps it up to date.
async fn subscribe(
    uri: &Uri,
    json: bool,
    out: &mut impl Write,
    last_id: &mut Option<String>,
) -> Result<(), String> {
    let host = uri.host().unwrap_or("127.0.0.1");
    let port = uri.port_u16().unwrap_or(80);
    let stream = TcpStream::connect((host, port))
        .await
        .map_err(|e| format!("cannot connect to {host}:{port}: {e}"))?;
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|e| e.to_string())?;
    tokio::spawn(connection);
    let path = uri.path_and_query().map_or("/events", |p| p.as_str());
    let mut request = hyper::Request::get(path)
        .header("host", format!("{host}:{port}"))
        .header("accept", "text/event-stream");
    if let Some(id) = last_id.as_deref() {
        request = request.header("last-event-id", id);
    }
    let request = request
        .body(Empty::<Bytes>::new())
        .map_err(|e| e.to_string())?;
    let response = sender
        .send_request(request)
        .await
        .map_err(|e| e.to_string())?;
    if !response.status().is_success() {
        return Err(format!("the server answered {}", response.status()));
    }
    let mut body = response.into_body();
    let mut parser = SseParser::default();
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| e.to_string())?;
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
            writeln!(out, "{line}").map_err(|e| e.to_string())?;
            out.flush().map_err(|e| e.to_string())?;
        }
    }
    Ok(())
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
