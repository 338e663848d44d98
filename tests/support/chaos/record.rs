//! What a chaos run records in the background, per Lease: the sampler of
//! every process's `/leader` (or `/leader/NAME`), the reader of every
//! process's `/events` (or `/events?lease=NAME`), the wall-clock map, and
//! the split into one [`History`] per Lease for the checker.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::support::events::EventClient;
use crate::support::history::{
    End, FaultSpan, History, Incarnation, Message, Probe, StreamEnd, StreamEvent, WallMap,
};
use crate::support::sidecar::get;

/// A stream message before its wall-clock stamp is mapped.
pub struct RawEvent {
    pub lease: usize,
    pub instance: String,
    pub incarnation: u32,
    pub arrived: Instant,
    pub kind: String,
    pub id: Option<String>,
    pub data: Value,
}

/// When the test's reader of one Lease's stream of one process connected
/// and how it ended.
#[derive(Clone, Copy, Debug, Default)]
pub struct StreamSpan {
    pub from: Option<Instant>,
    pub end: Option<(Instant, StreamEnd)>,
}

/// One process of one member, with a stream per Lease.
pub struct Process {
    pub instance: String,
    pub number: u32,
    pub spawned: Instant,
    pub ended: Option<(Instant, End)>,
    pub streams: Vec<StreamSpan>,
}

impl Process {
    pub fn new(instance: &str, number: u32, spawned: Instant, leases: usize) -> Process {
        Process {
            instance: instance.to_owned(),
            number,
            spawned,
            ended: None,
            streams: vec![StreamSpan::default(); leases],
        }
    }
}

/// What the background tasks record, shared with them.
pub struct Recorder {
    /// The Leases every process contends for.
    pub leases: &'static [&'static str],
    /// Each probe with the Lease it asked about.
    pub probes: Mutex<Vec<(usize, Probe)>>,
    pub events: Mutex<Vec<RawEvent>>,
    pub processes: Mutex<Vec<Process>>,
    pub wall: Mutex<WallMap>,
    /// Where each member's current process serves (`None`: down).
    pub targets: Mutex<HashMap<String, Option<(SocketAddr, u32)>>>,
    /// Answers of `/leader/NAME` and events of `/events?lease=NAME` that
    /// named another Lease.
    pub mislabelled: Mutex<Vec<(Instant, String)>>,
    pub stop: AtomicBool,
}

impl Recorder {
    pub fn new(leases: &'static [&'static str]) -> Recorder {
        Recorder {
            leases,
            probes: Mutex::default(),
            events: Mutex::default(),
            processes: Mutex::default(),
            wall: Mutex::default(),
            targets: Mutex::default(),
            mislabelled: Mutex::default(),
            stop: AtomicBool::new(false),
        }
    }

    /// The Lease a path names: none with one Lease (`/leader`, `/events`),
    /// as a sidecar of one Lease is asked.
    fn named(&self, lease: usize) -> Option<&'static str> {
        (self.leases.len() > 1).then(|| self.leases[lease])
    }

    pub fn process(&self, instance: &str, number: u32, f: impl FnOnce(&mut Process)) {
        let mut all = self.processes.lock().unwrap();
        if let Some(p) = all
            .iter_mut()
            .find(|p| p.instance == instance && p.number == number)
        {
            f(p);
        }
    }

    pub fn ended(&self, instance: &str, number: u32) -> bool {
        self.processes
            .lock()
            .unwrap()
            .iter()
            .any(|p| p.instance == instance && p.number == number && p.ended.is_some())
    }

    fn mislabelled(&self, what: String) {
        self.mislabelled
            .lock()
            .unwrap()
            .push((Instant::now(), what));
    }

    /// Whether every stream of every process is connected.
    pub fn all_streams_connected(&self) -> bool {
        self.processes
            .lock()
            .unwrap()
            .iter()
            .all(|p| p.streams.iter().all(|s| s.from.is_some()))
    }
}

/// Samples one member's `/leader` (`/leader/NAME`) every `every` until told
/// to stop, following its restarts.
pub async fn sample(rec: Arc<Recorder>, instance: String, lease: usize, every: Duration) {
    let named = rec.named(lease);
    let path = named.map_or("/leader".to_owned(), |name| format!("/leader/{name}"));
    while !rec.stop.load(Ordering::SeqCst) {
        let target = rec
            .targets
            .lock()
            .unwrap()
            .get(&instance)
            .copied()
            .flatten();
        if let Some((addr, incarnation)) = target {
            let sent = Instant::now();
            let answer = get(addr, &path).await;
            let received = Instant::now();
            if let (Some(p), Some(name)) = (&answer, named)
                && (matches!(p.status, 200 | 503) && p.body["lease"]["name"] != name)
            {
                rec.mislabelled(format!(
                    "{instance}#{incarnation} answered {path} with {}: {}",
                    p.status, p.body
                ));
            }
            rec.probes.lock().unwrap().push((
                lease,
                Probe {
                    instance: instance.clone(),
                    incarnation,
                    sent,
                    received,
                    status: answer.as_ref().map_or(0, |p| p.status),
                    term: answer.as_ref().and_then(|p| p.term().map(str::to_owned)),
                    holder: answer.as_ref().and_then(|p| p.holder().map(str::to_owned)),
                    valid_for: Duration::from_millis(
                        answer
                            .as_ref()
                            .and_then(|p| p.body["valid_for_ms"].as_u64())
                            .unwrap_or(0),
                    ),
                },
            ));
        }
        tokio::time::sleep(every).await;
    }
}

