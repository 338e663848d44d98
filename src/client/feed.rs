//! The one consumer of a sidecar's `/events` that every client gate shares.
//! It applies the validity rule, so a gate fails closed even when the
//! sidecar dies without a word (SIGKILL, OOM kill):
//!
//! leadership is valid until *receive time + `valid_for_ms`* of the latest
//! `state`, `started-leading` or `renewed` that confirmed it, and ends at
//! once on `stopped-leading`. A lost stream ends nothing by itself; the
//! expiry does. When the message's `valid_until` is on this client's own
//! boot clock (same `boot_id`: one kernel, one pod), that deadline is used
//! instead (never later than the rule above): a message delivered late, or
//! replayed after a reconnect, counts exactly as old as it is. The wall
//! clock is never used (a step of it would stretch or cut validity).
//!
//! The feed reconnects on its own (with `Last-Event-ID`, so nothing the
//! sidecar still holds is missed) and never ends. A gate that can tell when
//! a term has really ended for it registers ([`Feed::registered`]) and
//! acknowledges each such term ([`Feed::acknowledgement`]): the sidecar's
//! graceful release then need not wait out its whole gate lag. Only a 204
//! from the sidecar counts as told; a gate registered as one that never
//! acknowledges gets an error, never a pretended success. Validity is kept
//! on the boot clock, which counts through suspend.

use std::collections::VecDeque;
use std::time::Duration;

use http_body_util::BodyExt;
use hyper::Method;
use hyper::body::Incoming;
use serde_json::Value;
use tokio::time::{Instant, sleep_until};

use crate::args::MAX_KEEP_ALIVE;
use crate::backoff::Backoff;
use crate::client::place::Place;
use crate::client::sse_reader::{SseMessage, SseParser};
use crate::client::url::{GateUrl, RequestError};
use crate::clock::{BootInstant, boot_clock_id};

/// Reconnect when not even a keep-alive arrived for this long.
const IDLE_TIMEOUT: Duration = Duration::from_secs(3 * MAX_KEEP_ALIVE.as_secs());
/// Bound on connecting and on the response head.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// Bound on an acknowledgement: the sidecar answers it at once, and a gate
/// that cannot give one costs only the gate lag.
const ACK_TIMEOUT: Duration = Duration::from_secs(1);
/// Re-check the boot clock at least this often while leading: a monotonic
/// timer does not fire on time after a suspend.
const MAX_SLEEP: Duration = Duration::from_secs(1);
/// Reconnecting to a local sidecar: quick at first, never a busy loop. No
/// jitter: one client per sidecar, no herd to spread.
const RECONNECT: Backoff = Backoff {
    first: Duration::from_millis(250),
    max: Duration::from_secs(5),
    jitter: 0.0,
};

/// Leadership as this client may rely on it right now.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Validity {
    /// The term id, unique per acquisition.
    pub term: String,
    /// When it ends unless renewed first.
    pub until: BootInstant,
}

/// One event as the sidecar sent it.
#[derive(Clone, Debug)]
pub struct Message {
    pub sse: SseMessage,
    /// The parsed `data:` (`null` when it is not JSON).
    pub data: Value,
}

/// Why leadership ended here, not at the sidecar.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LocalStop {
    /// Connected, but no renewal arrived in time.
    ValidityExpired,
    /// The stream was lost, and with it every renewal.
    StreamLost,
}

impl LocalStop {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::ValidityExpired => "validity-expired",
            Self::StreamLost => "stream-lost",
        }
    }
}

/// What [`Feed::next`] reports.
#[derive(Clone, Debug)]
pub enum Signal {
    /// An event from the sidecar, already applied to [`Feed::leading`].
    Event(Message),
    /// Leadership of `term` ran out here without a renewal.
    Expired { term: String, reason: LocalStop },
    /// Subscribed (again).
    Connected,
    /// The stream broke or cannot be opened; said once per outage, naming
    /// the sidecar and what the outage means for a term held here.
    Disconnected(String),
    /// After an outage during which a term was held here, the sidecar
    /// confirmed that same term again: nothing of it was stopped, and the
    /// message says so.
    Resumed(String),
}

