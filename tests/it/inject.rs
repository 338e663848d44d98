//! `leader-gate inject` on real upstream manifests (tests/fixtures/upstream,
//! provenance in its README): what it gates, that a second run changes no
//! byte, that what it does not own comes back as it was, and where it
//! refuses with the way out.

use std::io::Write;
use std::process::{Command, Stdio};

use leader_gate::inject::yaml::{Map, Node, read_one, read_stream, write_stream};

const FIXTURES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/upstream");

/// Runs `leader-gate inject ARGS` with `input` on stdin: (exit code, stdout, stderr).
fn inject(input: &str, args: &[&str]) -> (i32, String, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_leader-gate"))
        .arg("inject")
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("leader-gate runs");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(input.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8(out.stdout).unwrap(),
        String::from_utf8(out.stderr).unwrap(),
    )
}

fn fixture(name: &str) -> String {
    std::fs::read_to_string(format!("{FIXTURES}/{name}")).unwrap()
}

fn gated(name: &str) -> String {
    let (code, out, err) = inject(&fixture(name), &[]);
    assert_eq!(code, 0, "inject {name}: {err}");
    out
}

fn find<'a>(docs: &'a [Node], kind: &str, name: &str) -> &'a Map {
    docs.iter()
        .filter_map(Node::as_map)
        .find(|d| d.str("kind") == Some(kind) && d.at_str(&["metadata", "name"]) == Some(name))
        .unwrap_or_else(|| panic!("no {kind}/{name}"))
}

fn named<'a>(list: &'a [Node], name: &str) -> &'a Map {
    list.iter()
        .filter_map(Node::as_map)
        .find(|c| c.str("name") == Some(name))
        .unwrap_or_else(|| panic!("no {name}"))
}

/// The init containers of a file-gated pod, in the order they start.
const FILE_GATED_INITS: [&str; 3] = [
    "leader-gate-install",
    "leader-gate",
    "leader-gate-file-gate",
];

fn init_names(pod: &Map) -> Vec<&str> {
    pod.seq("initContainers")
        .iter()
        .filter_map(|c| c.as_map()?.str("name"))
        .collect()
}

fn strings(list: &[Node]) -> Vec<&str> {
    list.iter().filter_map(Node::as_str).collect()
}

#[test]
fn elastics_metricbeat_gets_its_unique_modules_on_the_leader_only_and_its_node_modules_everywhere()
{
    let docs = read_stream(&gated("elastic-beats-metricbeat-kubernetes.yaml")).unwrap();
    // The unique: true provider is gone from metricbeat.yml; its modules,
    // apiserver included, are the leader-only file.
    let config = find(&docs, "ConfigMap", "metricbeat-daemonset-config");
    let yml = read_one(config.at_str(&["data", "metricbeat.yml"]).unwrap()).unwrap();
    let yml = yml.as_map().unwrap();
    assert!(yml.get("metricbeat.autodiscover").is_none(), "{yml:?}");
    let modules = yml.map("metricbeat.config.modules").unwrap();
    assert_eq!(modules.str("path"), Some("${path.config}/*modules.d/*.yml"));
    assert_eq!(modules.get("reload.enabled"), Some(&Node::Bool(true)));
    assert_eq!(modules.str("reload.period"), Some("10s"));
    let leader = find(&docs, "ConfigMap", "metricbeat-leader-only");
    let file = read_one(leader.at_str(&["data", "leader-only.yml"]).unwrap()).unwrap();
    let sets: Vec<&str> = file
        .as_seq()
        .unwrap()
        .iter()
        .flat_map(|m| strings(m.as_map().unwrap().seq("metricsets")))
        .collect();
    for wanted in ["state_node", "state_pod", "state_container", "apiserver"] {
        assert!(sets.contains(&wanted), "{wanted} not leader-only: {sets:?}");
    }
    // The node modules stay where they were, on every pod.
    let node_modules = find(&docs, "ConfigMap", "metricbeat-daemonset-modules");
    assert!(
        node_modules
            .at_str(&["data", "kubernetes.yml"])
            .unwrap()
            .contains("- node")
    );

    let ds = find(&docs, "DaemonSet", "metricbeat");
    let pod = ds
        .map("spec")
        .unwrap()
        .at(&["template", "spec"])
        .unwrap_or_else(|| panic!());
    let inits = pod.seq("initContainers");
    assert_eq!(init_names(pod), FILE_GATED_INITS);
    let gate = named(inits, "leader-gate-file-gate");
    let mapping = *strings(gate.seq("args")).last().unwrap();
    let (_, dst) = mapping.split_once(':').unwrap();
    // The glob loads the placed file: ${path.config} is /usr/share/metricbeat.
    assert_eq!(
        dst,
        "/usr/share/metricbeat/leader-gate-modules.d/leader-only.yml"
    );
    // Elastic's Metricbeat runs as root: so does the gate, or strict.perms
    // refuses the copy.
    assert_eq!(
        gate.at(&["securityContext"])
            .and_then(|s| s.get("runAsUser")),
        Some(&Node::Int(0))
    );
    let metricbeat = named(pod.seq("containers"), "metricbeat");
    let hook = strings(
        metricbeat
            .at(&["lifecycle", "preStop", "exec"])
            .unwrap()
            .seq("command"),
    );
    assert_eq!(&hook[..2], ["/leader-gate/leader-gate", "prestop"]);
    assert!(hook.contains(&"metricbeat-leader"), "{hook:?}");
    // Its own flags stay.
    assert_eq!(
        strings(metricbeat.seq("args")),
        ["-c", "/etc/metricbeat.yml", "-e", "-system.hostfs=/hostfs"]
    );
    // The pod's ServiceAccount gets the Lease.
    let role = find(&docs, "Role", "metricbeat-leader-gate");
    assert!(format!("{role:?}").contains("metricbeat-leader"));
    let binding = find(&docs, "RoleBinding", "metricbeat-leader-gate");
    assert_eq!(
        binding.seq("subjects")[0].as_map().unwrap().str("name"),
        Some("metricbeat")
    );
}

/// `inject --check` on a stream: (exit code, stderr).
fn check(stream: &str) -> (i32, String) {
    let (code, _, err) = inject(stream, &["--check"]);
    (code, err)
}

#[test]
fn what_inject_writes_passes_its_own_check_and_the_upstream_file_does_not() {
    for name in [
        "elastic-beats-metricbeat-kubernetes.yaml",
        "otel-helm-deployment-cluster-metrics.yaml",
        "otel-helm-daemonset-cluster-metrics.yaml",
        "otel-kube-stack-daemon.yaml",
    ] {
        assert_eq!(check(&gated(name)), (0, String::new()), "{name}");
        let (code, err) = check(&fixture(name));
        assert_eq!(code, 1, "{name}: {err}");
        assert!(
            err.contains("nothing here runs leader-gate"),
            "{name}: {err}"
        );
    }
}

