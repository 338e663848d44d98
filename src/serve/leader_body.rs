//! The wire format of `GET /leader`: its JSON body, judged from the
//! published state at read time, and the pieces the event stream's events
//! share with it (`lease`, `valid_until`, JSON strings).
//!
//! [`write_leader_body`] writes the bytes straight from the state (the route
//! a collector may poll in a tight loop); [`leader_body`] builds the same
//! body as a value, the reference the written bytes are tested against. A
//! lower room: the routes (`/leader` for one Lease or several, `/events`)
//! write with it, and it imports no route.

use std::cell::RefCell;

use serde::Serialize;

use crate::clock::{BootInstant, boot_clock_id, format_micro_time};
use crate::serve::app_state::AppState;
use crate::serve::published::LeaderState;

/// The body of `GET /leader`.
#[derive(Debug, Serialize)]
pub struct LeaderBody<'a> {
    pub leading: bool,
    pub identity: &'a str,
    pub holder: Option<&'a str>,
    pub lease: LeaseRef<'a>,
    pub term: Option<&'a str>,
    pub since: String,
    pub valid_for_ms: u64,
    pub seq: u64,
    pub last_stop_reason: Option<&'a str>,
    pub last_term: Option<&'a str>,
    pub collector_healthy: Option<bool>,
}

#[derive(Debug, Serialize)]
pub struct LeaseRef<'a> {
    pub namespace: &'a str,
    pub name: &'a str,
    pub shard: usize,
    pub shards: usize,
}

pub fn since_text(state: &LeaderState) -> String {
    format_micro_time(state.since_micros)
}

/// The `/leader` body for `state`, judged now, written into `out`: the same
/// bytes as [`leader_body`]'s value serialized (keys in the same, sorted,
/// order), without building the value. `extras` are a `state` event's
/// `may_have_missed_events` and `published_at_us`, written where they sort.
/// Returns whether this instance leads at this very moment.
pub fn write_leader_body(
    app: &AppState,
    state: &LeaderState,
    extras: Option<(bool, i64)>,
    out: &mut Vec<u8>,
) -> bool {
    // Decided now, against the boot-clock deadline, not when published (G2).
    let valid_for = state.valid_for();
    let leading = !valid_for.is_zero();
    out.extend_from_slice(b"{\"collector_healthy\":");
    out.extend_from_slice(match state.collector_healthy {
        None => b"null",
        Some(true) => b"true",
        Some(false) => b"false",
    });
    out.extend_from_slice(b",\"holder\":");
    json_str(out, state.holder.as_deref());
    out.extend_from_slice(b",\"identity\":");
    json_str(out, Some(&app.identity));
    out.extend_from_slice(b",\"last_stop_reason\":");
    json_str(out, state.last_stop);
    out.extend_from_slice(b",\"last_term\":");
    json_str(out, state.last_term.as_deref());
    out.extend_from_slice(b",\"leading\":");
    out.extend_from_slice(if leading { b"true" } else { b"false" });
    write_lease(out, app);
    if let Some((missed, published_at_us)) = extras {
        out.extend_from_slice(b",\"may_have_missed_events\":");
        out.extend_from_slice(if missed { b"true" } else { b"false" });
        out.extend_from_slice(b",\"published_at_us\":");
        out.extend_from_slice(itoa::Buffer::new().format(published_at_us).as_bytes());
    }
    out.extend_from_slice(b",\"seq\":");
    out.extend_from_slice(itoa::Buffer::new().format(state.seq).as_bytes());
    out.extend_from_slice(b",\"since\":");
    write_since(out, state.since_micros);
    out.extend_from_slice(b",\"term\":");
    json_str(out, state.term.as_deref().filter(|_| leading));
    out.extend_from_slice(b",\"valid_for_ms\":");
    let valid_for_ms = valid_for.as_millis() as u64;
    out.extend_from_slice(itoa::Buffer::new().format(valid_for_ms).as_bytes());
    if extras.is_some() {
        // A `state` event: also the deadline itself, on the boot clock.
        write_valid_until(out, state.valid_until.filter(|_| leading));
    }
    out.push(b'}');
    leading
}

