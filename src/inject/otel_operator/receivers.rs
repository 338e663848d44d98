//! What the operator's automatic RBAC granted the cluster receivers while
//! they were in `spec.config`, written again for the leader-only copy that
//! now runs them: the operator derives its ClusterRole from the components
//! in `spec.config`'s pipelines only (`internal/otelconfig/config.go`
//! `GetAllRbacRules`), so once `inject` moves them it stops granting theirs.
//! The rules are the operator's, in
//! open-telemetry/opentelemetry-operator at be8944414a876f17fcdeb5a59b86b8866fb5c88e,
//! `internal/components/receivers/`: `k8scluster.go` (plus OpenShift's
//! quotas under `distribution: openshift`), `k8sevents.go`,
//! `k8sobjects.go` (per watched object). A ClusterRole of the same rules
//! the stream already grants (kube-stack's, say) grants nothing more.

use std::collections::BTreeSet;

use crate::inject::pod::q;
use crate::inject::yaml::{Map, Node, read_one};

/// Processors the operator grants RBAC for (`internal/components/processors`),
/// by type, old names and new.
const GRANTED_PROCESSORS: &[&str] = &[
    "k8sattributes",
    "k8s_attributes",
    "resourcedetection",
    "resource_detection",
];

/// One ClusterRole rule: API groups, resources, verbs.
type Rule = (Vec<String>, Vec<String>, Vec<String>);

fn rule(groups: &[&str], resources: &[&str], verbs: &[&str]) -> Rule {
    let owned = |list: &[&str]| list.iter().map(|s| (*s).to_owned()).collect();
    (owned(groups), owned(resources), owned(verbs))
}

/// The operator's rules for one receiver (by type) and its settings.
fn rules_for(kind: &str, settings: Option<&Map>) -> Vec<Rule> {
    const READ: &[&str] = &["get", "list", "watch"];
    match kind {
        "k8s_cluster" => {
            let mut rules = vec![
                rule(
                    &[""],
                    &[
                        "events",
                        "namespaces",
                        "namespaces/status",
                        "nodes",
                        "nodes/spec",
                        "persistentvolumeclaims",
                        "persistentvolumes",
                        "pods",
                        "pods/status",
                        "replicationcontrollers",
                        "replicationcontrollers/status",
                        "resourcequotas",
                        "services",
                    ],
                    READ,
                ),
                rule(
                    &["apps"],
                    &["daemonsets", "deployments", "replicasets", "statefulsets"],
                    READ,
                ),
                rule(
                    &["extensions"],
                    &["daemonsets", "deployments", "replicasets"],
                    READ,
                ),
                rule(&["batch"], &["jobs", "cronjobs"], READ),
                rule(&["autoscaling"], &["horizontalpodautoscalers"], READ),
            ];
            if settings.and_then(|s| s.str("distribution")) == Some("openshift") {
                rules.push(rule(
                    &["quota.openshift.io"],
                    &["clusterresourcequotas"],
                    READ,
                ));
            }
            rules
        }
        "k8s_events" => vec![rule(&[""], &["events"], READ)],
        "k8sobjects" | "k8s_objects" => settings
            .map(|s| s.seq("objects"))
            .unwrap_or_default()
            .iter()
            .filter_map(Node::as_map)
            .map(|object| {
                let name = object.str("name").unwrap_or("");
                let mode = object.str("mode").unwrap_or("");
                let mut verbs = vec!["list"];
                if mode == "pull" && name != "events" && name != "events.k8s.io" {
                    verbs.push("get");
                } else if mode == "watch" {
                    verbs.push("watch");
                }
                rule(&[object.str("group").unwrap_or("")], &[name], &verbs)
            })
            .collect(),
        _ => Vec::new(),
    }
}

/// The component IDs of `kind` (`receivers`, `processors`) that `config`'s
/// pipelines use.
fn in_pipelines(config: &Map, kind: &str) -> BTreeSet<String> {
    config
        .at(&["service", "pipelines"])
        .map(|p| p.0.as_slice())
        .unwrap_or_default()
        .iter()
        .filter_map(|(_, p)| p.as_map())
        .flat_map(|p| p.seq(kind).iter().filter_map(Node::as_str))
        .map(str::to_owned)
        .collect()
}

fn type_of(id: &str) -> &str {
    id.split('/').next().unwrap_or(id)
}