#[test]
fn a_second_run_changes_no_byte() {
    for name in [
        "elastic-beats-metricbeat-kubernetes.yaml",
        "otel-helm-deployment-cluster-metrics.yaml",
        "otel-helm-daemonset-cluster-metrics.yaml",
        "otel-kube-stack-daemon.yaml",
    ] {
        let once = gated(name);
        let (code, twice, err) = inject(&once, &[]);
        assert_eq!(code, 0, "{err}");
        assert_eq!(once, twice, "{name}: the second run changed the stream");
    }
}

#[test]
fn a_workload_gated_by_an_older_run_is_updated_in_place() {
    let once = gated("elastic-beats-metricbeat-kubernetes.yaml");
    // As an older version or a hand edit left it: another gate lag, a
    // shorter grace period, the sidecar's image older.
    let older = once
        .replace("--gate-lag=12s", "--gate-lag=20s")
        .replace(
            "terminationGracePeriodSeconds: 37",
            "terminationGracePeriodSeconds: 30",
        )
        .replace("leader-gate:0.1.0", "leader-gate:0.0.9");
    assert_ne!(older, once);
    let (code, again, err) = inject(&older, &[]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(again, once);
}

#[test]
fn what_inject_does_not_own_comes_back_as_it_was() {
    let input = read_stream(&fixture("elastic-beats-metricbeat-kubernetes.yaml")).unwrap();
    let output = read_stream(&gated("elastic-beats-metricbeat-kubernetes.yaml")).unwrap();
    // Every object it does not gate is there, equal, in its order.
    let untouched: Vec<&Node> = input
        .iter()
        .filter(|d| {
            let kind = d.as_map().and_then(|m| m.str("kind"));
            !matches!(kind, Some("DaemonSet" | "ConfigMap"))
        })
        .collect();
    let kept: Vec<&Node> = output.iter().filter(|d| untouched.contains(d)).collect();
    assert_eq!(kept, untouched);
    // In the DaemonSet, every key it had keeps its value or gains only
    // leader-gate's, in the order it had.
    let before = find(&input, "DaemonSet", "metricbeat");
    let after = find(&output, "DaemonSet", "metricbeat");
    let keys = |m: &Map| m.0.iter().map(|(k, _)| k.clone()).collect::<Vec<_>>();
    assert_eq!(keys(before), keys(after));
    let pod_before = before
        .map("spec")
        .unwrap()
        .at(&["template", "spec"])
        .unwrap();
    let pod_after = after
        .map("spec")
        .unwrap()
        .at(&["template", "spec"])
        .unwrap();
    let after_keys = keys(pod_after);
    let old_keys: Vec<String> = after_keys
        .iter()
        .filter(|k| pod_before.get(k).is_some())
        .cloned()
        .collect();
    assert_eq!(old_keys, keys(pod_before), "the pod spec's keys reordered");
    for (key, value) in &pod_before.0 {
        if !["containers", "volumes", "terminationGracePeriodSeconds"].contains(&key.as_str()) {
            assert_eq!(pod_after.get(key), Some(value), "{key} changed");
        }
    }
    // The collector container keeps every key it had, in its order and
    // unchanged but its mounts, which gain leader-gate's after its own.
    let c_before = named(pod_before.seq("containers"), "metricbeat");
    let c_after = named(pod_after.seq("containers"), "metricbeat");
    assert_eq!(keys(c_before), keys(c_after)[..keys(c_before).len()]);
    for (key, value) in &c_before.0 {
        if key == "volumeMounts" {
            let mounts = value.as_seq().unwrap();
            assert_eq!(&c_after.seq("volumeMounts")[..mounts.len()], mounts);
        } else {
            assert_eq!(c_after.get(key), Some(value), "container {key} changed");
        }
    }
    // The collector's own volumes come first, unchanged.
    let volumes_before = pod_before.seq("volumes");
    assert_eq!(
        &pod_after.seq("volumes")[..volumes_before.len()],
        volumes_before
    );
}

#[test]
fn two_host_network_workloads_in_one_stream_get_ports_of_their_own() {
    // A second Metricbeat DaemonSet with ConfigMaps of its own.
    let one = fixture("elastic-beats-metricbeat-kubernetes.yaml");
    let two: Vec<Node> =
        read_stream(&one.replace("metricbeat-daemonset-", "metricbeat-b-daemonset-"))
            .unwrap()
            .into_iter()
            .filter(|d| {
                matches!(
                    d.as_map().and_then(|m| m.str("kind")),
                    Some("DaemonSet" | "ConfigMap")
                )
            })
            .map(|mut d| {
                if d.as_map().and_then(|m| m.str("kind")) == Some("DaemonSet") {
                    d.at_mut(&["metadata"])
                        .unwrap()
                        .insert("name", Node::str("metricbeat-b"));
                }
                d
            })
            .collect();
    assert_eq!(two.len(), 3);
    let stream = format!("{one}\n{}", write_stream(&two));
    let (code, out, err) = inject(
        &stream,
        &[
            "--workload",
            "DaemonSet/metricbeat",
            "--workload",
            "metricbeat-b",
        ],
    );
    assert_eq!(code, 0, "{err}");
    let docs = read_stream(&out).unwrap();
    let ports = |name: &str| -> Vec<String> {
        let ds = find(&docs, "DaemonSet", name);
        let pod = ds.map("spec").unwrap().at(&["template", "spec"]).unwrap();
        strings(named(pod.seq("initContainers"), "leader-gate").seq("args"))
            .into_iter()
            .filter(|a| a.contains("listen="))
            .map(str::to_owned)
            .collect()
    };
    assert_eq!(
        ports("metricbeat"),
        ["--listen=127.0.0.1:4040", "--admin-listen=0.0.0.0:4041"]
    );
    assert_eq!(
        ports("metricbeat-b"),
        ["--listen=127.0.0.1:4042", "--admin-listen=0.0.0.0:4043"]
    );
    assert!(
        err.contains("--host-port-base"),
        "says how to choose: {err}"
    );
}

#[test]
fn a_deployments_collector_runs_under_exec_with_its_own_command_and_args() {
    let docs = read_stream(&gated("otel-helm-deployment-cluster-metrics.yaml")).unwrap();
    let deploy = find(&docs, "Deployment", "example-opentelemetry-collector");
    let pod = deploy
        .map("spec")
        .unwrap()
        .at(&["template", "spec"])
        .unwrap();
    let collector = named(pod.seq("containers"), "opentelemetry-collector");
    let command = strings(collector.seq("command"));
    assert_eq!(&command[..2], ["/leader-gate/leader-gate", "exec"]);
    assert!(command.contains(&"--grace=3s"), "{command:?}");
    assert_eq!(command.last(), Some(&"/otelcol-k8s"));
    assert_eq!(
        strings(collector.seq("args")),
        ["--config=/conf/relay.yaml"]
    );
    // Hook 7 s + grace 3 s + shutdown 9 s + 5 s = 24 s: the chart's 30 s
    // already covers it and stays.
    assert_eq!(
        pod.get("terminationGracePeriodSeconds"),
        Some(&Node::Int(30))
    );
}

#[test]
fn collectors_it_cannot_gate_well_are_refused_with_the_way_out() {
    // Elastic Agent's own election is converted now (the agent tests below).
    // No spec.image: the operator's --collector-image, not in the file.
    let (name, says) = (
        "otel-operator-collector-k8scluster.yaml",
        "spec.image is unset",
    );
    let (code, out, err) = inject(&fixture(name), &[]);
    assert_eq!(code, 1, "{name}: {err}");
    assert!(out.is_empty(), "{name}: nothing written on a refusal");
    assert!(err.contains(says), "{name}: {err}");
}

#[test]
fn input_that_is_not_yaml_exits_65_and_a_missing_file_66() {
    let (code, _, err) = inject("kind: [unclosed\n", &[]);
    assert_eq!(code, 65, "{err}");
    let out = Command::new(env!("CARGO_BIN_EXE_leader-gate"))
        .args(["inject", "/nonexistent/manifest.yaml"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(66));
    assert!(String::from_utf8_lossy(&out.stderr).contains("/nonexistent/manifest.yaml"));
}

#[test]
fn an_eck_beat_with_a_unique_provider_gets_the_file_gate_in_its_pod_template() {
    // ECK's own recipe runs no module once per cluster: inject says so.
    let (code, _, err) = inject(&fixture("eck-beat-metricbeat-hosts.yaml"), &[]);
    assert_eq!(code, 1);
    assert!(
        err.contains("no `unique: true` autodiscover provider"),
        "{err}"
    );
    // The same Beat with a kube-state-metrics provider as Elastic's
    // manifest has it (added here, nested as ECK's spec.config writes it).
    let mut docs = read_stream(&fixture("eck-beat-metricbeat-hosts.yaml")).unwrap();
    let beat = docs
        .iter_mut()
        .find(|d| d.as_map().and_then(|m| m.str("kind")) == Some("Beat"))
        .unwrap();
    let providers = beat
        .at_mut(&["spec", "config", "metricbeat", "autodiscover"])
        .unwrap()
        .seq_entry("providers");
    providers.push(
        read_one(
            "{type: kubernetes, scope: cluster, node: '${NODE_NAME}', unique: true, templates: [{config: [{module: kubernetes, hosts: ['kube-state-metrics:8080'], period: 10s, metricsets: [state_node, state_pod]}]}]}",
        )
        .unwrap(),
    );
    let (code, out, err) = inject(&write_stream(&docs), &[]);
    assert_eq!(code, 0, "{err}");
    let docs = read_stream(&out).unwrap();
    let beat = find(&docs, "Beat", "metricbeat");
    let config = beat.at(&["spec", "config"]).unwrap();
    let providers = config
        .dotted(&["metricbeat", "autodiscover", "providers"])
        .unwrap();
    assert_eq!(
        providers.as_seq().unwrap().len(),
        1,
        "the hints provider stays, the unique one goes"
    );
    let modules = config
        .dotted(&["metricbeat", "config", "modules"])
        .unwrap()
        .as_map()
        .unwrap();
    assert_eq!(
        modules.dotted(&["path"]),
        Some(&Node::str("${path.config}/*modules.d/*.yml"))
    );
    assert_eq!(
        modules.dotted(&["reload", "enabled"]),
        Some(&Node::Bool(true))
    );
    let leader = find(&docs, "ConfigMap", "metricbeat-leader-only");
    assert!(
        leader
            .at_str(&["data", "leader-only.yml"])
            .unwrap()
            .contains("state_pod")
    );
    let pod = beat
        .at(&["spec", "daemonSet", "podTemplate", "spec"])
        .unwrap();
    assert_eq!(init_names(pod), FILE_GATED_INITS);
    let metricbeat = named(pod.seq("containers"), "metricbeat");
    assert!(metricbeat.at(&["lifecycle", "preStop", "exec"]).is_some());
    let (code, twice, err) = inject(&out, &[]);
    assert_eq!((code, twice == out), (0, true), "{err}");
    assert_eq!(check(&out), (0, String::new()));
}

#[test]
fn an_otel_daemonset_keeps_its_node_work_and_runs_its_cluster_receivers_in_a_gated_copy() {
    let docs = read_stream(&gated("otel-helm-daemonset-cluster-metrics.yaml")).unwrap();
    let relay = |cm: &str| {
        let text = find(&docs, "ConfigMap", cm)
            .at_str(&["data", "relay"])
            .unwrap()
            .to_owned();
        read_one(&text).unwrap()
    };
    let receivers = |config: &Node, pipeline: &str| -> Vec<String> {
        let p = config.at(&["service", "pipelines", pipeline]).unwrap();
        strings(p.seq("receivers"))
            .into_iter()
            .map(str::to_owned)
            .collect()
    };
    let node = relay("example-opentelemetry-collector-agent");
    assert_eq!(receivers(&node, "metrics"), ["otlp", "prometheus"]);
    assert_eq!(receivers(&node, "traces"), ["otlp", "jaeger", "zipkin"]);
    let leader = relay("example-opentelemetry-collector-agent-leader-only");
    assert_eq!(receivers(&leader, "metrics"), ["k8s_cluster"]);
    assert!(leader.at(&["service", "pipelines", "traces"]).is_none());
    // The receiver's own election is gone: leader-gate elects.
    assert!(!format!("{node:?}{leader:?}").contains("k8s_leader_elector"));

    let ds = find(&docs, "DaemonSet", "example-opentelemetry-collector-agent");
    let pod = ds.map("spec").unwrap().at(&["template", "spec"]).unwrap();
    let main = named(pod.seq("containers"), "opentelemetry-collector");
    assert_eq!(
        strings(main.seq("command")),
        ["/otelcol-k8s"],
        "the node collector runs ungated"
    );
    assert!(main.get("livenessProbe").is_some() && main.get("lifecycle").is_none());
    let copy = named(pod.seq("containers"), "opentelemetry-collector-leader-only");
    let command = strings(copy.seq("command"));
    assert_eq!(
        (command[1], *command.last().unwrap()),
        ("exec", "/otelcol-k8s")
    );
    assert_eq!(
        strings(copy.seq("args")),
        ["--config=/etc/leader-gate/collector/relay"]
    );
    // No hostPorts twice in one pod, no probes on a container idle on followers.
    for key in ["ports", "livenessProbe", "readinessProbe"] {
        assert!(copy.get(key).is_none(), "{key} copied");
    }
    assert!(
        copy.at(&["lifecycle", "preStop", "exec"]).is_some(),
        "the hand-over hook"
    );
}

#[test]
fn a_service_account_the_input_does_not_define_is_said() {
    // The chart's example renders no ServiceAccount; Elastic's file has one.
    let (code, _, err) = inject(&fixture("otel-helm-daemonset-cluster-metrics.yaml"), &[]);
    assert_eq!(code, 0, "{err}");
    assert!(
        err.contains("ServiceAccount example-opentelemetry-collector is not in this input"),
        "{err}"
    );
    let (code, _, err) = inject(&fixture("elastic-beats-metricbeat-kubernetes.yaml"), &[]);
    assert_eq!(code, 0, "{err}");
    assert!(!err.contains("is not in this input"), "{err}");
}

/// Elastic's manifest with `old` replaced by `new` (once, asserted).
fn elastic_with(old: &str, new: &str) -> String {
    let text = fixture("elastic-beats-metricbeat-kubernetes.yaml");
    assert!(text.contains(old), "{old:?} not in the fixture");
    text.replacen(old, new, 1)
}

/// The file gate's args in `out` (one file-gated workload).
fn file_gate_args(out: &str) -> Vec<String> {
    let docs = read_stream(out).unwrap();
    let ds = find(&docs, "DaemonSet", "metricbeat");
    let pod = ds.at(&["spec", "template", "spec"]).unwrap();
    let gate = named(pod.seq("initContainers"), "leader-gate-file-gate");
    strings(gate.seq("args"))
        .into_iter()
        .map(str::to_owned)
        .collect()
}

#[test]
fn metricbeats_own_stats_prove_the_leader_only_modules_stopped_unless_autodiscover_stays() {
    let (code, out, err) = inject(&fixture("elastic-beats-metricbeat-kubernetes.yaml"), &[]);
    assert_eq!(code, 0, "{err}");
    let args = file_gate_args(&out);
    for wanted in [
        "--status-url=http://127.0.0.1:5066/stats",
        "--stopped-when=libbeat.config.module.running <= before",
    ] {
        assert!(args.iter().any(|a| a == wanted), "{wanted} not in {args:?}");
    }
    // Elastic's manifest has the endpoint off: on, on loopback, and said.
    let docs = read_stream(&out).unwrap();
    let config = find(&docs, "ConfigMap", "metricbeat-daemonset-config");
    let yml = read_one(config.at_str(&["data", "metricbeat.yml"]).unwrap()).unwrap();
    let yml = yml.as_map().unwrap();
    assert_eq!(yml.get("http.enabled"), Some(&Node::Bool(true)), "{yml:?}");
    assert_eq!(yml.str("http.host"), Some("127.0.0.1"));
    assert!(
        err.contains("http.enabled: true (the file gate reads"),
        "{err}"
    );
    assert_eq!(check(&out), (0, String::new()));
    // The hints provider left on: it sets the same count, so no proof.
    let input = elastic_with(
        "        #- type: kubernetes\n        #  node: ${NODE_NAME}\n        #  hints.enabled: true",
        "        - type: kubernetes\n          node: ${NODE_NAME}\n          hints.enabled: true",
    );
    let (code, out, err) = inject(&input, &[]);
    assert_eq!(code, 0, "{err}");
    assert!(
        !file_gate_args(&out)
            .iter()
            .any(|a| a.starts_with("--status-url")),
        "{err}"
    );
    assert!(err.contains("no status proof for the file gate"), "{err}");
}

#[test]
fn a_fractional_reload_period_gives_whole_second_lease_timings_that_pass_the_check() {
    let input = elastic_with(
        "reload.enabled: false",
        "reload.enabled: true\n      reload.period: 2300ms",
    );
    let (code, out, err) = inject(&input, &[]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("--lease-duration=16s"), "whole seconds: {err}");
    assert_eq!(check(&out), (0, String::new()));
}

#[test]
fn names_that_yaml_would_read_as_null_or_numbers_stay_strings() {
    let input = fixture("elastic-beats-metricbeat-kubernetes.yaml")
        .replace("namespace: kube-system", "namespace: \"null\"");
    let (code, out, err) = inject(&input, &["--lease", "1234"]);
    assert_eq!(code, 0, "{err}");
    let docs = read_stream(&out).unwrap();
    let role = find(&docs, "Role", "metricbeat-leader-gate");
    assert_eq!(role.at_str(&["metadata", "namespace"]), Some("null"));
    assert_eq!(
        role.seq("rules")[0].as_map().unwrap().seq("resourceNames"),
        [Node::str("1234")]
    );
    let (again, twice, _) = inject(&out, &["--lease", "1234"]);
    assert_eq!((again, twice == out), (0, true));
}

#[test]
fn a_service_account_of_the_workloads_name_is_kept_as_it_is() {
    // The pod names no account; one named after the workload exists, with
    // an annotation inject must not drop.
    let input = elastic_with("      serviceAccountName: metricbeat\n", "")
        .replace("name: metricbeat\n  namespace: kube-system\n  labels:\n    k8s-app: metricbeat\n---", "name: metricbeat\n  namespace: kube-system\n  annotations:\n    eks.amazonaws.com/role-arn: arn:aws:iam::1:role/x\n  labels:\n    k8s-app: metricbeat\n---");
    assert!(input.contains("role-arn"));
    let (code, out, err) = inject(&input, &[]);
    assert_eq!(code, 0, "{err}");
    let docs = read_stream(&out).unwrap();
    let account = find(&docs, "ServiceAccount", "metricbeat");
    assert!(
        account
            .at_str(&["metadata", "annotations", "eks.amazonaws.com/role-arn"])
            .is_some(),
        "{account:?}"
    );
}

/// Fixture `name` and, after it, a copy of its DaemonSet named `copy`,
/// which mounts the same ConfigMaps.
fn with_a_second_daemonset(name: &str, copy: &str) -> String {
    let one = fixture(name);
    let ds: Vec<Node> = read_stream(&one)
        .unwrap()
        .into_iter()
        .filter(|d| d.as_map().and_then(|m| m.str("kind")) == Some("DaemonSet"))
        .map(|mut d| {
            d.at_mut(&["metadata"])
                .unwrap()
                .insert("name", Node::str(copy));
            d
        })
        .collect();
    format!("{one}\n{}", write_stream(&ds))
}

#[test]
fn what_would_break_is_refused_naming_why() {
    for (input, args, says) in [
        // `*` would load the file gate's temporary copy too.
        (
            elastic_with("modules.d/*.yml", "modules.d/*"),
            vec![],
            "does not end in .yml",
        ),
        (
            fixture("elastic-beats-metricbeat-kubernetes.yaml"),
            vec!["--host-port-base", "65535"],
            "leaves no node port",
        ),
    ] {
        let (code, out, err) = inject(&input, &args);
        assert_eq!((code, out.is_empty()), (1, true), "{err}");
        assert!(err.contains(says), "{says}: {err}");
    }
    // Two DaemonSets reading one ConfigMap: converting it for one changes the other.
    let (code, _, err) = inject(
        &with_a_second_daemonset("elastic-beats-metricbeat-kubernetes.yaml", "mb2"),
        &["--workload", "DaemonSet/metricbeat"],
    );
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("is also mounted by DaemonSet/mb2"), "{err}");
}

#[test]
fn a_prometheus_agent_of_the_operator_runs_prometheus_under_exec_with_probes_on_the_sidecar() {
    let out = gated("prometheus-operator-prometheusagent.yaml");
    let docs = read_stream(&out).unwrap();
    let agent = find(&docs, "PrometheusAgent", "prometheus-agent");
    let spec = agent.map("spec").unwrap();
    // What the operator merges, by name, into the container it makes.
    let prometheus = named(spec.seq("containers"), "prometheus");
    let command = strings(prometheus.seq("command"));
    assert_eq!(
        (command[1], *command.last().unwrap()),
        ("exec", "/bin/prometheus")
    );
    assert!(
        prometheus.get("args").is_none(),
        "the operator's own arguments follow"
    );
    for (probe, path) in [("livenessProbe", "/healthz"), ("readinessProbe", "/readyz")] {
        let get = prometheus.at(&[probe, "httpGet"]).unwrap();
        assert_eq!(
            (get.str("path"), get.get("port")),
            (Some(path), Some(&Node::Int(4041)))
        );
    }
    assert_eq!(init_names(spec), ["leader-gate-install", "leader-gate"]);
    let serve = strings(named(spec.seq("initContainers"), "leader-gate").seq("args"));
    assert!(
        serve.contains(&"--collector-health-url=http://127.0.0.1:9090/-/healthy"),
        "{serve:?}"
    );
    assert!(spec.at(&["podMetadata", "annotations"]).is_some());
    // The operator's 600 s grace period covers the 24 s needed: not lowered.
    assert!(spec.get("terminationGracePeriodSeconds").is_none());
    let binding = find(&docs, "RoleBinding", "prometheus-agent-leader-gate");
    assert_eq!(
        binding.seq("subjects")[0].as_map().unwrap().str("name"),
        Some("prometheus-agent")
    );
    assert_eq!(check(&out), (0, String::new()));
    let (code, twice, err) = inject(&out, &[]);
    assert_eq!((code, twice == out), (0, true), "{err}");
}

#[test]
fn an_unset_grace_period_that_covers_the_shutdown_is_left_unset() {
    // Unset is the API server's 30 s, above the 24 s exec needs.
    let text = fixture("otel-helm-deployment-cluster-metrics.yaml");
    let old = "      terminationGracePeriodSeconds: 30\n";
    assert!(text.contains(old));
    let (code, out, err) = inject(&text.replacen(old, "", 1), &[]);
    assert_eq!(code, 0, "{err}");
    assert!(!out.contains("terminationGracePeriodSeconds"), "{err}");
}

const AGENT: &str = "elastic-agent-standalone-kubernetes.yaml";

/// Elastic's standalone agent manifest with `old` replaced by `new` (once, asserted).
fn agent_with(old: &str, new: &str) -> String {
    let text = fixture(AGENT);
    assert_eq!(
        text.matches(old).count(),
        1,
        "{old:?} not once in the fixture"
    );
    text.replacen(old, new, 1)
}

/// The agent's settings (agent.yml) and the leader-only file's inputs in a gated stream.
fn agent_files(docs: &[Node]) -> (Map, Vec<Node>) {
    let yml = |kind: &str, name: &str, key: &str| {
        read_one(find(docs, kind, name).at_str(&["data", key]).unwrap()).unwrap()
    };
    let settings = yml("ConfigMap", "agent-node-datastreams", "agent.yml");
    let leader = yml(
        "ConfigMap",
        "elastic-agent-standalone-leader-only",
        "leader-only.yml",
    );
    (
        settings.as_map().unwrap().clone(),
        leader.as_map().unwrap().seq("inputs").to_vec(),
    )
}

fn ids(inputs: &[Node]) -> Vec<&str> {
    inputs
        .iter()
        .filter_map(|i| i.as_map()?.str("id"))
        .collect()
}

#[test]
fn elastics_agent_gets_its_leader_elected_inputs_on_the_leader_only_and_its_node_inputs_everywhere()
{
    let (code, out, err) = inject(&fixture(AGENT), &[]);
    assert_eq!(code, 0, "{err}");
    let docs = read_stream(&out).unwrap();
    let (settings, leader) = agent_files(&docs);
    // The input its own election ran moved, without its condition, with
    // every stream it had; the node inputs stay on every pod.
    assert_eq!(ids(&leader), ["kubernetes-cluster-metrics"]);
    let input = leader[0].as_map().unwrap();
    assert!(input.get("condition").is_none(), "{input:?}");
    let sets: Vec<&str> = input
        .seq("streams")
        .iter()
        .flat_map(|s| strings(s.as_map().unwrap().seq("metricsets")))
        .collect();
    for wanted in ["apiserver", "event", "state_node", "state_pod"] {
        assert!(sets.contains(&wanted), "{wanted} not leader-only: {sets:?}");
    }
    assert_eq!(
        ids(settings.seq("inputs")),
        [
            "system-logs",
            "windows-event-log",
            "container-log-${kubernetes.pod.name}-${kubernetes.container.id}",
            "audit-log",
            "system-metrics",
            "kubernetes-node-metrics"
        ]
    );
    // Its own election off; the reload that places and drops the file
    // written out, at the agent's default period.
    assert_eq!(
        settings.dotted(&["providers", "kubernetes_leaderelection", "enabled"]),
        Some(&Node::Bool(false))
    );
    assert_eq!(
        settings
            .dotted(&["agent", "reload", "period"])
            .and_then(Node::as_str),
        Some("10s")
    );
    // The file gate places it in the inputs.d the image's entrypoint reads
    // (no CONFIG_PATH or STATE_PATH), as the agent's own user, root here.
    let ds = find(&docs, "DaemonSet", "elastic-agent-standalone");
    let pod = ds.map("spec").unwrap().at(&["template", "spec"]).unwrap();
    assert_eq!(init_names(pod), FILE_GATED_INITS);
    let gate = named(pod.seq("initContainers"), "leader-gate-file-gate");
    assert_eq!(
        strings(gate.seq("args")).last(),
        Some(
            &"/etc/leader-gate/leader-only/leader-only.yml:/usr/share/elastic-agent/state/inputs.d/leader-only.yml"
        )
    );
    assert_eq!(
        gate.at(&["securityContext"])
            .and_then(|s| s.get("runAsUser")),
        Some(&Node::Int(0))
    );
    let agent = named(pod.seq("containers"), "elastic-agent-standalone");
    let placed = named(agent.seq("volumeMounts"), "leader-gate-placed");
    assert_eq!(
        placed.str("mountPath"),
        Some("/usr/share/elastic-agent/state/inputs.d")
    );
    assert_eq!(placed.get("readOnly"), Some(&Node::Bool(true)));
    assert_eq!(
        strings(agent.seq("args")),
        ["-c", "/etc/elastic-agent/agent.yml", "-e"]
    );
    // Metricbeat's timings: the same 10 s reload period.
    let sidecar = strings(named(pod.seq("initContainers"), "leader-gate").seq("args"));
    for flag in [
        "--lease-duration=30s",
        "--renew-deadline=15s",
        "--gate-lag=12s",
    ] {
        assert!(sidecar.contains(&flag), "{flag}: {sidecar:?}");
    }
    // What changed, one line each.
    for said in [
        "moved the inputs its own leader election ran once per cluster into ConfigMap elastic-agent-standalone-leader-only",
        "providers.kubernetes_leaderelection.enabled: false",
        "agent.reload.period: 10s",
        "the file gate runs as root (uid 0), the agent's user",
    ] {
        assert_eq!(err.matches(said).count(), 1, "{said}: {err}");
    }
}

#[test]
fn the_gated_agent_passes_its_own_check_and_a_second_run_changes_no_byte() {
    let once = gated(AGENT);
    assert_eq!(check(&once), (0, String::new()));
    let (code, err) = check(&fixture(AGENT));
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("nothing here runs leader-gate"), "{err}");
    let (code, twice, err) = inject(&once, &[]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(once, twice, "the second run changed the stream");
}

#[test]
fn an_agent_leader_condition_joined_by_and_keeps_its_other_terms_on_the_leader() {
    let input = agent_with(
        "condition: ${kubernetes_leaderelection.leader} == true\n",
        "condition: ${host.platform} == 'linux' and ${kubernetes_leaderelection.leader} == true\n",
    );
    let (code, out, err) = inject(&input, &[]);
    assert_eq!(code, 0, "{err}");
    let (_, leader) = agent_files(&read_stream(&out).unwrap());
    assert_eq!(
        leader[0].as_map().unwrap().str("condition"),
        Some("${host.platform} == 'linux'")
    );
    assert!(
        err.contains("input kubernetes-cluster-metrics keeps the rest of its condition on the leader: ${host.platform} == 'linux'"),
        "{err}"
    );
    assert_eq!(check(&out), (0, String::new()));
}

#[test]
fn an_agent_whose_reload_is_off_gets_it_on_and_its_own_period_sets_the_timings() {
    let input = agent_with(
        "    agent:\n      monitoring:\n",
        "    agent:\n      reload: {enabled: false, period: 5s}\n      monitoring:\n",
    );
    let (code, out, err) = inject(&input, &[]);
    assert_eq!(code, 0, "{err}");
    assert!(err.contains("agent.reload.enabled: true"), "{err}");
    assert!(
        !err.contains("agent.reload.period"),
        "its own is kept: {err}"
    );
    // A 5 s period: gate lag 7 s, a margin of 10 s.
    assert!(
        out.contains("--gate-lag=7s") && out.contains("--lease-duration=20s"),
        "{out}"
    );
    let (settings, _) = agent_files(&read_stream(&out).unwrap());
    assert_eq!(
        settings.dotted(&["agent", "reload", "enabled"]),
        Some(&Node::Bool(true))
    );
    assert_eq!(check(&out), (0, String::new()));
}

#[test]
fn an_agent_inject_cannot_convert_safely_is_refused_naming_why() {
    let leader = "condition: ${kubernetes_leaderelection.leader} == true\n";
    let env = "            - name: ELASTIC_NETINFO\n";
    let refused = [
        // Without the leader term an `or` means something else on the leader.
        (
            agent_with(
                leader,
                "condition: ${kubernetes_leaderelection.leader} == true or ${host.platform} == 'linux'\n",
            ),
            "is an `or`",
        ),
        // A stream's condition: only whole inputs move.
        (
            agent_with(
                "            metricsets:\n              - proxy\n",
                "            condition: ${kubernetes_leaderelection.leader} == true\n            metricsets:\n              - proxy\n",
            ),
            "names kubernetes_leaderelection where inject cannot move it (inputs[",
        ),
        // ... nor a stream's of an input that moves.
        (
            agent_with(
                "            metricsets:\n              - apiserver\n",
                "            condition: ${kubernetes_leaderelection.leader} == true\n            metricsets:\n              - apiserver\n",
            ),
            "inputs[0] (kubernetes-cluster-metrics) names kubernetes_leaderelection beside its condition (inputs[0].streams[0].condition)",
        ),
        (
            agent_with(&format!("        {leader}"), ""),
            "no input whose condition is",
        ),
        // Where inputs.d is, from a Secret or the downward API: unknown here.
        (
            agent_with(
                env,
                "            - name: STATE_PATH\n              valueFrom: {secretKeyRef: {name: s, key: k}}\n            - name: ELASTIC_NETINFO\n",
            ),
            "takes STATE_PATH from elsewhere",
        ),
        (
            agent_with(
                env,
                "            - name: FLEET_ENROLL\n              value: \"1\"\n            - name: ELASTIC_NETINFO\n",
            ),
            "enrolls in Fleet (FLEET_ENROLL)",
        ),
        (
            agent_with(
                "          args: [\"-c\",",
                "          command: [/usr/share/elastic-agent/elastic-agent]\n          args: [\"-c\",",
            ),
            "sets a command of its own",
        ),
        // Elastic's hints setup already mounts a volume at inputs.d.
        (
            agent_with(
                "            # - name: external-inputs\n            #   mountPath",
                "            - name: external-inputs\n              mountPath",
            )
            .replacen(
                "        # - name: external-inputs\n        #   emptyDir",
                "        - name: external-inputs\n          emptyDir",
                1,
            ),
            "already mounts volume external-inputs at /usr/share/elastic-agent/state/inputs.d",
        ),
    ];
    // ECK's Agent: the operator writes what inject would have to read.
    let eck = "apiVersion: agent.k8s.elastic.co/v1alpha1\nkind: Agent\nmetadata: {name: a, namespace: n}\nspec:\n  version: 8.19.7\n  daemonSet:\n    podTemplate:\n      spec:\n        containers: [{name: agent}]\n".to_owned();
    for (input, says) in refused
        .into_iter()
        .chain([(eck, "ECK's Agent: the operator writes")])
    {
        let (code, out, err) = inject(&input, &[]);
        assert_eq!((code, out.is_empty()), (1, true), "{says}: {err}");
        assert!(err.contains(says), "{says}: {err}");
    }
    // A second DaemonSet reading the agent's ConfigMap.
    let (code, _, err) = inject(
        &with_a_second_daemonset(AGENT, "agent2"),
        &["--workload", "DaemonSet/elastic-agent-standalone"],
    );
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains("ConfigMap agent-node-datastreams is also mounted by DaemonSet/agent2"),
        "{err}"
    );
}

