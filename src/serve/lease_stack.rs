//! One Lease of a sidecar: everything `serve` runs once per Lease — its
//! election driver, published state and event log, the gates registered
//! for its terms, its collector health check, Kubernetes Events and leader
//! routing — and what its handlers read ([`AppState`]). The process around
//! it (signals, listeners, the spread of several Leases) is
//! [`crate::serve::sidecar`]'s.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::clock::BootInstant;
use crate::elector::driver::{self, Heartbeat, Inputs};
use crate::elector::incarnation::{RecordWriter, StateDir, Timing};
use crate::elector::lease::TermId;
use crate::elector::lease_client::KubeLeaseStore;
use crate::elector::machine::{Election, Settings, Spread};
use crate::serve::app_state::{AppState, StreamSlots};
use crate::serve::collector_health;
use crate::serve::config::ServeConfig;
use crate::serve::gate_acks::GateAcks;
use crate::serve::kube_events::{self, Recorder};
use crate::serve::metrics::{Metrics, MetricsRegistry};
use crate::serve::published::{LeaderState, Publisher};
use crate::serve::routing;
use crate::serve::step_aside::StepAsideRequests;
use crate::serve::transitions::{EventLog, LeaseLabel};

/// Events kept for `Last-Event-ID` resumption.
const EVENT_HISTORY: usize = 1024;
/// Events a subscriber may fall behind before it is told it lagged.
const EVENT_BUFFER: usize = 256;

/// What every Lease of one process shares.
pub struct Process<'a> {
    pub config: &'a ServeConfig,
    pub namespace: &'a str,
    /// The client, shared by every Lease (one connection pool, one set of
    /// credentials reloaded for all).
    pub store: &'a KubeLeaseStore,
    /// `/events` streams open at once, over every Lease.
    pub subscribers: &'a StreamSlots,
    /// Every Lease's metrics, in one exposition.
    pub metrics: &'a Arc<MetricsRegistry>,
    pub stop_election: &'a CancellationToken,
    pub stop_serving: &'a CancellationToken,
}

/// One running Lease.
pub struct LeaseStack {
    pub app: AppState,
    driver: JoinHandle<()>,
    recorder: Option<JoinHandle<()>>,
    routing: Option<JoinHandle<()>>,
}