/// The ClusterRole and ClusterRoleBinding `NAME-NAMESPACE-leader-only` for
/// `account`, with the rules the leader-only configuration's receivers
/// need; and what the user should know of processors the operator no
/// longer grants (`node` is what stays in `spec.config`).
pub fn objects(
    name: &str,
    namespace: &str,
    account: &str,
    node: &Map,
    leader: &str,
) -> (Vec<Node>, Vec<String>) {
    let Ok(Node::Map(leader)) = read_one(leader) else {
        return (Vec::new(), Vec::new());
    };
    let mut rules: Vec<Rule> = Vec::new();
    for id in in_pipelines(&leader, "receivers") {
        let settings = leader.at(&["receivers", id.as_str()]);
        for r in rules_for(type_of(&id), settings) {
            if !rules.contains(&r) {
                rules.push(r);
            }
        }
    }
    let still = in_pipelines(node, "processors");
    let notes = in_pipelines(&leader, "processors")
        .into_iter()
        .filter(|p| GRANTED_PROCESSORS.contains(&type_of(p)) && !still.contains(p))
        .map(|p| format!(
            "processor {p} now runs only in the leader-only copy: the operator no longer grants what it reads, so grant the pod's ServiceAccount {account} its RBAC yourself"
        ))
        .collect();
    if rules.is_empty() {
        return (Vec::new(), notes);
    }
    let role = q(&format!("{name}-{namespace}-leader-only"));
    let list = |items: &[String]| {
        format!(
            "[{}]",
            items.iter().map(|i| q(i)).collect::<Vec<_>>().join(", ")
        )
    };
    let rules: String = rules
        .iter()
        .map(|(groups, resources, verbs)| {
            format!(
                "  - {{apiGroups: {}, resources: {}, verbs: {}}}\n",
                list(groups),
                list(resources),
                list(verbs)
            )
        })
        .collect();
    let doc = |text: String| {
        read_one(&text).unwrap_or_else(|e| panic!("inject's own RBAC template is YAML: {e}"))
    };
    let objects = vec![
        doc(format!(
            "apiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRole\nmetadata: {{name: {role}}}\nrules:\n{rules}"
        )),
        doc(format!(
            "apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {{name: {role}}}
roleRef: {{apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: {role}}}
subjects:
  - {{kind: ServiceAccount, name: {account}, namespace: {namespace}}}
",
            account = q(account),
            namespace = q(namespace),
        )),
    ];
    (objects, notes)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rules_of(leader: &str) -> Vec<Node> {
        let (objects, _) = objects("c", "ns", "c-collector", &Map::default(), leader);
        objects[0].as_map().unwrap().seq("rules").to_vec()
    }

    fn strs(rule: &Node, key: &str) -> Vec<String> {
        rule.as_map()
            .unwrap()
            .seq(key)
            .iter()
            .map(|n| n.as_str().unwrap().to_owned())
            .collect()
    }

    #[test]
    fn k8s_cluster_gets_the_operators_rules_and_openshift_its_quotas() {
        let plain = rules_of(
            "receivers: {k8s_cluster: {}}\nservice: {pipelines: {metrics: {receivers: [k8s_cluster]}}}\n",
        );
        assert_eq!(plain.len(), 5);
        assert!(strs(&plain[0], "resources").contains(&"nodes/spec".to_owned()));
        let openshift = rules_of(
            "receivers: {k8s_cluster: {distribution: openshift}}\nservice: {pipelines: {metrics: {receivers: [k8s_cluster]}}}\n",
        );
        assert_eq!(strs(&openshift[5], "apiGroups"), ["quota.openshift.io"]);
    }

    #[test]
    fn k8s_objects_gets_each_objects_verbs_under_either_name() {
        for kind in ["k8sobjects", "k8s_objects/x"] {
            let leader = format!(
                "receivers:\n  {kind}:\n    objects:\n      - {{name: pods, mode: pull}}\n      - {{name: events, group: events.k8s.io, mode: watch}}\n      - {{name: events, mode: pull}}\nservice: {{pipelines: {{logs: {{receivers: [{kind}]}}}}}}\n"
            );
            let rules = rules_of(&leader);
            let verbs: Vec<Vec<String>> = rules.iter().map(|r| strs(r, "verbs")).collect();
            assert_eq!(
                verbs,
                [vec!["list", "get"], vec!["list", "watch"], vec!["list"]]
            );
            assert_eq!(strs(&rules[1], "apiGroups"), ["events.k8s.io"]);
        }
    }

    #[test]
    fn a_processor_left_only_to_the_copy_is_said() {
        let leader = "receivers: {k8s_events: {}}\nprocessors: {k8s_attributes: {}}\n\
                      service: {pipelines: {logs: {receivers: [k8s_events], processors: [k8s_attributes]}}}\n";
        let (objects, notes) = objects("c", "ns", "sa", &Map::default(), leader);
        assert_eq!(objects.len(), 2);
        assert_eq!(notes.len(), 1, "{notes:?}");
        assert!(notes[0].contains("k8s_attributes"), "{notes:?}");
        let node = match read_one(
            "service: {pipelines: {logs: {receivers: [otlp], processors: [k8s_attributes]}}}\n",
        )
        .unwrap()
        {
            Node::Map(m) => m,
            _ => unreachable!(),
        };
        let (_, notes) = super::objects("c", "ns", "sa", &node, leader);
        assert!(notes.is_empty(), "{notes:?}");
    }
}