/// The `OpenTelemetryCollector` of a stream.
fn otel_cr<'a>(docs: &'a [Node], name: &str) -> &'a Map {
    find(docs, "OpenTelemetryCollector", name)
}

/// The receivers of `config`'s pipeline `pipeline`.
fn pipeline_receivers(config: &Map, pipeline: &str) -> Vec<String> {
    config
        .at(&["service", "pipelines", pipeline])
        .map(|p| strings(p.seq("receivers")))
        .unwrap_or_default()
        .into_iter()
        .map(str::to_owned)
        .collect()
}

#[test]
fn an_operator_daemonset_keeps_its_node_pipelines_and_runs_its_cluster_receivers_in_a_gated_copy() {
    // kube-stack's daemon collector: kubelet_stats, host_metrics, file_log
    // beside k8s_cluster and k8s_objects, each under its own
    // k8s_leader_elector; no spec.image, the operator's --collector-image
    // is in the stream.
    let (code, out, err) = inject(&fixture("otel-kube-stack-daemon.yaml"), &[]);
    assert_eq!(code, 0, "{err}");
    assert!(
        err.contains("runs otel/opentelemetry-collector-k8s:0.154.0, the --collector-image of the operator in this input"),
        "{err}"
    );
    let docs = read_stream(&out).unwrap();
    let spec = otel_cr(&docs, "example-daemon").map("spec").unwrap();
    let node = spec.map("config").unwrap();
    assert_eq!(
        pipeline_receivers(node, "metrics"),
        ["prometheus", "otlp", "host_metrics", "kubelet_stats"]
    );
    assert_eq!(pipeline_receivers(node, "logs"), ["otlp", "file_log"]);
    let leader_text = find(&docs, "ConfigMap", "example-daemon-leader-only")
        .at_str(&["data", "collector.yaml"])
        .unwrap()
        .to_owned();
    let leader = read_one(&leader_text).unwrap();
    let leader = leader.as_map().unwrap();
    assert_eq!(pipeline_receivers(leader, "metrics"), ["k8s_cluster"]);
    assert_eq!(pipeline_receivers(leader, "logs"), ["k8s_objects"]);
    assert!(
        !format!("{node:?}{leader:?}").contains("k8s_leader_elector"),
        "leader-gate elects instead"
    );
    // The sidecar in spec.initContainers; the copy beside the operator's
    // collector, under exec, on its own configuration.
    assert_eq!(init_names(spec), ["leader-gate-install", "leader-gate"]);
    let copies = spec.seq("additionalContainers");
    assert_eq!(copies.len(), 1);
    let copy = named(copies, "otc-container-leader-only");
    assert_eq!(
        copy.str("image"),
        Some("otel/opentelemetry-collector-k8s:0.154.0")
    );
    let command = strings(copy.seq("command"));
    assert_eq!(
        (command[0], command[1], *command.last().unwrap()),
        ("/leader-gate/leader-gate", "exec", "/otelcol-k8s")
    );
    assert_eq!(
        strings(copy.seq("args")),
        ["--config=/etc/leader-gate/collector/collector.yaml"]
    );
    assert!(copy.at(&["lifecycle", "preStop", "exec"]).is_some());
    assert!(
        spec.get("lifecycle").is_none(),
        "the operator's collector keeps its own lifecycle"
    );
    let volume = named(spec.seq("volumes"), "leader-gate-collector-config");
    assert_eq!(
        volume.at_str(&["configMap", "name"]),
        Some("example-daemon-leader-only")
    );
    assert!(
        spec.at(&["podAnnotations"])
            .unwrap()
            .get("leader-gate.dev/injected")
            .is_some()
    );
    // The operator's own ServiceAccount, <name>-collector, gets the Lease
    // and, since the operator now derives no grant for them, the cluster
    // receivers' rules.
    for kind in ["RoleBinding", "ClusterRoleBinding"] {
        let name = if kind == "RoleBinding" {
            "example-daemon-leader-gate"
        } else {
            "example-daemon-default-leader-only"
        };
        let subject = find(&docs, kind, name).seq("subjects")[0].as_map().unwrap();
        assert_eq!(
            subject.str("name"),
            Some("example-daemon-collector"),
            "{kind}"
        );
    }
    let role = find(&docs, "ClusterRole", "example-daemon-default-leader-only");
    let groups: Vec<&str> = role
        .seq("rules")
        .iter()
        .flat_map(|r| strings(r.as_map().unwrap().seq("apiGroups")))
        .collect();
    assert!(
        groups.contains(&"apps") && groups.contains(&"events.k8s.io"),
        "{groups:?}"
    );
    assert!(!err.contains("ServiceAccount example-daemon-collector is not in this input"));
    // What the CRD does not have is never written: its schema is checked
    // by scripts/check-inject.sh; here the pod-spec names stay out.
    for key in ["containers", "serviceAccountName", "template"] {
        assert!(spec.get(key).is_none(), "{key}");
    }
}

