//! `leader-gate inject --check`, run as a process on the shipped manifests
//! (which pass) and on copies of them with exactly one thing broken each,
//! as a person would break it by hand: the check exits 1 and says what
//! broke, once.

use std::io::Write;
use std::process::{Command, Stdio};

/// The shipped manifests this test starts from, by file name.
const FILES: [&str; 3] = ["rbac.yaml", "metricbeat-daemonset.yaml", "exec-gate.yaml"];

fn manifest(name: &str) -> String {
    let path = format!("{}/manifests/{name}", env!("CARGO_MANIFEST_DIR"));
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// The stream of [`FILES`], with `old` replaced by `new` in `file` (where
/// it must occur exactly once, or the test no longer breaks what it says).
fn stream_with(file: &str, old: &str, new: &str) -> String {
    stream_with_all(file, &[(old, new)])
}

/// [`stream_with`] for a change made of several replacements in one file.
fn stream_with_all(file: &str, changes: &[(&str, &str)]) -> String {
    FILES
        .iter()
        .map(|name| {
            let mut text = manifest(name);
            if *name == file {
                for (old, new) in changes {
                    assert_eq!(
                        text.matches(old).count(),
                        1,
                        "{file} no longer has the wiring this test breaks ({old:?}): update the test"
                    );
                    text = text.replacen(old, new, 1);
                }
            }
            text
        })
        .collect::<Vec<_>>()
        .join("---\n")
}

/// Runs `inject --check` on `stream` (stdin) with `env` added to a
/// cleared environment; returns the exit code and the findings.
fn check_with_env(stream: &str, env: &[(&str, &str)]) -> (i32, Vec<String>) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_leader-gate"))
        .args(["inject", "--check", "-"])
        .env_clear()
        .envs(env.iter().copied())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run leader-gate");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(stream.as_bytes())
        .unwrap();
    let output = child.wait_with_output().unwrap();
    assert!(output.stdout.is_empty(), "--check writes no stream");
    let findings = String::from_utf8_lossy(&output.stderr)
        .lines()
        .map(str::to_owned)
        .collect();
    (output.status.code().expect("exited"), findings)
}

fn check(stream: &str) -> (i32, Vec<String>) {
    check_with_env(stream, &[])
}

/// The one finding of a stream broken in one place: exit 1, one line,
/// starting with `at` and containing `what`.
fn one_finding(file: &str, old: &str, new: &str, at: &str, what: &str) {
    one_finding_in(file, &[(old, new)], at, what);
}

fn one_finding_in(file: &str, changes: &[(&str, &str)], at: &str, what: &str) {
    let (code, findings) = check(&stream_with_all(file, changes));
    assert_eq!(code, 1, "{findings:#?}");
    assert_eq!(findings.len(), 1, "exactly one thing broke: {findings:#?}");
    assert!(
        findings[0].starts_with(&format!("{at}: ")) && findings[0].contains(what),
        "expected `{at}: …{what}…`, got {findings:#?}"
    );
}

#[test]
fn the_shipped_manifests_pass() {
    let (code, findings) = check(&stream_with_all("rbac.yaml", &[]));
    assert_eq!((code, findings), (0, vec![]));
}

#[test]
fn the_whole_kustomization_passes_where_kubectl_renders_it() {
    // CI has kubectl (scripts/check-manifests.sh installs it); a machine
    // without one still checks the files above.
    let Ok(rendered) = Command::new("kubectl")
        .args([
            "kustomize",
            concat!(env!("CARGO_MANIFEST_DIR"), "/manifests"),
        ])
        .output()
    else {
        eprintln!("no kubectl: the rendered kustomization is not checked here");
        return;
    };
    assert!(rendered.status.success(), "kubectl kustomize failed");
    let (code, findings) = check(&String::from_utf8(rendered.stdout).unwrap());
    assert_eq!((code, findings), (0, vec![]));
}

