//! Prometheus metrics (`GET /metrics` on the admin listener): the same facts
//! the event stream carries, as numbers an operator can alert on.

use std::sync::Mutex;
use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::{Registry, Unit};
use std::sync::atomic::AtomicU64;

use crate::clock::BootInstant;
use crate::elector::api_error::ApiError;
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
    verb: &'static str,
    outcome: &'static str,
}

/// All metrics of one process.
pub struct Metrics {
    registry: Registry,
    lease: String,
    leading: Family<LeaseLabels, Gauge>,
    transitions: Family<TransitionLabels, Counter>,
    requests: Family<RequestLabels, Counter>,
    renew_latency: Histogram,
    last_renew: Mutex<Option<BootInstant>>,
    last_renew_age: Gauge<f64, AtomicU64>,
    leader_observed: Gauge,
    subscribers: Gauge,
    identity_conflicts: Counter,
    /// Registered only when a collector health check is configured.
    collector_healthy: Option<Gauge>,
    /// Renews answered 409 (a successor claim or an edit landed first).
    renew_conflicts: Counter,
}

// === impl Metrics ===

impl Metrics {
    /// Metrics for the Lease `namespace/name`.
    pub fn new(namespace: &str, name: &str) -> Self {
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
        let renew_latency =
            Histogram::new([0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0]);
        registry.register_with_unit(
            "renew_duration",
            "Latency of successful renews",
            Unit::Seconds,
            renew_latency.clone(),
        );
        let last_renew_age = Gauge::<f64, AtomicU64>::default();
        registry.register_with_unit(
            "last_renew_age",
            "Time since this instance's last successful renew was sent (NaN before the first)",
            Unit::Seconds,
            last_renew_age.clone(),
        );
        let leader_observed = Gauge::default();
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
        let renew_conflicts = Counter::default();
        registry.register(
            "renew_conflicts",
            "Renews answered 409 because another write (a successor claim, a hand-over request, an edit) landed first; each is retried at once from the new object",
            renew_conflicts.clone(),
        );
        let identity_conflicts = Counter::default();
        registry.register(
            "identity_conflicts",
            "Other processes seen writing the lease under this instance's identity (each counted once); give each candidate a unique --identity",
            identity_conflicts.clone(),
        );
        let lease = format!("{namespace}/{name}");
        leading
            .get_or_create(&LeaseLabels {
                lease: lease.clone(),
            })
            .set(0);
        last_renew_age.set(f64::NAN);
        Self {
            registry,
            lease,
            leading,
            transitions,
            requests,
            renew_latency,
            last_renew: Mutex::new(None),
            last_renew_age,
            leader_observed,
            subscribers,
            identity_conflicts,
            collector_healthy: None,
            renew_conflicts,
        }
    }

    /// A renew was answered 409.
    pub fn renew_conflict(&self) {
        self.renew_conflicts.inc();
    }

    /// Adds `leader_gate_collector_healthy`, for a process that checks its
    /// collector's health (absent otherwise, so "0" always means a failing
    /// collector, never an unconfigured check).
    pub fn with_collector_health(mut self) -> Self {
        let gauge = Gauge::default();
        self.registry.register(
            "collector_healthy",
            "1 while the collector health check (--collector-health-url) lets this instance lead or contend; 0 after its collector did not pass within the grace of a term or failed, until it passes again or the group has been leaderless for the stand-back wait",
            gauge.clone(),
        );
        self.collector_healthy = Some(gauge);
        self
    }

    /// Counts one API request by its outcome.
    pub fn api_request(&self, verb: &'static str, result: Result<(), &ApiError>) {
        let outcome = match result {
            Ok(()) => "ok",
            Err(error) => error.kind(),
        };
        self.requests
            .get_or_create(&RequestLabels { verb, outcome })
            .inc();
    }

    /// A renew (or the acquisition, a term's first renew) succeeded: it was
    /// sent `latency` before its answer arrived.
    pub fn renewed(&self, sent: BootInstant, latency: Duration) {
        self.renew_latency.observe(latency.as_secs_f64());
        *self.last_renew.lock().expect("metrics lock") = Some(sent);
    }

    /// A published event.
    pub fn transition(&self, event: &Event) {
        let direction = match event.kind {
            EventKind::StartedLeading => "started",
            EventKind::StoppedLeading => "stopped",
            EventKind::NewLeader => return,
        };
        let labels = TransitionLabels {
            lease: self.lease.clone(),
            direction,
            reason: match event.kind {
                EventKind::StartedLeading => "acquired",
                _ => event.reason.unwrap_or("unknown"),
            },
        };
        self.transitions.get_or_create(&labels).inc();
    }

    /// `new` more processes were seen writing under this identity.
    pub fn identity_conflicts(&self, new: u64) {
        self.identity_conflicts.inc_by(new);
    }

    /// The published state.
    pub fn state(&self, leading: bool, holder_observed: bool) {
        let labels = LeaseLabels {
            lease: self.lease.clone(),
        };
        self.leading.get_or_create(&labels).set(i64::from(leading));
        self.leader_observed.set(i64::from(holder_observed));
    }

    /// The collector's health as the election last saw it.
    pub fn collector_healthy(&self, healthy: Option<bool>) {
        if let Some(gauge) = &self.collector_healthy {
            gauge.set(i64::from(healthy == Some(true)));
        }
    }

    pub fn subscribers(&self) -> &Gauge {
        &self.subscribers
    }

    /// The exposition in `format`, as of now.
    pub fn encode(&self, format: Format) -> String {
        if let Some(sent) = *self.last_renew.lock().expect("metrics lock") {
            let age = BootInstant::now().saturating_since(sent);
            self.last_renew_age.set(age.as_secs_f64());
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
}
