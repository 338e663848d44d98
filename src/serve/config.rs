//! `serve`'s flags (every one also an environment variable) and their
//! validation into a [`ServeConfig`], before any I/O: a bad value exits 64
//! with one line naming the flag and the rule (G8). The bounds of the
//! timings and of the sidecar's resources are here too.

use std::net::SocketAddr;
use std::time::Duration;

use clap::{ArgAction, Args};

use crate::args::{
    ConfigError, LogArgs, LogFormat, MAX_KEEP_ALIVE, invalid, is_dns1123_label,
    is_dns1123_subdomain, is_label_value, validate_namespace,
};
use crate::duration::{HumanDuration, parse_duration};
use crate::elector::driver::ShutdownOptions;
use crate::elector::lease::{HOLDER_LABEL, HOLDER_NODE_LABEL, MAX_IDENTITY_LEN};
use crate::serve::collector_health;
use crate::serve::gate_channel::GateChannel;
use crate::serve::routing;
use crate::timing::{SHUTDOWN_SLACK, default_gate_lag};

#[derive(Debug, Args)]
pub struct ServeArgs {
    /// Name of the coordination.k8s.io/v1 Lease to contend for (a DNS-1123
    /// subdomain). Repeat it (or separate names by commas) to contend for
    /// several Leases, spread over the group: each pod holds at most one
    /// while there are as many pods as Leases.
    #[arg(
        long,
        env = "LEADER_GATE_LEASE_NAME",
        required = true,
        value_delimiter = ','
    )]
    pub lease_name: Vec<String>,

    /// Contend for N Leases named LEASE-NAME-0 … LEASE-NAME-(N-1), spread over
    /// the group (one --lease-name only).
    #[arg(long, env = "LEADER_GATE_SHARDS")]
    pub shards: Option<usize>,

    /// Namespace of the Lease [default: $POD_NAMESPACE, then the in-cluster
    /// namespace, then the kubeconfig context's, then "default"].
    #[arg(long, env = "LEADER_GATE_LEASE_NAMESPACE")]
    pub lease_namespace: Option<String>,

    /// This candidate's identity in holderIdentity [default: $POD_NAME, then the hostname].
    #[arg(long, env = "LEADER_GATE_IDENTITY")]
    pub identity: Option<String>,

    /// How long followers wait, from when they last saw the Lease change, before taking it over (whole seconds).
    #[arg(long, env = "LEADER_GATE_LEASE_DURATION", default_value = "15s", value_parser = parse_duration)]
    pub lease_duration: Duration,

    /// The leader steps down when no renew succeeded for this long.
    #[arg(long, env = "LEADER_GATE_RENEW_DEADLINE", default_value = "10s", value_parser = parse_duration)]
    pub renew_deadline: Duration,

    /// How often the leader renews, and the base of every retry.
    #[arg(long, env = "LEADER_GATE_RETRY_PERIOD", default_value = "2s", value_parser = parse_duration)]
    pub retry_period: Duration,

    /// Gate listener (pod-local): GET|HEAD /leader.
    #[arg(long, env = "LEADER_GATE_LISTEN", default_value = "127.0.0.1:4040")]
    pub listen: SocketAddr,

    /// Admin listener (kubelet, Prometheus): /leader, /healthz, /readyz.
    #[arg(long, env = "LEADER_GATE_ADMIN_LISTEN", default_value = "0.0.0.0:4041")]
    pub admin_listen: SocketAddr,

    /// On SIGTERM, release the Lease so a peer takes over at once.
    #[arg(long, env = "LEADER_GATE_RELEASE_ON_SHUTDOWN", default_value_t = true, action = ArgAction::Set)]
    pub release_on_shutdown: bool,

    /// Upper bound on the whole shutdown sequence (step down, gate lag, release, stop serving)
    /// [default: --gate-lag + 5s, 9s with the default timings].
    #[arg(long, env = "LEADER_GATE_SHUTDOWN_TIMEOUT", value_parser = parse_duration)]
    pub shutdown_timeout: Option<Duration>,

    /// How long the collector may go on after "not leading" is published
    /// (its poll or reload period); a graceful release waits this long first.
    /// Must be below the margin (--lease-duration - --renew-deadline)
    /// [default: 80% of the margin, 4s with the default timings].
    #[arg(long, env = "LEADER_GATE_GATE_LAG", value_parser = parse_duration)]
    pub gate_lag: Option<Duration>,

    /// Let a graceful release go out as soon as every gate registered for
    /// the term (exec, file-gate with --reload-url, a subscriber of
    /// /events?gate=ID) acknowledged that it closed,
    /// instead of always waiting --gate-lag. Set false when something else
    /// polls /leader to gate cluster-wide work: it cannot acknowledge.
    #[arg(long, env = "LEADER_GATE_GATE_ACKS", default_value_t = true, action = ArgAction::Set)]
    pub gate_acks: bool,

    /// Most /events streams open at once; more are answered 503. Counted
    /// apart for gates registering over the gate channel (as many again),
    /// so plain readers never take a gate's place.
    #[arg(long, env = "LEADER_GATE_MAX_SUBSCRIBERS", default_value_t = 128)]
    pub max_subscribers: usize,

    /// Interval of keep-alive comments on /events, so proxies keep idle streams open.
    #[arg(long, env = "LEADER_GATE_EVENTS_KEEP_ALIVE", default_value = "15s", value_parser = parse_duration)]
    pub events_keep_alive: Duration,

    #[command(flatten)]
    pub log: LogArgs,

    /// The collector's HTTP health endpoint (http:// only), e.g. Metricbeat's
    /// http://127.0.0.1:5066/stats, checked every --retry-period: a leader
    /// whose collector does not pass within --collector-health-grace, or then
    /// fails, releases the Lease; a pod whose collector failed stands back.
    #[arg(long, env = "LEADER_GATE_COLLECTOR_HEALTH_URL")]
    pub collector_health_url: Option<String>,

    /// Failed health checks in a row after which the collector counts as unhealthy.
    #[arg(
        long,
        env = "LEADER_GATE_COLLECTOR_HEALTH_FAILURES",
        default_value_t = 3
    )]
    pub collector_health_failures: u32,

    /// Time a new leader's collector has to pass its first health check
    /// before the Lease is released (at least 2 x --retry-period); under
    /// `leader-gate exec` the collector only starts once this pod leads.
    #[arg(long, env = "LEADER_GATE_COLLECTOR_HEALTH_GRACE", default_value = "30s", value_parser = parse_duration)]
    pub collector_health_grace: Duration,

    /// A leader releases the Lease when every gate of its term that can
    /// tell (exec, file-gate with --reload-url) has said for this long,
    /// without a break, that nothing of the term runs — a collector that
    /// exited under `leader-gate exec` and was not started again, as in a
    /// crash loop; the pod then stands back as for a failed health check.
    /// 0 turns it off. Needs --gate-acks.
    #[arg(long, env = "LEADER_GATE_COLLECTOR_NOT_RUNNING_AFTER", default_value = "30s", value_parser = parse_duration)]
    pub collector_not_running_after: Duration,

    /// Record a Kubernetes Event about the Lease on each start and stop of
    /// this instance ("X became leader"), as client-go does; best-effort.
    /// Needs `create` on `events` in the Lease's namespace.
    #[arg(long, env = "LEADER_GATE_RECORD_EVENTS")]
    pub record_events: bool,

    /// A directory of this pod that outlives the sidecar's container (an
    /// emptyDir): after a crash or OOM kill, the restarted sidecar resumes
    /// its own term if the Lease still shows its last write, instead of
    /// waiting a lease duration. One sidecar per directory.
    #[arg(long, env = "LEADER_GATE_STATE_DIR", value_name = "DIR")]
    pub state_dir: Option<std::path::PathBuf>,

    /// Route a Service without a selector to the leader: keep its
    /// EndpointSlice `<SERVICE>-leader` (in the Lease's namespace, shipped
    /// with the manifests) listing only this pod while it leads. Needs
    /// `get` and `update` on that one EndpointSlice, and --pod-ip.
    #[arg(long, env = "LEADER_GATE_ROUTE_SERVICE", value_name = "SERVICE")]
    pub route_service: Option<String>,

    /// This pod's IP, for --route-service (from the downward API: status.podIP);
    /// with --host-ip it also tells whether the pod uses the node's network.
    #[arg(long, env = "LEADER_GATE_POD_IP")]
    pub pod_ip: Option<String>,

    /// The node's IP (from the downward API: status.hostIP). When it equals
    /// --pod-ip the pod uses the node's network, where loopback is shared by
    /// every pod and process of the node: gates may then register and
    /// acknowledge only over --gate-socket.
    #[arg(long, env = "LEADER_GATE_HOST_IP")]
    pub host_ip: Option<String>,

    /// Also serve the gate routes on a Unix socket at this path, in a
    /// directory only this pod mounts (an emptyDir shared with the gates):
    /// gates then register and acknowledge over it alone (`--url
    /// unix:PATH`), whatever the pod's networking. Reads stay on --listen too.
    #[arg(long, env = "LEADER_GATE_GATE_SOCKET", value_name = "PATH")]
    pub gate_socket: Option<std::path::PathBuf>,

    /// This pod's name, for --route-service [default: the identity].
    #[arg(long, env = "LEADER_GATE_POD_NAME")]
    pub pod_name: Option<String>,

    /// This pod's node (from the downward API: spec.nodeName), for
    /// --route-service and the Lease's leader-gate.dev/holder-node label.
    #[arg(long, env = "LEADER_GATE_NODE_NAME")]
    pub node_name: Option<String>,

    /// Followers claim an empty successor slot at a random instant between
    /// --retry-period and this long after they see it empty; longer means
    /// fewer colliding claims (about candidates x 10 ms / window).
    #[arg(long, env = "LEADER_GATE_SUCCESSOR_CLAIM_WINDOW", default_value = "60s", value_parser = parse_duration)]
    pub successor_claim_window: Duration,

    /// This pod's revision (from the downward API: the label
    /// controller-revision-hash of a DaemonSet's or StatefulSet's pods,
    /// pod-template-hash of a Deployment's): during a rollout the successor
    /// slot goes to a pod of the new revision, so the Lease moves once.
    #[arg(long, env = "LEADER_GATE_REVISION")]
    pub revision: Option<String>,
}