impl Signal {
    /// What a gate says about this in its log, if anything: a local stop or
    /// an outage (the sidecar's events speak for themselves).
    pub fn log_line(&self) -> Option<String> {
        match self {
            Self::Expired { term, reason } => Some(format!(
                "leadership of term {term} could not be confirmed ({})",
                reason.as_str()
            )),
            Self::Disconnected(why) => Some(format!("{why}; retrying")),
            Self::Resumed(what) => Some(what.clone()),
            Self::Event(_) | Self::Connected => None,
        }
    }
}

/// The subscription and the leadership it vouches for.
pub struct Feed {
    url: GateUrl,
    /// This client's boot clock, to tell a deadline it can judge as is.
    boot_clock: Option<&'static str>,
    stream: Option<Stream>,
    last_id: Option<String>,
    validity: Option<Validity>,
    ready: VecDeque<Signal>,
    /// No connection attempt before this instant (backoff).
    retry_at: Instant,
    /// Failed connections in a row.
    failures: u32,
    /// An outage was reported and not yet followed by a connection.
    down_reported: bool,
    /// Registered as a gate under this id (`/events?gate=ID`): the sidecar
    /// counts it for every term until it acknowledges the term's end.
    gate: Option<String>,
    /// Registered as a gate that never acknowledges: every release of a
    /// term it was open for waits the whole gate lag.
    silent: bool,
    /// How long this gate may take to stop its collector once a term ends
    /// (`exec --grace`), told at registration so the sidecar can warn when
    /// its gate lag does not cover it.
    stops_within: Option<Duration>,
    /// The last term the sidecar itself said had stopped.
    stopped: Option<String>,
    /// The Lease the sidecar's events said they are of, and its place.
    place: Option<Place>,
    /// The term held here when the outage now under way was reported: its
    /// confirmation after a reconnect is said ([`Signal::Resumed`]).
    held_through_outage: Option<String>,
    /// See [`Feed::heard_not_leading`].
    heard_not_leading: bool,
}

struct Stream {
    body: Incoming,
    parser: SseParser,
    /// When something (even a keep-alive) last arrived.
    heard_at: Instant,
}

// === impl Feed ===

impl Feed {
    pub fn new(url: GateUrl) -> Self {
        Self {
            url,
            boot_clock: boot_clock_id(),
            stream: None,
            last_id: None,
            validity: None,
            ready: VecDeque::new(),
            retry_at: Instant::now(),
            failures: 0,
            down_reported: false,
            gate: None,
            silent: false,
            stops_within: None,
            stopped: None,
            place: None,
            held_through_outage: None,
            heard_not_leading: false,
        }
    }

    /// A feed that registers as a gate (`kind` names it in the sidecar's
    /// logs): the sidecar's graceful release waits for this gate's
    /// [`Feed::acknowledgement`] of each term it was open for, up to its
    /// gate lag — or, if it cannot tell when its collector stopped
    /// (`acknowledges` false), always the whole gate lag.
    pub fn registered(url: GateUrl, kind: &str, acknowledges: bool) -> Self {
        let mut feed = Self::new(url);
        feed.silent = !acknowledges;
        feed.gate = Some(format!(
            "{kind}-{}-{:08x}",
            std::process::id(),
            fastrand::u32(..)
        ));
        feed
    }

    /// Tells the sidecar at registration that this gate may take up to
    /// `bound` to stop its collector once a term ends.
    pub fn stopping_within(mut self, bound: Duration) -> Self {
        self.stops_within = Some(bound);
        self
    }

    /// Whether this feed acknowledges terms: registered, and not as a gate
    /// that never does.
    pub fn acknowledges(&self) -> bool {
        self.gate.is_some() && !self.silent
    }

    /// The last term the sidecar said had stopped (a `stopped-leading`):
    /// it is over there and cannot come back, unlike one that only ran out
    /// here.
    pub fn stopped_term(&self) -> Option<&str> {
        self.stopped.as_deref()
    }