impl LeaseStack {
    /// Starts the election of `name`, the `shard`th of the process's
    /// Leases, and what follows it. `spread`: what
    /// the process holds of its other Leases (`None` for a Lease alone).
    /// `Err`: a refused `--state-dir`, said in the message.
    pub fn start(
        process: &Process<'_>,
        name: &str,
        shard: usize,
        state_dir: Option<PathBuf>,
        spread: Option<watch::Receiver<Spread>>,
    ) -> Result<Self, String> {
        let Process {
            config,
            namespace,
            store,
            subscribers,
            stop_election,
            stop_serving,
            ..
        } = *process;
        let store = store.for_lease(name);
        let settings = Settings {
            identity: config.identity.clone(),
            namespace: namespace.to_owned(),
            lease_name: name.to_owned(),
            lease_duration: config.lease_duration,
            renew_deadline: config.renew_deadline,
            retry_period: config.retry_period,
            holder_labels: config.holder_labels.clone(),
        };
        let place = LeaseLabel {
            name: name.to_owned(),
            namespace: namespace.to_owned(),
            shard,
            shards: config.leases.len(),
        };
        let events = EventLog::new(&config.identity, place, EVENT_HISTORY, EVENT_BUFFER);
        let metrics = Arc::new(process.metrics.lease(namespace, name));
        // --state-dir: locked for this process; what a previous process of
        // this pod left there is read before anything is written.
        let (state_dir, previous) = match &state_dir {
            None => (None, None),
            Some(dir) => {
                let timing = Timing {
                    renew_deadline: config.renew_deadline,
                    gate_lag: config.shutdown.gate_lag,
                };
                let state_dir = StateDir::open(dir, namespace, name, timing)
                    .map_err(|error| format!("invalid --state-dir: {error}"))?;
                let previous = state_dir.previous(&config.identity, namespace, name);
                (Some(state_dir), previous)
            }
        };
        let (mut publisher, state) = Publisher::new(events.clone(), metrics.clone());
        // Gates register here; with --gate-acks their acknowledgements may
        // end the gate lag before a release.
        let gate_acks = GateAcks::for_sidecar_counting(
            config.max_subscribers,
            config.gate_acks,
            config.renew_deadline,
            config.renew_deadline + config.shutdown.gate_lag,
            metrics.gate_disconnects_while_leading(),
        );
        if config.gate_acks {
            publisher = publisher.with_gate_acks(gate_acks.clone());
        }
        if let Some(state_dir) = state_dir {
            // Written by a thread of its own: a hung volume must not stall
            // the election, nor the listeners on its runtime.
            let writer = RecordWriter::spawn(state_dir)
                .map_err(|error| format!("cannot start the --state-dir writer: {error}"))?;
            publisher = publisher.with_state_dir(writer);
        }
        // Kubernetes Events (--record-events): queued by the publisher, sent
        // by a task of their own on the Lease's client.
        let mut recorder = None;
        if config.record_events {
            let subject = kube_events::Subject {
                namespace: namespace.to_owned(),
                lease_name: name.to_owned(),
                identity: config.identity.clone(),
            };
            let (queue, task) = Recorder::spawn(subject, Arc::new(store.clone()));
            publisher = publisher.with_recorder(queue);
            recorder = Some(task);
        }
        // Leader routing (--route-service): a task of its own on the Lease's
        // client, following the published state like the HTTP gates.
        let routing = config.route.clone().map(|options| {
            routing::spawn(
                store.clone(),
                namespace.to_owned(),
                options,
                state.clone(),
                config.retry_period,
                config.lease_duration,
            )
        });
        let heartbeat = Heartbeat::new();
        let app = AppState {
            state: state.clone(),
            identity: config.identity.as_str().into(),
            namespace: namespace.into(),
            lease_name: name.into(),
            heartbeat: heartbeat.clone(),
            stuck_after: config.lease_duration,
            events,
            metrics,
            subscribers: subscribers.clone(),
            keep_alive: config.events_keep_alive,
            shutdown: stop_serving.clone(),
            gate_acks,
            gate_lag: config.shutdown.gate_lag,
            step_aside: Arc::new(StepAsideRequests::new(config.lease_duration)),
        };
        let mut election = Election::new(settings, fastrand::u64(..));
        election.set_successor_claim_window(config.successor_claim_window);
        election.set_revision(config.revision.clone());
        if let Some(previous) = &previous {
            // Named as the term it starts is ([`TermId`]).
            let term = TermId::new(Some(&previous.uid), previous.transitions).to_string();
            match election.resume(previous, driver::now()) {
                Ok(()) => {
                    // Its gates registered before the restart are unknown
                    // until they hold nothing (gate_acks' module docs): if
                    // it starts, its release waits until then at least.
                    let gone_in = unknown_gates_gone_in(
                        previous.sent_boot(),
                        config.renew_deadline,
                        config.shutdown.gate_lag,
                    );
                    app.gate_acks
                        .resumed(&term, std::time::Instant::now() + gone_in);
                    tokio::spawn(unknown_gates_gone(
                        app.gate_acks.clone(),
                        term.clone(),
                        gone_in,
                    ));
                    tracing::info!(lease = name, %term, "found the last write of this pod's previous process: its term resumes if the lease still shows that write")
                }
                Err(why) => {
                    tracing::info!(lease = name, %term, "not resuming the previous process's term: {why}")
                }
            }
        }
        // The gates' word, for the metric and (--collector-not-running-after)
        // for the policy.
        tokio::spawn(export_running(
            app.gate_acks.running(),
            app.metrics.clone(),
            stop_election.clone(),
        ));
        let collector_health = (config.collector_health.is_some()
            || config.collector_not_running.is_some())
        .then(|| {
            let inputs = collector_health::Inputs {
                health: config.collector_health.clone(),
                not_running: config
                    .collector_not_running
                    .map(|bound| (bound, app.gate_acks.running())),
                retry_period: config.retry_period,
                lease_duration: config.lease_duration,
            };
            collector_health::spawn(inputs, state, stop_election.clone())
        });
        let election_task = driver::run(
            Arc::new(store),
            election,
            publisher,
            heartbeat,
            stop_election.clone(),
            config.shutdown.clone(),
            Inputs {
                collector_health,
                spread: spread.clone(),
                step_aside: Some(app.step_aside.asked()),
            },
        );
        // With several Leases, every line the election logs names its Lease.
        let driver = if spread.is_some() {
            tokio::spawn(election_task.instrument(tracing::info_span!("lease", name)))
        } else {
            tokio::spawn(election_task)
        };
        Ok(Self {
            app,
            driver,
            recorder,
            routing,
        })
    }