/// The longest `--lease-duration`: far below the int32 of the API, and a
/// day is already no failover at all.
pub const MAX_LEASE_DURATION: Duration = Duration::from_secs(86_400);
/// The shortest `--retry-period`: the leader writes once per retry period,
/// and below this the API server load stops being "near zero".
pub const MIN_RETRY_PERIOD: Duration = Duration::from_millis(100);
/// The longest `--successor-claim-window`: an empty slot longer than this
/// makes most hand-overs fall back.
pub const MAX_CLAIM_WINDOW: Duration = Duration::from_secs(3600);
/// The most `/events` streams: each costs a few KiB and a socket.
pub const MAX_SUBSCRIBERS: usize = 100_000;

/// Validated `serve` configuration. The namespace may still be unresolved:
/// its fallbacks need the kube configuration (see
/// [`resolve_namespace`](crate::args::resolve_namespace)).
#[derive(Clone, Debug)]
pub struct ServeConfig {
    /// The Leases contended for, in their order (a shard's index is its place).
    pub leases: Vec<String>,
    pub lease_namespace: Option<String>,
    pub identity: String,
    pub lease_duration: Duration,
    pub renew_deadline: Duration,
    pub retry_period: Duration,
    pub listen: SocketAddr,
    pub admin_listen: SocketAddr,
    pub shutdown: ShutdownOptions,
    /// `--gate-acks`.
    pub gate_acks: bool,
    pub max_subscribers: usize,
    pub events_keep_alive: Duration,
    pub log_format: LogFormat,
    /// The collector health check, if configured.
    pub collector_health: Option<collector_health::Options>,
    /// `--collector-not-running-after`, `None` when 0 or without
    /// `--gate-acks` (the gates' word is then unknown).
    pub collector_not_running: Option<Duration>,
    /// Record Kubernetes Events about the Lease (`--record-events`).
    pub record_events: bool,
    /// `--state-dir`.
    pub state_dir: Option<std::path::PathBuf>,
    /// `--successor-claim-window`.
    pub successor_claim_window: Duration,
    /// `--revision`, when given.
    pub revision: Option<String>,
    /// Leader routing through an EndpointSlice (`--route-service`).
    pub route: Option<routing::Options>,
    /// Where gates register and acknowledge (`--gate-socket`, and whether
    /// the pod uses the node's network).
    pub gate_channel: GateChannel,
    /// The labels an acquisition puts on the Lease: this pod (the
    /// identity) and its node (`--node-name`), where valid label values.
    pub holder_labels: Vec<(String, String)>,
}