/// The upstream fixture `otel-operator-collector-k8scluster.yaml` with
/// `spec` lines added first (an image, a mode…).
fn k8scluster_with(lines: &str) -> String {
    let text = fixture("otel-operator-collector-k8scluster.yaml");
    assert!(text.contains("\nspec:\n"));
    text.replacen("\nspec:\n", &format!("\nspec:\n{lines}"), 1)
}

#[test]
fn an_operator_collector_whose_every_pipeline_is_cluster_wide_keeps_an_idle_nop_pipeline() {
    // Deployment mode (unset), k8s_cluster its only receiver. (The upstream
    // e2e test checks the operator's RBAC only: k8s_cluster makes no
    // traces, so that pipeline would not start either way.)
    let input = k8scluster_with("  image: otel/opentelemetry-collector-contrib:0.158.0\n");
    let (code, out, err) = inject(&input, &[]);
    assert_eq!(code, 0, "{err}");
    assert!(err.contains("keeps an idle pipeline"), "{err}");
    let docs = read_stream(&out).unwrap();
    let spec = otel_cr(&docs, "simplest").map("spec").unwrap();
    let node = spec.map("config").unwrap();
    assert_eq!(
        keys_of(node.at(&["service", "pipelines"])),
        ["logs/leader-gate-idle"]
    );
    assert_eq!(
        pipeline_receivers(node, "logs/leader-gate-idle"),
        ["nop/leader-gate"]
    );
    assert!(node.at(&["exporters", "nop/leader-gate"]).is_some());
    let leader = find(&docs, "ConfigMap", "simplest-leader-only");
    let leader = read_one(leader.at_str(&["data", "collector.yaml"]).unwrap()).unwrap();
    assert_eq!(
        pipeline_receivers(leader.as_map().unwrap(), "traces"),
        ["k8s_cluster"]
    );
    let copy = named(
        spec.seq("additionalContainers"),
        "otc-container-leader-only",
    );
    assert_eq!(
        strings(copy.seq("command")).last(),
        Some(&"/otelcol-contrib")
    );
    assert_eq!(check(&out), (0, String::new()));
    let (code, twice, err) = inject(&out, &[]);
    assert_eq!((code, twice == out), (0, true), "{err}");
    // A distribution without the nop receiver, or too old for it: refused,
    // naming the ways out.
    for image in [
        "otel/opentelemetry-collector-k8s:0.158.0",
        "otel/opentelemetry-collector-contrib:0.97.0",
    ] {
        let (code, out, err) = inject(&k8scluster_with(&format!("  image: {image}\n")), &[]);
        assert_eq!((code, out.is_empty()), (1, true), "{err}");
        assert!(
            err.contains("every pipeline reads a cluster receiver (k8s_cluster)")
                && err.contains("keep a pipeline of your own in spec.config"),
            "{err}"
        );
    }
}

