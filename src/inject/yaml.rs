//! Kubernetes YAML as `inject` reads and writes it: a [`Node`] tree that
//! keeps every mapping's keys in their order (so what `inject` does not own
//! comes back as it went in, comments aside), read from one document or a
//! multi-document stream and written back as a stream.

use std::fmt;

use serde::de::{self, Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};
use serde::ser::{Serialize, SerializeMap, SerializeSeq, Serializer};

/// One YAML value. Mapping keys are strings, as every Kubernetes object's are.
#[derive(Clone, Debug, PartialEq)]
pub enum Node {
    Null,
    Bool(bool),
    Int(i64),
    Uint(u64),
    Float(f64),
    Str(String),
    Seq(Vec<Node>),
    Map(Map),
}

/// A mapping in its written order.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Map(pub Vec<(String, Node)>);

impl Map {
    pub fn get(&self, key: &str) -> Option<&Node> {
        self.0.iter().find(|(k, _)| k == key).map(|(_, v)| v)
    }

    pub fn get_mut(&mut self, key: &str) -> Option<&mut Node> {
        self.0.iter_mut().find(|(k, _)| k == key).map(|(_, v)| v)
    }

    /// Sets `key`, in place when it exists, else at the end.
    pub fn insert(&mut self, key: &str, value: Node) {
        match self.get_mut(key) {
            Some(slot) => *slot = value,
            None => self.0.push((key.to_owned(), value)),
        }
    }

    pub fn remove(&mut self, key: &str) -> Option<Node> {
        let at = self.0.iter().position(|(k, _)| k == key)?;
        Some(self.0.remove(at).1)
    }

    /// The value at `key`, made a mapping (inserted empty when missing or null).
    pub fn map_entry(&mut self, key: &str) -> &mut Map {
        if !matches!(self.get(key), Some(Node::Map(_))) {
            self.insert(key, Node::Map(Map::default()));
        }
        match self.get_mut(key) {
            Some(Node::Map(map)) => map,
            _ => unreachable!("just made a mapping"),
        }
    }

    /// The value at `key`, made a sequence (inserted empty when missing or null).
    pub fn seq_entry(&mut self, key: &str) -> &mut Vec<Node> {
        if !matches!(self.get(key), Some(Node::Seq(_))) {
            self.insert(key, Node::Seq(Vec::new()));
        }
        match self.get_mut(key) {
            Some(Node::Seq(seq)) => seq,
            _ => unreachable!("just made a sequence"),
        }
    }

    pub fn str(&self, key: &str) -> Option<&str> {
        self.get(key).and_then(Node::as_str)
    }

    pub fn map(&self, key: &str) -> Option<&Map> {
        self.get(key).and_then(Node::as_map)
    }

    pub fn map_mut(&mut self, key: &str) -> Option<&mut Map> {
        self.get_mut(key).and_then(Node::as_map_mut)
    }

    /// The mapping at the end of `path` (keys through mappings).
    pub fn at(&self, path: &[&str]) -> Option<&Map> {
        let mut map = self;
        for key in path {
            map = map.map(key)?;
        }
        Some(map)
    }

    /// The string at the end of `path` (keys through mappings).
    pub fn at_str(&self, path: &[&str]) -> Option<&str> {
        let (last, through) = path.split_last()?;
        let mut map = self;
        for key in through {
            map = map.map(key)?;
        }
        map.str(last)
    }

    /// The value at `path` written either way a Beat reads it: nested
    /// (`metricbeat: {autodiscover: …}`) or with dotted keys
    /// (`metricbeat.autodiscover: …`), or any mix.
    pub fn dotted(&self, path: &[&str]) -> Option<&Node> {
        (1..=path.len()).find_map(|i| {
            let value = self.get(&path[..i].join("."))?;
            match &path[i..] {
                [] => Some(value),
                rest => value.as_map()?.dotted(rest),
            }
        })
    }