// === impl ServeArgs ===

impl ServeArgs {
    /// Checks every rule; `env` reads fallbacks such as `POD_NAME` (injected
    /// so tests need not touch the process environment).
    pub fn validate(
        self,
        env: impl Fn(&str) -> Option<String>,
        hostname: impl FnOnce() -> Option<String>,
    ) -> Result<ServeConfig, ConfigError> {
        let Self {
            lease_name,
            shards,
            lease_namespace,
            identity,
            lease_duration,
            renew_deadline,
            retry_period,
            listen,
            admin_listen,
            release_on_shutdown,
            shutdown_timeout,
            gate_lag,
            gate_acks,
            max_subscribers,
            events_keep_alive,
            log: LogArgs { log_format },
            collector_health_url,
            collector_health_failures,
            collector_health_grace,
            collector_not_running_after,
            record_events,
            state_dir,
            successor_claim_window,
            route_service,
            pod_ip,
            host_ip,
            gate_socket,
            pod_name,
            node_name,
            revision,
        } = self;

        let leases = lease_names(lease_name, shards)?;
        let lease_namespace =
            lease_namespace.or_else(|| env("POD_NAMESPACE").filter(|n| !n.is_empty()));
        if let Some(namespace) = &lease_namespace {
            validate_namespace(namespace)?;
        }
        let identity = identity
            .or_else(|| env("POD_NAME").filter(|n| !n.is_empty()))
            .or_else(hostname)
            .unwrap_or_default();
        if identity.trim().is_empty() {
            return Err(invalid(
                "--identity",
                "must not be empty (set --identity, or POD_NAME through the downward API)",
            ));
        }
        if identity.len() > MAX_IDENTITY_LEN {
            return Err(invalid(
                "--identity",
                format!(
                    "must be at most {MAX_IDENTITY_LEN} bytes (got {}): a pod name's limit, and longer holders are cut when read",
                    identity.len()
                ),
            ));
        }
        if lease_duration < Duration::from_secs(1) || lease_duration.subsec_nanos() != 0 {
            return Err(invalid(
                "--lease-duration",
                format!(
                    "must be whole seconds, at least 1s (got {lease_duration}): the Lease stores whole seconds",
                    lease_duration = HumanDuration(lease_duration),
                ),
            ));
        }
        if lease_duration > MAX_LEASE_DURATION {
            return Err(invalid(
                "--lease-duration",
                format!(
                    "must be at most {MAX_LEASE_DURATION} (got {lease_duration}): leaseDurationSeconds is an int32, and a day without a leader is no failover",
                    MAX_LEASE_DURATION = HumanDuration(MAX_LEASE_DURATION),
                    lease_duration = HumanDuration(lease_duration),
                ),
            ));
        }
        if renew_deadline >= lease_duration {
            return Err(invalid(
                "--renew-deadline",
                format!(
                    "must be less than --lease-duration ({renew_deadline} >= {lease_duration})",
                    renew_deadline = HumanDuration(renew_deadline),
                    lease_duration = HumanDuration(lease_duration),
                ),
            ));
        }
        if renew_deadline <= retry_period.mul_f64(1.2) {
            return Err(invalid(
                "--retry-period",
                format!(
                    "1.2 x --retry-period must be less than --renew-deadline ({retry_period} x 1.2 >= {renew_deadline})",
                    retry_period = HumanDuration(retry_period),
                    renew_deadline = HumanDuration(renew_deadline),
                ),
            ));
        }
        if retry_period < MIN_RETRY_PERIOD {
            return Err(invalid(
                "--retry-period",
                format!(
                    "must be at least {MIN_RETRY_PERIOD} (got {retry_period}): the leader writes once per retry period",
                    MIN_RETRY_PERIOD = HumanDuration(MIN_RETRY_PERIOD),
                    retry_period = HumanDuration(retry_period),
                ),
            ));
        }
        if shutdown_timeout.is_some_and(|t| t.is_zero()) {
            return Err(invalid("--shutdown-timeout", "must be more than 0"));
        }
        let margin = lease_duration - renew_deadline;
        // Derived from the timing rule when not given: inside the margin.
        let (gate_lag, lag_origin) = match gate_lag {
            Some(lag) => (lag, ""),
            None => (
                default_gate_lag(lease_duration, renew_deadline),
                ", the default: 80% of the margin",
            ),
        };
        if gate_lag >= margin {
            return Err(invalid(
                "--gate-lag",
                format!(
                    "must be less than the margin --lease-duration - --renew-deadline ({gate_lag} >= {margin}): a peer could start before this collector stops",
                    gate_lag = HumanDuration(gate_lag),
                    margin = HumanDuration(margin),
                ),
            ));
        }
        let shutdown_timeout = shutdown_timeout.unwrap_or(gate_lag + SHUTDOWN_SLACK);
        if gate_lag >= shutdown_timeout {
            return Err(invalid(
                "--shutdown-timeout",
                format!(
                    "must be more than --gate-lag ({shutdown_timeout} <= {gate_lag}{lag_origin}), or the release never happens",
                    shutdown_timeout = HumanDuration(shutdown_timeout),
                    gate_lag = HumanDuration(gate_lag),
                ),
            ));
        }
        if !(1..=MAX_SUBSCRIBERS).contains(&max_subscribers) {
            return Err(invalid(
                "--max-subscribers",
                format!("must be from 1 to {MAX_SUBSCRIBERS} (got {max_subscribers})"),
            ));
        }
        if events_keep_alive.is_zero() || events_keep_alive > MAX_KEEP_ALIVE {
            // Longer, and every gate client would drop and reopen its
            // stream whenever nothing else happened for three intervals.
            return Err(invalid(
                "--events-keep-alive",
                format!(
                    "must be more than 0 and at most {MAX_KEEP_ALIVE} (got {events_keep_alive}): event-stream clients reconnect after {} of silence",
                    HumanDuration(MAX_KEEP_ALIVE * 3),
                    MAX_KEEP_ALIVE = HumanDuration(MAX_KEEP_ALIVE),
                    events_keep_alive = HumanDuration(events_keep_alive),
                ),
            ));
        }
        if successor_claim_window <= retry_period || successor_claim_window > MAX_CLAIM_WINDOW {
            return Err(invalid(
                "--successor-claim-window",
                format!(
                    "must be more than --retry-period and at most {MAX_CLAIM_WINDOW} (got {successor_claim_window} with --retry-period {retry_period})",
                    MAX_CLAIM_WINDOW = HumanDuration(MAX_CLAIM_WINDOW),
                    successor_claim_window = HumanDuration(successor_claim_window),
                    retry_period = HumanDuration(retry_period),
                ),
            ));
        }
        // An empty value is a label the pod lacks: no revision.
        let revision = revision.filter(|r| !r.is_empty());
        if let Some(revision) = &revision
            && !is_label_value(revision)
        {
            return Err(invalid(
                "--revision",
                format!("must be a label value, as the pod's revision label is (got {revision:?})"),
            ));
        }
        if collector_health_failures == 0 {
            return Err(invalid("--collector-health-failures", "must be at least 1"));
        }
        if collector_health_url.is_some() && collector_health_grace < 2 * retry_period {
            // A new leader's collector gets at least two checks.
            return Err(invalid(
                "--collector-health-grace",
                format!(
                    "must be at least 2 x --retry-period ({collector_health_grace} < 2 x {retry_period})",
                    collector_health_grace = HumanDuration(collector_health_grace),
                    retry_period = HumanDuration(retry_period),
                ),
            ));
        }
        let collector_not_running =
            (!collector_not_running_after.is_zero()).then_some(collector_not_running_after);
        if let Some(bound) = collector_not_running
            && bound < Duration::from_secs(1)
        {
            // It must outlast the restart of a gate, which takes longer.
            return Err(invalid(
                "--collector-not-running-after",
                format!(
                    "must be 0 (off) or at least 1s ({bound} < 1s)",
                    bound = HumanDuration(bound),
                ),
            ));
        }
        let collector_health = collector_health_url
            .map(|url| {
                let url = collector_health::parse_url(&url)
                    .map_err(|rule| invalid("--collector-health-url", rule))?;
                Ok(collector_health::Options {
                    url,
                    failures: collector_health_failures,
                    period: retry_period,
                    grace: collector_health_grace,
                    lease_duration,
                })
            })
            .transpose()?;
        if leases.len() > 1 && route_service.is_some() {
            return Err(invalid(
                "--route-service",
                "routes a Service to the holder of one Lease: it cannot be used with several Leases",
            ));
        }
        let gate_channel = gate_channel(gate_socket, pod_ip.as_deref(), host_ip.as_deref())?;
        // Where the leader runs, at a glance (`kubectl get lease -L …`): a
        // value the API server would refuse as a label is left out rather
        // than fail an acquisition.
        let holder_labels = [
            (HOLDER_LABEL, Some(identity.as_str())),
            (HOLDER_NODE_LABEL, node_name.as_deref()),
        ]
        .into_iter()
        .filter_map(|(key, value)| {
            value
                .filter(|v| !v.is_empty() && is_label_value(v))
                .map(|v| (key.to_owned(), v.to_owned()))
        })
        .collect();
        let route = route_service
            .map(|service| route_options(service, pod_ip, pod_name, node_name, &identity))
            .transpose()?;
        Ok(ServeConfig {
            leases,
            lease_namespace,
            identity,
            lease_duration,
            renew_deadline,
            retry_period,
            listen,
            admin_listen,
            shutdown: ShutdownOptions {
                release: release_on_shutdown,
                gate_lag,
                timeout: shutdown_timeout,
            },
            gate_acks,
            max_subscribers,
            events_keep_alive,
            log_format,
            collector_health,
            collector_not_running: collector_not_running.filter(|_| gate_acks),
            record_events,
            state_dir,
            successor_claim_window,
            revision,
            route,
            gate_channel,
            holder_labels,
        })
    }
}

