//! The Lease store: objects, the global resourceVersion, watch history and watch fan-out.
//!
//! Every method runs under the server's one lock and never awaits.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::Arc;

use serde_json::{Map, Value, json};
use tokio::sync::{mpsc, watch};

use super::status::{self, API_VERSION, ApiError, FieldError};

/// The first resourceVersion of the first server (real clusters are never at 0).
pub(super) const INITIAL_RV: u64 = 1000;
/// Each later server of the process starts this much higher, so that a client that
/// carries a resourceVersion over from an earlier server gets 410 `Expired` (and re-lists)
/// rather than "too large resource version".
const RV_STRIDE: u64 = 1_000_000;
static NEXT_BASE: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(INITIAL_RV);
const DEFAULT_HISTORY_LIMIT: usize = 1000;

/// The type of a stored change.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum EventType {
    Added,
    Modified,
    Deleted,
}

impl EventType {
    pub(super) fn as_str(self) -> &'static str {
        match self {
            EventType::Added => "ADDED",
            EventType::Modified => "MODIFIED",
            EventType::Deleted => "DELETED",
        }
    }
}

/// One committed change, kept in the history and sent to every open watch.
#[derive(Debug)]
pub(super) struct StoredEvent {
    pub rv: u64,
    pub ty: EventType,
    pub ns: String,
    pub name: String,
    /// The new state (for a delete: the last state, with the deletion's resourceVersion).
    pub obj: Value,
    /// The state before the change (`None` for a create).
    pub prev: Option<Value>,
    /// `obj` serialized once.
    pub json: String,
}

/// A control message for the watches of one client.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum WatchSignal {
    /// End the stream now, abruptly.
    Drop,
    /// Send an ERROR 410 event and end the stream.
    Expire,
}

/// What a watch task receives.
#[derive(Debug)]
pub(super) enum WatchMsg {
    Event(Arc<StoredEvent>),
    Signal(WatchSignal),
}

struct WatcherReg {
    id: u64,
    client: String,
    tx: mpsc::UnboundedSender<WatchMsg>,
}

/// A label selector requirement (equality-based selectors only).
#[derive(Clone, Debug)]
pub(super) enum LabelReq {
    Eq(String, String),
    NotEq(String, String),
    Exists(String),
    NotExists(String),
}

/// Which objects a list or watch selects.
#[derive(Clone, Debug, Default)]
pub(super) struct Filter {
    /// `None`: all namespaces.
    pub ns: Option<String>,
    /// From `fieldSelector=metadata.name=...`.
    pub name: Option<String>,
    /// From `fieldSelector=metadata.namespace=...`.
    pub field_ns: Option<String>,
    pub labels: Vec<LabelReq>,
}

impl Filter {
    pub(super) fn matches(&self, obj: &Value) -> bool {
        let meta = &obj["metadata"];
        let ns = meta["namespace"].as_str().unwrap_or("");
        let name = meta["name"].as_str().unwrap_or("");
        if self.ns.as_deref().is_some_and(|n| n != ns)
            || self.field_ns.as_deref().is_some_and(|n| n != ns)
            || self.name.as_deref().is_some_and(|n| n != name)
        {
            return false;
        }
        let label = |k: &str| meta["labels"][k].as_str().map(str::to_string);
        self.labels.iter().all(|r| match r {
            LabelReq::Eq(k, v) => label(k).as_deref() == Some(v.as_str()),
            LabelReq::NotEq(k, v) => label(k).as_deref() != Some(v.as_str()),
            LabelReq::Exists(k) => label(k).is_some(),
            LabelReq::NotExists(k) => label(k).is_none(),
        })
    }
}

/// Where a new watch starts.
#[derive(Clone, Copy, Debug)]
pub(super) enum WatchFrom {
    /// `resourceVersion` unset or `"0"`: synthetic ADDED events for the current state.
    Current,
    /// `sendInitialEvents=true`: ADDED events, then a BOOKMARK marking their end.
    InitialEvents,
    /// Every change after this resourceVersion.
    Rv(u64),
}

/// A registered watch: its id, its channel, what to send first and its starting point.
pub(super) struct WatchStart {
    pub id: u64,
    pub rx: mpsc::UnboundedReceiver<WatchMsg>,
    pub initial: Vec<String>,
    pub start_rv: u64,
}

/// The store at one instant ([`Store::snapshot`]).
#[derive(Clone, Debug)]
pub struct StoreSnapshot {
    rv: u64,
    objects: BTreeMap<(String, String), Value>,
    history: VecDeque<Arc<StoredEvent>>,
    oldest: u64,
}

/// The Lease store.
pub(super) struct Store {
    rv: u64,
    objects: BTreeMap<(String, String), Value>,
    history: VecDeque<Arc<StoredEvent>>,
    /// The oldest resourceVersion a watch or exact list may start from.
    oldest: u64,
    history_limit: usize,
    watchers: Vec<WatcherReg>,
    next_watch_id: u64,
    changed: watch::Sender<u64>,
    /// The CoordinatedLeaderElection feature gate. Off (the default, as on
    /// v1.36 clusters unless enabled), the real API server drops
    /// `spec.strategy` and `spec.preferredHolder` from a create, and from an
    /// update whose stored object lacks them (lease strategy.go,
    /// PrepareForCreate / PrepareForUpdate).
    pub(super) coordinated_leader_election: bool,
}

impl Store {
    pub(super) fn new() -> Store {
        let base = NEXT_BASE.fetch_add(RV_STRIDE, std::sync::atomic::Ordering::SeqCst);
        Store {
            rv: base,
            objects: BTreeMap::new(),
            history: VecDeque::new(),
            oldest: base,
            history_limit: DEFAULT_HISTORY_LIMIT,
            watchers: Vec::new(),
            next_watch_id: 0,
            changed: watch::channel(base).0,
            coordinated_leader_election: false,
        }
    }

    pub(super) fn rv(&self) -> u64 {
        self.rv
    }

    /// A new resourceVersion for a write outside the Lease store (an Event): the counter
    /// moves and waiters see it, but Lease watches get nothing (Events are not watched).
    pub(super) fn bump_rv(&mut self) -> u64 {
        self.rv += 1;
        self.changed.send_replace(self.rv);
        self.rv
    }

    pub(super) fn oldest(&self) -> u64 {
        self.oldest
    }

