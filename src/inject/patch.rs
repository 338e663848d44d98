//! `inject --patch DIR`: what `inject` changed, as a kustomization over the
//! untouched input, for GitOps repositories that keep the upstream file as
//! it is. DIR gets `kustomization.yaml` (the input and the added objects as
//! resources, one strategic-merge patch per changed object),
//! `leader-gate.yaml` (the objects `inject` added) and one
//! `leader-gate-patch-KIND-NAME.yaml` per changed object;
//! `kubectl kustomize DIR` renders what `inject` prints, but for the order
//! of list items merged by key (kustomize puts added containers, volumes
//! and mounts before the ones it had), which no pod depends on.

use std::path::{Component, Path, PathBuf};

use super::yaml::{Map, Node, write_one, write_stream};

/// What identifies an object in a stream: apiVersion, kind, name, namespace.
type Identity = (String, String, String, String);

/// What identifies an object in a stream.
fn identity(doc: &Node) -> Option<Identity> {
    let m = doc.as_map()?;
    Some((
        m.str("apiVersion").unwrap_or("").to_owned(),
        m.str("kind")?.to_owned(),
        m.at_str(&["metadata", "name"])?.to_owned(),
        m.at_str(&["metadata", "namespace"])
            .unwrap_or("")
            .to_owned(),
    ))
}

/// Kubernetes' own kinds merge lists by key under a strategic-merge patch;
/// a custom resource's patch replaces whole lists (kustomize knows no
/// merge keys for it).
fn built_in(api_version: &str) -> bool {
    !api_version.contains('.')
        || api_version.ends_with(".k8s.io/v1")
        || api_version.starts_with("apps/")
}

/// The key a strategic-merge patch merges a list's items by, for the lists
/// a pod spec holds.
fn merge_key(field: &str) -> Option<&'static str> {
    match field {
        "containers" | "initContainers" | "volumes" | "env" | "imagePullSecrets" => Some("name"),
        "volumeMounts" => Some("mountPath"),
        "ports" => Some("containerPort"),
        _ => None,
    }
}

/// The patch that turns `old` into `new`, `None` when they are equal.
/// `smp`: merge the lists that have a merge key by it.
pub fn diff(old: &Node, new: &Node, field: &str, smp: bool) -> Option<Node> {
    if old == new {
        return None;
    }
    match (old, new) {
        (Node::Map(o), Node::Map(n)) => {
            let mut out = Map::default();
            for (key, value) in &n.0 {
                match o.get(key) {
                    Some(was) => {
                        if let Some(d) = diff(was, value, key, smp) {
                            out.insert(key, d);
                        }
                    }
                    None => out.insert(key, value.clone()),
                }
            }
            for (key, _) in &o.0 {
                if n.get(key).is_none() {
                    // A strategic-merge and a JSON merge patch both delete by null.
                    out.insert(key, Node::Null);
                }
            }
            Some(Node::Map(out))
        }
        (Node::Seq(o), Node::Seq(n)) if smp => match merge_key(field) {
            Some(key) => Some(merge_list(o, n, key, smp)),
            None => Some(new.clone()),
        },
        _ => Some(new.clone()),
    }
}

/// A list patch by merge key: changed items as their own patches (with
/// their key), new ones whole, removed ones as `$patch: delete`.
fn merge_list(old: &[Node], new: &[Node], key: &str, smp: bool) -> Node {
    let key_of = |n: &Node| n.as_map().and_then(|m| m.get(key)).cloned();
    let mut out = Vec::new();
    for item in new {
        let k = key_of(item);
        match old.iter().find(|o| k.is_some() && key_of(o) == k) {
            Some(was) => {
                if let Some(Node::Map(mut d)) = diff(was, item, "", smp) {
                    let mut patch = Map::default();
                    patch.insert(key, k.clone().unwrap_or(Node::Null));
                    d.0.retain(|(name, _)| name != key);
                    patch.0.extend(d.0);
                    out.push(Node::Map(patch));
                }
            }
            None => out.push(item.clone()),
        }
    }
    for was in old {
        let k = key_of(was);
        if k.is_some() && !new.iter().any(|n| key_of(n) == k) {
            let mut gone = Map::default();
            gone.insert(key, k.unwrap_or(Node::Null));
            gone.insert("$patch", Node::str("delete"));
            out.push(Node::Map(gone));
        }
    }
    Node::Seq(out)
}