/// Most Leases one sidecar contends for: each costs a watch and a driver.
pub const MAX_LEASES: usize = 64;

/// The Leases of `--lease-name` (repeated) or `--shards`, checked.
fn lease_names(names: Vec<String>, shards: Option<usize>) -> Result<Vec<String>, ConfigError> {
    let names = match shards {
        None => names,
        Some(0) => return Err(invalid("--shards", "must be at least 1")),
        Some(n) if n > MAX_LEASES => {
            return Err(invalid(
                "--shards",
                format!("{n} is more than {MAX_LEASES}"),
            ));
        }
        Some(n) => match names.as_slice() {
            [base] => (0..n).map(|i| format!("{base}-{i}")).collect(),
            _ => {
                return Err(invalid(
                    "--shards",
                    "takes exactly one --lease-name, the base of the shards' names",
                ));
            }
        },
    };
    if names.len() > MAX_LEASES {
        return Err(invalid(
            "--lease-name",
            format!("{} Leases is more than {MAX_LEASES}", names.len()),
        ));
    }
    for (i, name) in names.iter().enumerate() {
        if !is_dns1123_subdomain(name) {
            return Err(invalid(
                "--lease-name",
                format!(
                    "{name:?} must be a DNS-1123 subdomain (lowercase letters, digits, '-' and '.', starting and ending alphanumeric, at most 253 characters)"
                ),
            ));
        }
        if names[..i].contains(name) {
            return Err(invalid("--lease-name", format!("{name:?} is named twice")));
        }
    }
    Ok(names)
}