    /// The published state, as the handlers read it.
    pub fn state(&self) -> watch::Receiver<LeaderState> {
        self.app.state.clone()
    }

    /// The election task, to notice that it ended before a signal.
    pub fn driver(&mut self) -> &mut JoinHandle<()> {
        &mut self.driver
    }

    /// After `stop_election`: waits for the hand-over (bounded by the
    /// driver's own shutdown timeout, `until` is the grace beyond it), then
    /// for the last Kubernetes Events and the routing slice's update.
    pub async fn finish(self, until: tokio::time::Instant) {
        let name = self.app.lease_name.clone();
        let _ = tokio::time::timeout_at(until, self.driver).await;
        // The driver is done with the publisher, so the recorder's queue
        // ends: give the last Events (the stop) their one attempt.
        if let Some(task) = self.recorder {
            let _ = tokio::time::timeout_at(until, task).await;
        }
        // The slice lists this pod marked terminating (written when the
        // step-down was published) or already names the next leader, or
        // that could not be done in time.
        if let Some(mut task) = self.routing
            && tokio::time::timeout_at(until, &mut task).await.is_err()
        {
            tracing::warn!(
                lease = %name,
                "routing: the EndpointSlice could not be updated before the shutdown timeout"
            );
            task.abort();
        }
    }
}

/// Exports whether this instance leads while its gates say that nothing of
/// its term runs, until `stop`.
async fn export_running(
    mut running: watch::Receiver<Option<bool>>,
    metrics: Arc<Metrics>,
    stop: CancellationToken,
) {
    loop {
        let now = *running.borrow_and_update();
        metrics.leading_without_collector(now == Some(false));
        tokio::select! {
            () = stop.cancelled() => return,
            changed = running.changed() => {
                if changed.is_err() {
                    return;
                }
            }
        }
    }
}

/// How long from now until the gates a restart made unknown hold nothing
/// of the resumed term: the validity the previous process gave them ended
/// at its last stored write (`sent`, on the boot clock, in whole
/// milliseconds: one more for the rounding) + `renew_deadline`, and their
/// collectors stopped a gate lag later.
fn unknown_gates_gone_in(
    sent: BootInstant,
    renew_deadline: Duration,
    gate_lag: Duration,
) -> Duration {
    sent.plus(renew_deadline + gate_lag + Duration::from_millis(1))
        .remaining()
}

/// Tells `acks`, `gone_in` from now, that the gates a restart made unknown
/// hold nothing of resumed term `term`.
async fn unknown_gates_gone(acks: Arc<GateAcks>, term: String, gone_in: Duration) {
    tokio::time::sleep(gone_in).await;
    if acks.unknown_gates_gone(&term) {
        tracing::info!(
            %term,
            "the gates registered for the resumed term before the restart and not since hold nothing of it now: its release ends on its gates' acknowledgements again"
        );
    }
}
