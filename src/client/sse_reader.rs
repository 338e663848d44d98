//! An incremental parser of `text/event-stream` bodies (the subset of the
//! HTML spec that `/events` uses: `id`, `event`, `data`, comments).

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
    }
}