    /// A receiver that sees every change of the resourceVersion.
    pub(super) fn subscribe(&self) -> watch::Receiver<u64> {
        self.changed.subscribe()
    }

    pub(super) fn get(&self, ns: &str, name: &str) -> Option<&Value> {
        self.objects.get(&(ns.to_string(), name.to_string()))
    }

    pub(super) fn list_namespace(&self, ns: &str) -> Vec<Value> {
        self.objects
            .iter()
            .filter(|((n, _), _)| n == ns)
            .map(|(_, v)| v.clone())
            .collect()
    }

    pub(super) fn compact(&mut self) {
        self.history.clear();
        self.oldest = self.rv;
    }

    pub(super) fn set_history_limit(&mut self, n: usize) {
        self.history_limit = n;
        self.trim_history();
    }

    fn trim_history(&mut self) {
        while self.history.len() > self.history_limit {
            if let Some(e) = self.history.pop_front() {
                self.oldest = e.rv;
            }
        }
    }

    /// The objects, their resourceVersion and the watch history as they are
    /// now (an etcd snapshot), for [`Store::restore`].
    pub(super) fn snapshot(&self) -> StoreSnapshot {
        StoreSnapshot {
            rv: self.rv,
            objects: self.objects.clone(),
            history: self.history.clone(),
            oldest: self.oldest,
        }
    }

    /// Back to `snapshot`, as etcd restored without `--bump-revision`: the
    /// same objects (same uids) at their older resourceVersions, and the
    /// counter goes on from the snapshot's. Every open watch ends, as the API
    /// servers restart onto the restored etcd; a watch resumed from a newer
    /// resourceVersion then waits for it and gets 504 (too large).
    pub(super) fn restore(&mut self, snapshot: &StoreSnapshot) {
        self.rv = snapshot.rv;
        self.objects = snapshot.objects.clone();
        self.history = snapshot.history.clone();
        self.oldest = snapshot.oldest;
        self.watchers.clear();
        self.changed.send_replace(self.rv);
    }

    // ----- watches -----

    pub(super) fn open_watches(&self, client: Option<&str>) -> usize {
        self.watchers
            .iter()
            .filter(|w| !w.tx.is_closed() && client.is_none_or(|c| c == w.client))
            .count()
    }

    pub(super) fn signal_watches(&mut self, client: &str, signal: WatchSignal) {
        self.watchers
            .retain(|w| w.client != client || w.tx.send(WatchMsg::Signal(signal)).is_ok());
    }

    pub(super) fn unregister_watch(&mut self, id: u64) {
        self.watchers.retain(|w| w.id != id);
    }

    /// Registers a watch. Fails with the 410 `Expired` Status if `from` is older than the
    /// retained history (exchange 13); the caller sends it as an ERROR event.
    pub(super) fn start_watch(
        &mut self,
        client: &str,
        filter: &Filter,
        from: WatchFrom,
    ) -> Result<WatchStart, ApiError> {
        let mut initial = Vec::new();
        match from {
            WatchFrom::Current | WatchFrom::InitialEvents => {
                for obj in self.objects.values().filter(|o| filter.matches(o)) {
                    initial.push(event_line("ADDED", &to_json(obj)));
                }
                if let WatchFrom::InitialEvents = from {
                    initial.push(bookmark_line(self.rv, true));
                }
            }
            WatchFrom::Rv(rv) => {
                if rv < self.oldest {
                    return Err(status::expired(rv, self.oldest));
                }
                for e in self.history.iter().filter(|e| e.rv > rv) {
                    if let Some(line) = render_event(filter, e) {
                        initial.push(line);
                    }
                }
            }
        }
        let (tx, rx) = mpsc::unbounded_channel();
        self.next_watch_id += 1;
        let id = self.next_watch_id;
        self.watchers.push(WatcherReg {
            id,
            client: client.to_string(),
            tx,
        });
        Ok(WatchStart {
            id,
            rx,
            initial,
            start_rv: self.rv,
        })
    }

    // ----- reads -----

    /// The objects as they were at `rv` (reconstructed from the history).
    fn state_at(&self, rv: u64) -> Result<BTreeMap<(String, String), Value>, ApiError> {
        if rv < self.oldest {
            return Err(status::expired(rv, self.oldest));
        }
        let mut objects = self.objects.clone();
        for e in self.history.iter().rev().take_while(|e| e.rv > rv) {
            let key = (e.ns.clone(), e.name.clone());
            match &e.prev {
                Some(p) => objects.insert(key, p.clone()),
                None => objects.remove(&key),
            };
        }
        Ok(objects)
    }

    /// A `LeaseList` (exchange 09): items without `kind`/`apiVersion`, `metadata.resourceVersion`
    /// the point to watch from. `exact_rv` serves `resourceVersionMatch=Exact`; the caller has
    /// already waited for a resourceVersion newer than the store's.
    pub(super) fn list(
        &self,
        filter: &Filter,
        exact_rv: Option<u64>,
        limit: Option<usize>,
        continue_token: Option<&str>,
    ) -> Result<Value, ApiError> {
        let (list_rv, after) = match continue_token {
            Some(tok) => {
                let (rv, after) = decode_continue(tok)
                    .ok_or_else(|| status::bad_request("continue key is not valid"))?;
                (rv, Some(after))
            }
            None => (exact_rv.unwrap_or(self.rv), None),
        };
        let snapshot;
        let objects = if list_rv == self.rv {
            &self.objects
        } else {
            snapshot = self.state_at(list_rv).map_err(|e| {
                if continue_token.is_some() {
                    status::continue_expired()
                } else {
                    e
                }
            })?;
            &snapshot
        };
        let mut matching = objects
            .iter()
            .filter(|(k, o)| {
                filter.matches(o) && after.as_ref().is_none_or(|a| k.0.clone() + "/" + &k.1 > *a)
            })
            .peekable();
        let mut items = Vec::new();
        let mut last_key = None;
        let limit = limit.filter(|l| *l > 0);
        for (k, o) in matching.by_ref() {
            let mut item = o.clone();
            if let Some(m) = item.as_object_mut() {
                m.remove("kind");
                m.remove("apiVersion");
            }
            items.push(item);
            last_key = Some(format!("{}/{}", k.0, k.1));
            if limit.is_some_and(|l| items.len() >= l) {
                break;
            }
        }
        let mut meta = json!({ "resourceVersion": list_rv.to_string() });
        if matching.peek().is_some()
            && let Some(last) = last_key
        {
            meta["continue"] = json!(encode_continue(list_rv, &last));
        }
        Ok(json!({
            "kind": "LeaseList",
            "apiVersion": API_VERSION,
            "metadata": meta,
            "items": items,
        }))
    }