/// `--gate-socket` (an absolute path that fits a socket address), and
/// whether the pod uses the node's network (`--pod-ip` equals `--host-ip`).
fn gate_channel(
    socket: Option<std::path::PathBuf>,
    pod_ip: Option<&str>,
    host_ip: Option<&str>,
) -> Result<GateChannel, ConfigError> {
    if let Some(path) = &socket {
        use std::os::unix::ffi::OsStrExt;
        // sun_path holds 108 bytes with its terminating NUL.
        let len = path.as_os_str().as_bytes().len();
        if !path.is_absolute() || len == 0 || len > 107 {
            return Err(invalid(
                "--gate-socket",
                format!(
                    "{} must be an absolute path of at most 107 bytes (a Unix socket's limit), e.g. /run/leader-gate/gate.sock",
                    path.display()
                ),
            ));
        }
    }
    let ip = |flag: &'static str, text: Option<&str>| {
        text.filter(|t| !t.is_empty())
            .map(|t| {
                t.parse::<std::net::IpAddr>()
                    .map_err(|_| invalid(flag, format!("{t:?} is not an IP address")))
            })
            .transpose()
    };
    let host_ip = ip("--host-ip", host_ip)?;
    // --pod-ip is checked here only beside --host-ip (--route-service
    // checks it on its own).
    let pod_ip = match host_ip {
        Some(_) => ip("--pod-ip", pod_ip)?,
        None => None,
    };
    Ok(GateChannel::new(socket.as_deref(), pod_ip, host_ip))
}