/// Calibrates the wall-clock map while the test runs.
pub async fn calibrate(rec: Arc<Recorder>) {
    while !rec.stop.load(Ordering::SeqCst) {
        rec.wall.lock().unwrap().calibrate();
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Reads one process's `/events` (`/events?lease=NAME`) until it ends,
/// resuming by `Last-Event-ID` if the connection breaks while the process
/// lives.
pub async fn read_stream(
    rec: Arc<Recorder>,
    instance: String,
    incarnation: u32,
    lease: usize,
    addr: SocketAddr,
) {
    let named = rec.named(lease);
    let mut last_id: Option<String> = None;
    let end = |rec: &Recorder, how: StreamEnd| {
        rec.process(&instance, incarnation, |p| {
            p.streams[lease].end = Some((Instant::now(), how));
        });
    };
    loop {
        let connected = match named {
            Some(name) => EventClient::try_connect_lease(addr, name, last_id.as_deref()).await,
            None => EventClient::try_connect(addr, last_id.as_deref()).await,
        };
        let mut client = match connected {
            Ok(client) if client.status == 200 => client,
            _ => {
                if rec.ended(&instance, incarnation) {
                    return end(&rec, StreamEnd::Broken);
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let connected = Instant::now();
        rec.process(&instance, incarnation, |p| {
            p.streams[lease].from.get_or_insert(connected);
        });
        while let Some(received) = client.next(Duration::from_secs(3600)).await {
            if let Some(id) = &received.message.id {
                last_id = Some(id.clone());
            }
            if let Some(name) = named
                && received.data["lease"]["name"] != name
            {
                rec.mislabelled(format!(
                    "{instance}#{incarnation}'s stream of {name} carried {} {}",
                    received.message.event, received.data
                ));
            }
            rec.events.lock().unwrap().push(RawEvent {
                lease,
                instance: instance.clone(),
                incarnation,
                arrived: received.at,
                kind: received.message.event.clone(),
                id: received.message.id.clone(),
                data: received.data.clone(),
            });
        }
        if !client.failed {
            return end(&rec, StreamEnd::Clean);
        }
        if rec.ended(&instance, incarnation) {
            return end(&rec, StreamEnd::Broken);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A stream message as the checker reads it.
fn to_stream_event(raw: &RawEvent, wall: &WallMap) -> StreamEvent {
    let data = &raw.data;
    let published = data["published_at_us"]
        .as_i64()
        .and_then(|us| wall.map(us))
        .unwrap_or(raw.arrived);
    let message = match raw.kind.as_str() {
        "state" => Message::State {
            leading: data["leading"].as_bool().unwrap_or(false),
            holder: data["holder"].as_str().map(str::to_owned),
            since: data["since"]
                .as_str()
                .and_then(leader_gate::clock::parse_micro_time)
                .and_then(|us| wall.map(us)),
        },
        "started-leading" => Message::Started,
        "stopped-leading" => Message::Stopped {
            reason: data["reason"].as_str().map(str::to_owned),
        },
        "new-leader" => Message::NewLeader {
            holder: data["holder"].as_str().map(str::to_owned),
        },
        "renewed" => Message::Renewed,
        "lagged" => Message::Lagged,
        other => Message::Other(other.to_owned()),
    };
    StreamEvent {
        instance: raw.instance.clone(),
        incarnation: raw.incarnation,
        arrived: raw.arrived,
        published,
        message,
        id: raw.id.clone(),
        term: data["term"].as_str().map(str::to_owned),
        valid_for: data["valid_for_ms"].as_u64().map(Duration::from_millis),
    }
}

/// The stretch of the run a history covers.
pub struct Frame {
    pub seed: u64,
    pub origin: Instant,
    pub check_from: Instant,
    pub end: Instant,
}

/// What the checker judges of one Lease: its probes and stream messages,
/// every process (with its stream of this Lease), and the faults that
/// concern it (those of a process or a client concern all its Leases; a
/// deletion, only the Lease deleted). No slice writes: a world that routes
/// adds them.
pub fn lease_history(
    rec: &Recorder,
    spans: &[(Option<usize>, FaultSpan)],
    lease: usize,
    frame: &Frame,
) -> History {
    let wall = rec.wall.lock().unwrap().clone();
    History {
        seed: frame.seed,
        origin: frame.origin,
        check_from: frame.check_from,
        end: frame.end,
        probes: rec
            .probes
            .lock()
            .unwrap()
            .iter()
            .filter(|(l, _)| *l == lease)
            .map(|(_, p)| p.clone())
            .collect(),
        events: rec
            .events
            .lock()
            .unwrap()
            .iter()
            .filter(|e| e.lease == lease)
            .map(|e| to_stream_event(e, &wall))
            .collect(),
        incarnations: rec
            .processes
            .lock()
            .unwrap()
            .iter()
            .map(|p| Incarnation {
                instance: p.instance.clone(),
                number: p.number,
                spawned: p.spawned,
                ended: p.ended.clone(),
                stream_from: p.streams[lease].from,
                stream_end: p.streams[lease].end,
            })
            .collect(),
        faults: spans
            .iter()
            .filter(|(l, _)| l.is_none_or(|l| l == lease))
            .map(|(_, f)| f.clone())
            .collect(),
        slice_writes: Vec::new(),
    }
}