    /// Tells the sidecar that nothing of `term` runs here and nothing will
    /// again, so its release need not wait out the gate lag for this gate.
    /// Best-effort: without it the sidecar waits its gate lag, as for any
    /// gate that cannot say. Not registered: nothing to tell. Registered as
    /// a gate that never acknowledges: an error, never a claim that it told.
    /// Resolves with the term once the sidecar counted it (a 204, nothing
    /// else).
    pub fn acknowledgement(
        &self,
        term: String,
    ) -> impl Future<Output = Result<String, String>> + Send + 'static {
        let silent = self.gate.is_some() && self.silent;
        let request = self.gate.as_ref().filter(|_| !self.silent).map(|gate| {
            let endpoint = format!("/gates/{gate}/closed?term={}", query_escape(&term));
            (self.url.clone(), self.url.of_lease(&endpoint))
        });
        async move {
            let Some((url, endpoint)) = request else {
                if silent {
                    return Err(format!(
                        "not acknowledging term {term}: registered as a gate that never acknowledges"
                    ));
                }
                return Ok(term);
            };
            match url.fetch(Method::POST, &endpoint, ACK_TIMEOUT).await {
                Ok((204, _)) => Ok(term),
                Ok((status, body)) => Err(format!(
                    "the sidecar answered {status} to the acknowledgement of term {term}: {}",
                    String::from_utf8_lossy(&body).trim()
                )),
                Err(error) => Err(format!(
                    "cannot acknowledge the end of term {term}: {error}"
                )),
            }
        }
    }

    /// The sidecar said at least once that this pod does not lead the
    /// followed Lease (a `state` saying so, or a `stopped-leading`): every
    /// term after that began while this feed listened.
    pub fn heard_not_leading(&self) -> bool {
        self.heard_not_leading
    }

    /// The followed Lease and its shard, once the sidecar named them.
    pub fn place(&self) -> Option<&Place> {
        self.place.as_ref()
    }

    /// The leadership this client may act on now, if any.
    pub fn leading(&self) -> Option<&Validity> {
        self.validity
            .as_ref()
            .filter(|v| !v.until.remaining().is_zero())
    }

    /// The next thing that happened; never ends (it reconnects).
    pub async fn next(&mut self) -> Signal {
        loop {
            if let Some(signal) = self.ready.pop_front() {
                return signal;
            }
            if let Some(validity) = &self.validity
                && validity.until.remaining().is_zero()
            {
                let term = validity.term.clone();
                self.validity = None;
                self.held_through_outage = None;
                let reason = if self.stream.is_some() {
                    // A stream that missed a renewal may be stalled: start over.
                    self.stream = None;
                    LocalStop::ValidityExpired
                } else {
                    LocalStop::StreamLost
                };
                return Signal::Expired { term, reason };
            }
            let check = self
                .validity
                .as_ref()
                .map(|v| Instant::now() + v.until.remaining().min(MAX_SLEEP));
            tokio::select! {
                () = self.progress() => {}
                () = sleep_until(check.unwrap_or_else(far_future)), if check.is_some() => {}
            }
        }
    }

    /// One step of the connection: connect, or read what arrived. Every
    /// await in here may be cancelled by the expiry timer without loss.
    async fn progress(&mut self) {
        let Some(stream) = &mut self.stream else {
            sleep_until(self.retry_at).await;
            self.connect().await;
            return;
        };
        let quiet_until = stream.heard_at + IDLE_TIMEOUT;
        let frame = match tokio::time::timeout_at(quiet_until, stream.body.frame()).await {
            Err(_) => {
                return self.lost(format!(
                    "nothing received on the event stream from the sidecar at {} for {IDLE_TIMEOUT:?}",
                    self.url
                ));
            }
            Ok(None) => {
                return self.lost(format!(
                    "the sidecar at {} ended the event stream",
                    self.url
                ));
            }
            Ok(Some(Err(error))) => {
                return self.lost(format!(
                    "the event stream from the sidecar at {} broke ({error})",
                    self.url
                ));
            }
            Ok(Some(Ok(frame))) => frame,
        };
        let received = BootInstant::now();
        stream.heard_at = Instant::now();
        let Some(bytes) = frame.data_ref() else {
            return;
        };
        for sse in stream.parser.feed(bytes) {
            let data = serde_json::from_str(&sse.data).unwrap_or(Value::Null);
            let message = Message { sse, data };
            self.apply(&message, received);
            self.say_resumed(&message);
            self.ready.push_back(Signal::Event(message));
        }
    }

    async fn connect(&mut self) {
        let last_id = self.last_id.clone();
        let mut headers = vec![("accept", "text/event-stream")];
        if let Some(id) = last_id.as_deref() {
            headers.push(("last-event-id", id));
        }
        let mut endpoint = match &self.gate {
            Some(gate) if self.silent => format!("/events?gate={gate}&acknowledges=false"),
            Some(gate) => format!("/events?gate={gate}"),
            None => "/events".to_owned(),
        };
        if let (Some(_), Some(bound)) = (&self.gate, self.stops_within) {
            endpoint.push_str(&format!("&stops_within_ms={}", bound.as_millis()));
        }
        let endpoint = self.url.of_lease(&endpoint);
        let result = self
            .url
            .send(Method::GET, &endpoint, &headers, CONNECT_TIMEOUT)
            .await;
        match result {
            Ok(response) if response.status().is_success() => {
                self.stream = Some(Stream {
                    body: response.into_body(),
                    parser: SseParser::default(),
                    heard_at: Instant::now(),
                });
                self.failures = 0;
                self.down_reported = false;
                self.ready.push_back(Signal::Connected);
            }
            Ok(response) => {
                // Its words say what is wrong (a Lease to name, say); an
                // answer that does not end soon is not waited for.
                let status = response.status();
                let body = tokio::time::timeout(CONNECT_TIMEOUT, response.into_body().collect())
                    .await
                    .ok()
                    .and_then(Result::ok)
                    .map(|body| String::from_utf8_lossy(&body.to_bytes()).trim().to_owned())
                    .unwrap_or_default();
                self.lost(format!(
                    "the sidecar at {} answered {status} to {endpoint}: {body}",
                    self.url,
                ))
            }
            // "cannot connect to ADDR: …" names the sidecar already.
            Err(error @ RequestError::Connect { .. }) => self.lost(error.to_string()),
            Err(error) => self.lost(format!(
                "cannot subscribe to the sidecar at {}: {error}",
                self.url
            )),
        }
    }

    /// The stream is gone or could not be opened: retry after a backoff.
    fn lost(&mut self, why: String) {
        self.stream = None;
        self.failures = self.failures.saturating_add(1);
        self.retry_at = Instant::now() + RECONNECT.delay(self.failures, 0.0);
        if !self.down_reported {
            self.down_reported = true;
            let outcome = self.outage_outcome();
            self.ready
                .push_back(Signal::Disconnected(format!("{why}{outcome}")));
        }
    }

    /// What an outage means for the term held here, if one is: it stays
    /// until its validity runs out, unless the sidecar confirms it again.
    fn outage_outcome(&mut self) -> String {
        let Some(validity) = self.leading() else {
            self.held_through_outage = None;
            return String::new();
        };
        let (term, left) = (validity.term.clone(), validity.until.remaining());
        let what = if self.gate.is_some() {
            "what this gate keeps for term"
        } else {
            "leadership of term"
        };
        let said = format!(
            ": {what} {term} stays for at most {:.1}s (its validity) unless the sidecar confirms the term again",
            left.as_secs_f64()
        );
        self.held_through_outage = Some(term);
        said
    }

    /// After an outage: whether `message` confirmed the term held through
    /// it, which is then said once.
    fn say_resumed(&mut self, message: &Message) {
        let Some(held) = self.held_through_outage.as_deref() else {
            return;
        };
        if !matches!(
            message.sse.event.as_str(),
            "state" | "started-leading" | "renewed" | "stopped-leading"
        ) || self
            .url
            .lease()
            .is_some_and(|name| message.data["lease"]["name"] != name)
        {
            return; // says nothing about the term followed
        }
        if self.validity.as_ref().is_some_and(|v| v.term == held) {
            let what = if self.gate.is_some() {
                "what this gate keeps for it stays"
            } else {
                "it went on"
            };
            self.ready.push_back(Signal::Resumed(format!(
                "the sidecar at {} confirmed term {held} again after the outage: {what}",
                self.url
            )));
        }
        // Confirmed, or over (the gate says what it stops).
        self.held_through_outage = None;
    }

    /// The validity rule.
    fn apply(&mut self, message: &Message, received: BootInstant) {
        if message.sse.id.is_some() {
            self.last_id.clone_from(&message.sse.id);
        }
        let data = &message.data;
        let lease = &data["lease"];
        if let Some(name) = lease["name"].as_str() {
            self.place = Some(Place {
                lease: name.to_owned(),
                shard: lease["shard"].as_u64().unwrap_or(0),
                shards: lease["shards"].as_u64().unwrap_or(1),
            });
        }
        // Following one Lease of several: only what names it counts.
        let ours = self.url.lease().is_none_or(|name| lease["name"] == name);
        let confirmed = || {
            if !ours {
                return None;
            }
            let term = data["term"].as_str()?;
            let until = validity_end(data, received, self.boot_clock)?;
            Some(Validity {
                term: term.to_owned(),
                until,
            })
        };
        match message.sse.event.as_str() {
            // The whole truth as of now: leading with a validity, or not.
            "state" => {
                let leading = data["leading"].as_bool().unwrap_or(false);
                self.validity = confirmed().filter(|_| leading);
                self.heard_not_leading |= ours && !leading;
                // The sidecar says that term ended: as a `stopped-leading`
                // would have, had this stream not missed it.
                if let Some(term) = data["last_term"].as_str()
                    && !leading
                {
                    self.stopped = Some(term.to_owned());
                }
            }
            "started-leading" | "renewed" => {
                if let Some(validity) = confirmed() {
                    self.validity = Some(validity);
                }
            }
            "stopped-leading" => {
                self.validity = None;
                self.heard_not_leading |= ours;
                if let Some(term) = data["term"].as_str() {
                    self.stopped = Some(term.to_owned());
                }
            }
            // `new-leader` changes nothing here; `lagged` is followed by a state.
            _ => {}
        }
    }
}

