//! The timing rules that tie one pod's containers together: what the
//! sidecar's defaults derive from its Lease timings (the gate lag, the
//! shutdown timeout), how far an `exec` gate's `--grace` stays below them,
//! and what `terminationGracePeriodSeconds` must cover. `serve` applies the
//! first two at start-up; `inject` writes pods by them and `inject --check`
//! holds hand-made pods to them, so each rule is stated once, here.

use std::time::Duration;

/// `--shutdown-timeout` by default is the gate lag plus this: the release
/// write (whose request timeout is half the renew deadline, 5 s by default)
/// and closing the listeners.
pub const SHUTDOWN_SLACK: Duration = Duration::from_secs(5);

/// How far `exec --grace` must stay below the gate lag and below the margin.
/// On a graceful hand-over the sidecar releases the Lease one gate lag after
/// it stepped down; `exec` SIGKILLs a collector that ignores SIGTERM
/// `--grace` after it heard of the step-down. A grace equal to the gate lag
/// sends the SIGKILL a fraction of a millisecond before the release, so the
/// peer's collector may start while this one still runs: this second pays
/// for the news reaching `exec`, the kill and the reaping on a throttled
/// CPU. The same holds against the margin when the sidecar dies.
pub const EXEC_GRACE_HEADROOM: Duration = Duration::from_secs(1);

/// What `terminationGracePeriodSeconds` keeps beyond the shutdown sequence
/// it must cover: the collector's own stop and the kubelet's scheduling.
pub const POD_GRACE_SLACK: Duration = Duration::from_secs(5);

/// `--gate-lag` when not given: 80% of the margin, so a graceful hand-over
/// waits about as long as a crash gives the gates (the margin), less a fifth
/// for scheduling and throttling; 4 s with the default timings.
pub fn default_gate_lag(lease_duration: Duration, renew_deadline: Duration) -> Duration {
    lease_duration.saturating_sub(renew_deadline) * 4 / 5
}

/// The longest `exec --grace` a sidecar's timings allow: a whole
/// [`EXEC_GRACE_HEADROOM`] below both the margin and the gate lag.
pub fn max_exec_grace(margin: Duration, gate_lag: Duration) -> Duration {
    margin.min(gate_lag).saturating_sub(EXEC_GRACE_HEADROOM)
}

/// The shortest `terminationGracePeriodSeconds` for a pod whose deletion
/// runs, one after the other, a preStop hook (`prestop --timeout` +
/// `--drain`, 0 without one), the gated collector's stop (at most the
/// longest `exec --grace`, 0 without `exec`) and the sidecar's
/// `--shutdown-timeout`, plus [`POD_GRACE_SLACK`]; whole seconds, rounded up.
pub fn min_pod_grace(hook: Duration, exec_grace: Duration, shutdown_timeout: Duration) -> u64 {
    let total = hook + exec_grace + shutdown_timeout + POD_GRACE_SLACK;
    total.as_secs() + u64::from(total.subsec_nanos() > 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: fn(u64) -> Duration = Duration::from_secs;

    #[test]
    fn the_default_gate_lag_is_four_fifths_of_the_margin() {
        assert_eq!(default_gate_lag(S(15), S(10)), S(4));
        assert_eq!(default_gate_lag(S(30), S(15)), S(12));
    }

    #[test]
    fn exec_grace_stays_a_second_below_the_margin_and_the_gate_lag() {
        assert_eq!(max_exec_grace(S(5), S(4)), S(3));
        assert_eq!(max_exec_grace(S(5), S(12)), S(4));
        assert_eq!(max_exec_grace(S(1), S(0)), S(0));
    }

    #[test]
    fn the_pod_grace_covers_hook_grace_shutdown_and_slack_rounded_up() {
        // The shipped Metricbeat DaemonSet: hook 15 s, no exec, shutdown 20 s.
        assert_eq!(min_pod_grace(S(15), S(0), S(20)), 40);
        assert_eq!(min_pod_grace(Duration::from_millis(15_500), S(3), S(9)), 33);
    }
}
