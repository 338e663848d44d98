//! The wiring rules of one gated pod: each leader-gate command line as
//! start-up takes it ([`super::line`]), where each runs (`serve` and
//! `file-gate` native sidecars, `install` a plain init container), the
//! sidecar's identity from the downward API, readiness, the pod-wide
//! timing rules of [`crate::timing`], the gate socket, the preStop hooks,
//! the binaries `install` puts in the collector's containers, the Lease
//! each gate follows, `--state-dir`; then [`super::rbac`],
//! [`super::metricbeat`] and [`super::agent`].

use std::time::Duration;

use super::Stream;
use super::line::{self, Env, Parsed, ServeArgsSeen, Side};
use super::workload::{Container, Pod};
use super::{agent, metricbeat, otel, rbac};
use crate::client::file_gate::Mapping;
use crate::client::url::ClientArgs;
use crate::duration::HumanDuration;
use crate::serve::config::ServeConfig;
use crate::timing::{EXEC_GRACE_HEADROOM, POD_GRACE_SLACK, max_exec_grace, min_pod_grace};

/// A leader-gate command line of the pod: a container's or a preStop hook's.
struct Run<'p> {
    container: &'p Container,
    /// `KIND/NAME container C` (and ` preStop hook`).
    at: String,
    /// Its first word (`serve`, `exec`…), also when the rest was refused.
    subcommand: String,
    /// As start-up takes it; `None` when it would refuse it (said already).
    parsed: Option<Parsed>,
    env: Env,
    /// A hook's binary.
    binary: Option<String>,
}

impl Run<'_> {
    fn side(&self) -> Option<&Side> {
        match &self.parsed {
            Some(Parsed::Other(side)) => Some(side),
            _ => None,
        }
    }

    fn client(&self) -> Option<&ClientArgs> {
        Some(match self.side()? {
            Side::Exec(a) => &a.client,
            Side::FileGate(a) => &a.client,
            Side::Watch(a) => &a.client,
            Side::Status(a) => a,
            Side::Wait(a) => &a.client,
            Side::Prestop(a) => &a.client,
            _ => return None,
        })
    }
}

/// The sidecar's settings the rules measure the rest against.
struct Sidecar<'p> {
    run: &'p Run<'p>,
    seen: &'p ServeArgsSeen,
    config: &'p ServeConfig,
}

impl Sidecar<'_> {
    fn margin(&self) -> Duration {
        self.config.lease_duration - self.config.renew_deadline
    }

    fn leases(&self) -> String {
        self.config.leases.join(", ")
    }
}

fn h(d: Duration) -> HumanDuration {
    HumanDuration(d)
}

