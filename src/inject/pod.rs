//! What `inject` puts in a pod: the init container that installs the binary,
//! the `serve` native sidecar, the gate (a `file-gate` native sidecar, or
//! `exec` around the collector's command), their volumes, the collector's
//! preStop hand-over and a termination grace period that covers it all.
//! Everything it adds carries a `leader-gate` name, so a second run replaces
//! it in place and leaves the rest where it was.

use std::time::Duration;

use super::plan::{FilePlacement, GateKind, Plan};
use super::workload::Collector;
use super::yaml::{Map, Node, read_one};
use crate::duration::HumanDuration;

/// Where the installed binary lives in every container that runs it.
pub const BIN_DIR: &str = "/leader-gate";
pub const BIN: &str = "/leader-gate/leader-gate";
pub const SOCKET_DIR: &str = "/run/leader-gate";
pub const SOCKET: &str = "/run/leader-gate/gate.sock";
pub const STATE_DIR: &str = "/var/run/leader-gate";
pub const SOURCE_DIR: &str = "/etc/leader-gate/leader-only";

pub const INSTALL: &str = "leader-gate-install";
pub const SIDECAR: &str = "leader-gate";
pub const FILE_GATE: &str = "leader-gate-file-gate";
pub const VOL_BIN: &str = "leader-gate-bin";
pub const VOL_SOCKET: &str = "leader-gate-socket";
pub const VOL_STATE: &str = "leader-gate-state";
pub const VOL_SOURCE: &str = "leader-gate-leader-only";
pub const VOL_PLACED: &str = "leader-gate-placed";

/// The file gate's placement of `file`, kept in ConfigMap `config_map`
/// (mounted at [`SOURCE_DIR`]), into `placed_dir`.
pub fn file_placement(config_map: String, placed_dir: String, file: &str) -> FilePlacement {
    FilePlacement {
        config_map,
        mapping: format!("{SOURCE_DIR}/{file}:{placed_dir}/{file}"),
        placed_dir,
        proof: None,
    }
}

/// The annotation saying which version gated the pod template.
pub const INJECTED: &str = "leader-gate.dev/injected";

fn h(d: Duration) -> String {
    HumanDuration(d).to_string()
}

/// A container's securityContext: the restricted profile, as `user`.
fn security(user: u64) -> String {
    let non_root = user != 0;
    format!(
        "{{runAsNonRoot: {non_root}, runAsUser: {user}, runAsGroup: {user}, readOnlyRootFilesystem: true, allowPrivilegeEscalation: false, capabilities: {{drop: [ALL]}}, seccompProfile: {{type: RuntimeDefault}}}}"
    )
}

/// A name as a YAML scalar that stays a string whatever it spells (`null`,
/// `on`, `1234`): JSON's quoting, which YAML reads alike.
pub fn q(text: &str) -> String {
    serde_json::to_string(text).expect("a string serializes")
}

fn parse(text: &str) -> Node {
    read_one(text).unwrap_or_else(|e| panic!("inject's own template is YAML: {e}\n{text}"))
}

/// Puts `item` in place of the entry of the same `key` value, or at the end.
pub fn upsert(list: &mut Vec<Node>, key: &str, item: Node) {
    let value = item.as_map().and_then(|m| m.str(key)).map(str::to_owned);
    match list
        .iter_mut()
        .find(|n| n.as_map().and_then(|m| m.str(key)) == value.as_deref())
    {
        Some(slot) => *slot = item,
        None => list.push(item),
    }
}

fn remove_named(list: &mut Vec<Node>, name: &str) {
    list.retain(|n| n.as_map().and_then(|m| m.str("name")) != Some(name));
}