    // ----- writes -----

    /// POST: creates a Lease (exchanges 02, 03).
    pub(super) fn create(
        &mut self,
        ns: &str,
        body: Value,
        manager: &str,
        dry_run: bool,
    ) -> Result<Value, ApiError> {
        self.create_as(ns, body, manager, "Update", dry_run)
    }

    /// A create whose managedFields entry has `operation` (`Update` for a POST, `Apply`
    /// for a server-side apply of an absent object).
    fn create_as(
        &mut self,
        ns: &str,
        body: Value,
        manager: &str,
        operation: &str,
        dry_run: bool,
    ) -> Result<Value, ApiError> {
        let mut obj = decode_lease(body)?;
        let meta = obj["metadata"].as_object_mut().expect("decoded metadata");
        match meta.get("namespace").and_then(Value::as_str) {
            Some(n) if !n.is_empty() && n != ns => {
                return Err(status::bad_request(
                    "the namespace of the provided object does not match the namespace sent on the request",
                ));
            }
            _ => {
                meta.insert("namespace".into(), json!(ns));
            }
        }
        let mut name = meta
            .get("name")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string();
        if name.is_empty()
            && let Some(g) = meta.get("generateName").and_then(Value::as_str)
            && !g.is_empty()
        {
            name = format!("{g}{}", random_suffix());
            meta.insert("name".into(), json!(name));
        }
        if !self.coordinated_leader_election
            && let Some(spec) = obj["spec"].as_object_mut()
        {
            spec.remove("strategy");
            spec.remove("preferredHolder");
        }
        validate(&name, &obj, true)?;
        let meta = obj["metadata"].as_object_mut().expect("decoded metadata");
        if meta
            .get("resourceVersion")
            .and_then(Value::as_str)
            .is_some_and(|rv| !rv.is_empty())
        {
            return Err(status::unknown_500(
                "resourceVersion should not be set on objects to be created",
            ));
        }
        if self.get(ns, &name).is_some() {
            return Err(status::already_exists(&name));
        }
        let now = k8s_time_now();
        meta.insert("uid".into(), json!(random_uid()));
        meta.insert("creationTimestamp".into(), json!(now));
        for k in [
            "deletionTimestamp",
            "deletionGracePeriodSeconds",
            "selfLink",
        ] {
            meta.remove(k);
        }
        let fields = field_paths(&obj);
        let mut entry = managed_entry(manager, &now, &fields);
        entry["operation"] = json!(operation);
        obj["metadata"]["managedFields"] = json!([entry]);
        if dry_run {
            obj["metadata"]["resourceVersion"] = json!(self.rv.to_string());
            return Ok(obj);
        }
        Ok(self.commit(EventType::Added, ns, &name, Some(obj)))
    }

    /// PUT: replaces a Lease (exchanges 05 to 08). `name` is the name in the URL.
    pub(super) fn update(
        &mut self,
        ns: &str,
        name: &str,
        body: Value,
        manager: &str,
        dry_run: bool,
    ) -> Result<Value, ApiError> {
        let mut obj = decode_lease(body)?;
        check_name_and_namespace(&mut obj, ns, name)?;
        let Some(existing) = self.get(ns, name).cloned() else {
            return Err(status::not_found(name));
        };
        let existing_uid = existing["metadata"]["uid"]
            .as_str()
            .unwrap_or("")
            .to_string();
        if let Some(uid) = obj["metadata"]["uid"].as_str()
            && !uid.is_empty()
            && uid != existing_uid
        {
            return Err(status::conflict_with(
                name,
                &format!(
                    "Precondition failed: UID in precondition: {uid}, UID in object meta: {existing_uid}"
                ),
            ));
        }
        let rv = match obj["metadata"]["resourceVersion"].as_str() {
            None | Some("") => return Err(status::rv_required(name)),
            Some(s) => s.parse::<u64>().map_err(|_| {
                status::bad_request(format!(
                    "metadata.resourceVersion: Invalid value: \"{s}\": must be a valid resource version"
                ))
            })?,
        };
        if rv != resource_version(&existing) {
            return Err(status::conflict(name));
        }
        self.apply_update(ns, name, obj, existing, manager, dry_run)
    }

    /// An operator's edit: like PUT but always against the current version.
    pub(super) fn operator_update(
        &mut self,
        ns: &str,
        name: &str,
        mut obj: Value,
        manager: &str,
    ) -> Result<Value, ApiError> {
        let existing = self
            .get(ns, name)
            .cloned()
            .ok_or_else(|| status::not_found(name))?;
        if let Some(m) = obj.get_mut("metadata").and_then(Value::as_object_mut) {
            m.insert(
                "resourceVersion".into(),
                existing["metadata"]["resourceVersion"].clone(),
            );
        }
        let mut obj = decode_lease(obj)?;
        check_name_and_namespace(&mut obj, ns, name)?;
        self.apply_update(ns, name, obj, existing, manager, false)
    }

    /// PATCH with a JSON merge patch (strategic merge patches are treated the same: Leases
    /// have no lists with merge keys that matter here).
    pub(super) fn merge_patch(
        &mut self,
        ns: &str,
        name: &str,
        patch: &Value,
        manager: &str,
        dry_run: bool,
    ) -> Result<Value, ApiError> {
        let existing = self
            .get(ns, name)
            .cloned()
            .ok_or_else(|| status::not_found(name))?;
        let mut merged = existing.clone();
        json_merge_patch(&mut merged, patch);
        if let Some(rv) = patch
            .pointer("/metadata/resourceVersion")
            .and_then(Value::as_str)
            && rv.parse::<u64>().ok() != Some(resource_version(&existing))
        {
            return Err(status::conflict(name));
        }
        let mut obj = decode_lease(merged)?;
        check_name_and_namespace(&mut obj, ns, name)?;
        self.apply_update(ns, name, obj, existing, manager, dry_run)
    }