    /// [`Map::dotted`], to change it.
    pub fn dotted_mut(&mut self, path: &[&str]) -> Option<&mut Node> {
        let i = (1..=path.len()).find(|&i| {
            let Some(value) = self.get(&path[..i].join(".")) else {
                return false;
            };
            i == path.len()
                || value
                    .as_map()
                    .is_some_and(|m| m.dotted(&path[i..]).is_some())
        })?;
        let value = self.get_mut(&path[..i].join("."))?;
        match &path[i..] {
            [] => Some(value),
            rest => value.as_map_mut()?.dotted_mut(rest),
        }
    }

    pub fn seq(&self, key: &str) -> &[Node] {
        self.get(key).and_then(Node::as_seq).unwrap_or(&[])
    }
}

impl Node {
    pub fn str(value: impl Into<String>) -> Node {
        Node::Str(value.into())
    }

    pub fn as_str(&self) -> Option<&str> {
        match self {
            Node::Str(s) => Some(s),
            _ => None,
        }
    }

    pub fn as_map(&self) -> Option<&Map> {
        match self {
            Node::Map(map) => Some(map),
            _ => None,
        }
    }

    pub fn as_map_mut(&mut self) -> Option<&mut Map> {
        match self {
            Node::Map(map) => Some(map),
            _ => None,
        }
    }

    pub fn as_seq(&self) -> Option<&[Node]> {
        match self {
            Node::Seq(seq) => Some(seq),
            _ => None,
        }
    }

    pub fn as_seq_mut(&mut self) -> Option<&mut Vec<Node>> {
        match self {
            Node::Seq(seq) => Some(seq),
            _ => None,
        }
    }

    pub fn as_u64(&self) -> Option<u64> {
        match *self {
            Node::Int(i) => u64::try_from(i).ok(),
            Node::Uint(u) => Some(u),
            _ => None,
        }
    }

    /// The string at the end of `path` (keys through mappings).
    pub fn at_str_path(&self, path: &[&str]) -> Option<&str> {
        self.as_map()?.at_str(path)
    }

    /// The mapping at the end of `path` (keys), if every step is one.
    pub fn at(&self, path: &[&str]) -> Option<&Map> {
        let mut map = self.as_map()?;
        for key in path {
            map = map.map(key)?;
        }
        Some(map)
    }

    pub fn at_mut(&mut self, path: &[&str]) -> Option<&mut Map> {
        let mut map = self.as_map_mut()?;
        for key in path {
            map = map.map_mut(key)?;
        }
        Some(map)
    }
}

/// A YAML text that is not a stream of Kubernetes documents.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct YamlError(String);

/// Read as the API server's YAML reader (YAML 1.1) reads: `0444` is octal
/// (a volume's `defaultMode`), `yes`/`on` are booleans.
fn options() -> serde_saphyr::Options {
    let mut options = serde_saphyr::Options::default();
    options.legacy_octal_numbers = true;
    options
}

/// Every document of a stream; empty documents (a trailing `---`) dropped.
pub fn read_stream(text: &str) -> Result<Vec<Node>, YamlError> {
    let docs: Vec<Node> = serde_saphyr::from_multiple_with_options(text, options())
        .map_err(|e| YamlError(e.to_string()))?;
    Ok(docs.into_iter().filter(|d| *d != Node::Null).collect())
}

/// One document (the text inside a ConfigMap's value, say).
pub fn read_one(text: &str) -> Result<Node, YamlError> {
    serde_saphyr::from_str_with_options(text, options()).map_err(|e| YamlError(e.to_string()))
}

/// One document as YAML text, ending in a newline.
pub fn write_one(node: &Node) -> String {
    let mut options = serde_saphyr::SerializerOptions::default();
    // A long one-line string (a file gate's SRC:DST) stays one plain line.
    options.min_fold_chars = usize::MAX;
    let mut out =
        serde_saphyr::to_string_with_options(node, options).expect("a Node always serializes");
    if !out.ends_with('\n') {
        out.push('\n');
    }
    out
}