/// `,"lease":{…}`: which Lease this is, and its place among the sidecar's
/// ([`LeaseLabel`](crate::serve::transitions::LeaseLabel), keys sorted).
pub fn write_lease(out: &mut Vec<u8>, app: &AppState) {
    let place = app.events.lease();
    out.extend_from_slice(b",\"lease\":{\"name\":");
    json_str(out, Some(&app.lease_name));
    out.extend_from_slice(b",\"namespace\":");
    json_str(out, Some(&app.namespace));
    out.extend_from_slice(b",\"shard\":");
    out.extend_from_slice(itoa::Buffer::new().format(place.shard).as_bytes());
    out.extend_from_slice(b",\"shards\":");
    out.extend_from_slice(itoa::Buffer::new().format(place.shards).as_bytes());
    out.push(b'}');
}

/// `,"valid_until":…`: the step-down deadline on this node's boot clock,
/// `{"boot_id":…,"boottime_ms":…}` (rounded down), for a subscriber on the
/// same boot clock to judge as is (no transit time, no wall clock); `null`
/// when not leading or when the boot clock has no id here.
pub fn write_valid_until(out: &mut Vec<u8>, until: Option<BootInstant>) {
    out.extend_from_slice(b",\"valid_until\":");
    match (until, boot_clock_id()) {
        (Some(until), Some(boot_id)) => {
            out.extend_from_slice(b"{\"boot_id\":");
            json_str(out, Some(boot_id));
            out.extend_from_slice(b",\"boottime_ms\":");
            out.extend_from_slice(itoa::Buffer::new().format(until.as_millis()).as_bytes());
            out.push(b'}');
        }
        _ => out.extend_from_slice(b"null"),
    }
}

/// `since` as a JSON string: formatted once per value (it changes only at a
/// transition), not once per request.
fn write_since(out: &mut Vec<u8>, micros: i64) {
    thread_local! {
        static SINCE: RefCell<(i64, String)> = const { RefCell::new((i64::MIN, String::new())) };
    }
    SINCE.with_borrow_mut(|(at, text)| {
        if *at != micros {
            *at = micros;
            *text = format_micro_time(micros);
        }
        json_str(out, Some(text));
    });
}

/// A JSON string (escaped as serde_json does), or `null`. Names, terms
/// and times rarely hold a byte JSON must escape (a control character, `"`
/// or `\\`): those are copied between quotes as they are, the rest go
/// through serde_json (whose escaping loop was a tenth of the instructions
/// of a `GET /leader`).
pub fn json_str(out: &mut Vec<u8>, value: Option<&str>) {
    match value {
        Some(value) if !value.bytes().any(|b| b < 0x20 || b == b'"' || b == b'\\') => {
            out.reserve(value.len() + 2);
            out.push(b'"');
            out.extend_from_slice(value.as_bytes());
            out.push(b'"');
        }
        Some(value) => serde_json::to_writer(&mut *out, value).expect("a string serializes"),
        None => out.extend_from_slice(b"null"),
    }
}