/// Where the validity a message confirms ends, if it confirms one: its
/// `valid_until` when that is on `boot_clock` (the sidecar's deadline, so a
/// message held back or replayed counts as old as it is), else `received +
/// valid_for_ms`, and never later than that. `None` once it has run out.
fn validity_end(
    data: &Value,
    received: BootInstant,
    boot_clock: Option<&str>,
) -> Option<BootInstant> {
    let valid_for = data["valid_for_ms"].as_u64().filter(|&ms| ms > 0)?;
    let by_receipt = received.plus(Duration::from_millis(valid_for));
    let until = &data["valid_until"];
    let deadline = until["boottime_ms"]
        .as_u64()
        .filter(|_| boot_clock.is_some() && until["boot_id"].as_str() == boot_clock)
        .map(|ms| BootInstant::from_since_boot(Duration::from_millis(ms)));
    let end = deadline.map_or(by_receipt, |deadline| deadline.min(by_receipt));
    (!end.remaining().is_zero()).then_some(end)
}

/// Everything but unreserved characters percent-encoded, for a query value.
fn query_escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for byte in text.bytes() {
        if byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'.' | b'_' | b'~') {
            out.push(byte as char);
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
}

fn far_future() -> Instant {
    Instant::now() + Duration::from_secs(86_400)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn feed() -> Feed {
        Feed::new(GateUrl::parse("http://127.0.0.1:9").unwrap())
    }

    fn message(event: &str, data: Value) -> Message {
        Message {
            sse: SseMessage {
                id: None,
                event: event.into(),
                data: data.to_string(),
            },
            data,
        }
    }

    #[test]
    fn validity_runs_from_receipt_and_ends_at_once_on_a_stop() {
        let mut feed = feed();
        let now = BootInstant::now();
        let start = json_msg("started-leading", "u/1", 3000);
        feed.apply(&start, now);
        let leading = feed.leading().expect("leading after a start");
        assert_eq!(leading.term, "u/1");
        assert_eq!(leading.until, now.plus(Duration::from_millis(3000)));
        feed.apply(&json_msg("renewed", "u/1", 5000), now);
        assert_eq!(
            feed.leading().unwrap().until,
            now.plus(Duration::from_millis(5000))
        );
        feed.apply(
            &message("stopped-leading", serde_json::json!({"term": "u/1"})),
            now,
        );
        assert_eq!(feed.leading(), None);
    }

    #[test]
    fn nothing_without_a_positive_validity_counts_as_leading() {
        let mut feed = feed();
        let now = BootInstant::now();
        // A replayed start of an old term, an old sidecar without validity,
        // a state that says not leading, a validity already run out.
        feed.apply(&json_msg("started-leading", "u/1", 0), now);
        feed.apply(
            &message("started-leading", serde_json::json!({"term": "u/2"})),
            now,
        );
        feed.apply(
            &message(
                "state",
                serde_json::json!({"leading": false, "term": null, "valid_for_ms": 0}),
            ),
            now,
        );
        assert_eq!(feed.leading(), None);
        let long_ago = BootInstant::now();
        std::thread::sleep(Duration::from_millis(5));
        feed.apply(&json_msg("renewed", "u/3", 1), long_ago);
        assert_eq!(feed.leading(), None, "validity counted from receipt");
    }

    /// A `renewed` as the sidecar on boot clock `boot_id` sends it.
    fn renewed_until(boot_id: &str, valid_for_ms: u64, boottime_ms: u64) -> Message {
        message(
            "renewed",
            serde_json::json!({
                "term": "u/1",
                "valid_for_ms": valid_for_ms,
                "valid_until": {"boot_id": boot_id, "boottime_ms": boottime_ms},
            }),
        )
    }

    #[test]
    fn a_deadline_on_this_boot_clock_is_used_as_is() {
        let mut feed = feed();
        feed.boot_clock = Some("boot-a");
        let now = BootInstant::now();
        // Sent 2 s ago with 3 s left (held back by a proxy, or a replayed
        // start): 1 s left, by the sidecar's own deadline.
        let deadline = now.plus(Duration::from_millis(1_000)).as_millis();
        feed.apply(&renewed_until("boot-a", 3_000, deadline), now);
        let until = feed.leading().expect("still valid for about 1 s").until;
        assert_eq!(until.as_millis(), deadline);
        // A deadline already passed confirms nothing, whatever valid_for says.
        let mut feed = self::feed();
        feed.boot_clock = Some("boot-a");
        let passed = now.as_millis().saturating_sub(1);
        feed.apply(&renewed_until("boot-a", 3_000, passed), now);
        assert_eq!(feed.leading(), None, "held back longer than its validity");
        // Never later than receipt + valid_for_ms.
        let late = now.plus(Duration::from_secs(60)).as_millis();
        feed.apply(&renewed_until("boot-a", 3_000, late), now);
        assert_eq!(
            feed.leading().unwrap().until,
            now.plus(Duration::from_millis(3_000))
        );
    }

    #[test]
    fn a_deadline_on_another_boot_clock_counts_from_receipt() {
        let now = BootInstant::now();
        let soon = now.plus(Duration::from_millis(500)).as_millis();
        for own in [Some("boot-a"), None] {
            let mut feed = feed();
            feed.boot_clock = own;
            // Another kernel's boot clock (or none here): not comparable.
            feed.apply(&renewed_until("boot-b", 3_000, soon), now);
            assert_eq!(
                feed.leading().unwrap().until,
                now.plus(Duration::from_millis(3_000)),
                "{own:?}"
            );
            // An older sidecar without the field.
            let mut feed = self::feed();
            feed.boot_clock = own;
            feed.apply(&json_msg("renewed", "u/1", 3_000), now);
            assert_eq!(
                feed.leading().unwrap().until,
                now.plus(Duration::from_millis(3_000))
            );
        }
    }

    #[test]
    fn the_wall_clock_is_never_used() {
        let now = BootInstant::now();
        let deadline = now.plus(Duration::from_millis(2_000)).as_millis();
        // Publication times an hour behind and ahead of this wall clock (a
        // clock step between sending and receipt) change nothing.
        for published_at_us in [
            crate::clock::wall_micros() - 3_600_000_000,
            crate::clock::wall_micros() + 3_600_000_000,
        ] {
            for (boot_id, expected) in [
                (
                    "boot-a",
                    BootInstant::from_since_boot(Duration::from_millis(deadline)),
                ),
                ("boot-b", now.plus(Duration::from_millis(3_000))),
            ] {
                let mut feed = feed();
                feed.boot_clock = Some("boot-a");
                let mut renewed = renewed_until(boot_id, 3_000, deadline);
                renewed.data["published_at_us"] = published_at_us.into();
                feed.apply(&renewed, now);
                assert_eq!(feed.leading().unwrap().until, expected, "{boot_id}");
            }
        }
    }

    #[test]
    fn a_state_is_the_whole_truth() {
        let mut feed = feed();
        let now = BootInstant::now();
        feed.apply(&json_msg("started-leading", "u/1", 3000), now);
        // The stream missed the stop; the fresh stream's state says u/1
        // ended, as the stop would have.
        feed.apply(
            &message(
                "state",
                serde_json::json!({"leading": false, "term": null, "last_term": "u/1", "valid_for_ms": 0}),
            ),
            now,
        );
        assert_eq!(feed.leading(), None);
        assert_eq!(feed.stopped_term(), Some("u/1"));
        feed.stopped = None;
        // Leading again: the term that ended before is no news.
        feed.apply(
            &message(
                "state",
                serde_json::json!({"leading": true, "term": "u/2", "last_term": "u/1", "valid_for_ms": 900}),
            ),
            now,
        );
        assert_eq!(feed.leading().map(|v| v.term.as_str()), Some("u/2"));
        assert_eq!(feed.stopped_term(), None);
    }

    fn json_msg(event: &str, term: &str, valid_for_ms: u64) -> Message {
        message(
            event,
            serde_json::json!({"term": term, "valid_for_ms": valid_for_ms}),
        )
    }

    /// The outage line names the sidecar and says what happens to the term
    /// held here; the term confirmed again after it is said too, once.
    #[test]
    fn an_outage_says_which_sidecar_and_what_the_held_term_keeps() {
        let mut feed = Feed::registered(
            GateUrl::parse("http://127.0.0.1:4040").unwrap(),
            "file-gate",
            true,
        );
        feed.apply(
            &json_msg("started-leading", "u/1", 10_000),
            BootInstant::now(),
        );
        feed.lost("the event stream from the sidecar at 127.0.0.1:4040 broke (error reading a body from connection)".into());
        let Some(Signal::Disconnected(why)) = feed.ready.pop_front() else {
            panic!("the outage is reported");
        };
        let line = Signal::Disconnected(why).log_line().unwrap();
        assert!(
            line.starts_with(
                "the event stream from the sidecar at 127.0.0.1:4040 broke (error reading a body from connection): \
                 what this gate keeps for term u/1 stays for at most "
            ) && line.ends_with(
                "s (its validity) unless the sidecar confirms the term again; retrying"
            ),
            "{line}"
        );
        // Reconnected: the state confirms the same term.
        let state = message(
            "state",
            serde_json::json!({"leading": true, "term": "u/1", "valid_for_ms": 10_000}),
        );
        feed.apply(&state, BootInstant::now());
        feed.say_resumed(&state);
        let resumed = feed.ready.pop_front().and_then(|s| s.log_line());
        assert_eq!(
            resumed.as_deref(),
            Some(
                "the sidecar at 127.0.0.1:4040 confirmed term u/1 again after the outage: what this gate keeps for it stays"
            )
        );
        feed.say_resumed(&state);
        assert!(feed.ready.is_empty(), "said once");

        // An outage while not leading says nothing of a term; one whose
        // term ended while it lasted says no resumption.
        feed.down_reported = false;
        feed.apply(
            &message("stopped-leading", serde_json::json!({"term": "u/1"})),
            BootInstant::now(),
        );
        feed.lost("the sidecar at 127.0.0.1:4040 ended the event stream".into());
        let Some(Signal::Disconnected(why)) = feed.ready.pop_front() else {
            panic!("the outage is reported");
        };
        assert_eq!(why, "the sidecar at 127.0.0.1:4040 ended the event stream");
        feed.down_reported = false;
        feed.apply(
            &json_msg("started-leading", "u/2", 10_000),
            BootInstant::now(),
        );
        feed.lost("gone".into());
        feed.ready.clear();
        let other = message(
            "state",
            serde_json::json!({"leading": false, "last_term": "u/2", "valid_for_ms": 0}),
        );
        feed.apply(&other, BootInstant::now());
        feed.say_resumed(&other);
        assert!(feed.ready.is_empty(), "the term ended: nothing resumed");
        assert_eq!(feed.held_through_outage, None);
    }

    #[tokio::test]
    async fn an_unreachable_sidecar_is_reported_once_and_never_leads() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        drop(listener); // nothing listens there now
        let mut feed = Feed::new(GateUrl::parse(&url).unwrap());
        assert!(matches!(feed.next().await, Signal::Disconnected(_)));
        // Further failed attempts say nothing more.
        let quiet = tokio::time::timeout(Duration::from_millis(800), feed.next()).await;
        assert!(quiet.is_err(), "reported once per outage: {quiet:?}");
        assert_eq!(feed.leading(), None);
    }
}