#[test]
fn the_checking_process_environment_counts_for_nothing() {
    // Variables the binary's flags fall back to, set where --check runs:
    // the pods' flags are judged by the pods' own environment alone.
    let hostile = [
        ("LEADER_GATE_GATE_LAG", "20s"),
        ("LEADER_GATE_URL", "http://127.0.0.1:4040"),
        ("LEADER_GATE_GRACE", "10m"),
        ("LEADER_GATE_LEASE", "other"),
    ];
    let (code, findings) = check_with_env(&stream_with_all("rbac.yaml", &[]), &hostile);
    assert_eq!((code, findings), (0, vec![]));
    // ... nor does it stand in for what a pod lacks.
    let stream = stream_with(
        "metricbeat-daemonset.yaml",
        "            - --lease-name\n            - metricbeat-leader\n",
        "",
    );
    let (code, findings) =
        check_with_env(&stream, &[("LEADER_GATE_LEASE_NAME", "metricbeat-leader")]);
    assert_eq!(code, 1);
    assert!(
        findings.iter().any(
            |f| f.starts_with("DaemonSet/metricbeat container leader-gate: ")
                && f.contains("--lease-name")
        ),
        "{findings:#?}"
    );
}

#[test]
fn the_incident_a_gate_lag_beyond_the_margin_would_exit_64() {
    // Issue 36: margin 30s - 15s = 15s; the pod crash-looped on exit 64.
    one_finding(
        "metricbeat-daemonset.yaml",
        "--gate-lag=12s",
        "--gate-lag=20s",
        "DaemonSet/metricbeat container leader-gate",
        "`leader-gate serve` refuses its flags and would exit 64: invalid --gate-lag: must be less than the margin --lease-duration - --renew-deadline (20s >= 15s)",
    );
}

#[test]
fn an_unknown_flag_is_refused_as_clap_refuses_it() {
    one_finding(
        "metricbeat-daemonset.yaml",
        "--collector-health-failures=3",
        "--collector-health-failure=3",
        "DaemonSet/metricbeat container leader-gate",
        "would exit 64: unexpected argument '--collector-health-failure' found",
    );
}

#[test]
fn a_gate_lag_equal_to_the_margin_from_the_containers_variable_is_refused() {
    // The flag replaced by its variable (without either, the default 80%
    // of the margin passes): the container's environment is read.
    one_finding_in(
        "metricbeat-daemonset.yaml",
        &[
            ("            - --gate-lag=12s\n", ""),
            (
                "            - name: POD_NAME\n",
                "            - name: LEADER_GATE_GATE_LAG\n              value: 15s\n            - name: POD_NAME\n",
            ),
        ],
        "DaemonSet/metricbeat container leader-gate",
        "invalid --gate-lag: must be less than the margin --lease-duration - --renew-deadline (15s >= 15s)",
    );
}

#[test]
fn an_exec_grace_not_a_second_below_the_gate_lag_is_refused() {
    // Defaults: margin 5s, gate lag 4s; --grace 4s sends the SIGKILL
    // with the release.
    one_finding(
        "exec-gate.yaml",
        "            - --grace\n            - 3s\n",
        "            - --grace\n            - 4s\n",
        "Deployment/otel-cluster-collector container collector",
        "--grace 4s is not 1s below the sidecar's gate lag 4s and margin 5s",
    );
}

#[test]
fn a_termination_grace_period_short_of_hook_and_shutdown_is_refused() {
    // preStop --timeout 15s + --drain 0s + --shutdown-timeout 20s + 5s.
    one_finding(
        "metricbeat-daemonset.yaml",
        "terminationGracePeriodSeconds: 40",
        "terminationGracePeriodSeconds: 39",
        "DaemonSet/metricbeat",
        "terminationGracePeriodSeconds 39 is below 40",
    );
}

#[test]
fn a_gate_left_on_tcp_is_refused() {
    one_finding(
        "metricbeat-daemonset.yaml",
        "              value: unix:/run/leader-gate/gate.sock\n",
        "              value: http://127.0.0.1:4040\n",
        "DaemonSet/metricbeat container file-gate",
        "`file-gate` is on TCP (http://127.0.0.1:4040), which the sidecar refuses beside --gate-socket",
    );
}