/// The `/leader` body for `state`, judged now: whether this instance leads
/// at this very moment, and the JSON.
pub fn leader_body(app: &AppState, state: &LeaderState) -> (bool, serde_json::Value) {
    // Decided now, against the boot-clock deadline, not when published (G2).
    let valid_for = state.valid_for();
    let leading = state.leading_now();
    let body = LeaderBody {
        leading,
        identity: &app.identity,
        holder: state.holder.as_deref(),
        lease: LeaseRef {
            namespace: &app.namespace,
            name: &app.lease_name,
            shard: app.events.lease().shard,
            shards: app.events.lease().shards,
        },
        term: state.term.as_deref().filter(|_| leading),
        since: since_text(state),
        valid_for_ms: valid_for.as_millis() as u64,
        seq: state.seq,
        last_stop_reason: state.last_stop,
        last_term: state.last_term.as_deref(),
        collector_healthy: state.collector_healthy,
    };
    (
        leading,
        serde_json::to_value(body).expect("the body serializes"),
    )
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use tokio::sync::watch;
    use tokio_util::sync::CancellationToken;

    use super::*;
    use crate::elector::driver::Heartbeat;
    use crate::serve::metrics::Metrics;
    use crate::serve::transitions::{EventLog, LeaseLabel};

    fn app(identity: &str) -> AppState {
        let (_, state) = watch::channel(LeaderState::initial());
        AppState {
            state,
            identity: identity.into(),
            namespace: "ns \"quoted\"".into(),
            lease_name: "demo".into(),
            heartbeat: Heartbeat::new(),
            stuck_after: Duration::from_secs(15),
            events: EventLog::new(identity, LeaseLabel::alone("ns", "demo"), 4, 4),
            metrics: Arc::new(Metrics::new("ns", "demo")),
            subscribers: crate::serve::app_state::StreamSlots::new(1),
            keep_alive: Duration::from_secs(15),
            shutdown: CancellationToken::new(),
            gate_acks: crate::serve::gate_acks::GateAcks::new(8),
            gate_lag: Duration::from_secs(4),
            step_aside: Default::default(),
        }
    }

    #[test]
    fn json_strings_are_written_as_serde_json_writes_them() {
        for c in (0u32..0x800)
            .chain([0x2028, 0xfeff, 0x1f600])
            .filter_map(char::from_u32)
        {
            for value in [c.to_string(), format!("pod-{c}-0")] {
                let mut out = b"x".to_vec();
                json_str(&mut out, Some(&value));
                let mut expected = b"x".to_vec();
                expected.extend(serde_json::to_vec(&value).unwrap());
                assert_eq!(out, expected, "{value:?}");
            }
        }
    }

    #[test]
    fn the_written_body_is_the_serialized_value_byte_for_byte() {
        let states = [
            LeaderState {
                leading: true,
                holder: Some("me".into()),
                term: Some("uid/1".into()),
                since_micros: 1_795_979_297_250_658,
                valid_until: Some(BootInstant::after(Duration::from_secs(3600))),
                seq: 7,
                last_stop: Some("shutdown"),
                last_term: None,
                observed: true,
                collector_healthy: Some(true),
                successor: None,
                own_record: false,
            },
            LeaderState {
                leading: false,
                holder: Some("other\u{e9}\n\"pod\"".into()),
                term: Some("uid/1".into()),
                since_micros: 0,
                valid_until: None,
                seq: 0,
                last_stop: None,
                last_term: None,
                observed: false,
                collector_healthy: Some(false),
                successor: None,
                own_record: false,
            },
            // Published as leading, past its deadline: no term, not leading.
            LeaderState {
                leading: true,
                holder: Some("me".into()),
                term: Some("uid/2".into()),
                since_micros: 5,
                valid_until: Some(BootInstant::now()),
                seq: 3,
                last_stop: None,
                last_term: None,
                observed: true,
                collector_healthy: None,
                successor: None,
                own_record: false,
            },
        ];
        for identity in ["me", "a\\b\u{1}"] {
            let app = app(identity);
            for state in &states {
                let (leading, value) = leader_body(&app, state);
                let mut out = Vec::new();
                assert_eq!(write_leader_body(&app, state, None, &mut out), leading);
                // The valid_for_ms may differ by the time between the two.
                let mut expected = value.clone();
                let written: serde_json::Value = serde_json::from_slice(&out).unwrap();
                expected["valid_for_ms"] = written["valid_for_ms"].clone();
                assert_eq!(String::from_utf8(out).unwrap(), expected.to_string());

                let mut with_extras = expected.clone();
                with_extras["may_have_missed_events"] = true.into();
                with_extras["published_at_us"] = 1_795_979_297_250_658_i64.into();
                let mut out = Vec::new();
                write_leader_body(&app, state, Some((true, 1_795_979_297_250_658)), &mut out);
                let written: serde_json::Value = serde_json::from_slice(&out).unwrap();
                with_extras["valid_for_ms"] = written["valid_for_ms"].clone();
                // A state event also carries the deadline on the boot clock.
                with_extras["valid_until"] = if leading {
                    serde_json::json!({
                        "boot_id": crate::clock::boot_clock_id().unwrap(),
                        "boottime_ms": state.valid_until.unwrap().as_millis(),
                    })
                } else {
                    serde_json::Value::Null
                };
                assert_eq!(String::from_utf8(out).unwrap(), with_extras.to_string());
            }
        }
    }
}