fn keys_of(map: Option<&Map>) -> Vec<&str> {
    map.map(|m| m.0.iter().map(|(k, _)| k.as_str()).collect())
        .unwrap_or_default()
}

#[test]
fn what_the_operator_cannot_run_gated_is_refused_with_the_reason() {
    for (lines, says) in [
        (
            "  mode: sidecar\n  image: otel/opentelemetry-collector-contrib:0.158.0\n",
            "spec.mode sidecar: the operator injects this collector into each application pod",
        ),
        // The core distribution has no cluster receiver at all.
        (
            "  image: otel/opentelemetry-collector:0.158.0\n",
            "is the core distribution",
        ),
        (
            "  image: example.com/my-collector:1\n",
            "set spec.command to it",
        ),
    ] {
        let (code, out, err) = inject(&k8scluster_with(lines), &[]);
        assert_eq!((code, out.is_empty()), (1, true), "{lines}: {err}");
        assert!(err.contains(says), "{lines}: {err}");
    }
    // Nothing once per cluster: nothing to gate.
    let otlp = k8scluster_with("  image: otel/opentelemetry-collector-contrib:0.158.0\n")
        .replace("k8s_cluster", "otlp");
    let (code, _, err) = inject(&otlp, &[]);
    assert_eq!(code, 1);
    assert!(
        err.contains("its spec.config runs none of the receivers"),
        "{err}"
    );
    // Named, the sidecar-mode collector is refused the same way.
    let sidecar =
        k8scluster_with("  mode: sidecar\n  image: otel/opentelemetry-collector-contrib:0.158.0\n");
    let (code, _, err) = inject(&sidecar, &["--workload", "OpenTelemetryCollector/simplest"]);
    assert_eq!(code, 1);
    assert!(err.contains("spec.mode sidecar"), "{err}");
    let (code, _, err) = inject(
        &k8scluster_with("  image: otel/opentelemetry-collector-contrib:0.158.0\n"),
        &["--gate", "poll"],
    );
    assert_eq!(code, 1);
    assert!(err.contains("--gate poll"), "{err}");
}