#[test]
fn a_gate_without_the_socket_volume_is_refused() {
    // The exec gate and the preStop hook of its container both lose it.
    let stream = stream_with(
        "exec-gate.yaml",
        "            - {name: gate-socket, mountPath: /run/leader-gate, readOnly: true}\n            - {name: config",
        "            - {name: config",
    );
    let (code, findings) = check(&stream);
    assert_eq!(code, 1);
    let lost = "does not mount the gate socket's volume gate-socket at /run/leader-gate: it cannot reach unix:/run/leader-gate/gate.sock";
    assert_eq!(
        findings,
        [
            format!("Deployment/otel-cluster-collector container collector preStop hook: {lost}"),
            format!("Deployment/otel-cluster-collector container collector: {lost}"),
        ]
    );
}

#[test]
fn a_prestop_hook_naming_another_lease_is_refused() {
    one_finding(
        "metricbeat-daemonset.yaml",
        "                  - metricbeat-leader\n                  - --timeout=15s\n",
        "                  - other-leader\n                  - --timeout=15s\n",
        "DaemonSet/metricbeat container metricbeat preStop hook",
        "--lease other-leader is not one of the sidecar's Leases (metricbeat-leader)",
    );
}

#[test]
fn a_prestop_hook_whose_binary_nobody_installs_is_refused() {
    one_finding(
        "metricbeat-daemonset.yaml",
        r#"args: ["install", "--log-format=json", "/gate/leader-gate"]"#,
        r#"args: ["install", "--log-format=json", "/gate/lg"]"#,
        "DaemonSet/metricbeat container metricbeat preStop hook",
        "no init container installs leader-gate at /gate/leader-gate (volume gate)",
    );
}

#[test]
fn a_pod_name_not_from_the_downward_api_is_refused() {
    // Every replica would hold the Lease under one name.
    one_finding(
        "metricbeat-daemonset.yaml",
        "            - name: POD_NAME\n              valueFrom: {fieldRef: {fieldPath: metadata.name}}\n",
        "            - name: POD_NAME\n              value: metricbeat\n",
        "DaemonSet/metricbeat container leader-gate",
        "POD_NAME does not come from the downward API",
    );
}

#[test]
fn a_role_without_update_on_the_lease_is_refused() {
    one_finding(
        "rbac.yaml",
        r#"verbs: ["get", "update", "list", "watch"]"#,
        r#"verbs: ["get", "list", "watch"]"#,
        "DaemonSet/metricbeat",
        "service account metricbeat lacks update on Lease metricbeat-leader in namespace monitoring",
    );
}

#[test]
fn a_role_naming_another_lease_is_refused() {
    one_finding(
        "rbac.yaml",
        r#"resourceNames: ["metricbeat-leader"]"#,
        r#"resourceNames: ["other-leader"]"#,
        "DaemonSet/metricbeat",
        "lacks get, update, list, watch on Lease metricbeat-leader in namespace monitoring (Role leader-gate names only other-leader)",
    );
}

#[test]
fn a_modules_glob_missing_the_file_gates_dst_is_refused() {
    one_finding(
        "metricbeat-daemonset.yaml",
        "path: /usr/share/metricbeat/*modules.d/*.yml",
        "path: /usr/share/metricbeat/node-modules.d/*.yml",
        "DaemonSet/metricbeat container metricbeat",
        "modules glob /usr/share/metricbeat/node-modules.d/*.yml (ConfigMap metricbeat-config) does not match the file gate's DST /usr/share/metricbeat/modules.d/kubernetes-cluster.yml",
    );
}

#[test]
fn a_modules_glob_matching_the_temporary_file_is_refused() {
    one_finding(
        "metricbeat-daemonset.yaml",
        "path: /usr/share/metricbeat/*modules.d/*.yml",
        "path: /usr/share/metricbeat/*modules.d/*",
        "DaemonSet/metricbeat container metricbeat",
        "matches the file gate's temporary file /usr/share/metricbeat/modules.d/.kubernetes-cluster.yml.leader-gate.tmp",
    );
}

#[test]
fn a_file_gate_that_is_not_a_native_sidecar_is_refused() {
    one_finding(
        "metricbeat-daemonset.yaml",
        "          restartPolicy: Always\n          # No probes",
        "          # No probes",
        "DaemonSet/metricbeat container file-gate",
        "`file-gate` is not a native sidecar",
    );
}

