//! Prometheus metrics (`GET /metrics` on the admin listener): the same facts
//! the event stream carries, as numbers an operator can alert on. Every
//! series of a Lease is labelled `lease="NAMESPACE/NAME"`, so that one
//! exposition holds the several Leases of a sidecar.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::{Registry, Unit};
use std::sync::atomic::AtomicU64;

use crate::clock::BootInstant;
use crate::elector::api_error::{ApiError, Forbidden};
use crate::elector::machine::StopReason;
use crate::serve::exposition::{Format, to_text_004};
use crate::serve::transitions::{Event, EventKind};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct LeaseLabels {
    lease: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct BuildLabels {
    version: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TransitionLabels {
    lease: String,
    direction: &'static str,
    reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RequestLabels {
    lease: String,
    verb: &'static str,
    outcome: &'static str,
}

/// The reason of every `direction="started"` transition.
const ACQUIRED: &str = "acquired";

/// The verbs of the Lease requests (`api_request`'s callers).
const VERBS: [&str; 4] = ["get", "create", "update", "watch"];

type Histograms = Family<LeaseLabels, Histogram, fn() -> Histogram>;

fn renew_histogram() -> Histogram {
    Histogram::new([0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0])
}

/// The metric families of one process: every Lease's series are in them,
/// labelled by their Lease, so one exposition holds them all.
pub struct MetricsRegistry {
    registry: Registry,
    leading: Family<LeaseLabels, Gauge>,
    transitions: Family<TransitionLabels, Counter>,
    requests: Family<RequestLabels, Counter>,
    renew_latency: Histograms,
    /// When each Lease's last successful renew was sent.
    last_renews: Mutex<Vec<(LeaseLabels, Option<BootInstant>)>>,
    last_renew_age: Family<LeaseLabels, Gauge<f64, AtomicU64>>,
    leader_observed: Family<LeaseLabels, Gauge>,
    subscribers: Gauge,
    identity_conflicts: Family<LeaseLabels, Counter>,
    /// Registered only when a collector health check is configured.
    collector_healthy: Option<Family<LeaseLabels, Gauge>>,
    /// Renews answered 409 (a successor claim or an edit landed first).
    renew_conflicts: Family<LeaseLabels, Counter>,
    /// 1 while leading with gates that say nothing of the term runs.
    leading_without_collector: Family<LeaseLabels, Gauge>,
    /// Gates whose stream ended while leading ([`crate::serve::gate_acks`]).
    gate_disconnects: Family<LeaseLabels, Counter>,
}

/// One Lease's handle on its process's [`MetricsRegistry`].
pub struct Metrics {
    shared: Arc<MetricsRegistry>,
    labels: LeaseLabels,
}

// === impl MetricsRegistry ===

impl MetricsRegistry {
    /// The families; `leader_gate_collector_healthy` only when
    /// `collector_health` is checked (so "0" always means a failing
    /// collector, never an unconfigured check).
    pub fn new(collector_health: bool) -> Arc<Self> {
        let mut registry = Registry::with_prefix("leader_gate");
        let build_info = Family::<BuildLabels, Gauge>::default();
        registry.register(
            "build_info",
            "Always 1; the version label is this binary's version",
            build_info.clone(),
        );
        build_info
            .get_or_create(&BuildLabels {
                version: env!("CARGO_PKG_VERSION"),
            })
            .set(1);
        let leading = Family::<LeaseLabels, Gauge>::default();
        registry.register(
            "leading",
            "1 while this instance leads the lease",
            leading.clone(),
        );
        let transitions = Family::<TransitionLabels, Counter>::default();
        registry.register(
            "transitions",
            "Leadership transitions of this instance, by direction (started, stopped) and reason",
            transitions.clone(),
        );
        let requests = Family::<RequestLabels, Counter>::default();
        registry.register(
            "api_requests",
            "Lease API requests by verb and outcome (ok, conflict, forbidden, unauthorized, not_found, gone, throttled, invalid, timeout, transport, error)",
            requests.clone(),
        );
        let renew_latency: Histograms = Family::new_with_constructor(renew_histogram);
        registry.register_with_unit(
            "renew_duration",
            "Latency of successful renews",
            Unit::Seconds,
            renew_latency.clone(),
        );
        let last_renew_age = Family::<LeaseLabels, Gauge<f64, AtomicU64>>::default();
        registry.register_with_unit(
            "last_renew_age",
            "Time since this instance's last successful renew was sent (NaN before the first)",
            Unit::Seconds,
            last_renew_age.clone(),
        );
        let leader_observed = Family::<LeaseLabels, Gauge>::default();
        registry.register(
            "leader_observed",
            "1 while a live holder of the lease is observed (by any instance); 0 means nobody leads",
            leader_observed.clone(),
        );
        let subscribers = Gauge::default();
        registry.register(
            "event_subscribers",
            "Open /events streams",
            subscribers.clone(),
        );
        let renew_conflicts = Family::<LeaseLabels, Counter>::default();
        registry.register(
            "renew_conflicts",
            "Renews answered 409 because another write (a successor claim, a hand-over request, an edit) landed first; each is retried at once from the new object",
            renew_conflicts.clone(),
        );
        let identity_conflicts = Family::<LeaseLabels, Counter>::default();
        registry.register(
            "identity_conflicts",
            "Other processes seen writing the lease under this instance's identity (each counted once); give each candidate a unique --identity",
            identity_conflicts.clone(),
        );
        let collector_healthy = collector_health.then(|| {
            let family = Family::<LeaseLabels, Gauge>::default();
            registry.register(
                "collector_healthy",
                "1 while the collector health check (--collector-health-url) lets this instance lead or contend; 0 after its collector did not pass within the grace of a term or failed, until it passes again or the group has been leaderless for the stand-back wait",
                family.clone(),
            );
            family
        });
        let leading_without_collector = Family::<LeaseLabels, Gauge>::default();
        registry.register(
            "leading_without_collector",
            "1 while this instance leads and every gate of its term that can tell (exec, file-gate with --reload-url) says nothing of the term runs: the collector exited and was not started again; 0 otherwise, also when no gate can tell",
            leading_without_collector.clone(),
        );
        let gate_disconnects = Family::<LeaseLabels, Counter>::default();
        registry.register(
            "gate_disconnects_while_leading",
            "Registered gates (exec, file-gate) whose last /events stream ended while this instance led: the gate exited, was restarted or lost its connection; a crash-looping gated container counts once per restart",
            gate_disconnects.clone(),
        );
        Arc::new(Self {
            registry,
            gate_disconnects,
            leading_without_collector,
            leading,
            transitions,
            requests,
            renew_latency,
            last_renews: Mutex::default(),
            last_renew_age,
            leader_observed,
            subscribers,
            identity_conflicts,
            collector_healthy,
            renew_conflicts,
        })
    }

    /// The handle of Lease `namespace/name`: its series exist from now on
    /// (the counters at 0, the renew age NaN), followers' too. The counters
    /// with labels beside `lease` exist at 0 for the label sets the shipped
    /// rules select: a term's start, the step-downs of failed renews, and
    /// refused requests of every verb.
    pub fn lease(self: &Arc<Self>, namespace: &str, name: &str) -> Metrics {
        let labels = LeaseLabels {
            lease: format!("{namespace}/{name}"),
        };
        self.leading.get_or_create(&labels).set(0);
        self.leader_observed.get_or_create(&labels).set(0);
        self.last_renew_age.get_or_create(&labels).set(f64::NAN);
        self.leading_without_collector.get_or_create(&labels).set(0);
        drop(self.renew_latency.get_or_create(&labels));
        drop(self.renew_conflicts.get_or_create(&labels));
        drop(self.identity_conflicts.get_or_create(&labels));
        drop(self.gate_disconnects.get_or_create(&labels));
        let started = [("started", ACQUIRED)];
        let stopped = [StopReason::RenewDeadline, StopReason::ApiUnreachable]
            .map(|reason| ("stopped", reason.as_str()));
        for (direction, reason) in started.into_iter().chain(stopped) {
            drop(self.transitions.get_or_create(&TransitionLabels {
                lease: labels.lease.clone(),
                direction,
                reason,
            }));
        }
        let refused = [
            ApiError::Forbidden(Forbidden::parse("")).kind(),
            ApiError::Unauthorized.kind(),
        ];
        for verb in VERBS {
            for outcome in refused {
                drop(self.requests.get_or_create(&RequestLabels {
                    lease: labels.lease.clone(),
                    verb,
                    outcome,
                }));
            }
        }
        self.last_renews
            .lock()
            .expect("metrics lock")
            .push((labels.clone(), None));
        Metrics {
            shared: self.clone(),
            labels,
        }
    }

    /// The exposition of every Lease in `format`, as of now.
    pub fn encode(&self, format: Format) -> String {
        for (labels, sent) in self.last_renews.lock().expect("metrics lock").iter() {
            if let Some(sent) = sent {
                let age = BootInstant::now().saturating_since(*sent);
                self.last_renew_age
                    .get_or_create(labels)
                    .set(age.as_secs_f64());
            }
        }
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &self.registry)
            .expect("encoding to a String cannot fail");
        match format {
            Format::OpenMetrics => text,
            Format::Text004 => to_text_004(&text),
        }
    }
}

// === impl Metrics ===

impl Metrics {
    /// Metrics for a process of one Lease, `namespace/name`.
    pub fn new(namespace: &str, name: &str) -> Self {
        MetricsRegistry::new(false).lease(namespace, name)
    }

    /// A renew was answered 409.
    pub fn renew_conflict(&self) {
        self.shared
            .renew_conflicts
            .get_or_create(&self.labels)
            .inc();
    }

    /// Counts one API request by its outcome.
    pub fn api_request(&self, verb: &'static str, result: Result<(), &ApiError>) {
        let outcome = match result {
            Ok(()) => "ok",
            Err(error) => error.kind(),
        };
        let labels = RequestLabels {
            lease: self.labels.lease.clone(),
            verb,
            outcome,
        };
        self.shared.requests.get_or_create(&labels).inc();
    }

    /// A renew (or the acquisition, a term's first renew) succeeded: it was
    /// sent `latency` before its answer arrived.
    pub fn renewed(&self, sent: BootInstant, latency: Duration) {
        let shared = &self.shared;
        shared
            .renew_latency
            .get_or_create(&self.labels)
            .observe(latency.as_secs_f64());
        let mut last_renews = shared.last_renews.lock().expect("metrics lock");
        if let Some((_, last)) = last_renews.iter_mut().find(|(l, _)| *l == self.labels) {
            *last = Some(sent);
        }
    }

    /// A published event.
    pub fn transition(&self, event: &Event) {
        let direction = match event.kind {
            EventKind::StartedLeading => "started",
            EventKind::StoppedLeading => "stopped",
            EventKind::NewLeader => return,
        };
        let labels = TransitionLabels {
            lease: self.labels.lease.clone(),
            direction,
            reason: match event.kind {
                EventKind::StartedLeading => ACQUIRED,
                _ => event.reason.unwrap_or("unknown"),
            },
        };
        self.shared.transitions.get_or_create(&labels).inc();
    }

    /// `new` more processes were seen writing under this identity.
    pub fn identity_conflicts(&self, new: u64) {
        self.shared
            .identity_conflicts
            .get_or_create(&self.labels)
            .inc_by(new);
    }

    /// The published state.
    pub fn state(&self, leading: bool, holder_observed: bool) {
        let shared = &self.shared;
        shared
            .leading
            .get_or_create(&self.labels)
            .set(i64::from(leading));
        shared
            .leader_observed
            .get_or_create(&self.labels)
            .set(i64::from(holder_observed));
    }

    /// The collector's health as the election last saw it.
    pub fn collector_healthy(&self, healthy: Option<bool>) {
        if let Some(family) = &self.shared.collector_healthy {
            family
                .get_or_create(&self.labels)
                .set(i64::from(healthy == Some(true)));
        }
    }

    /// Whether this instance leads while its gates say nothing of its
    /// term runs ([`crate::serve::gate_acks::GateAcks::running`]).
    pub fn leading_without_collector(&self, yes: bool) {
        self.shared
            .leading_without_collector
            .get_or_create(&self.labels)
            .set(i64::from(yes));
    }

    /// The counter of this Lease's gates whose stream ended while leading,
    /// for its [`crate::serve::gate_acks::GateAcks`] to count in.
    pub fn gate_disconnects_while_leading(&self) -> Counter {
        self.shared
            .gate_disconnects
            .get_or_create(&self.labels)
            .clone()
    }

    /// Open `/events` streams, over every Lease of the process.
    pub fn subscribers(&self) -> &Gauge {
        &self.shared.subscribers
    }

    /// The process's whole exposition in `format` (every Lease), as of now.
    pub fn encode(&self, format: Format) -> String {
        self.shared.encode(format)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn build_info_is_one_and_names_this_version() {
        let text = Metrics::new("ns", "demo").encode(Format::Text004);
        let line = format!(
            "leader_gate_build_info{{version=\"{}\"}} 1\n",
            env!("CARGO_PKG_VERSION")
        );
        assert!(text.contains(&line), "{text}");
        assert!(
            text.contains("# TYPE leader_gate_build_info gauge\n"),
            "{text}"
        );
    }

    #[test]
    fn the_counters_the_rules_select_exist_at_zero_before_anything_happened() {
        let text = Metrics::new("ns", "demo").encode(Format::Text004);
        let mut lines = vec![
            r#"leader_gate_transitions_total{lease="ns/demo",direction="started",reason="acquired"} 0"#.to_owned(),
            r#"leader_gate_transitions_total{lease="ns/demo",direction="stopped",reason="renew-deadline"} 0"#.to_owned(),
            r#"leader_gate_transitions_total{lease="ns/demo",direction="stopped",reason="api-unreachable"} 0"#.to_owned(),
            r#"leader_gate_identity_conflicts_total{lease="ns/demo"} 0"#.to_owned(),
            r#"leader_gate_gate_disconnects_while_leading_total{lease="ns/demo"} 0"#.to_owned(),
        ];
        for verb in VERBS {
            for outcome in ["forbidden", "unauthorized"] {
                lines.push(format!(
                    r#"leader_gate_api_requests_total{{lease="ns/demo",verb="{verb}",outcome="{outcome}"}} 0"#
                ));
            }
        }
        for line in lines {
            assert!(
                text.contains(&format!("{line}\n")),
                "{line} missing:\n{text}"
            );
        }
    }

    #[test]
    fn a_gate_disconnect_counted_through_the_handle_is_exposed() {
        let metrics = Metrics::new("ns", "demo");
        metrics.gate_disconnects_while_leading().inc();
        metrics.gate_disconnects_while_leading().inc();
        let text = metrics.encode(Format::Text004);
        assert!(
            text.contains(
                "leader_gate_gate_disconnects_while_leading_total{lease=\"ns/demo\"} 2\n"
            ),
            "{text}"
        );
    }
}