    /// PATCH with `application/apply-patch+yaml`: server-side apply, modelled on the
    /// apiserver's apply patcher and field manager (`patch.go`, `fieldmanager`,
    /// `managedfields/internal/conflict.go`) at the granularity this fake tracks ownership
    /// (labels, annotations, top-level spec fields):
    ///
    /// * the applied configuration must name `coordination.k8s.io/v1` (400 `Incorrect
    ///   version specified in apply patch`), kind `Lease`, and carry no managedFields;
    /// * `metadata.resourceVersion` in it is a precondition (409 `Conflict`, the optimistic
    ///   lock message of exchange 06), `metadata.uid` too;
    /// * a field it sets to a value other than the current one, owned by another manager
    ///   (any other Apply entry, any Update entry, the same manager's Update entry too), is
    ///   a conflict: 409 `Conflict`, `Apply failed with N conflict(s): ...`, one
    ///   `FieldManagerConflict` cause per field, unless `force`, which takes the fields
    ///   from their owners;
    /// * the manager's Apply entry then owns exactly the applied fields; a field it
    ///   applied before and no longer applies is removed unless another manager owns it;
    /// * an absent Lease is created (201; the caller checks the `create` permission);
    /// * nothing changed (fields and ownership): no new resourceVersion, no event.
    ///
    /// Returns the HTTP status (200 or 201) and the object.
    pub(super) fn apply(
        &mut self,
        ns: &str,
        name: &str,
        patch: &Value,
        manager: &str,
        force: bool,
        dry_run: bool,
    ) -> Result<(u16, Value), ApiError> {
        let Some(p) = patch.as_object() else {
            return Err(status::bad_request(format!(
                "error decoding YAML: json: cannot unmarshal {} into Go value of type map[string]interface {{}}",
                json_type(patch)
            )));
        };
        let version = p.get("apiVersion").and_then(Value::as_str).unwrap_or("");
        if version != API_VERSION {
            return Err(status::bad_request(format!(
                "Incorrect version specified in apply patch. Specified patch version: {version}, expected: {API_VERSION}"
            )));
        }
        let kind = p.get("kind").and_then(Value::as_str).unwrap_or("");
        if kind != "Lease" {
            return Err(status::bad_request(format!(
                "invalid object type: {API_VERSION}, Kind={kind}"
            )));
        }
        if p.get("metadata")
            .and_then(|m| m.get("managedFields"))
            .is_some_and(|m| !m.is_null())
        {
            return Err(status::bad_request("metadata.managedFields must be nil"));
        }
        let mut applied = patch.clone();
        strip_nulls(&mut applied);
        let meta = applied
            .as_object_mut()
            .expect("object")
            .entry("metadata")
            .or_insert_with(|| json!({}));
        let Some(meta) = meta.as_object_mut() else {
            return Err(go_type_error(meta, "Lease.metadata", "v1.ObjectMeta"));
        };
        match meta.get("name").and_then(Value::as_str) {
            None | Some("") => {
                meta.insert("name".into(), json!(name));
            }
            Some(n) if n != name => {
                return Err(status::bad_request(format!(
                    "the name of the object ({n}) does not match the name on the URL ({name})"
                )));
            }
            Some(_) => {}
        }
        let rv_precondition = meta
            .remove("resourceVersion")
            .and_then(|v| v.as_str().map(str::to_string))
            .filter(|v| !v.is_empty());
        let uid_precondition = meta
            .remove("uid")
            .and_then(|v| v.as_str().map(str::to_string))
            .filter(|v| !v.is_empty());

        // Decoded like any Lease body (type errors are 400s, MicroTimes normalized), so
        // that values compare with the stored ones.
        let applied = decode_lease(applied)?;

        let Some(existing) = self.get(ns, name).cloned() else {
            if let Some(uid) = uid_precondition {
                return Err(status::conflict_with(
                    name,
                    &format!(
                        "uid mismatch: the provided object specified uid {uid}, and no existing object was found"
                    ),
                ));
            }
            if rv_precondition.is_some() {
                return Err(status::unknown_500(
                    "resourceVersion should not be set on objects to be created",
                ));
            }
            return self
                .create_as(ns, applied, manager, "Apply", dry_run)
                .map(|o| (201, o));
        };
        if let Some(rv) = rv_precondition
            && rv.parse::<u64>().ok() != Some(resource_version(&existing))
        {
            return Err(status::conflict(name));
        }
        let existing_uid = existing["metadata"]["uid"].as_str().unwrap_or("");
        if let Some(uid) = uid_precondition
            && uid != existing_uid
        {
            return Err(status::conflict_with(
                name,
                &format!(
                    "Precondition failed: UID in precondition: {uid}, UID in object meta: {existing_uid}"
                ),
            ));
        }

        let fields = field_paths(&applied);
        let entries = existing["metadata"]["managedFields"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        let is_mine = |e: &Value| e["manager"] == manager && e["operation"] == "Apply";
        let owned = |e: &Value| {
            let mut set = BTreeSet::new();
            flatten_fields(&e["fieldsV1"], &mut Vec::new(), &mut set);
            set
        };
        let mut conflicts: Vec<(String, FieldPath)> = Vec::new();
        for path in &fields {
            if field_value(&existing, path) == field_value(&applied, path) {
                continue; // same value: shared ownership, never a conflict
            }
            for e in entries.iter().filter(|e| !is_mine(e)) {
                if owned(e).contains(path) {
                    conflicts.push((print_manager(e), path.clone()));
                }
            }
        }
        if !conflicts.is_empty() && !force {
            let shown: Vec<(String, String)> = conflicts
                .iter()
                .map(|(m, p)| (m.clone(), path_string(p)))
                .collect();
            return Err(status::apply_conflict(&shown));
        }
        let forced: BTreeSet<FieldPath> = conflicts.into_iter().map(|(_, p)| p).collect();

        let mut merged = existing.clone();
        json_merge_patch(&mut merged, &applied);
        // Fields this manager applied before and no longer applies go, unless another
        // manager owns them too.
        let before: BTreeSet<FieldPath> = entries
            .iter()
            .filter(|e| is_mine(e))
            .flat_map(&owned)
            .collect();
        for path in before.difference(&fields) {
            if !entries
                .iter()
                .any(|e| !is_mine(e) && owned(e).contains(path))
            {
                remove_field(&mut merged, path);
            }
        }
        let mut obj = decode_lease(merged)?;
        check_name_and_namespace(&mut obj, ns, name)?;
        validate(name, &obj, false)?;

        let now = k8s_time_now();
        let mut new_entries: Vec<Value> = Vec::new();
        let mut placed = false;
        for e in &entries {
            if is_mine(e) {
                placed = true;
                if !fields.is_empty() {
                    new_entries.push(apply_entry(manager, &now, &fields));
                }
                continue;
            }
            let mut set = owned(e);
            set.retain(|p| !forced.contains(p) && field_value(&obj, p).is_some());
            if set.is_empty() {
                continue;
            }
            let mut e = e.clone();
            e["fieldsV1"] = fields_v1(&set);
            new_entries.push(e);
        }
        if !placed && !fields.is_empty() {
            new_entries.push(apply_entry(manager, &now, &fields));
        }
        if same_object(&obj, &existing) && same_ownership(&new_entries, &entries) {
            return Ok((200, existing));
        }
        obj["metadata"]["managedFields"] = Value::Array(new_entries);
        if dry_run {
            obj["metadata"]["resourceVersion"] = existing["metadata"]["resourceVersion"].clone();
            return Ok((200, obj));
        }
        Ok((200, self.commit(EventType::Modified, ns, name, Some(obj))))
    }

    fn apply_update(
        &mut self,
        ns: &str,
        name: &str,
        mut obj: Value,
        existing: Value,
        manager: &str,
        dry_run: bool,
    ) -> Result<Value, ApiError> {
        {
            let meta = obj["metadata"].as_object_mut().expect("decoded metadata");
            // Fields the client cannot change: taken from the stored object.
            for k in [
                "uid",
                "creationTimestamp",
                "generation",
                "deletionTimestamp",
            ] {
                match existing["metadata"].get(k) {
                    Some(v) => meta.insert(k.into(), v.clone()),
                    None => meta.remove(k),
                };
            }
            meta.remove("selfLink");
        }
        if !self.coordinated_leader_election
            && let Some(spec) = obj["spec"].as_object_mut()
        {
            for k in ["strategy", "preferredHolder"] {
                if existing["spec"].get(k).is_none() {
                    spec.remove(k);
                }
            }
        }
        validate(name, &obj, false)?;
        if same_object(&obj, &existing) {
            // Exchange 05b: nothing changes, not even the resourceVersion; no event.
            return Ok(existing);
        }
        let now = k8s_time_now();
        let mf = update_managed_fields(&existing, &obj, manager, &now);
        obj["metadata"]["managedFields"] = mf;
        if dry_run {
            obj["metadata"]["resourceVersion"] = existing["metadata"]["resourceVersion"].clone();
            return Ok(obj);
        }
        Ok(self.commit(EventType::Modified, ns, name, Some(obj)))
    }

    /// DELETE (exchange 18). Returns the deleted object (with the deletion's
    /// resourceVersion, as its DELETED event shows it).
    pub(super) fn delete(
        &mut self,
        ns: &str,
        name: &str,
        uid_precondition: Option<&str>,
        rv_precondition: Option<&str>,
        dry_run: bool,
    ) -> Result<Value, ApiError> {
        let existing = self
            .get(ns, name)
            .cloned()
            .ok_or_else(|| status::not_found(name))?;
        let meta = &existing["metadata"];
        if let Some(uid) = uid_precondition {
            let cur = meta["uid"].as_str().unwrap_or("");
            if uid != cur {
                return Err(status::conflict_with(
                    name,
                    &format!(
                        "Precondition failed: UID in precondition: {uid}, UID in object meta: {cur}"
                    ),
                ));
            }
        }
        if let Some(rv) = rv_precondition {
            let cur = meta["resourceVersion"].as_str().unwrap_or("");
            if rv != cur {
                return Err(status::conflict_with(
                    name,
                    &format!(
                        "Precondition failed: ResourceVersion in precondition: {rv}, ResourceVersion in object meta: {cur}"
                    ),
                ));
            }
        }
        if dry_run {
            return Ok(existing);
        }
        Ok(self.commit(EventType::Deleted, ns, name, None))
    }

    /// Bumps the resourceVersion, stores (or removes) the object, records the event and
    /// sends it to every watch. Returns the new object (for a delete: the last state).
    fn commit(&mut self, ty: EventType, ns: &str, name: &str, new: Option<Value>) -> Value {
        self.rv += 1;
        let rv = self.rv;
        let key = (ns.to_string(), name.to_string());
        let prev = self.objects.get(&key).cloned();
        let obj = match new {
            Some(mut obj) => {
                obj["metadata"]["resourceVersion"] = json!(rv.to_string());
                self.objects.insert(key, obj.clone());
                obj
            }
            None => {
                self.objects.remove(&key);
                let mut last = prev.clone().expect("delete of an existing object");
                last["metadata"]["resourceVersion"] = json!(rv.to_string());
                last
            }
        };
        let event = Arc::new(StoredEvent {
            rv,
            ty,
            ns: ns.to_string(),
            name: name.to_string(),
            json: to_json(&obj),
            obj: obj.clone(),
            prev,
        });
        self.history.push_back(event.clone());
        self.trim_history();
        self.watchers
            .retain(|w| w.tx.send(WatchMsg::Event(event.clone())).is_ok());
        self.changed.send_replace(rv);
        obj
    }
}

// ----- watch lines -----

/// One watch event line: `{"type":"...","object":...}\n`.
pub(super) fn event_line(ty: &str, obj_json: &str) -> String {
    format!("{{\"type\":\"{ty}\",\"object\":{obj_json}}}\n")
}

/// A BOOKMARK line: only `metadata.resourceVersion` (exchange 12), plus the
/// `k8s.io/initial-events-end` annotation at the end of a streaming list (exchange 14).
pub(super) fn bookmark_line(rv: u64, initial_end: bool) -> String {
    let annotations = if initial_end {
        ",\"annotations\":{\"k8s.io/initial-events-end\":\"true\"}"
    } else {
        ""
    };
    format!(
        "{{\"type\":\"BOOKMARK\",\"object\":{{\"kind\":\"Lease\",\"apiVersion\":\"{API_VERSION}\",\"metadata\":{{\"resourceVersion\":\"{rv}\"{annotations}}},\"spec\":{{}}}}}}\n"
    )
}

/// An ERROR line holding a Status (exchange 13).
pub(super) fn error_line(status: &Value) -> String {
    event_line("ERROR", &to_json(status))
}

/// The line a watch with `filter` gets for `e`, if any: an object moving into the selection
/// is ADDED, one moving out is DELETED, like the real watch cache does.
pub(super) fn render_event(filter: &Filter, e: &StoredEvent) -> Option<String> {
    let now = e.ty != EventType::Deleted && filter.matches(&e.obj);
    let before = match e.ty {
        EventType::Added => false,
        EventType::Deleted => filter.matches(&e.obj),
        EventType::Modified => e.prev.as_ref().is_some_and(|p| filter.matches(p)),
    };
    let ty = match (before, now) {
        (false, false) => return None,
        (false, true) => "ADDED",
        (true, true) => "MODIFIED",
        (true, false) => "DELETED",
    };
    Some(event_line(ty, &e.json))
}

// ----- objects -----

pub(super) fn to_json(v: &Value) -> String {
    let Some(m) = v.as_object() else {
        return v.to_string();
    };
    // Write kind and apiVersion first so that lines read like the recordings.
    let mut out = String::from("{");
    let mut first = true;
    let mut put = |k: &str, val: &Value, out: &mut String| {
        if !first {
            out.push(',');
        }
        first = false;
        out.push_str(&Value::String(k.to_string()).to_string());
        out.push(':');
        out.push_str(&val.to_string());
    };
    for k in ["kind", "apiVersion", "metadata"] {
        if let Some(val) = m.get(k) {
            put(k, val, &mut out);
        }
    }
    for (k, val) in m {
        if !matches!(k.as_str(), "kind" | "apiVersion" | "metadata") {
            put(k, val, &mut out);
        }
    }
    out.push('}');
    out
}

pub(super) fn resource_version(obj: &Value) -> u64 {
    obj["metadata"]["resourceVersion"]
        .as_str()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0)
}