#[test]
fn readiness_on_leader_in_a_daemonset_is_refused() {
    one_finding(
        "metricbeat-daemonset.yaml",
        "httpGet: {path: /readyz, port: admin}",
        "httpGet: {path: /leader, port: admin}",
        "DaemonSet/metricbeat container leader-gate",
        "readiness on /leader stalls a DaemonSet rollout",
    );
}

#[test]
fn a_stream_without_rbac_says_the_lease_is_granted_nothing_here() {
    let stream = [manifest("metricbeat-daemonset.yaml")].join("---\n");
    let stream = stream.replace("kind: ClusterRoleBinding", "kind: ConfigMap");
    let stream = stream.replace("kind: ClusterRole\n", "kind: ConfigMap\n");
    let (code, findings) = check(&stream);
    assert_eq!(code, 1);
    assert_eq!(
        findings,
        [
            "DaemonSet/metricbeat: service account metricbeat is granted nothing on Lease metricbeat-leader in namespace monitoring in this stream: bind it a Role granting get, update, list, watch, create (or ignore this if it is granted elsewhere)",
            "DaemonSet/metricbeat: service account metricbeat is granted nothing on Events (--record-events) in namespace monitoring in this stream: bind it a Role granting create (or ignore this if it is granted elsewhere)",
        ]
    );
}

#[test]
fn a_stream_with_workloads_but_no_leader_gate_says_so() {
    let stream = "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: c}\nspec:\n  template:\n    spec:\n      containers: [{name: c, image: collector:1}]\n";
    let (code, findings) = check(stream);
    assert_eq!(code, 1);
    assert_eq!(findings.len(), 1, "{findings:#?}");
    assert!(
        findings[0].starts_with("stream: nothing here runs leader-gate"),
        "{findings:#?}"
    );
    // Without any workload there is nothing to gate, and nothing to say.
    let (code, findings) = check("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: c}\n");
    assert_eq!((code, findings), (0, vec![]));
}

#[test]
fn garbage_is_a_finding_never_a_crash() {
    for (stream, finding) in [
        (
            "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: c}\nspec:\n  template:\n    spec:\n      containers: nope\n",
            "Deployment/c: spec.template.spec.containers is not a list",
        ),
        (
            "apiVersion: apps/v1\nkind: DaemonSet\nmetadata: {name: c}\nspec: 3\n",
            "DaemonSet/c: no spec.template.spec",
        ),
        ("just a string\n", "document 1: not a Kubernetes object"),
        (
            "apiVersion: v1\nkind: Pod\nmetadata: {name: p}\nspec:\n  containers:\n    - 7\n    - {name: g, image: ghcr.io/leader-gate/leader-gate:0.1.0, args: {serve: yes}}\n",
            "Pod/p: spec.containers[0] is not a container",
        ),
        (
            "apiVersion: v1\nkind: Pod\nmetadata: {name: p}\nspec:\n  terminationGracePeriodSeconds: soon\n  containers:\n    - {name: g, image: ghcr.io/leader-gate/leader-gate:0.1.0, args: [serve, 3]}\n",
            "Pod/p container g: args[1] is not a string",
        ),
    ] {
        let (code, findings) = check(stream);
        assert_eq!(code, 1, "{stream}");
        assert!(
            findings.iter().any(|f| f.starts_with(finding)),
            "{stream}: expected {finding:?} in {findings:#?}"
        );
    }
}

/// An ECK `Beat` gated by hand: Metricbeat's configuration is the Beat's
/// inline `spec.config`, Metricbeat (ECK's container named after the type)
/// and the file gate both run as root (the pod's user).
const ECK_BEAT: &str = "\
apiVersion: coordination.k8s.io/v1
kind: Lease
metadata: {name: mb-leader, namespace: monitoring}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {name: mb-leader-gate, namespace: monitoring}
rules:
  - apiGroups: [coordination.k8s.io]
    resources: [leases]
    resourceNames: [mb-leader]
    verbs: [get, update, list, watch]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {name: mb-leader-gate, namespace: monitoring}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: Role, name: mb-leader-gate}