#[test]
fn an_operator_collectors_own_fields_reach_its_copy_and_its_pod() {
    // A daemonset-mode collector with a node pipeline, its command, args,
    // extra ConfigMap, ServiceAccount, hostNetwork and a grace period too
    // short for the hand-over.
    let input = fixture("otel-operator-collector-k8scluster.yaml")
        .replacen(
            "\nspec:\n  config:\n    receivers:\n      k8s_cluster: {}\n",
            "\nspec:
  mode: daemonset
  image: registry.example/otelcol-contrib:0.158.0
  command: [/otelcol-contrib]
  args: {feature-gates: +x, config: /ignored.yaml, a-flag: \"1\"}
  configmaps: [{name: certs, mountpath: /tls}]
  serviceAccount: node-collector
  hostNetwork: true
  terminationGracePeriodSeconds: 5
  config:
    receivers:
      k8s_cluster: {}
      otlp: {protocols: {grpc: {}}}
",
            1,
        )
        .replacen(
            "receivers: [k8s_cluster]",
            "receivers: [k8s_cluster, otlp]",
            1,
        );
    let (code, out, err) = inject(&input, &[]);
    assert_eq!(code, 0, "{err}");
    let docs = read_stream(&out).unwrap();
    let spec = otel_cr(&docs, "simplest").map("spec").unwrap();
    let copy = named(
        spec.seq("additionalContainers"),
        "otc-container-leader-only",
    );
    let command = strings(copy.seq("command"));
    assert_eq!(*command.last().unwrap(), "/otelcol-contrib");
    // As the operator writes spec.args: sorted, `config` dropped.
    assert_eq!(
        strings(copy.seq("args")),
        [
            "--config=/etc/leader-gate/collector/collector.yaml",
            "--a-flag=1",
            "--feature-gates=+x"
        ]
    );
    let mounts: Vec<&str> = copy
        .seq("volumeMounts")
        .iter()
        .filter_map(|m| m.as_map()?.str("mountPath"))
        .collect();
    assert!(
        mounts.contains(&"/var/conf/tls/configmap-certs"),
        "{mounts:?}"
    );
    // Hook 7 s + grace 3 s + shutdown 9 s + 5 s.
    assert_eq!(
        spec.get("terminationGracePeriodSeconds"),
        Some(&Node::Int(24))
    );
    let serve = strings(named(spec.seq("initContainers"), "leader-gate").seq("args"));
    assert!(serve.contains(&"--admin-listen=0.0.0.0:4041"), "{serve:?}");
    assert!(
        err.contains("the leader-only collector's metrics on 4042"),
        "{err}"
    );
    let leader = find(&docs, "ConfigMap", "simplest-leader-only");
    assert!(
        leader
            .at_str(&["data", "collector.yaml"])
            .unwrap()
            .contains("port: 4042")
    );
    let binding = find(&docs, "RoleBinding", "simplest-leader-gate");
    assert_eq!(
        binding.seq("subjects")[0].as_map().unwrap().str("name"),
        Some("node-collector")
    );
    assert!(
        err.contains("ServiceAccount node-collector is not in this input"),
        "{err}"
    );
    assert!(
        !docs
            .iter()
            .any(|d| d.as_map().and_then(|m| m.str("kind")) == Some("ServiceAccount")),
        "a ServiceAccount the resource names is the user's to make"
    );
    assert_eq!(check(&out), (0, String::new()));
    let (code, twice, err) = inject(&out, &[]);
    assert_eq!((code, twice == out), (0, true), "{err}");
}