/// Documents as a stream: each after a `---` line.
pub fn write_stream(docs: &[Node]) -> String {
    let mut out = String::new();
    for doc in docs {
        out.push_str("---\n");
        out.push_str(&write_one(doc));
    }
    out
}

impl Serialize for Node {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            Node::Null => s.serialize_unit(),
            Node::Bool(b) => s.serialize_bool(*b),
            Node::Int(i) => s.serialize_i64(*i),
            Node::Uint(u) => s.serialize_u64(*u),
            Node::Float(f) => s.serialize_f64(*f),
            Node::Str(v) => s.serialize_str(v),
            Node::Seq(items) => {
                let mut seq = s.serialize_seq(Some(items.len()))?;
                for item in items {
                    seq.serialize_element(item)?;
                }
                seq.end()
            }
            Node::Map(map) => map.serialize(s),
        }
    }
}

impl Serialize for Map {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut out = s.serialize_map(Some(self.0.len()))?;
        for (k, v) in &self.0 {
            out.serialize_entry(k, v)?;
        }
        out.end()
    }
}

impl<'de> Deserialize<'de> for Node {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Node, D::Error> {
        d.deserialize_any(NodeVisitor)
    }
}

struct NodeVisitor;

impl<'de> Visitor<'de> for NodeVisitor {
    type Value = Node;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a YAML value")
    }

    fn visit_bool<E>(self, v: bool) -> Result<Node, E> {
        Ok(Node::Bool(v))
    }
    fn visit_i64<E>(self, v: i64) -> Result<Node, E> {
        Ok(Node::Int(v))
    }
    fn visit_u64<E>(self, v: u64) -> Result<Node, E> {
        Ok(match i64::try_from(v) {
            Ok(i) => Node::Int(i),
            Err(_) => Node::Uint(v),
        })
    }
    fn visit_f64<E>(self, v: f64) -> Result<Node, E> {
        Ok(Node::Float(v))
    }
    fn visit_str<E>(self, v: &str) -> Result<Node, E> {
        Ok(Node::Str(v.to_owned()))
    }
    fn visit_string<E>(self, v: String) -> Result<Node, E> {
        Ok(Node::Str(v))
    }
    fn visit_unit<E>(self) -> Result<Node, E> {
        Ok(Node::Null)
    }
    fn visit_none<E>(self) -> Result<Node, E> {
        Ok(Node::Null)
    }
    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Node, D::Error> {
        Node::deserialize(d)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Node, A::Error> {
        let mut items = Vec::new();
        while let Some(item) = seq.next_element()? {
            items.push(item);
        }
        Ok(Node::Seq(items))
    }
    fn visit_map<A: MapAccess<'de>>(self, mut access: A) -> Result<Node, A::Error> {
        let mut map = Map::default();
        while let Some(key) = access.next_key::<Node>()? {
            let key = match key {
                Node::Str(s) => s,
                Node::Bool(b) => b.to_string(),
                Node::Int(i) => i.to_string(),
                Node::Uint(u) => u.to_string(),
                Node::Float(f) => f.to_string(),
                Node::Null => "null".to_owned(),
                Node::Seq(_) | Node::Map(_) => {
                    return Err(de::Error::custom("a mapping key that is not a scalar"));
                }
            };
            let value = access.next_value()?;
            if map.get(&key).is_some() {
                return Err(de::Error::custom(format!(
                    "the key {key:?} twice in one mapping"
                )));
            }
            map.0.push((key, value));
        }
        Ok(Node::Map(map))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stream_comes_back_in_its_order() {
        let text = "b: 1\na: {z: x, m: [1, two, 3.5, null, true]}\n---\n---\nkind: X\n";
        let docs = read_stream(text).unwrap();
        assert_eq!(docs.len(), 2);
        let out = write_stream(&docs);
        assert_eq!(read_stream(&out).unwrap(), docs);
        assert!(out.find("b:").unwrap() < out.find("a:").unwrap(), "{out}");
        assert!(out.find("z:").unwrap() < out.find("m:").unwrap(), "{out}");
    }
}