subjects: [{kind: ServiceAccount, name: mb, namespace: monitoring}]
---
apiVersion: beat.k8s.elastic.co/v1beta1
kind: Beat
metadata: {name: metricbeat, namespace: monitoring}
spec:
  type: metricbeat
  version: 8.15.0
  config:
    metricbeat.config.modules:
      path: /usr/share/metricbeat/modules.d/*.yml
      reload.enabled: true
      reload.period: 3s
  daemonSet:
    podTemplate:
      spec:
        serviceAccountName: mb
        securityContext: {runAsUser: 0}
        initContainers:
          - name: leader-gate
            image: ghcr.io/leader-gate/leader-gate:0.1.0
            restartPolicy: Always
            args: [serve, --lease-name=mb-leader, --gate-socket=/run/leader-gate/gate.sock]
            env:
              - {name: POD_NAME, valueFrom: {fieldRef: {fieldPath: metadata.name}}}
              - {name: POD_NAMESPACE, valueFrom: {fieldRef: {fieldPath: metadata.namespace}}}
            securityContext: {runAsUser: 65532}
            volumeMounts: [{name: gate-socket, mountPath: /run/leader-gate}]
          - name: file-gate
            image: ghcr.io/leader-gate/leader-gate:0.1.0
            restartPolicy: Always
            args: [file-gate, --url=unix:/run/leader-gate/gate.sock, /etc/leader-only/k.yml:/usr/share/metricbeat/modules.d/k.yml]
            volumeMounts:
              - {name: leader-only, mountPath: /etc/leader-only}
              - {name: modules, mountPath: /usr/share/metricbeat/modules.d}
              - {name: gate-socket, mountPath: /run/leader-gate}
        containers:
          - name: metricbeat
            volumeMounts: [{name: modules, mountPath: /usr/share/metricbeat/modules.d}]
        volumes:
          - {name: gate-socket, emptyDir: {}}
          - {name: leader-only, configMap: {name: mb-leader-only}}
          - {name: modules, emptyDir: {}}
";

/// [`ECK_BEAT`] with `old` (there once) replaced by `new`: its findings.
fn eck_beat_with(old: &str, new: &str) -> (i32, Vec<String>) {
    assert_eq!(ECK_BEAT.matches(old).count(), 1, "{old:?}");
    check(&ECK_BEAT.replacen(old, new, 1))
}

#[test]
fn an_eck_beats_inline_config_is_held_to_the_modules_rules() {
    assert_eq!(check(ECK_BEAT), (0, vec![]));
    let (code, findings) = eck_beat_with("reload.period: 3s", "reload.period: 20s");
    assert_eq!(code, 1);
    assert_eq!(
        findings,
        [
            "Beat/metricbeat container metricbeat: reload.period 20s (the Beat's spec.config) must be below the margin 5s and at most --gate-lag 4s: Metricbeat may run the module that long after leadership ended"
        ]
    );
    let (code, findings) = eck_beat_with("modules.d/*.yml\n", "modules.d/*\n");
    assert_eq!(code, 1);
    assert_eq!(findings.len(), 1, "{findings:#?}");
    assert!(
        findings[0].contains("(the Beat's spec.config) matches the file gate's temporary file"),
        "{findings:#?}"
    );
}

#[test]
fn a_file_gate_writing_as_another_user_than_metricbeat_is_refused() {
    // The strict.perms trap: root Metricbeat, the file gate as 65532.
    let (code, findings) = eck_beat_with(
        "args: [file-gate,",
        "securityContext: {runAsUser: 65532}\n            args: [file-gate,",
    );
    assert_eq!(code, 1);
    assert_eq!(
        findings,
        [
            "Beat/metricbeat container metricbeat: strict.perms: Metricbeat runs as uid 0 and loads only module files owned by it or root, but the file gate file-gate writes its copy as uid 65532: the leader's module would be refused; run file-gate as uid 0, or start Metricbeat with -strict.perms=false"
        ]
    );
    // Metricbeat told to skip the check: nothing to say.
    let relaxed = ECK_BEAT
        .replacen(
            "args: [file-gate,",
            "securityContext: {runAsUser: 65532}\n            args: [file-gate,",
            1,
        )
        .replacen(
            "          - name: metricbeat\n",
            "          - name: metricbeat\n            args: [-strict.perms=false]\n",
            1,
        );
    assert_eq!(check(&relaxed), (0, vec![]));
}

#[test]
fn a_file_gate_mode_letting_others_write_is_refused() {
    one_finding(
        "metricbeat-daemonset.yaml",
        "            - file-gate\n            - --log-format=json\n",
        "            - file-gate\n            - --mode=0664\n            - --log-format=json\n",
        "DaemonSet/metricbeat container metricbeat",
        "strict.perms: the file gate file-gate's --mode 0664 lets group or others write the copy",
    );
}

/// `leader-gate inject FIXTURE` (tests/fixtures/upstream): the gated stream.
fn gated_fixture(name: &str) -> String {
    let path = format!(
        "{}/tests/fixtures/upstream/{name}",
        env!("CARGO_MANIFEST_DIR")
    );
    let out = Command::new(env!("CARGO_BIN_EXE_leader-gate"))
        .args(["inject", &path])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// The gated OpenTelemetry DaemonSet with `edit` applied to the collector
/// configuration of ConfigMap `cm` (key `relay`).
fn otel_with(cm: &str, edit: impl Fn(&mut leader_gate::inject::yaml::Map)) -> String {
    use leader_gate::inject::yaml::{Node, read_one, read_stream, write_one, write_stream};
    let mut docs = read_stream(&gated_fixture("otel-helm-daemonset-cluster-metrics.yaml")).unwrap();
    let doc = docs
        .iter_mut()
        .find(|d| d.at_str_path(&["metadata", "name"]) == Some(cm))
        .unwrap();
    let data = doc.at_mut(&["data"]).unwrap();
    let mut config = read_one(data.str("relay").unwrap()).unwrap();
    edit(config.as_map_mut().unwrap());
    data.insert("relay", Node::str(write_one(&config)));
    write_stream(&docs)
}

#[test]
fn a_metricbeat_that_still_elects_its_own_leader_for_unique_modules_is_refused() {
    let gated = gated_fixture("elastic-beats-metricbeat-kubernetes.yaml");
    assert_eq!(check(&gated), (0, vec![]));
    let old = "  metricbeat.yml: |\n    metricbeat.config.modules:";
    assert!(gated.contains(old));
    let broken = gated.replacen(
        old,
        "  metricbeat.yml: |\n    metricbeat.autodiscover: {providers: [{type: kubernetes, scope: cluster, unique: true}]}\n    metricbeat.config.modules:",
        1,
    );
    let (code, findings) = check(&broken);
    assert_eq!(code, 1, "{findings:?}");
    assert!(
        findings
            .iter()
            .any(|f| f.contains("still has a `unique: true` autodiscover provider")),
        "{findings:?}"
    );
}

#[test]
fn cluster_receivers_outside_exec_or_a_gated_collectors_own_election_are_refused() {
    use leader_gate::inject::yaml::Node;
    assert_eq!(
        check(&gated_fixture("otel-helm-daemonset-cluster-metrics.yaml")),
        (0, vec![])
    );
    // k8s_cluster back in the node collector, which runs on every pod.
    let node = otel_with("example-opentelemetry-collector-agent", |config| {
        config
            .map_entry("receivers")
            .insert("k8s_cluster", Node::Map(Default::default()));
        let metrics = config
            .map_entry("service")
            .map_entry("pipelines")
            .map_entry("metrics");
        metrics
            .seq_entry("receivers")
            .push(Node::str("k8s_cluster"));
    });
    let (code, findings) = check(&node);
    assert_eq!(code, 1, "{findings:?}");
    assert!(
        findings.iter().any(|f| f.contains("container opentelemetry-collector: runs receivers that work once per cluster (k8s_cluster) outside `leader-gate exec`")),
        "{findings:?}"
    );
    // The gated copy electing a leader of its own.
    let elects = otel_with(
        "example-opentelemetry-collector-agent-leader-only",
        |config| {
            let receiver = config.map_entry("receivers").map_entry("k8s_cluster");
            receiver.insert(
                "k8s_leader_elector",
                Node::str("k8s_leader_elector/k8s_cluster"),
            );
        },
    );
    let (code, findings) = check(&elects);
    assert_eq!(code, 1, "{findings:?}");
    assert!(
        findings
            .iter()
            .any(|f| f.contains("keeps `k8s_leader_elector`")),
        "{findings:?}"
    );
}

/// Elastic's standalone agent as `inject` gates it, with `old` (there once)
/// replaced by `new`: it passes as gated, and broken so it has exactly one
/// finding, on the agent's container, containing `what`.
fn agent_one_finding(old: &str, new: &str, what: &str) {
    let gated = gated_fixture("elastic-agent-standalone-kubernetes.yaml");
    assert_eq!(check(&gated), (0, vec![]));
    assert_eq!(gated.matches(old).count(), 1, "{old:?}");
    let (code, findings) = check(&gated.replacen(old, new, 1));
    assert_eq!(code, 1, "{findings:#?}");
    assert_eq!(findings.len(), 1, "exactly one thing broke: {findings:#?}");
    let at = "DaemonSet/elastic-agent-standalone container elastic-agent-standalone: ";
    assert!(
        findings[0].starts_with(at) && findings[0].contains(what),
        "expected `{at}…{what}…`, got {findings:#?}"
    );
}

#[test]
fn a_gated_agent_still_electing_its_own_leader_for_an_input_is_refused() {
    // In its own configuration, where it runs on every pod the agent elects...
    agent_one_finding(
        "    - id: system-logs\n",
        "    - id: system-logs\n      condition: ${kubernetes_leaderelection.leader} == true\n",
        "agent.yml of ConfigMap agent-node-datastreams still names kubernetes_leaderelection (inputs[0].condition)",
    );
    // ... and in the leader-only file, where, the provider off, it runs nowhere.
    agent_one_finding(
        "    - id: kubernetes-cluster-metrics\n",
        "    - id: kubernetes-cluster-metrics\n      condition: ${kubernetes_leaderelection.leader} == true\n",
        "the file gate's file leader-only.yml of ConfigMap elastic-agent-standalone-leader-only still names kubernetes_leaderelection (inputs[0].condition)",
    );
}

#[test]
fn a_gated_agent_with_its_leader_election_provider_on_is_refused() {
    agent_one_finding(
        "providers.kubernetes_leaderelection.enabled: false",
        "providers.kubernetes_leaderelection.enabled: true",
        "the agent's kubernetes_leaderelection provider is not disabled",
    );
}

#[test]
fn a_file_gate_placing_outside_the_inputs_d_the_agent_reads_is_refused() {
    // CONFIG_PATH moves inputs.d; the file gate still places into the default.
    agent_one_finding(
        "        - name: ELASTIC_NETINFO\n",
        "        - name: CONFIG_PATH\n          value: /etc/elastic-agent\n        - name: ELASTIC_NETINFO\n",
        "the file gate's DST /usr/share/elastic-agent/state/inputs.d/leader-only.yml is not a *.yml in /etc/elastic-agent/inputs.d",
    );
}

#[test]
fn a_gated_agent_that_does_not_reload_is_refused() {
    agent_one_finding(
        "      reload.period: 10s\n",
        "      reload: {enabled: false, period: 10s}\n",
        "agent.reload.enabled is false",
    );
}

#[test]
fn an_agent_reload_period_beyond_the_gate_lag_is_refused() {
    agent_one_finding(
        "      reload.period: 10s\n",
        "      reload.period: 20s\n",
        "agent.reload.period 20s (agent.yml of ConfigMap agent-node-datastreams) must be below the margin 15s and at most --gate-lag 12s",
    );
}

/// The gated kube-stack daemon collector (an OpenTelemetryCollector) with
/// `edit` applied to the stream's documents.
fn operator_with(edit: impl Fn(&mut Vec<leader_gate::inject::yaml::Node>)) -> String {
    use leader_gate::inject::yaml::{read_stream, write_stream};
    let mut docs = read_stream(&gated_fixture("otel-kube-stack-daemon.yaml")).unwrap();
    edit(&mut docs);
    write_stream(&docs)
}

/// The `spec` of the stream's OpenTelemetryCollector.
fn operator_spec(
    docs: &mut [leader_gate::inject::yaml::Node],
) -> &mut leader_gate::inject::yaml::Map {
    docs.iter_mut()
        .find(|d| d.at_str_path(&["kind"]) == Some("OpenTelemetryCollector"))
        .and_then(|d| d.at_mut(&["spec"]))
        .unwrap()
}

/// The one finding of `stream`: exit 1, one line, with `what` in it.
fn the_one_finding(stream: &str, what: &str) {
    let (code, findings) = check(stream);
    assert_eq!(code, 1, "{findings:#?}");
    assert_eq!(findings.len(), 1, "exactly one thing broke: {findings:#?}");
    assert!(
        findings[0].contains(what),
        "expected …{what}…, got {findings:#?}"
    );
}

#[test]
fn an_operator_collector_running_cluster_receivers_in_its_spec_config_is_refused() {
    use leader_gate::inject::yaml::Node;
    assert_eq!(
        check(&gated_fixture("otel-kube-stack-daemon.yaml")),
        (0, vec![])
    );
    // k8s_cluster back in the operator's own collector, on every pod.
    let broken = operator_with(|docs| {
        let config = operator_spec(docs).map_entry("config");
        config
            .map_entry("receivers")
            .insert("k8s_cluster", Node::Map(Default::default()));
        config
            .map_entry("service")
            .map_entry("pipelines")
            .map_entry("metrics")
            .seq_entry("receivers")
            .push(Node::str("k8s_cluster"));
    });
    the_one_finding(
        &broken,
        "OpenTelemetryCollector/example-daemon container otc-container: runs receivers that work once per cluster (k8s_cluster) outside `leader-gate exec`",
    );
}

#[test]
fn an_operator_collectors_leader_only_copy_outside_exec_is_refused() {
    use leader_gate::inject::yaml::Node;
    // The copy runs the collector itself, not under `leader-gate exec`.
    let broken = operator_with(|docs| {
        let copy = operator_spec(docs)
            .seq_entry("additionalContainers")
            .iter_mut()
            .find_map(Node::as_map_mut)
            .unwrap();
        copy.insert("command", Node::Seq(vec![Node::str("/otelcol-k8s")]));
    });
    the_one_finding(
        &broken,
        "container otc-container-leader-only: runs receivers that work once per cluster (k8s_objects, k8s_cluster) outside `leader-gate exec`",
    );
}

#[test]
fn an_operator_collectors_copy_electing_its_own_leader_is_refused() {
    use leader_gate::inject::yaml::{Node, read_one, write_one};
    let broken = operator_with(|docs| {
        let data = docs
            .iter_mut()
            .find(|d| d.at_str_path(&["metadata", "name"]) == Some("example-daemon-leader-only"))
            .and_then(|d| d.at_mut(&["data"]))
            .unwrap();
        let mut config = read_one(data.str("collector.yaml").unwrap()).unwrap();
        config
            .at_mut(&["receivers", "k8s_cluster"])
            .unwrap()
            .insert(
                "k8s_leader_elector",
                Node::str("k8s_leader_elector/k8s_cluster"),
            );
        data.insert("collector.yaml", Node::str(write_one(&config)));
    });
    the_one_finding(
        &broken,
        "container otc-container-leader-only: a receiver of its configuration keeps `k8s_leader_elector`",
    );
}

#[test]
fn pod_fields_an_opentelemetrycollector_does_not_have_are_refused() {
    use leader_gate::inject::yaml::Node;
    // Containers where a pod spec has them: the API server drops the field,
    // and with it the gated copy.
    let broken = operator_with(|docs| {
        let spec = operator_spec(docs);
        let copies = spec.remove("additionalContainers").unwrap();
        spec.insert("containers", copies);
    });
    the_one_finding(
        &broken,
        "OpenTelemetryCollector/example-daemon: spec.containers is not a field of OpenTelemetryCollector, so the API server drops it: its containers go in spec.additionalContainers",
    );
    let broken = operator_with(|docs| {
        operator_spec(docs).insert("serviceAccountName", Node::str("example-daemon-collector"));
    });
    the_one_finding(
        &broken,
        "spec.serviceAccountName is not a field of OpenTelemetryCollector",
    );
}