/// Equal ignoring resourceVersion and managedFields (exchange 05b).
fn same_object(a: &Value, b: &Value) -> bool {
    let strip = |v: &Value| {
        let mut v = v.clone();
        if let Some(m) = v["metadata"].as_object_mut() {
            m.remove("resourceVersion");
            m.remove("managedFields");
        }
        v
    };
    strip(a) == strip(b)
}

fn check_name_and_namespace(obj: &mut Value, ns: &str, name: &str) -> Result<(), ApiError> {
    let meta = obj["metadata"].as_object_mut().expect("decoded metadata");
    match meta.get("name").and_then(Value::as_str).unwrap_or("") {
        "" => {
            return Err(status::bad_request(format!(
                "the name of the object ({name} based on URL) was undeterminable: name must be provided"
            )));
        }
        n if n != name => {
            return Err(status::bad_request(format!(
                "the name of the object ({n}) does not match the name on the URL ({name})"
            )));
        }
        _ => {}
    }
    match meta.get("namespace").and_then(Value::as_str) {
        Some(n) if !n.is_empty() && n != ns => Err(status::bad_request(
            "the namespace of the provided object does not match the namespace sent on the request",
        )),
        _ => {
            meta.insert("namespace".into(), json!(ns));
            Ok(())
        }
    }
}