/// The `serve` sidecar's command line.
pub fn serve_args(plan: &Plan) -> Vec<String> {
    let t = &plan.timings;
    let mut args = vec![
        "serve".to_owned(),
        "--lease-name".to_owned(),
        plan.lease.clone(),
        format!("--lease-duration={}", h(t.lease_duration)),
        format!("--renew-deadline={}", h(t.renew_deadline)),
        format!("--retry-period={}", h(t.retry_period)),
        format!("--gate-lag={}", h(t.gate_lag)),
        format!("--shutdown-timeout={}", h(t.shutdown_timeout)),
        format!("--state-dir={STATE_DIR}"),
        format!("--gate-socket={SOCKET}"),
    ];
    if let Some((listen, admin)) = plan.ports {
        args.push(format!("--listen=127.0.0.1:{listen}"));
        args.push(format!("--admin-listen=0.0.0.0:{admin}"));
    }
    if let Some(url) = &plan.health_url {
        args.push(format!("--collector-health-url={url}"));
    }
    if plan.gate == GateKind::Exec {
        // The collector runs only while leading: the sidecar can tell a
        // leader whose collector never started from its gate's word.
        args.push("--collector-not-running-after=30s".to_owned());
    }
    args.push("--record-events".to_owned());
    args.push("--log-format=json".to_owned());
    args
}

fn yaml_list(items: &[String]) -> String {
    let quoted: Vec<String> = items
        .iter()
        .map(|a| serde_json::to_string(a).expect("a string"))
        .collect();
    format!("[{}]", quoted.join(", "))
}

fn install_container(plan: &Plan) -> Node {
    parse(&format!(
        "name: {INSTALL}
image: {image}
args: [install, --log-format=json, {BIN}]
volumeMounts: [{{name: {VOL_BIN}, mountPath: {BIN_DIR}}}]
resources: {{requests: {{cpu: 10m, memory: 8Mi}}, limits: {{cpu: 100m, memory: 32Mi}}}}
securityContext: {sec}
",
        image = q(&plan.image),
        sec = security(65532),
    ))
}