/// `--route-service` and the pod it names, checked as the API server would
/// check the slice (an IP, not loopback) so a mistake shows at start.
fn route_options(
    service: String,
    pod_ip: Option<String>,
    pod_name: Option<String>,
    node_name: Option<String>,
    identity: &str,
) -> Result<routing::Options, ConfigError> {
    let is_dns1035_label =
        |s: &str| is_dns1123_label(s) && s.starts_with(|c: char| c.is_ascii_lowercase());
    if !is_dns1035_label(&service) {
        return Err(invalid(
            "--route-service",
            format!(
                "{service:?} must be a Service name (lowercase letters, digits and '-', starting with a letter, at most 63 characters)"
            ),
        ));
    }
    let pod_ip = pod_ip.filter(|ip| !ip.is_empty()).ok_or_else(|| {
        invalid(
            "--pod-ip",
            "is required with --route-service: set LEADER_GATE_POD_IP from the downward API (fieldRef status.podIP)",
        )
    })?;
    let pod_ip: std::net::IpAddr = pod_ip
        .parse()
        .map_err(|_| invalid("--pod-ip", format!("{pod_ip:?} is not an IP address")))?;
    if pod_ip.is_loopback() || pod_ip.is_unspecified() {
        return Err(invalid(
            "--pod-ip",
            format!(
                "{pod_ip} cannot be routed to: the API server refuses loopback endpoints, use the pod's IP"
            ),
        ));
    }
    let pod_name = pod_name
        .filter(|n| !n.is_empty())
        .unwrap_or_else(|| identity.to_owned());
    if !is_dns1123_subdomain(&pod_name) {
        return Err(invalid(
            "--pod-name",
            format!("{pod_name:?} must be a pod name (a DNS-1123 subdomain)"),
        ));
    }
    Ok(routing::Options {
        service,
        pod_ip,
        pod_name,
        node_name: node_name.filter(|n| !n.is_empty()),
    })
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    /// `serve`'s flags alone, as the binary's command line flattens them.
    #[derive(Debug, Parser)]
    struct Serve {
        #[command(flatten)]
        args: ServeArgs,
    }

    fn parse(argv: &[&str]) -> Result<ServeArgs, String> {
        let argv = std::iter::once(&"serve").chain(argv);
        Serve::try_parse_from(argv)
            .map(|serve| serve.args)
            .map_err(|e| e.to_string())
    }

    fn args(extra: &[&str]) -> Result<ServeConfig, String> {
        let mut argv = vec!["--lease-name", "demo"];
        argv.extend_from_slice(extra);
        parse(&argv)?
            .validate(|_| None, || Some("host-1".into()))
            .map_err(|e| e.to_string())
    }

    #[test]
    fn defaults_follow_client_go() {
        let config = args(&[]).unwrap();
        assert_eq!(config.lease_duration, Duration::from_secs(15));
        assert_eq!(config.renew_deadline, Duration::from_secs(10));
        assert_eq!(config.retry_period, Duration::from_secs(2));
        assert_eq!(config.identity, "host-1");
        assert_eq!(config.listen.to_string(), "127.0.0.1:4040");
        assert_eq!(config.admin_listen.to_string(), "0.0.0.0:4041");
        assert!(config.shutdown.release);
        assert!(
            config.collector_health.is_none(),
            "no health check by default"
        );
        assert!(!config.record_events, "no Kubernetes Events by default");
        assert_eq!(
            config.collector_not_running,
            Some(Duration::from_secs(30)),
            "a leader whose gates say nothing runs releases by default"
        );
    }

    #[test]
    fn the_collector_not_running_bound_is_off_at_0_and_without_acknowledgements() {
        let bound = |extra: &[&str]| args(extra).map(|c| c.collector_not_running);
        assert_eq!(
            bound(&["--collector-not-running-after", "2m"]),
            Ok(Some(Duration::from_secs(120)))
        );
        assert_eq!(bound(&["--collector-not-running-after", "0"]), Ok(None));
        assert_eq!(bound(&["--gate-acks", "false"]), Ok(None));
        let error = bound(&["--collector-not-running-after", "500ms"]).unwrap_err();
        assert!(
            error.contains("--collector-not-running-after") && error.contains("at least 1s"),
            "{error}"
        );
    }

    #[test]
    fn the_gate_lag_follows_the_timings_it_is_not_given_with() {
        for (lease, renew, lag) in [
            ("30s", "15s", Duration::from_secs(12)),
            ("4s", "3s", Duration::from_millis(800)),
            ("6s", "4s", Duration::from_millis(1600)),
            ("2s", "1500ms", Duration::from_millis(400)),
        ] {
            let config = args(&[
                "--lease-duration",
                lease,
                "--renew-deadline",
                renew,
                "--retry-period",
                "1s",
            ])
            .unwrap();
            let margin = config.lease_duration - config.renew_deadline;
            assert_eq!(config.shutdown.gate_lag, lag, "{lease}/{renew}");
            assert!(config.shutdown.gate_lag < margin);
            assert_eq!(config.shutdown.timeout, lag + SHUTDOWN_SLACK);
        }
        // Given ones win, also 0s (an operator who measures raw hand-overs).
        let config = args(&["--gate-lag", "0s"]).unwrap();
        assert_eq!(config.shutdown.gate_lag, Duration::ZERO);
        assert_eq!(config.shutdown.timeout, SHUTDOWN_SLACK);
        let config = args(&["--gate-lag", "2s", "--shutdown-timeout", "3s"]).unwrap();
        assert_eq!(config.shutdown.gate_lag, Duration::from_secs(2));
        assert_eq!(config.shutdown.timeout, Duration::from_secs(3));
    }

    #[test]
    fn a_shutdown_timeout_below_the_derived_gate_lag_is_refused_naming_both() {
        let error = args(&["--shutdown-timeout", "3s"]).unwrap_err();
        assert!(
            error.starts_with("invalid --shutdown-timeout: must be more than --gate-lag (3s <= 4s, the default: 80% of the margin)"),
            "{error}"
        );
        let error = args(&["--shutdown-timeout", "4s"]).unwrap_err();
        assert!(error.contains("--gate-lag"), "{error}");
        assert!(args(&["--shutdown-timeout", "4100ms"]).is_ok());
    }

    #[test]
    fn kubernetes_events_are_recorded_only_when_asked() {
        assert!(args(&["--record-events"]).unwrap().record_events);
        assert!(
            args(&["--record-events", "true"]).is_err(),
            "a switch: takes no value"
        );
    }

    #[test]
    fn the_collector_health_check_runs_every_retry_period() {
        let config = args(&[
            "--collector-health-url",
            "http://127.0.0.1:5066/stats",
            "--retry-period",
            "3s",
        ])
        .unwrap();
        let health = config.collector_health.unwrap();
        assert_eq!(health.url, "http://127.0.0.1:5066/stats");
        assert_eq!(health.failures, 3);
        assert_eq!(health.period, Duration::from_secs(3));
        assert_eq!(health.grace, Duration::from_secs(30));
    }

    #[test]
    fn identity_and_namespace_fall_back_to_the_downward_api() {
        let args = parse(&["--lease-name", "demo"]).unwrap();
        let env = |name: &str| match name {
            "POD_NAME" => Some("metricbeat-x7k2p".to_owned()),
            "POD_NAMESPACE" => Some("monitoring".to_owned()),
            _ => None,
        };
        let config = args.validate(env, || Some("host-1".into())).unwrap();
        assert_eq!(config.identity, "metricbeat-x7k2p");
        assert_eq!(config.lease_namespace.as_deref(), Some("monitoring"));
    }

    #[test]
    fn bad_values_name_the_flag_and_the_rule() {
        let cases: &[(&[&str], &str)] = &[
            (
                &["--lease-duration", "1.5s"],
                "invalid --lease-duration: must be whole seconds",
            ),
            (
                &["--lease-duration", "0s"],
                "invalid --lease-duration: must be whole seconds",
            ),
            (
                &["--renew-deadline", "15s"],
                "invalid --renew-deadline: must be less than --lease-duration",
            ),
            (
                &["--retry-period", "9s"],
                "invalid --retry-period: 1.2 x --retry-period must be less than --renew-deadline",
            ),
            (
                &["--lease-namespace", "Kube_System"],
                "invalid --lease-namespace: \"Kube_System\" must be a DNS-1123 label",
            ),
            (
                &["--identity", " "],
                "invalid --identity: must not be empty",
            ),
            (
                &["--shutdown-timeout", "0s"],
                "invalid --shutdown-timeout: must be more than 0",
            ),
            (
                &["--gate-lag", "5s"],
                "invalid --gate-lag: must be less than the margin",
            ),
            (
                &["--gate-lag", "3s", "--shutdown-timeout", "2s"],
                "invalid --shutdown-timeout: must be more than --gate-lag",
            ),
            (
                &["--collector-health-url", "https://127.0.0.1:5066/stats"],
                "invalid --collector-health-url: \"https://127.0.0.1:5066/stats\" must be an http:// URL",
            ),
            (
                &["--collector-health-url", "127.0.0.1:5066"],
                "invalid --collector-health-url: \"127.0.0.1:5066\" must be an http:// URL",
            ),
            (
                &["--collector-health-url", "http://"],
                "invalid --collector-health-url",
            ),
            (
                &["--collector-health-failures", "0"],
                "invalid --collector-health-failures: must be at least 1",
            ),
            (
                &[
                    "--collector-health-url",
                    "http://127.0.0.1:5066/stats",
                    "--collector-health-grace",
                    "3s",
                    "--retry-period",
                    "2s",
                ],
                "invalid --collector-health-grace: must be at least 2 x --retry-period",
            ),
            (
                &["--lease-duration", "3000000000s", "--renew-deadline", "10s"],
                "invalid --lease-duration: must be at most",
            ),
            (
                &[
                    "--retry-period",
                    "10ms",
                    "--renew-deadline",
                    "1s",
                    "--lease-duration",
                    "2s",
                ],
                "invalid --retry-period: must be at least 100ms",
            ),
            (
                &["--max-subscribers", "4611686018427387904"],
                "invalid --max-subscribers: must be from 1 to 100000",
            ),
            (
                &["--identity", &"x".repeat(254)],
                "invalid --identity: must be at most 253 bytes",
            ),
            (
                &["--events-keep-alive", "60s"],
                "invalid --events-keep-alive: must be more than 0 and at most 15s",
            ),
            (
                &["--route-service", "statsd"],
                "invalid --pod-ip: is required with --route-service",
            ),
            (
                &["--route-service", "statsd", "--pod-ip", "127.0.0.1"],
                "invalid --pod-ip: 127.0.0.1 cannot be routed to",
            ),
            (
                &["--route-service", "statsd", "--pod-ip", "10.1.2"],
                "invalid --pod-ip: \"10.1.2\" is not an IP address",
            ),
            (
                &["--route-service", "9statsd", "--pod-ip", "10.1.2.3"],
                "invalid --route-service: \"9statsd\" must be a Service name",
            ),
            (&["--shards", "0"], "invalid --shards: must be at least 1"),
            (&["--shards", "65"], "invalid --shards: 65 is more than 64"),
            (
                &["--lease-name", "other", "--shards", "2"],
                "invalid --shards: takes exactly one --lease-name, the base of the shards' names",
            ),
            (
                &["--lease-name", "other,demo"],
                "invalid --lease-name: \"demo\" is named twice",
            ),
            (
                &["--lease-name", "Other"],
                "invalid --lease-name: \"Other\" must be a DNS-1123 subdomain (lowercase letters, digits, '-' and '.', starting and ending alphanumeric, at most 253 characters)",
            ),
            (
                &[
                    "--lease-name",
                    "b",
                    "--route-service",
                    "statsd",
                    "--pod-ip",
                    "10.1.2.3",
                ],
                "invalid --route-service: routes a Service to the holder of one Lease: it cannot be used with several Leases",
            ),
        ];
        for (extra, expected) in cases {
            let error = args(extra).unwrap_err();
            assert!(error.starts_with(expected), "{extra:?}: {error}");
        }
    }

    #[test]
    fn several_leases_are_named_in_order_repeated_by_commas_or_as_shards() {
        let leases = |extra: &[&str]| args(extra).unwrap().leases;
        assert_eq!(leases(&[]), ["demo"]);
        assert_eq!(
            leases(&["--lease-name", "b,c", "--lease-name", "d"]),
            ["demo", "b", "c", "d"]
        );
        assert_eq!(leases(&["--shards", "3"]), ["demo-0", "demo-1", "demo-2"]);
    }

    #[test]
    fn lease_names_must_be_dns1123_subdomains() {
        for bad in ["", "Demo", "-demo", "demo-", "de_mo", &"a".repeat(254)] {
            let flag = format!("--lease-name={bad}");
            let args = parse(&[&flag]).unwrap();
            let error = args.validate(|_| None, || Some("h".into())).unwrap_err();
            assert_eq!(error.flag, "--lease-name", "{bad:?}");
        }
        assert!(args(&[]).is_ok());
        assert!(is_dns1123_subdomain("metricbeat.cluster-leader"));
    }

    #[test]
    fn the_successor_claim_window_defaults_to_a_minute_and_names_its_flag() {
        assert_eq!(
            args(&[]).unwrap().successor_claim_window,
            Duration::from_secs(60)
        );
        assert_eq!(
            args(&["--successor-claim-window", "5s"])
                .unwrap()
                .successor_claim_window,
            Duration::from_secs(5)
        );
        for bad in ["2s", "1s", "2h"] {
            let error = args(&["--successor-claim-window", bad]).unwrap_err();
            assert!(
                error.starts_with(
                    "invalid --successor-claim-window: must be more than --retry-period"
                ),
                "{bad}: {error}"
            );
        }
    }
}