/// Decodes a request body the way the apiserver's Lease decoder would: type errors of
/// known fields are 400s, MicroTimes must have six fractional digits and are normalized to
/// UTC, nulls and empty metadata maps disappear. Unknown fields are KEPT (the real server
/// drops fields it does not know; this fake keeps them so that tests see whether a client
/// preserves them).
pub(super) fn decode_lease(body: Value) -> Result<Value, ApiError> {
    let mut obj = body;
    if !obj.is_object() {
        return Err(status::undecodable(format!(
            "json: cannot unmarshal {} into Go value of type v1.Lease",
            json_type(&obj)
        )));
    }
    strip_nulls(&mut obj);
    let m = obj.as_object_mut().expect("object");
    m.insert("kind".into(), json!("Lease"));
    m.insert("apiVersion".into(), json!(API_VERSION));
    let meta = m.entry("metadata").or_insert_with(|| json!({}));
    let Some(meta) = meta.as_object_mut() else {
        return Err(go_type_error(meta, "Lease.metadata", "v1.ObjectMeta"));
    };
    for k in [
        "name",
        "namespace",
        "resourceVersion",
        "uid",
        "generateName",
    ] {
        if let Some(v) = meta.get(k)
            && !v.is_string()
        {
            return Err(go_type_error(
                v,
                &format!("ObjectMeta.metadata.{k}"),
                "string",
            ));
        }
    }
    for k in ["labels", "annotations"] {
        if let Some(v) = meta.get(k) {
            let Some(map) = v.as_object() else {
                return Err(go_type_error(
                    v,
                    &format!("ObjectMeta.metadata.{k}"),
                    "map[string]string",
                ));
            };
            if let Some((_, bad)) = map.iter().find(|(_, v)| !v.is_string()) {
                return Err(go_type_error(
                    bad,
                    &format!("ObjectMeta.metadata.{k}"),
                    "string",
                ));
            }
        }
    }
    for k in [
        "labels",
        "annotations",
        "finalizers",
        "ownerReferences",
        "managedFields",
    ] {
        let empty = match meta.get(k) {
            Some(Value::Object(o)) => o.is_empty(),
            Some(Value::Array(a)) => a.is_empty(),
            _ => false,
        };
        if empty {
            meta.remove(k);
        }
    }
    if let Some(spec) = m.get_mut("spec") {
        let Some(spec) = spec.as_object_mut() else {
            return Err(go_type_error(spec, "Lease.spec", "v1.LeaseSpec"));
        };
        for k in ["holderIdentity", "strategy", "preferredHolder"] {
            if let Some(v) = spec.get(k)
                && !v.is_string()
            {
                return Err(go_type_error(v, &format!("LeaseSpec.spec.{k}"), "string"));
            }
        }
        for k in ["leaseDurationSeconds", "leaseTransitions"] {
            if let Some(v) = spec.get(k)
                && v.as_i64().is_none_or(|n| i32::try_from(n).is_err())
            {
                return Err(go_type_error(v, &format!("LeaseSpec.spec.{k}"), "int32"));
            }
        }
        for k in ["acquireTime", "renewTime"] {
            if let Some(v) = spec.get_mut(k) {
                let Some(s) = v.as_str() else {
                    return Err(go_type_error(v, &format!("LeaseSpec.spec.{k}"), "string"));
                };
                *v = json!(parse_micro_time(s).map_err(status::undecodable)?);
            }
        }
    }
    Ok(obj)
}