fn sidecar_container(plan: &Plan) -> Node {
    let admin = plan.ports.map_or(4041, |(_, admin)| admin);
    parse(&format!(
        "name: {SIDECAR}
image: {image}
restartPolicy: Always
args: {args}
env:
  - {{name: POD_NAME, valueFrom: {{fieldRef: {{fieldPath: metadata.name}}}}}}
  - {{name: POD_NAMESPACE, valueFrom: {{fieldRef: {{fieldPath: metadata.namespace}}}}}}
  - {{name: LEADER_GATE_NODE_NAME, valueFrom: {{fieldRef: {{fieldPath: spec.nodeName}}}}}}
  - {{name: LEADER_GATE_REVISION, valueFrom: {{fieldRef: {{fieldPath: \"metadata.labels['{revision}']\"}}}}}}
{pod_ip}ports: [{{name: lg-admin, containerPort: {admin}, protocol: TCP}}]
startupProbe: {{httpGet: {{path: /healthz, port: lg-admin}}, periodSeconds: 1, failureThreshold: 30}}
livenessProbe: {{httpGet: {{path: /healthz, port: lg-admin}}, periodSeconds: 10, timeoutSeconds: 2, failureThreshold: 3}}
readinessProbe: {{httpGet: {{path: /readyz, port: lg-admin}}, periodSeconds: 5, timeoutSeconds: 2}}
resources: {{requests: {{cpu: 10m, memory: 16Mi}}, limits: {{cpu: 200m, memory: 64Mi}}}}
volumeMounts:
  - {{name: {VOL_STATE}, mountPath: {STATE_DIR}}}
  - {{name: {VOL_SOCKET}, mountPath: {SOCKET_DIR}}}
securityContext: {sec}
",
        image = q(&plan.image),
        args = yaml_list(&serve_args(plan)),
        sec = security(65532),
        revision = plan.revision_label,
        // `$(POD_IP)` in --collector-health-url: the kubelet expands it.
        pod_ip = if plan.health_url.as_deref().is_some_and(|u| u.contains("$(POD_IP)")) {
            "  - {name: POD_IP, valueFrom: {fieldRef: {fieldPath: status.podIP}}}\n"
        } else {
            ""
        },
    ))
}

fn file_gate_container(plan: &Plan, file: &FilePlacement, user: u64) -> Node {
    let proof = file.proof.as_ref().map_or(String::new(), |(url, when)| {
        format!(
            "{}, {}, ",
            q(&format!("--status-url={url}")),
            q(&format!("--stopped-when={when}"))
        )
    });
    parse(&format!(
        "name: {FILE_GATE}
image: {image}
restartPolicy: Always
args: [file-gate, --log-format=json, --lease, {lease}, {proof}{mapping}]
env: [{{name: LEADER_GATE_URL, value: 'unix:{SOCKET}'}}]
volumeMounts:
  - {{name: {VOL_SOURCE}, mountPath: {SOURCE_DIR}, readOnly: true}}
  - {{name: {VOL_PLACED}, mountPath: {placed_dir}}}
  - {{name: {VOL_SOCKET}, mountPath: {SOCKET_DIR}, readOnly: true}}
resources: {{requests: {{cpu: 5m, memory: 8Mi}}, limits: {{cpu: 100m, memory: 32Mi}}}}
securityContext: {sec}
",
        image = q(&plan.image),
        lease = q(&plan.lease),
        mapping = q(&file.mapping),
        placed_dir = q(&file.placed_dir),
        sec = security(user),
    ))
}

fn prestop_hook(plan: &Plan) -> Node {
    parse(&format!(
        "exec:
  command: [{BIN}, prestop, --log-format=json, '--url=unix:{SOCKET}', --lease, {lease}, --timeout={timeout}, --drain=0s]
",
        lease = q(&plan.lease),
        timeout = h(plan.timings.hook_timeout),
    ))
}

/// The user the collector container runs as (its own securityContext, else
/// the pod's), if the manifest says.
pub fn collector_user(pod: &Map, collector: &Map) -> Option<u64> {
    collector
        .map("securityContext")
        .and_then(|s| s.get("runAsUser"))
        .or_else(|| pod.map("securityContext").and_then(|s| s.get("runAsUser")))
        .and_then(Node::as_u64)
}

/// The collector's health, for `--collector-health-url`, when `exec` runs
/// it: on a follower nothing runs, so its own probes would fail there (a
/// liveness probe restarting the container, a readiness probe stalling the
/// rollout). Its HTTP liveness (else readiness) probe says where it answers:
/// the kubelet probes the pod's IP, so the sidecar asks `$(POD_IP)` too. A
/// second run finds the URL in the sidecar it wrote.
pub fn exec_health_url(pod: &Map, collector: &Map) -> Option<String> {
    let probe = ["livenessProbe", "readinessProbe"]
        .iter()
        .find_map(|p| collector.map(p).and_then(|p| p.map("httpGet")));
    if let Some(get) = probe {
        if get.str("scheme").is_some_and(|s| s != "HTTP") || get.get("host").is_some() {
            return None;
        }
        let port = match get.get("port")? {
            Node::Str(name) => collector
                .seq("ports")
                .iter()
                .filter_map(Node::as_map)
                .find(|p| p.str("name") == Some(name))
                .and_then(|p| p.get("containerPort"))
                .and_then(Node::as_u64)?,
            other => other.as_u64()?,
        };
        let path = get.str("path").unwrap_or("/");
        return Some(format!("http://$(POD_IP):{port}{path}"));
    }
    let sidecar = pod
        .seq("initContainers")
        .iter()
        .filter_map(Node::as_map)
        .find(|c| c.str("name") == Some(SIDECAR))?;
    sidecar
        .seq("args")
        .iter()
        .filter_map(Node::as_str)
        .find_map(|a| a.strip_prefix("--collector-health-url="))
        .map(str::to_owned)
}

/// Gates `pod` (the pod spec) by `plan`; its collector is container
/// `collector`. Returns what it changed beyond the usual, for the user.
pub fn gate(
    pod: &mut Map,
    collector: usize,
    kind: Collector,
    plan: &Plan,
) -> Result<Vec<String>, String> {
    let mut notes = Vec::new();
    let placed = plan.file.as_ref();
    // The collector: the socket and the binary mounted, its hook, its
    // command wrapped by `exec`.
    {
        let containers = pod.seq_entry("containers");
        let Some(c) = containers.get_mut(collector).and_then(Node::as_map_mut) else {
            return Err("its collector container is not a mapping".to_owned());
        };
        let name = c.str("name").unwrap_or("?").to_owned();
        let own_hook = c.map("lifecycle").and_then(|l| l.map("preStop")).map(|p| {
            p.map("exec")
                .map(|e| e.seq("command"))
                .and_then(|cmd| cmd.first())
                .and_then(Node::as_str)
                == Some(BIN)
        });
        if own_hook == Some(false) {
            return Err(format!(
                "container {name} has a preStop hook of its own; inject would replace it (merge it into `leader-gate prestop`'s place by hand, or remove it)"
            ));
        }
        c.map_entry("lifecycle")
            .insert("preStop", prestop_hook(plan));
        let mounts = c.seq_entry("volumeMounts");
        upsert(
            mounts,
            "name",
            parse(&format!(
                "{{name: {VOL_BIN}, mountPath: {BIN_DIR}, readOnly: true}}"
            )),
        );
        upsert(
            mounts,
            "name",
            parse(&format!(
                "{{name: {VOL_SOCKET}, mountPath: {SOCKET_DIR}, readOnly: true}}"
            )),
        );
        match placed {
            Some(file) => upsert(
                mounts,
                "name",
                parse(&format!(
                    "{{name: {VOL_PLACED}, mountPath: {}, readOnly: true}}",
                    q(&file.placed_dir)
                )),
            ),
            None => mounts.retain(|m| m.as_map().and_then(|m| m.str("name")) != Some(VOL_PLACED)),
        }
        if plan.gate == GateKind::Exec && plan.operator_merged {
            wrap_command(c, plan, Some(&["/bin/prometheus"]))?;
            // The operator's own probes of Prometheus would fail on every
            // follower (nothing runs there): merged over them, these ask
            // the sidecar, ready once the API server answered.
            let admin = plan.ports.map_or(4041, |(_, admin)| admin);
            for (probe, path) in [
                ("livenessProbe", "/healthz"),
                ("readinessProbe", "/readyz"),
                ("startupProbe", "/healthz"),
            ] {
                c.insert(
                    probe,
                    parse(&format!("{{httpGet: {{path: {path}, port: {admin}}}}}")),
                );
            }
            notes.push(format!(
                "container {name}: the operator's command is run by leader-gate exec (the operator's arguments follow /bin/prometheus), and its probes ask the sidecar's admin port {admin}: Prometheus runs only on the leader, so its own would fail on every follower"
            ));
        } else if plan.gate == GateKind::Exec {
            wrap_command(c, plan, None)?;
            let probes: Vec<String> = ["livenessProbe", "readinessProbe", "startupProbe"]
                .into_iter()
                .filter(|p| c.remove(p).is_some())
                .map(str::to_owned)
                .collect();
            if !probes.is_empty() {
                notes.push(format!(
                    "removed container {name}'s {}: it runs only on the leader, so they would fail on every follower; {}",
                    probes.join(" and "),
                    match &plan.health_url {
                        Some(url) => format!("the sidecar checks {url} instead (--collector-health-url) and hands over from a leader whose collector stops answering"),
                        None => "the sidecar hands over from a leader whose collector is not running (--collector-not-running-after)".to_owned(),
                    }
                ));
            }
        } else if c.seq("command").first().and_then(Node::as_str) == Some(BIN) {
            return Err(format!(
                "container {name} runs under `leader-gate exec`: pass --gate exec, or restore its command"
            ));
        }
    }
    // Then the pod: init containers in their order (install, sidecar, gate).
    let user = {
        let c = pod.seq("containers")[collector]
            .as_map()
            .cloned()
            .unwrap_or_default();
        collector_user(pod, &c)
    };
    let inits = pod.seq_entry("initContainers");
    upsert(inits, "name", install_container(plan));
    upsert(inits, "name", sidecar_container(plan));
    match placed {
        Some(file) => {
            // The copy belongs to the collector's user: Metricbeat's
            // strict.perms loads a module file only if its owner is root or
            // the user Metricbeat runs as. Elastic Agent checks no owner
            // (super::agent), but its own user can always read it.
            let user = match (user, kind) {
                (Some(user), _) => user,
                // Elastic's images run as `metricbeat` / `elastic-agent`, 1000.
                (None, Collector::Metricbeat | Collector::ElasticAgent) => 1000,
                (None, _) => 65532,
            };
            if user == 0 {
                notes.push(match kind {
                    Collector::ElasticAgent => "the file gate runs as root (uid 0), the agent's user, so the copy is the agent's own (the agent checks no owner of its inputs.d files)",
                    _ => "the file gate runs as root (uid 0), the collector's user: Metricbeat loads only module files owned by root or by itself",
                }.to_owned());
            }
            upsert(inits, "name", file_gate_container(plan, file, user));
        }
        None => remove_named(inits, FILE_GATE),
    }
    let volumes = pod.seq_entry("volumes");
    upsert(
        volumes,
        "name",
        parse(&format!(
            "{{name: {VOL_BIN}, emptyDir: {{sizeLimit: 64Mi}}}}"
        )),
    );
    upsert(
        volumes,
        "name",
        parse(&format!(
            "{{name: {VOL_SOCKET}, emptyDir: {{medium: Memory, sizeLimit: 1Mi}}}}"
        )),
    );
    upsert(
        volumes,
        "name",
        parse(&format!(
            "{{name: {VOL_STATE}, emptyDir: {{sizeLimit: 1Mi}}}}"
        )),
    );
    match placed {
        Some(file) => {
            upsert(
                volumes,
                "name",
                parse(&format!(
                    "{{name: {VOL_SOURCE}, configMap: {{name: {}, defaultMode: 0444}}}}",
                    q(&file.config_map)
                )),
            );
            upsert(
                volumes,
                "name",
                parse(&format!(
                    "{{name: {VOL_PLACED}, emptyDir: {{sizeLimit: 1Mi}}}}"
                )),
            );
        }
        None => {
            remove_named(volumes, VOL_SOURCE);
            remove_named(volumes, VOL_PLACED);
        }
    }
    // The pod's deletion: hook, the collector's stop, the sidecar's shutdown.
    let t = &plan.timings;
    let exec_grace = if plan.gate == GateKind::Exec {
        t.exec_grace
    } else {
        Duration::ZERO
    };
    let needed = crate::timing::min_pod_grace(t.hook_timeout, exec_grace, t.shutdown_timeout);
    // Unset, it is the API server's default of 30 s; prometheus-operator
    // gives its pods 600 s.
    let unset = if plan.operator_merged { 600 } else { 30 };
    let current = pod
        .get("terminationGracePeriodSeconds")
        .map_or(Some(unset), Node::as_u64);
    if current.is_none_or(|c| c < needed) {
        pod.insert("terminationGracePeriodSeconds", Node::Uint(needed));
        notes.push(format!(
            "terminationGracePeriodSeconds {needed}: the preStop hand-over ({}) + the collector's stop ({}) + the sidecar's shutdown ({}) + {}",
            h(t.hook_timeout),
            h(exec_grace),
            h(t.shutdown_timeout),
            h(crate::timing::POD_GRACE_SLACK),
        ));
    }
    Ok(notes)
}

/// Runs the collector's command under `leader-gate exec` (again, when an
/// older run wrapped it: the command inside is kept).
/// `entrypoint`: what the container runs when it has no `command` and no
/// image (the operator's own container, of which `inject` sees a part).
fn wrap_command(c: &mut Map, plan: &Plan, entrypoint: Option<&[&str]>) -> Result<(), String> {
    let name = c.str("name").unwrap_or("?").to_owned();
    let command: Vec<String> = c
        .seq("command")
        .iter()
        .map(|n| {
            n.as_str().map(str::to_owned).ok_or_else(|| {
                format!("container {name}'s command has a value that is not a string")
            })
        })
        .collect::<Result<_, _>>()?;
    let inner: Vec<String> = if command.first().map(String::as_str) == Some(BIN) {
        match command.iter().position(|a| a == "--") {
            Some(at) => command[at + 1..].to_vec(),
            None => {
                return Err(format!(
                    "container {name} runs leader-gate without `-- COMMAND`"
                ));
            }
        }
    } else if !command.is_empty() {
        command
    } else {
        let image = c.str("image").unwrap_or("");
        match Collector::entrypoint(image).or_else(|| entrypoint.map(<[&str]>::to_vec)) {
            Some(entry) => entry.into_iter().map(str::to_owned).collect(),
            None => {
                return Err(format!(
                    "container {name} has no `command` and inject does not know the ENTRYPOINT of {image:?}: set its command to the image's entrypoint, then run inject again"
                ));
            }
        }
    };
    let mut wrapped = vec![
        BIN.to_owned(),
        "exec".to_owned(),
        "--log-format=json".to_owned(),
        format!("--url=unix:{SOCKET}"),
        "--lease".to_owned(),
        plan.lease.clone(),
        format!("--grace={}", h(plan.timings.exec_grace)),
        "--".to_owned(),
    ];
    wrapped.extend(inner);
    c.insert(
        "command",
        Node::Seq(wrapped.into_iter().map(Node::Str).collect()),
    );
    Ok(())
}
