//! What `inject` decides for one workload before it writes anything: the
//! gate, the Lease, the timings (from the rules of [`crate::timing`], so
//! their margins hold by construction, and checked by `serve`'s own
//! validation) and the sidecar's ports.

use std::time::Duration;

use clap::ValueEnum;

use super::workload::Collector;

/// The gates `inject` can set up.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum GateKind {
    /// `leader-gate exec -- COMMAND`: the whole collector runs only on the leader.
    Exec,
    /// `leader-gate file-gate`: a leader-only configuration file placed
    /// where the collector live-reloads it (Metricbeat's modules directory,
    /// Elastic Agent's inputs.d).
    File,
    /// The sidecar and the preStop hand-over only: the collector (or a
    /// script) asks `GET /leader` itself.
    Poll,
}

impl GateKind {
    /// The gate the docs recommend for a collector in a workload: Metricbeat
    /// keeps its node modules everywhere and gets its cluster modules by
    /// file, and so does a DaemonSet's Elastic Agent with the inputs its own
    /// election ran; a collector of a Deployment runs whole on the leader.
    pub fn recommended(collector: Collector, per_node: bool) -> Result<GateKind, String> {
        match (collector, per_node) {
            (Collector::Metricbeat, _) | (Collector::ElasticAgent, true) => Ok(GateKind::File),
            (_, false) => Ok(GateKind::Exec),
            (_, true) => Err("a DaemonSet's collector does node work on every pod: pass --gate exec to run it on one node only, or --gate poll".to_owned()),
        }
    }
}

/// The sidecar's timings and what follows from them.
#[derive(Clone, Debug, PartialEq)]
pub struct Timings {
    pub lease_duration: Duration,
    pub renew_deadline: Duration,
    pub retry_period: Duration,
    pub gate_lag: Duration,
    pub shutdown_timeout: Duration,
    /// `prestop --timeout`.
    pub hook_timeout: Duration,
    /// `exec --grace`.
    pub exec_grace: Duration,
}

/// What the preStop hook waits beyond the gate lag: the release and the
/// peer's take-over being seen.
const HOOK_SLACK: Duration = Duration::from_secs(3);

impl Timings {
    /// From the Lease timings: the gate lag given (or the default), the
    /// rest derived by [`crate::timing`].
    pub fn derive(
        lease_duration: Duration,
        renew_deadline: Duration,
        retry_period: Duration,
        gate_lag: Option<Duration>,
    ) -> Timings {
        let gate_lag = gate_lag
            .unwrap_or_else(|| crate::timing::default_gate_lag(lease_duration, renew_deadline));
        let margin = lease_duration - renew_deadline;
        Timings {
            lease_duration,
            renew_deadline,
            retry_period,
            gate_lag,
            shutdown_timeout: gate_lag + crate::timing::SHUTDOWN_SLACK,
            hook_timeout: gate_lag + HOOK_SLACK,
            exec_grace: crate::timing::max_exec_grace(margin, gate_lag)
                .min(crate::client::exec::DEFAULT_GRACE),
        }
    }

    /// The timings for a gate, as docs/timing.md "Which timings" lists them:
    /// the defaults for `exec` and a poll; for a file that the collector
    /// reloads every `reload_period` (Metricbeat's modules, Elastic Agent's
    /// inputs.d: both 10 s by default), a margin and a gate lag above it.
    pub fn for_gate(gate: GateKind, reload_period: Option<Duration>) -> Timings {
        let s = Duration::from_secs;
        match (gate, reload_period) {
            (GateKind::File, Some(reload)) => {
                // Metricbeat's reload.period 10 s: 30 s / 15 s / 3 s, gate lag 12 s.
                // Whole seconds: the Lease stores its duration in seconds.
                let reload = s(reload.as_secs() + u64::from(reload.subsec_nanos() > 0));
                let gate_lag = reload + s(2);
                let margin = (gate_lag + s(3)).max(s(5));
                let renew = margin;
                Timings::derive(renew + margin, renew, renew / 5, Some(gate_lag))
            }
            _ => Timings::derive(s(15), s(10), s(2), None),
        }
    }
}

/// A leader-only file the file gate places.
#[derive(Clone, Debug)]
pub struct FilePlacement {
    /// The ConfigMap holding it (mounted at [`super::pod::SOURCE_DIR`]).
    pub config_map: String,
    /// `SRC:DST` for `file-gate`.
    pub mapping: String,
    /// DST's directory, an emptyDir shared with the collector.
    pub placed_dir: String,
    /// The collector's status that proves the placed file's work stopped
    /// (`file-gate --status-url`, `--stopped-when`), where there is one.
    pub proof: Option<(String, &'static str)>,
}

/// Everything decided for one workload.
#[derive(Clone, Debug)]
pub struct Plan {
    pub gate: GateKind,
    pub lease: String,
    pub timings: Timings,
    pub image: String,
    /// `--listen` and `--admin-listen` ports under hostNetwork.
    pub ports: Option<(u16, u16)>,
    pub health_url: Option<String>,
    /// The pod label `--revision` comes from.
    pub revision_label: &'static str,
    pub file: Option<FilePlacement>,
    /// The collector container is merged by an operator into one it makes
    /// (prometheus-operator): its command, args and probes are not in the input.
    pub operator_merged: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metricbeats_reload_period_gives_the_documented_timings() {
        let t = Timings::for_gate(GateKind::File, Some(Duration::from_secs(10)));
        let s = Duration::from_secs;
        assert_eq!(
            (
                t.lease_duration,
                t.renew_deadline,
                t.retry_period,
                t.gate_lag,
                t.shutdown_timeout,
                t.hook_timeout
            ),
            (s(30), s(15), s(3), s(12), s(17), s(15))
        );
    }

    #[test]
    fn a_fractional_reload_period_still_gives_whole_second_lease_timings() {
        let t = Timings::for_gate(GateKind::File, Some(Duration::from_millis(2300)));
        let s = Duration::from_secs;
        assert_eq!(
            (t.lease_duration, t.renew_deadline, t.gate_lag),
            (s(16), s(8), s(5))
        );
    }

    #[test]
    fn exec_gets_the_defaults_and_a_grace_a_second_below_the_gate_lag() {
        let t = Timings::for_gate(GateKind::Exec, None);
        let s = Duration::from_secs;
        assert_eq!(
            (t.gate_lag, t.exec_grace, t.shutdown_timeout),
            (s(4), s(3), s(9))
        );
    }
}