/// Moves every `initContainers` list out of `patch`, returning it whole
/// from `doc` with its JSON pointer.
fn take_init_containers(
    patch: &mut Map,
    doc: &Node,
    path: &mut Vec<String>,
    out: &mut Vec<(String, Node)>,
) {
    if patch.remove("initContainers").is_some() {
        let keys: Vec<&str> = path.iter().map(String::as_str).collect();
        if let Some(list) = doc.at(&keys).and_then(|m| m.get("initContainers")) {
            let pointer: String = path.iter().map(|k| format!("/{k}")).collect();
            out.push((format!("{pointer}/initContainers"), list.clone()));
        }
    }
    for (key, value) in &mut patch.0 {
        if let Node::Map(inner) = value {
            path.push(key.clone());
            take_init_containers(inner, doc, path, out);
            path.pop();
        }
    }
}

/// The files of DIR: (name, text), `input` being the input file's path
/// as the kustomization names it.
pub fn files(original: &[Node], gated: &[Node], input: &str) -> Vec<(String, String)> {
    let mut added = Vec::new();
    let mut patches = Vec::new();
    let mut json_patches: Vec<(String, String, Identity)> = Vec::new();
    for doc in gated {
        let Some(id) = identity(doc) else { continue };
        match original.iter().find(|o| identity(o).as_ref() == Some(&id)) {
            None => added.push(doc.clone()),
            Some(was) => {
                let smp = built_in(&id.0);
                let Some(Node::Map(mut patch)) = diff(was, doc, "", smp) else {
                    continue;
                };
                // Init containers run in their order, which a strategic-merge
                // patch does not keep (kustomize puts added ones first): the
                // whole list goes in a JSON patch of its own.
                let mut orders = Vec::new();
                if smp {
                    take_init_containers(&mut patch, doc, &mut Vec::new(), &mut orders);
                }
                if !orders.is_empty() {
                    let file = format!(
                        "leader-gate-patch-{}-{}-init.yaml",
                        id.1.to_lowercase(),
                        id.2
                    );
                    let ops: Vec<Node> = orders
                        .into_iter()
                        .map(|(pointer, list)| {
                            let mut op = Map::default();
                            op.insert("op", Node::str("add"));
                            op.insert("path", Node::str(pointer));
                            op.insert("value", list);
                            Node::Map(op)
                        })
                        .collect();
                    json_patches.push((file, write_one(&Node::Seq(ops)), id.clone()));
                }
                // The patch names its target.
                let mut head = Map::default();
                head.insert("apiVersion", Node::str(&id.0));
                head.insert("kind", Node::str(&id.1));
                let mut metadata = Map::default();
                metadata.insert("name", Node::str(&id.2));
                if !id.3.is_empty() {
                    metadata.insert("namespace", Node::str(&id.3));
                }
                head.insert("metadata", Node::Map(metadata));
                if let Some(Node::Map(meta)) = patch.remove("metadata")
                    && let Some(Node::Map(head_meta)) = head.get_mut("metadata")
                {
                    head_meta.0.extend(
                        meta.0
                            .into_iter()
                            .filter(|(k, _)| k != "name" && k != "namespace"),
                    );
                }
                patch.0.retain(|(k, _)| k != "apiVersion" && k != "kind");
                head.0.extend(patch.0);
                let file = format!("leader-gate-patch-{}-{}.yaml", id.1.to_lowercase(), id.2);
                patches.push((file, write_one(&Node::Map(head))));
            }
        }
    }
    let mut kustomization = String::from(
        "# Written by `leader-gate inject --patch`: the input as it is, with\n# leader-gate's objects and patches. `kubectl kustomize` renders it.\napiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources:\n",
    );
    kustomization.push_str(&format!(
        "  - {}\n",
        serde_json::to_string(input).expect("a string")
    ));
    if !added.is_empty() {
        kustomization.push_str("  - leader-gate.yaml\n");
    }
    if !patches.is_empty() || !json_patches.is_empty() {
        kustomization.push_str("patches:\n");
        for (file, _) in &patches {
            kustomization.push_str(&format!("  - path: {file}\n"));
        }
        for (file, _, (api, kind, name, namespace)) in &json_patches {
            let (group, version) = api.rsplit_once('/').unwrap_or(("", api));
            kustomization.push_str(&format!(
                "  - path: {file}\n    target: {{group: {}, version: {version}, kind: {kind}, name: {}{}}}\n",
                super::pod::q(group),
                super::pod::q(name),
                if namespace.is_empty() { String::new() } else { format!(", namespace: {}", super::pod::q(namespace)) }
            ));
        }
    }
    let mut out = vec![("kustomization.yaml".to_owned(), kustomization)];
    if !added.is_empty() {
        out.push(("leader-gate.yaml".to_owned(), write_stream(&added)));
    }
    out.extend(patches);
    out.extend(json_patches.into_iter().map(|(file, text, _)| (file, text)));
    out
}