/// Checks `pod`; false when it runs no leader-gate at all.
pub fn check(stream: &Stream<'_>, pod: &Pod, out: &mut Vec<String>) -> bool {
    let config_map = |name: &str| stream.config_map(&pod.namespace, name);
    let mut runs = Vec::new();
    for container in &pod.containers {
        let at = pod.at(container);
        let env = Env::of(container, pod, &config_map);
        match line::container_argv(container, &env) {
            None => {}
            Some(Err(error)) => out.push(format!("{at}: {error}")),
            Some(Ok(argv)) => runs.push(read(container, at.clone(), argv, env, None, out)),
        }
        let env = Env::of(container, pod, &config_map);
        match line::hook_argv(container) {
            None => {}
            Some(Err(error)) => out.push(format!("{at} preStop hook: {error}")),
            Some(Ok((binary, argv))) => {
                let at = format!("{at} preStop hook");
                runs.push(read(container, at, argv, env, Some(binary), out));
            }
        }
    }
    if runs.is_empty() {
        return false;
    }
    placement(&runs, out);
    let serves: Vec<&Run<'_>> = runs
        .iter()
        .filter(|r| r.binary.is_none() && r.subcommand == "serve")
        .collect();
    let sidecar = match serves.as_slice() {
        [] => {
            out.push(format!(
                "{}: no `leader-gate serve` sidecar beside its leader-gate containers: nothing contends for a Lease, so the gates never open; add one (`leader-gate inject` writes it)",
                pod.name
            ));
            return true;
        }
        [one] => *one,
        more => {
            out.push(format!(
                "{}: {} `leader-gate serve` containers ({}): one sidecar per pod, or two identities contend from one pod",
                pod.name,
                more.len(),
                more.iter()
                    .map(|r| r.container.name.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            ));
            return true;
        }
    };
    let Some(Parsed::Serve(seen, config)) = &sidecar.parsed else {
        // Refused at start-up: said already, and nothing to measure against.
        return true;
    };
    let sidecar = Sidecar {
        run: sidecar,
        seen,
        config,
    };
    identity(&sidecar, out);
    readiness(pod, &runs, out);
    let installs = installs(pod, &runs, out);
    let mut longest_grace = Duration::ZERO;
    let mut longest_hook = Duration::ZERO;
    for run in &runs {
        follows(&sidecar, run, out);
        match run.side() {
            Some(Side::Exec(exec)) => {
                longest_grace = longest_grace.max(exec.grace);
                exec_grace(&sidecar, run, exec.grace, out);
                exec_binary(run, &installs, out);
            }
            Some(Side::FileGate(gate)) => {
                let file_gate = metricbeat::Gate {
                    container: run.container,
                    mode: gate.mode,
                };
                for mapping in &gate.mappings {
                    file_gate_mapping(stream, pod, &sidecar, run, &file_gate, mapping, out);
                }
            }
            Some(Side::Prestop(hook)) => {
                longest_hook = longest_hook.max(hook.timeout + hook.drain);
                prestop(&sidecar, run, &installs, out);
            }
            _ => {}
        }
    }
    let shutdown = config.shutdown.timeout;
    let least = min_pod_grace(longest_hook, longest_grace, shutdown);
    if pod.grace_period < least {
        out.push(format!(
            "{}: terminationGracePeriodSeconds {} is below {least}: the preStop hook (--timeout + --drain {}), the exec gate's stop (--grace {}) and the sidecar's --shutdown-timeout {} run one after the other, plus {} for the collector and the kubelet; the kubelet would SIGKILL the sidecar before it released the Lease. Raise it to {least}",
            pod.name,
            pod.grace_period,
            h(longest_hook),
            h(longest_grace),
            h(shutdown),
            h(POD_GRACE_SLACK),
        ));
    }
    gate_socket(pod, &sidecar, &runs, out);
    state_dir(pod, &sidecar, out);
    let under_exec: Vec<&str> = runs
        .iter()
        .filter(|r| matches!(r.side(), Some(Side::Exec(_))))
        .map(|r| r.container.name.as_str())
        .collect();
    otel::check(stream, pod, &under_exec, out);
    rbac::check(stream, pod, &sidecar.run.at, config, out);
    true
}

fn read<'p>(
    container: &'p Container,
    at: String,
    argv: Vec<String>,
    env: Env,
    binary: Option<String>,
    out: &mut Vec<String>,
) -> Run<'p> {
    let subcommand = argv
        .iter()
        .find(|a| !a.starts_with('-'))
        .cloned()
        .unwrap_or_default();
    let parsed = match line::parse(&argv, &env) {
        Ok(parsed) => Some(parsed),
        Err(error) => {
            out.push(format!("{at}: {error}"));
            None
        }
    };
    Run {
        container,
        at,
        subcommand,
        parsed,
        env,
        binary,
    }
}