fn json_type(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "bool",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

fn go_type_error(v: &Value, field: &str, go_type: &str) -> ApiError {
    let what = match v {
        Value::Number(n) => format!("number {n}"),
        other => json_type(other).to_string(),
    };
    status::undecodable(format!(
        "json: cannot unmarshal {what} into Go struct field {field} of type {go_type}"
    ))
}

fn strip_nulls(v: &mut Value) {
    match v {
        Value::Object(m) => {
            m.retain(|_, v| !v.is_null());
            m.values_mut().for_each(strip_nulls);
        }
        Value::Array(a) => a.iter_mut().for_each(strip_nulls),
        _ => {}
    }
}

/// Parses a MicroTime like Go's `time.Parse("2006-01-02T15:04:05.000000Z07:00", s)` (exactly
/// six fractional digits) and formats it the way the server writes it back (UTC, `Z`).
fn parse_micro_time(s: &str) -> Result<String, String> {
    const LAYOUT: &str = "2006-01-02T15:04:05.000000Z07:00";
    let err = |rest: &str, elem: &str| {
        format!("parsing time \"{s}\" as \"{LAYOUT}\": cannot parse \"{rest}\" as \"{elem}\"")
    };
    let b = s.as_bytes();
    let digits = |r: std::ops::Range<usize>| {
        b.get(r.clone())
            .is_some_and(|d| d.iter().all(u8::is_ascii_digit))
    };
    let shape_ok = b.len() >= 19
        && digits(0..4)
        && b[4] == b'-'
        && digits(5..7)
        && b[7] == b'-'
        && digits(8..10)
        && b[10] == b'T'
        && digits(11..13)
        && b[13] == b':'
        && digits(14..16)
        && b[16] == b':'
        && digits(17..19);
    if !shape_ok {
        return Err(err(s, "2006"));
    }
    let rest = &s[19..];
    if !(rest.len() >= 7 && rest.as_bytes()[0] == b'.' && digits(20..26)) {
        return Err(err(rest, ".000000"));
    }
    let zone = &s[26..];
    let zb = zone.as_bytes();
    let zone_ok = zone == "Z"
        || (zb.len() == 6
            && (zb[0] == b'+' || zb[0] == b'-')
            && zb[1..3].iter().all(u8::is_ascii_digit)
            && zb[3] == b':'
            && zb[4..6].iter().all(u8::is_ascii_digit));
    if !zone_ok {
        return Err(err(zone, "Z07:00"));
    }
    let ts: k8s_openapi::jiff::Timestamp = s
        .parse()
        .map_err(|e| format!("parsing time \"{s}\": {e}"))?;
    Ok(ts.strftime("%Y-%m-%dT%H:%M:%S%.6fZ").to_string())
}

/// Validation of the Lease strategy (422 `Invalid`).
fn validate(name: &str, obj: &Value, creating: bool) -> Result<(), ApiError> {
    let mut errs = Vec::new();
    if creating && name.is_empty() {
        errs.push(FieldError {
            field: "metadata.name".into(),
            reason: "FieldValueRequired",
            message: "Required value: name or generateName is required".into(),
        });
    } else if creating && !is_dns_subdomain(name) {
        errs.push(FieldError {
            field: "metadata.name".into(),
            reason: "FieldValueInvalid",
            message: format!(
                "Invalid value: \"{name}\": a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')"
            ),
        });
    }
    let spec = &obj["spec"];
    if let Some(d) = spec["leaseDurationSeconds"].as_i64()
        && d <= 0
    {
        errs.push(FieldError {
            field: "spec.leaseDurationSeconds".into(),
            reason: "FieldValueInvalid",
            message: format!("Invalid value: {d}: must be greater than 0"),
        });
    }
    if let Some(t) = spec["leaseTransitions"].as_i64()
        && t < 0
    {
        errs.push(FieldError {
            field: "spec.leaseTransitions".into(),
            reason: "FieldValueInvalid",
            message: format!("Invalid value: {t}: must be greater than or equal to 0"),
        });
    }
    if spec["preferredHolder"]
        .as_str()
        .is_some_and(|p| !p.is_empty())
        && spec["strategy"].as_str().is_none_or(str::is_empty)
    {
        errs.push(FieldError {
            field: "spec.preferredHolder".into(),
            reason: "FieldValueForbidden",
            message: "Forbidden: may only be specified if `strategy` is defined".into(),
        });
    }
    if errs.is_empty() {
        Ok(())
    } else {
        Err(status::invalid(name, &errs))
    }
}

fn is_dns_subdomain(name: &str) -> bool {
    name.len() <= 253
        && name.split('.').all(|label| {
            let b = label.as_bytes();
            !b.is_empty()
                && b.iter()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
                && b[0] != b'-'
                && b[b.len() - 1] != b'-'
        })
}

fn json_merge_patch(target: &mut Value, patch: &Value) {
    let Some(p) = patch.as_object() else {
        *target = patch.clone();
        return;
    };
    if !target.is_object() {
        *target = json!({});
    }
    let t = target.as_object_mut().expect("object");
    for (k, v) in p {
        if v.is_null() {
            t.remove(k);
        } else {
            json_merge_patch(t.entry(k.clone()).or_insert(Value::Null), v);
        }
    }
}

// ----- managedFields -----

type FieldPath = Vec<String>;

/// The fields a manager can own: labels, annotations, top-level spec fields and other
/// top-level fields.
pub(super) fn field_paths(obj: &Value) -> BTreeSet<FieldPath> {
    let mut out = BTreeSet::new();
    let Some(m) = obj.as_object() else {
        return out;
    };
    for k in ["labels", "annotations"] {
        if let Some(map) = obj["metadata"][k].as_object() {
            for key in map.keys() {
                out.insert(vec![
                    "f:metadata".into(),
                    format!("f:{k}"),
                    format!("f:{key}"),
                ]);
            }
        }
    }
    for (k, v) in m {
        match k.as_str() {
            "kind" | "apiVersion" | "metadata" | "status" => {}
            "spec" => {
                if let Some(spec) = v.as_object() {
                    for key in spec.keys() {
                        out.insert(vec!["f:spec".into(), format!("f:{key}")]);
                    }
                }
            }
            other => {
                out.insert(vec![format!("f:{other}")]);
            }
        }
    }
    out
}

fn field_value<'a>(obj: &'a Value, path: &FieldPath) -> Option<&'a Value> {
    let mut cur = obj;
    for seg in path {
        let key = seg.strip_prefix("f:").unwrap_or(seg);
        cur = cur.get(key)?;
    }
    Some(cur)
}

