//! Kubernetes Events about the Lease (`--record-events`), as client-go's
//! resource locks record them: one core/v1 `Event` per leadership transition
//! of this instance, in the Lease's namespace, about the Lease, reason
//! `LeaderElection`, type `Normal`, "X became leader" / "X stopped leading:
//! <reason>", named `<lease>.<hex nanoseconds>` like client-go's recorder —
//! so `kubectl describe lease` and `kubectl get events` show them.
//!
//! Best-effort, and never in the election's way: publishing a transition only
//! puts its Event in a bounded queue (when full, the Event is dropped with a
//! debug line); a task of its own sends each one once, bounded by
//! [`SEND_TIMEOUT`]. A 403 or 401 is explained once per episode, in the words
//! of the Lease's 403s ([`crate::elector::api_error`] names the verb, resource and
//! namespace), and the end of the episode is logged; other failures are debug
//! lines.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use futures::future::BoxFuture;
use k8s_openapi::api::core::v1::{Event as KubeEvent, EventSource, ObjectReference};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::api::ObjectMeta;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use crate::elector::api_error::ApiError;
use crate::elector::lease_client::KubeLeaseStore;
use crate::serve::transitions::{Event, EventKind};

/// `source.component` and `reportingComponent` of every Event.
pub const COMPONENT: &str = "leader-gate";
/// The reason client-go's resource locks give their Events.
pub const REASON: &str = "LeaderElection";
/// Events waiting to be sent at most; more are dropped. Transitions come at
/// most a few per retry period, so this fills only while the API server
/// does not answer.
pub const QUEUE: usize = 16;
/// One attempt per Event, bounded by this.
pub const SEND_TIMEOUT: Duration = Duration::from_secs(3);

/// Where Events go: the one call the recorder makes (a seam for tests).
pub trait EventSink: Send + Sync + 'static {
    /// POST `event` to its namespace.
    fn create_event(&self, event: KubeEvent) -> BoxFuture<'static, Result<(), ApiError>>;
}

/// Events go out on the Lease's client, to the Lease's namespace.
impl EventSink for KubeLeaseStore {
    fn create_event(&self, event: KubeEvent) -> BoxFuture<'static, Result<(), ApiError>> {
        KubeLeaseStore::create_event(self, event)
    }
}

/// The Lease the Events are about, and who records them.
#[derive(Clone, Debug)]
pub struct Subject {
    pub namespace: String,
    pub lease_name: String,
    pub identity: String,
}

/// The publisher's side: turns transitions into queued Events.
pub struct Recorder {
    subject: Subject,
    tx: mpsc::Sender<KubeEvent>,
    /// The last name's nanoseconds, so two Events never share a name.
    last_nanos: AtomicU64,
}

// === impl Recorder ===

impl Recorder {
    /// A recorder and its sending task, which ends once the recorder is
    /// dropped and the queue is empty (await it to flush on shutdown).
    pub fn spawn(subject: Subject, sink: Arc<dyn EventSink>) -> (Self, JoinHandle<()>) {
        let (tx, rx) = mpsc::channel(QUEUE);
        let task = tokio::spawn(send_all(rx, sink, subject.clone()));
        let recorder = Self {
            subject,
            tx,
            last_nanos: AtomicU64::new(0),
        };
        (recorder, task)
    }

    /// Queues the Event for `event` if it is a start or stop of this
    /// instance; never waits.
    pub fn record(&self, event: &Event) {
        let now = self.unique_nanos();
        let Some(kube_event) = kube_event(&self.subject, event, now) else {
            return;
        };
        match self.tx.try_send(kube_event) {
            Ok(()) => {}
            Err(mpsc::error::TrySendError::Full(dropped)) => tracing::debug!(
                message = dropped.message.as_deref(),
                "the Kubernetes Event queue is full: dropping this Event"
            ),
            Err(mpsc::error::TrySendError::Closed(_)) => {}
        }
    }

    fn unique_nanos(&self) -> u64 {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        let previous = self
            .last_nanos
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |last| {
                Some(now.max(last + 1))
            })
            .unwrap_or(0);
        now.max(previous + 1)
    }
}