/// `serve` and `file-gate` run for the pod's lifetime beside the collector,
/// started before it and stopped after it; `install` runs once, first;
/// a preStop hook runs `prestop`.
fn placement(runs: &[Run<'_>], out: &mut Vec<String>) {
    for run in runs {
        let c = run.container;
        let sub = run.subcommand.as_str();
        if run.binary.is_some() {
            if sub != "prestop" {
                out.push(format!(
                    "{}: runs `leader-gate {sub}`, not `leader-gate prestop`: the hook would not hand the Lease over",
                    run.at
                ));
            }
            continue;
        }
        match sub {
            "serve" | "file-gate" if !c.native_sidecar() => out.push(format!(
                "{}: `{sub}` is not a native sidecar: move it to initContainers with restartPolicy: Always, so it starts before the collector and stops after it",
                run.at
            )),
            "install" if !c.init || c.node.get("restartPolicy").is_some() => out.push(format!(
                "{}: `install` is not a plain init container: move it to initContainers without restartPolicy, so the binary is in place before the others start",
                run.at
            )),
            _ => {}
        }
    }
}

/// The sidecar's identity must differ from pod to pod (POD_NAME), and its
/// Lease's namespace be the pod's (POD_NAMESPACE): from the downward API.
fn identity(sidecar: &Sidecar<'_>, out: &mut Vec<String>) {
    for (var, field, given, what) in [
        (
            "POD_NAME",
            "metadata.name",
            sidecar.seen.identity_given,
            "its identity (holderIdentity) must be this pod's own",
        ),
        (
            "POD_NAMESPACE",
            "metadata.namespace",
            sidecar.seen.namespace_given,
            "the Lease is looked up in this pod's namespace",
        ),
    ] {
        if given {
            continue;
        }
        let from = sidecar.run.env.var(var).and_then(|v| v.field.clone());
        if from.as_deref() != Some(field) {
            out.push(format!(
                "{}: {var} does not come from the downward API ({what}): set it with valueFrom.fieldRef.fieldPath {field}",
                sidecar.run.at
            ));
        }
    }
}

/// Only one pod leads: readiness on /leader leaves the others unready,
/// and a DaemonSet or StatefulSet waits for each pod to be ready.
fn readiness(pod: &Pod, runs: &[Run<'_>], out: &mut Vec<String>) {
    let Some(kind) = pod.rolls_by_readiness else {
        return;
    };
    let _ = runs;
    for c in &pod.containers {
        let path = c
            .node
            .map("readinessProbe")
            .and_then(|p| p.map("httpGet"))
            .and_then(|g| g.str("path"));
        if path.is_some_and(|p| p == "/leader" || p.starts_with("/leader/")) {
            out.push(format!(
                "{}: readiness on /leader stalls a {kind} rollout (every follower stays unready): probe /readyz instead",
                pod.at(c)
            ));
        }
    }
}

/// Where `install` puts the binary: (volume, path inside it).
fn installs(pod: &Pod, runs: &[Run<'_>], out: &mut Vec<String>) -> Vec<(String, String)> {
    let mut places = Vec::new();
    for run in runs {
        let Some(Side::Install(install)) = run.side() else {
            continue;
        };
        let dest = install.dest.to_string_lossy();
        match run.container.mount_of(&dest) {
            Some(mount) if pod.volume(mount.volume).is_some() => {
                places.push((mount.volume.to_owned(), mount.inside));
            }
            _ => out.push(format!(
                "{}: installs into {dest}, which is in no volume it mounts: no other container sees the copy",
                run.at
            )),
        }
    }
    places
}

/// Whether `binary`, as `container` sees it, is a copy `install` made.
fn installed(
    container: &Container,
    binary: &str,
    installs: &[(String, String)],
) -> Result<(), String> {
    let Some(mount) = container.mount_of(binary) else {
        return Err(format!(
            "{binary} is in no volume its container mounts: mount the volume an init container runs `leader-gate install` into"
        ));
    };
    if installs
        .iter()
        .any(|(volume, inside)| volume == mount.volume && *inside == mount.inside)
    {
        return Ok(());
    }
    Err(format!(
        "no init container installs leader-gate at {binary} (volume {}): add `leader-gate install DEST` with DEST there, in a plain init container mounting {}",
        mount.volume, mount.volume
    ))
}

fn exec_binary(run: &Run<'_>, installs: &[(String, String)], out: &mut Vec<String>) {
    let c = run.container;
    if line::is_leader_gate_image(c.node.str("image").unwrap_or("")) {
        return; // The image's own binary.
    }
    let binary = c
        .node
        .seq("command")
        .first()
        .and_then(|b| b.as_str())
        .map(|b| run.env.expand(b));
    if let Some(binary) = binary
        && let Err(error) = installed(c, &binary, installs)
    {
        out.push(format!("{}: {error}", run.at));
    }
}

/// Each gate follows one of the sidecar's Leases: beside several, the one
/// it names (without --lease it stays closed).
fn follows(sidecar: &Sidecar<'_>, run: &Run<'_>, out: &mut Vec<String>) {
    let Some(client) = run.client() else { return };
    let leases = &sidecar.config.leases;
    match &client.lease {
        Some(lease) if !leases.contains(lease) => out.push(format!(
            "{}: --lease {lease} is not one of the sidecar's Leases ({}): it would wait for a Lease nobody here holds",
            run.at,
            sidecar.leases()
        )),
        None if leases.len() > 1 => out.push(format!(
            "{}: names no --lease beside a sidecar of {} Leases ({}): it would stay closed; name one",
            run.at,
            leases.len(),
            sidecar.leases()
        )),
        None if run.binary.is_some() => out.push(format!(
            "{}: names no --lease: name the sidecar's Lease ({}), so the hook cannot ask another sidecar to hand over",
            run.at,
            sidecar.leases()
        )),
        _ => {}
    }
}

fn exec_grace(sidecar: &Sidecar<'_>, run: &Run<'_>, grace: Duration, out: &mut Vec<String>) {
    let lag = sidecar.config.shutdown.gate_lag;
    let margin = sidecar.margin();
    let most = max_exec_grace(margin, lag);
    if grace > most {
        out.push(format!(
            "{}: --grace {} is not {} below the sidecar's gate lag {} and margin {} (lease duration - renew deadline): the release may go out before the SIGKILL, and a collector ignoring SIGTERM may outlive the margin; lower --grace to {} at most, or raise --gate-lag within the margin",
            run.at,
            h(grace),
            h(EXEC_GRACE_HEADROOM),
            h(lag),
            h(margin),
            h(most),
        ));
    }
}

/// The gate socket's place: (volume, inside), when in an emptyDir the
/// sidecar mounts read-write (said otherwise).
fn socket_place(
    pod: &Pod,
    sidecar: &Sidecar<'_>,
    out: &mut Vec<String>,
) -> Option<(String, String, String)> {
    let socket = sidecar
        .seen
        .gate_socket
        .as_ref()?
        .to_string_lossy()
        .into_owned();
    let mount = sidecar.run.container.mount_of(&socket);
    let empty_dir = mount
        .as_ref()
        .and_then(|m| pod.volume(m.volume))
        .is_some_and(|v| v.get("emptyDir").is_some());
    match mount {
        Some(mount) if empty_dir => {
            if mount.read_only {
                out.push(format!(
                    "{}: --gate-socket {socket}: its volume {} is mounted readOnly, where the sidecar cannot create the socket",
                    sidecar.run.at, mount.volume
                ));
            }
            Some((socket, mount.volume.to_owned(), mount.inside))
        }
        _ => {
            out.push(format!(
                "{}: --gate-socket {socket} is not in an emptyDir mounted in this container: only a directory no other pod mounts keeps the socket pod-local",
                sidecar.run.at
            ));
            None
        }
    }
}

/// Gates register and acknowledge over the gate socket, pod-local whatever
/// the pod's networking: every `exec` and `file-gate` names it and reaches
/// it through the same volume.
fn gate_socket(pod: &Pod, sidecar: &Sidecar<'_>, runs: &[Run<'_>], out: &mut Vec<String>) {
    let gates: Vec<&Run<'_>> = runs
        .iter()
        .filter(|r| matches!(r.side(), Some(Side::Exec(_) | Side::FileGate(_))))
        .collect();
    if gates.is_empty() {
        return;
    }
    if sidecar.seen.gate_socket.is_none() {
        let names: Vec<&str> = gates.iter().map(|g| g.container.name.as_str()).collect();
        out.push(format!(
            "{}: no --gate-socket beside the gates ({}): they would register over loopback TCP, which under hostNetwork is every pod and process of the node; give it --gate-socket in an emptyDir the gates mount",
            sidecar.run.at,
            names.join(", ")
        ));
        return;
    }
    let Some((socket, volume, inside)) = socket_place(pod, sidecar, out) else {
        return;
    };
    for gate in gates {
        let Some(client) = gate.client() else {
            continue;
        };
        reaches_socket(gate, client, &socket, &volume, &inside, out);
    }
}

/// Whether `run` names the sidecar's socket and reaches it; said if not.
fn reaches_socket(
    run: &Run<'_>,
    client: &ClientArgs,
    socket: &str,
    volume: &str,
    inside: &str,
    out: &mut Vec<String>,
) {
    let url = client.url.to_string();
    let want = format!("unix:{socket}");
    if url != want {
        let what = if url.starts_with("unix:") {
            format!("has the URL {url}, not the sidecar's gate socket {want}")
        } else if run.binary.is_some() {
            format!(
                "is on TCP (http://{url}): the sidecar takes a step-down from its gate socket only, so the hook would not hand over"
            )
        } else {
            format!(
                "is on TCP (http://{url}), which the sidecar refuses beside --gate-socket: the gate never opens"
            )
        };
        out.push(format!(
            "{}: `{}` {what}; set --url or LEADER_GATE_URL to {want}",
            run.at, run.subcommand
        ));
        return;
    }
    let reaches = run
        .container
        .mount_of(socket)
        .is_some_and(|m| m.volume == volume && m.inside == inside);
    if !reaches {
        let at = socket.rsplit_once('/').map_or("/", |(dir, _)| dir);
        out.push(format!(
            "{}: does not mount the gate socket's volume {volume} at {at}: it cannot reach {want}",
            run.at
        ));
    }
}

/// A preStop hook asks this pod's own sidecar to step down: over its socket
/// when it has one (loopback TCP otherwise), with a binary installed into
/// a volume its container mounts.
fn prestop(
    sidecar: &Sidecar<'_>,
    run: &Run<'_>,
    installs: &[(String, String)],
    out: &mut Vec<String>,
) {
    let Some(client) = run.client() else { return };
    match &sidecar.seen.gate_socket {
        Some(socket) => {
            let socket = socket.to_string_lossy();
            let mount = sidecar.run.container.mount_of(&socket);
            if let Some(mount) = mount {
                reaches_socket(run, client, &socket, mount.volume, &mount.inside, out);
            }
        }
        None => {
            let (host, _) = client.url.host_port();
            let url = client.url.to_string();
            if url.starts_with("unix:") || !matches!(host, "127.0.0.1" | "localhost" | "::1") {
                let url = if url.starts_with("unix:") {
                    url
                } else {
                    format!("http://{url}")
                };
                out.push(format!(
                    "{}: has the URL {url}, not this pod's loopback gate listener: it would ask another sidecar",
                    run.at
                ));
            }
        }
    }
    if let Some(binary) = &run.binary
        && let Err(error) = installed(run.container, binary, installs)
    {
        out.push(format!("{}: {error}", run.at));
    }
}

/// A file gate's SRC and DST are in volumes, and a collector reads DST's.
fn file_gate_mapping(
    stream: &Stream<'_>,
    pod: &Pod,
    sidecar: &Sidecar<'_>,
    run: &Run<'_>,
    file_gate: &metricbeat::Gate<'_>,
    mapping: &Mapping,
    out: &mut Vec<String>,
) {
    let (src, dst) = (mapping.src.to_string_lossy(), mapping.dst.to_string_lossy());
    let (src, dst) = (src.as_ref(), dst.as_ref());
    let gate = run.container;
    if gate.mount_of(src).is_none() {
        out.push(format!(
            "{}: SRC {src} is in no volume it mounts: mount the ConfigMap (or volume) that holds it",
            run.at
        ));
    }
    let dir = dst.rsplit_once('/').map_or("", |(dir, _)| dir);
    let Some(mount) = gate.mount_of(dst).filter(|m| m.mount_path == dir) else {
        out.push(format!(
            "{}: DST {dst}: its directory {dir} is not a volume this container mounts: the directory would not exist (file-gate exits 64), or the collector would never see the copy; mount the volume the collector reads at {dir}",
            run.at
        ));
        return;
    };
    let readers: Vec<&Container> = pod
        .containers
        .iter()
        .filter(|c| {
            !c.init
                && c.node
                    .seq("volumeMounts")
                    .iter()
                    .any(|m| m.as_map().and_then(|m| m.str("name")) == Some(mount.volume))
        })
        .collect();
    if readers.is_empty() {
        out.push(format!(
            "{}: no container reads the volume {} of DST {dst}: mount it in the collector",
            run.at, mount.volume
        ));
    }
    for reader in readers {
        if let Some(seen_as) = reader.path_of(mount.volume, &mount.inside) {
            metricbeat::check(
                stream,
                pod,
                reader,
                file_gate,
                &seen_as,
                sidecar.config,
                out,
            );
            agent::check(
                stream,
                pod,
                reader,
                gate,
                src,
                &seen_as,
                sidecar.config,
                out,
            );
        }
    }
}

/// --state-dir outlives the sidecar's container, not the pod: an emptyDir.
fn state_dir(pod: &Pod, sidecar: &Sidecar<'_>, out: &mut Vec<String>) {
    let Some(dir) = &sidecar.config.state_dir else {
        return;
    };
    let dir = dir.to_string_lossy();
    let empty_dir = sidecar
        .run
        .container
        .mount_of(&dir)
        .and_then(|m| pod.volume(m.volume))
        .is_some_and(|v| v.get("emptyDir").is_some());
    if !empty_dir {
        out.push(format!(
            "{}: --state-dir {dir} is not an emptyDir mounted in this container: a restarted sidecar would not find its record",
            sidecar.run.at
        ));
    }
}