fn fields_v1(paths: &BTreeSet<FieldPath>) -> Value {
    let mut root = Map::new();
    for p in paths {
        let mut cur = &mut root;
        for seg in p {
            cur = cur
                .entry(seg.clone())
                .or_insert_with(|| json!({}))
                .as_object_mut()
                .expect("object");
        }
    }
    Value::Object(root)
}

fn flatten_fields(v: &Value, prefix: &mut FieldPath, out: &mut BTreeSet<FieldPath>) {
    match v.as_object() {
        Some(m) if !m.is_empty() => {
            for (k, child) in m {
                prefix.push(k.clone());
                flatten_fields(child, prefix, out);
                prefix.pop();
            }
        }
        _ => {
            if !prefix.is_empty() {
                out.insert(prefix.clone());
            }
        }
    }
}

pub(super) fn managed_entry(manager: &str, time: &str, fields: &BTreeSet<FieldPath>) -> Value {
    json!({
        "manager": manager,
        "operation": "Update",
        "apiVersion": API_VERSION,
        "time": time,
        "fieldsType": "FieldsV1",
        "fieldsV1": fields_v1(fields),
    })
}

/// Moves the fields this update changed to `manager` (like exchange 12, where
/// `kubectl-patch` took `f:holderIdentity` from `curl`).
fn update_managed_fields(existing: &Value, new: &Value, manager: &str, now: &str) -> Value {
    let new_fields = field_paths(new);
    let changed: BTreeSet<FieldPath> = new_fields
        .iter()
        .filter(|p| field_value(existing, p) != field_value(new, p))
        .cloned()
        .collect();
    let mut entries: Vec<Value> = Vec::new();
    let mut found = false;
    for e in existing["metadata"]["managedFields"]
        .as_array()
        .cloned()
        .unwrap_or_default()
    {
        let mut owned = BTreeSet::new();
        flatten_fields(&e["fieldsV1"], &mut Vec::new(), &mut owned);
        owned.retain(|p| new_fields.contains(p));
        let mine = e["manager"] == manager && e["operation"] == "Update";
        if mine {
            found = true;
            owned.extend(changed.iter().cloned());
        } else {
            owned.retain(|p| !changed.contains(p));
        }
        if owned.is_empty() {
            continue;
        }
        let mut e = e.clone();
        e["fieldsV1"] = fields_v1(&owned);
        if mine {
            e["time"] = json!(now);
        }
        entries.push(e);
    }
    if !found && !changed.is_empty() {
        entries.push(managed_entry(manager, now, &changed));
    }
    Value::Array(entries)
}

/// The managedFields entry of a server-side apply (no apiVersion in the manager's identity,
/// but recorded like the real server does).
fn apply_entry(manager: &str, time: &str, fields: &BTreeSet<FieldPath>) -> Value {
    let mut e = managed_entry(manager, time, fields);
    e["operation"] = json!("Apply");
    e
}

/// The same managers owning the same fields (times aside).
fn same_ownership(a: &[Value], b: &[Value]) -> bool {
    let key = |v: &[Value]| -> Vec<(Value, Value, Value)> {
        v.iter()
            .map(|e| {
                (
                    e["manager"].clone(),
                    e["operation"].clone(),
                    e["fieldsV1"].clone(),
                )
            })
            .collect()
    };
    key(a) == key(b)
}

/// A manager as an apply conflict names it (`printManager` in the apiserver's
/// `conflict.go`): `"name"` for an applier, `"name" using group/version` for an updater
/// (the manager's identity carries no time).
fn print_manager(e: &Value) -> String {
    let name = Value::String(e["manager"].as_str().unwrap_or("").to_string()).to_string();
    if e["operation"] == "Update" {
        format!(
            "{name} using {}",
            e["apiVersion"].as_str().unwrap_or(API_VERSION)
        )
    } else {
        name
    }
}

/// A field path as structured-merge-diff prints it: `.spec.holderIdentity`.
fn path_string(path: &FieldPath) -> String {
    path.iter()
        .map(|seg| format!(".{}", seg.strip_prefix("f:").unwrap_or(seg)))
        .collect()
}

fn remove_field(obj: &mut Value, path: &FieldPath) {
    let Some((last, parents)) = path.split_last() else {
        return;
    };
    let mut cur = obj;
    for seg in parents {
        let key = seg.strip_prefix("f:").unwrap_or(seg);
        match cur.get_mut(key) {
            Some(next) => cur = next,
            None => return,
        }
    }
    if let Some(m) = cur.as_object_mut() {
        m.remove(last.strip_prefix("f:").unwrap_or(last));
    }
}

// ----- small helpers -----

/// `2026-11-29T17:26:29Z`
pub(super) fn k8s_time_now() -> String {
    k8s_openapi::jiff::Timestamp::now()
        .strftime("%Y-%m-%dT%H:%M:%SZ")
        .to_string()
}

pub(super) fn random_uid() -> String {
    let hex = |n: usize| -> String {
        (0..n)
            .map(|_| char::from_digit(fastrand::u32(0..16), 16).expect("hex digit"))
            .collect()
    };
    let variant = ['8', '9', 'a', 'b'][fastrand::usize(0..4)];
    format!(
        "{}-{}-4{}-{}{}-{}",
        hex(8),
        hex(4),
        hex(3),
        variant,
        hex(3),
        hex(12)
    )
}

fn random_suffix() -> String {
    const CHARS: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    (0..5)
        .map(|_| char::from(CHARS[fastrand::usize(0..CHARS.len())]))
        .collect()
}

fn encode_continue(rv: u64, after: &str) -> String {
    format!("{rv}:{after}")
        .bytes()
        .map(|b| format!("{b:02x}"))
        .collect()
}

fn decode_continue(tok: &str) -> Option<(u64, String)> {
    if !tok.len().is_multiple_of(2) {
        return None;
    }
    let bytes: Option<Vec<u8>> = (0..tok.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(tok.get(i..i + 2)?, 16).ok())
        .collect();
    let s = String::from_utf8(bytes?).ok()?;
    let (rv, after) = s.split_once(':')?;
    Some((rv.parse().ok()?, after.to_string()))
}