/// `target` as seen from directory `from` (both made absolute first).
pub fn relative(target: &Path, from: &Path) -> PathBuf {
    let absolute = |p: &Path| {
        let p = if p.is_absolute() {
            p.to_path_buf()
        } else {
            std::env::current_dir().unwrap_or_default().join(p)
        };
        // Lexically: `..` and `.` resolved without touching the disk.
        let mut out = PathBuf::new();
        for c in p.components() {
            match c {
                Component::ParentDir => {
                    out.pop();
                }
                Component::CurDir => {}
                other => out.push(other),
            }
        }
        out
    };
    let (target, from) = (absolute(target), absolute(from));
    let common = target
        .components()
        .zip(from.components())
        .take_while(|(a, b)| a == b)
        .count();
    let mut out = PathBuf::new();
    for _ in from.components().skip(common) {
        out.push("..");
    }
    for c in target.components().skip(common) {
        out.push(c);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::inject::yaml::read_one;

    #[test]
    fn a_container_list_is_patched_by_name_and_command_replaced_whole() {
        let old =
            read_one("{containers: [{name: a, image: x, command: [p, q]}, {name: b, image: y}]}")
                .unwrap();
        let new = read_one("{containers: [{name: a, image: x, command: [w, p, q]}, {name: b, image: y}, {name: c, image: z}]}").unwrap();
        let d = diff(&old, &new, "", true).unwrap();
        assert_eq!(
            d,
            read_one("{containers: [{name: a, command: [w, p, q]}, {name: c, image: z}]}").unwrap()
        );
        // A custom resource's list is replaced whole.
        assert_eq!(
            diff(&old, &new, "", false)
                .unwrap()
                .as_map()
                .unwrap()
                .get("containers"),
            new.as_map().unwrap().get("containers")
        );
    }

    #[test]
    fn removed_keys_and_items_are_deleted_in_the_patch() {
        let old = read_one("{probe: {x: 1}, volumes: [{name: v, emptyDir: {}}], keep: 1}").unwrap();
        let new = read_one("{volumes: [], keep: 1}").unwrap();
        assert_eq!(
            diff(&old, &new, "", true).unwrap(),
            read_one("{volumes: [{name: v, $patch: delete}], probe: null}").unwrap()
        );
        assert_eq!(diff(&new, &new, "", true), None);
    }

    #[test]
    fn paths_are_relative_to_the_kustomization() {
        assert_eq!(
            relative(Path::new("/a/b/up.yaml"), Path::new("/a/c/d")),
            PathBuf::from("../../b/up.yaml")
        );
        assert_eq!(
            relative(Path::new("/a/up.yaml"), Path::new("/a")),
            PathBuf::from("up.yaml")
        );
    }
}