/// The Event client-go's recorder would create for `event` at `nanos` since
/// the epoch; `None` for transitions that are not this instance's own.
pub fn kube_event(subject: &Subject, event: &Event, nanos: u64) -> Option<KubeEvent> {
    let message = match event.kind {
        EventKind::StartedLeading => format!("{} became leader", subject.identity),
        EventKind::StoppedLeading => format!(
            "{} stopped leading: {}",
            subject.identity,
            event.reason.unwrap_or("unknown")
        ),
        EventKind::NewLeader => return None,
    };
    let at = Timestamp::from_nanosecond(i128::from(nanos)).unwrap_or(Timestamp::UNIX_EPOCH);
    Some(KubeEvent {
        metadata: ObjectMeta {
            name: Some(format!("{}.{nanos:x}", subject.lease_name)),
            namespace: Some(subject.namespace.clone()),
            ..ObjectMeta::default()
        },
        involved_object: ObjectReference {
            api_version: Some("coordination.k8s.io/v1".into()),
            kind: Some("Lease".into()),
            name: Some(subject.lease_name.clone()),
            namespace: Some(subject.namespace.clone()),
            uid: event.term.as_deref().and_then(lease_uid).map(str::to_owned),
            ..ObjectReference::default()
        },
        reason: Some(REASON.into()),
        message: Some(message),
        type_: Some("Normal".into()),
        source: Some(EventSource {
            component: Some(COMPONENT.into()),
            host: None,
        }),
        reporting_component: Some(COMPONENT.into()),
        reporting_instance: Some(subject.identity.clone()),
        first_timestamp: Some(Time(at)),
        last_timestamp: Some(Time(at)),
        count: Some(1),
        ..KubeEvent::default()
    })
}

/// The Lease uid in a term id (`<uid>/<leaseTransitions>`).
fn lease_uid(term: &str) -> Option<&str> {
    term.rsplit_once('/')
        .map(|(uid, _)| uid)
        .filter(|uid| !uid.is_empty())
}

/// Sends queued Events one by one, once each, until the recorder is gone.
async fn send_all(mut rx: mpsc::Receiver<KubeEvent>, sink: Arc<dyn EventSink>, subject: Subject) {
    let mut episode = Episode::default();
    while let Some(event) = rx.recv().await {
        let message = event.message.clone().unwrap_or_default();
        let result = tokio::time::timeout(SEND_TIMEOUT, sink.create_event(event))
            .await
            .unwrap_or(Err(ApiError::Timeout(SEND_TIMEOUT)));
        match episode.note(result.as_ref().err()) {
            Say::Nothing => {}
            Say::Failed(error) => {
                tracing::debug!(%error, message, "could not record a Kubernetes Event")
            }
            Say::Denied(error) => tracing::warn!(
                verb = "create", namespace = %subject.namespace, lease = %subject.lease_name, %error,
                "cannot create events about the lease; leadership is not affected, and Events are dropped meanwhile"
            ),
            Say::Again => tracing::info!(
                verb = "create",
                "Kubernetes Events about the lease are recorded again"
            ),
        }
    }
}

