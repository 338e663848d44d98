//! The RBAC a gated workload's sidecar needs, for the workload's own
//! ServiceAccount: a Role on its Lease (and `create`, which no resource name
//! can limit, for the first start) and on Events (`--record-events`), and a
//! RoleBinding. A ServiceAccount is written only when the pod names none.

use super::pod::q;
use super::yaml::{Map, Node, read_one};

/// The Role's and the RoleBinding's name.
pub fn name(workload: &str) -> String {
    format!("{workload}-leader-gate")
}

/// The objects to upsert, in their order.
pub fn objects(
    workload: &str,
    namespace: &str,
    account: &str,
    lease: &str,
    new_account: bool,
) -> Vec<Node> {
    // Quoted: a namespace `null` or a Lease `1234` stays a string.
    let role = q(&name(workload));
    let (namespace, account, lease) = (q(namespace), q(account), q(lease));
    let mut out = Vec::new();
    if new_account {
        out.push(doc(&format!(
            "apiVersion: v1
kind: ServiceAccount
metadata: {{name: {account}, namespace: {namespace}}}
"
        )));
    }
    out.push(doc(&format!(
        "apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {{name: {role}, namespace: {namespace}}}
rules:
  - apiGroups: [coordination.k8s.io]
    resources: [leases]
    resourceNames: [{lease}]
    verbs: [get, update, list, watch]
  - apiGroups: [coordination.k8s.io]
    resources: [leases]
    verbs: [create]
  - apiGroups: ['']
    resources: [events]
    verbs: [create]
"
    )));
    out.push(doc(&format!(
        "apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {{name: {role}, namespace: {namespace}}}
roleRef: {{apiGroup: rbac.authorization.k8s.io, kind: Role, name: {role}}}
subjects:
  - {{kind: ServiceAccount, name: {account}, namespace: {namespace}}}
"
    )));
    out
}

fn doc(text: &str) -> Node {
    read_one(text).unwrap_or_else(|e| panic!("inject's own RBAC template is YAML: {e}"))
}

/// Puts `object` in place of the stream's object of the same kind, name and
/// namespace, or at the end.
pub fn upsert(docs: &mut Vec<Node>, object: Node) {
    let key = |n: &Node| -> Option<(String, String, String)> {
        let m: &Map = n.as_map()?;
        Some((
            m.str("kind")?.to_owned(),
            m.at_str(&["metadata", "name"])?.to_owned(),
            m.at_str(&["metadata", "namespace"])
                .unwrap_or("default")
                .to_owned(),
        ))
    };
    let wanted = key(&object);
    match docs.iter().position(|d| key(d) == wanted) {
        // A ServiceAccount of that name is someone's (its annotations,
        // imagePullSecrets): kept as it is.
        Some(_) if wanted.as_ref().is_some_and(|k| k.0 == "ServiceAccount") => {}
        Some(at) => docs[at] = object,
        None => docs.push(object),
    }
}