/// What one outcome calls for in the log.
#[derive(Debug, PartialEq, Eq)]
enum Say<'a> {
    Nothing,
    /// Best-effort: a debug line.
    Failed(&'a ApiError),
    /// The first 403 or 401 of an episode.
    Denied(&'a ApiError),
    /// A success that ends an episode.
    Again,
}

/// A 403 (or 401) episode of Event creation: said once, and its end.
#[derive(Debug, Default)]
struct Episode {
    denied: Option<&'static str>,
}

impl Episode {
    fn note<'a>(&mut self, error: Option<&'a ApiError>) -> Say<'a> {
        match error {
            None if self.denied.take().is_some() => Say::Again,
            None => Say::Nothing,
            Some(error @ (ApiError::Forbidden(_) | ApiError::Unauthorized)) => {
                if self.denied.replace(error.kind()) == Some(error.kind()) {
                    Say::Failed(error)
                } else {
                    Say::Denied(error)
                }
            }
            Some(error) => Say::Failed(error),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use futures::FutureExt;

    use super::*;
    use crate::elector::api_error::Forbidden;
    use crate::serve::transitions::LeaseLabel;

    fn subject() -> Subject {
        Subject {
            namespace: "monitoring".into(),
            lease_name: "metricbeat-leader".into(),
            identity: "pod-a".into(),
        }
    }

    fn event(kind: EventKind, reason: Option<&'static str>) -> Event {
        Event {
            id: "b-1".into(),
            seq: 1,
            kind,
            identity: "pod-a".into(),
            term: Some("0df1ec1c-5da0-427f-9d88-64bd7371c3c1/3".into()),
            reason,
            holder: None,
            published_at_us: 0,
            published_at: String::new(),
            lease: LeaseLabel::alone("monitoring", "metricbeat-leader"),
        }
    }

    #[test]
    fn events_say_what_client_go_says_about_the_lease() {
        let nanos = 1_795_979_297_250_658_123;
        let started = kube_event(&subject(), &event(EventKind::StartedLeading, None), nanos)
            .expect("an Event for a start");
        let json = serde_json::to_value(&started).unwrap();
        assert_eq!(
            json,
            serde_json::json!({
                "apiVersion": "v1",
                "kind": "Event",
                "metadata": {"name": "metricbeat-leader.18ec99a7c494c74b", "namespace": "monitoring"},
                "involvedObject": {
                    "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                    "name": "metricbeat-leader", "namespace": "monitoring",
                    "uid": "0df1ec1c-5da0-427f-9d88-64bd7371c3c1",
                },
                "reason": "LeaderElection",
                "message": "pod-a became leader",
                "type": "Normal",
                "source": {"component": "leader-gate"},
                "reportingComponent": "leader-gate",
                "reportingInstance": "pod-a",
                "firstTimestamp": "2026-11-29T19:08:17Z",
                "lastTimestamp": "2026-11-29T19:08:17Z",
                "count": 1,
            })
        );
        assert_eq!(format!("{nanos:x}"), "18ec99a7c494c74b");
        let stopped = kube_event(
            &subject(),
            &event(EventKind::StoppedLeading, Some("lost-to-other-holder")),
            nanos,
        )
        .unwrap();
        assert_eq!(
            stopped.message.as_deref(),
            Some("pod-a stopped leading: lost-to-other-holder")
        );
        assert!(kube_event(&subject(), &event(EventKind::NewLeader, None), nanos).is_none());
    }

    #[test]
    fn the_uid_comes_from_the_term() {
        assert_eq!(lease_uid("u-1/0"), Some("u-1"));
        assert_eq!(lease_uid("/0"), None);
        assert_eq!(lease_uid("garbage"), None);
    }

    /// A sink that records what it is sent and answers from a script.
    #[derive(Default)]
    struct Script {
        sent: Mutex<Vec<String>>,
        answers: Mutex<Vec<Result<(), ApiError>>>,
        hang: bool,
    }

    impl EventSink for Script {
        fn create_event(&self, event: KubeEvent) -> BoxFuture<'static, Result<(), ApiError>> {
            self.sent
                .lock()
                .unwrap()
                .push(event.message.unwrap_or_default());
            if self.hang {
                return std::future::pending().boxed();
            }
            let answer = self.answers.lock().unwrap().pop().unwrap_or(Ok(()));
            async move { answer }.boxed()
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_hung_api_server_costs_one_timeout_per_event_and_a_full_queue_drops() {
        let sink = Arc::new(Script {
            hang: true,
            ..Script::default()
        });
        let (recorder, task) = Recorder::spawn(subject(), sink.clone());
        // Many more than the queue holds, all at once: none of them waits.
        for _ in 0..QUEUE * 4 {
            recorder.record(&event(EventKind::StartedLeading, None));
        }
        drop(recorder);
        let started = tokio::time::Instant::now();
        task.await.unwrap();
        // One attempt each for what the queue held (and the one in flight).
        let sent = sink.sent.lock().unwrap().len();
        assert!((QUEUE..=QUEUE + 1).contains(&sent), "{sent}");
        assert_eq!(started.elapsed(), SEND_TIMEOUT * sent as u32);
    }

    #[tokio::test]
    async fn events_go_out_in_order_and_distinctly_named() {
        let sink = Arc::new(Script::default());
        let names = Arc::new(Mutex::new(Vec::new()));
        struct Names(Arc<Script>, Arc<Mutex<Vec<String>>>);
        impl EventSink for Names {
            fn create_event(&self, event: KubeEvent) -> BoxFuture<'static, Result<(), ApiError>> {
                self.1
                    .lock()
                    .unwrap()
                    .push(event.metadata.name.clone().unwrap());
                self.0.create_event(event)
            }
        }
        let (recorder, task) =
            Recorder::spawn(subject(), Arc::new(Names(sink.clone(), names.clone())));
        recorder.record(&event(EventKind::StoppedLeading, Some("shutdown")));
        recorder.record(&event(EventKind::NewLeader, None));
        recorder.record(&event(EventKind::StartedLeading, None));
        drop(recorder);
        task.await.unwrap();
        assert_eq!(
            *sink.sent.lock().unwrap(),
            ["pod-a stopped leading: shutdown", "pod-a became leader"]
        );
        let names = names.lock().unwrap();
        assert_ne!(names[0], names[1]);
        assert!(names.iter().all(|n| n.starts_with("metricbeat-leader.")));
    }

    #[test]
    fn a_403_is_said_once_per_episode_and_its_end_too() {
        let forbidden = ApiError::Forbidden(Forbidden::parse(
            "events is forbidden: User \"u\" cannot create resource \"events\" in API group \"\" in the namespace \"ns\"",
        ));
        let timeout = ApiError::Timeout(SEND_TIMEOUT);
        let mut episode = Episode::default();
        assert_eq!(episode.note(None), Say::Nothing);
        assert_eq!(episode.note(Some(&forbidden)), Say::Denied(&forbidden));
        assert_eq!(episode.note(Some(&forbidden)), Say::Failed(&forbidden));
        assert_eq!(episode.note(Some(&timeout)), Say::Failed(&timeout));
        assert_eq!(episode.note(Some(&forbidden)), Say::Failed(&forbidden));
        assert_eq!(episode.note(None), Say::Again);
        assert_eq!(episode.note(None), Say::Nothing);
        assert_eq!(episode.note(Some(&forbidden)), Say::Denied(&forbidden));
        // The words are the Lease 403's: user, verb, resource, namespace.
        assert!(
            forbidden
                .to_string()
                .contains("u may not create events in namespace ns"),
            "{forbidden}"
        );
    }
}
