//! Acknowledged step-downs: which gates hold a term open, and whether every
//! one of them has said it is closed.
//!
//! A gate registers by subscribing to `/events?gate=ID` (`exec` does, and
//! `file-gate`). Every gate connected
//! when a term starts, or that registers while it runs, is *registered for
//! that term* and stays so — through disconnects, and if it dies — until it
//! acknowledges the term with `POST /gates/ID/closed?term=TERM`: "nothing of
//! this term runs here, and nothing will again". A graceful release waits
//! for [`GateAcks::all_closed`] or the gate lag, whichever comes first; with
//! no gate registered for the term it waits the whole gate lag (a poller of
//! `/leader` cannot say when it stopped). A gate that knows it can never
//! say (`&acknowledges=false`: `file-gate` without a reload URL) registers
//! all the same, so that every release waits the whole gate lag while it is there,
//! however soon the others acknowledge.
//!
//! The registry also says whether the collector runs now
//! ([`GateAcks::running`]), for the collector policy: while this sidecar
//! leads, *nothing runs* when every gate registered for the term that can
//! acknowledge has acknowledged it mid-term (`exec` does when its child
//! exited on its own and its tree is reaped, `file-gate` when it exits), or
//! none is connected although a gate has acknowledged a term here before (a
//! crash-looping `exec` between two restarts). A gate whose stream ended
//! without a word (SIGKILLed, or its whole container OOM-killed) counts as
//! running only until it is *gone for good*: its validity ran out by then
//! (the renew deadline) and what it ran was stopped (the gate lag); it
//! still owes the term its acknowledgement, so the release waits the gate
//! lag all the same. Silent gates say nothing either way; with none that
//! can tell, or acknowledgements off, it is unknown.
//!
//! A term resumed by a restarted sidecar (`--state-dir`) does not end its
//! gate lag early ([`GateAcks::resumed`]), and its release waits at least
//! ([`GateAcks::release_not_before`]), until the gates it cannot know
//! hold nothing ([`GateAcks::unknown_gates_gone`]): those registered for
//! it before the restart and not since — one may have died or be backing
//! off, its collector still running — and no registry kept on disk could
//! be trusted to list them all (the record is written behind the
//! election). Such a gate hears nothing of the new process, so what it
//! runs ends with the validity the old one gave it: by the old process's
//! last stored write + the renew deadline (the very write the term resumed
//! from: a later one would not have matched the Lease), it closes, and a
//! gate lag later its collector stopped. From then on, the gates this
//! process knows are all there are, and their acknowledgements count as
//! for any term. A term resumed from a write long before its step-down (a
//! sidecar OOM-killed or upgraded mid-term) thus hands over on its gates'
//! word again, not after the whole gate lag.
//!
//! It counts, for `/metrics`, the gates whose last stream ended while this
//! sidecar led ([`GateAcks::for_sidecar_counting`]): a gated container
//! that crash-loops on the leader (exit 127, `CrashLoopBackOff`) ends its
//! stream once per restart, whether or not it said its term was over.
//!
//! This module is the registry alone: the routes that register
//! (`/events?gate=`, [`crate::serve::sse_route`]) and acknowledge
//! ([`crate::serve::ack_route`]) call it.
//!
//! Safety rests on one order: the publisher changes the published state
//! *before* it tells this registry ([`GateAcks::term_changed`]), and a
//! subscriber registers *before* it reads the state. A gate that registers
//! too late to be counted for a term therefore reads that the term is over,
//! and never opens for it.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use prometheus_client::metrics::counter::Counter;
use tokio::sync::watch;

/// Why a resumed term's release waits at least the whole gate lag.
pub const RESUMED_WHY: &str = "the term was resumed after a restart: the gates registered for it before and not since may run it until the previous process's last validity and a gate lag have run out";

/// The registry of one sidecar.
pub struct GateAcks {
    inner: Mutex<Inner>,
    /// Bumped on every change an [`GateAcks::all_closed`] waiter may care for.
    changed: watch::Sender<u64>,
    /// [`Inner::running`], published on change.
    running: watch::Sender<Option<bool>>,
    /// Distinct gates (connected or still owing an acknowledgement) at most.
    capacity: usize,
    /// `serve --gate-acks=false`: every release waits the gate lag, and an
    /// acknowledgement changes nothing (it is answered as counted, so that
    /// gates do not report a failure).
    ignored: bool,
    /// When the registry is full, gates gone (disconnected) for this long
    /// make room. What they ran may still be stopping (within `exec
    /// --grace`, a collector's own reload period), so the term they owed
    /// then waits its whole gate lag.
    forget_after: Duration,
    /// A gate gone (disconnected) for this long runs nothing (see the
    /// module docs): the renew deadline plus the gate lag.
    gone_for_good: Duration,
    /// Gates whose last stream ended while this sidecar led.
    disconnects_while_leading: Counter,
}

#[derive(Default)]
struct Inner {
    /// Gates with an open subscription, by id: how many (a reconnect may
    /// overlap the old stream's end).
    connected: HashMap<Arc<str>, usize>,
    /// Of those, the ones that never acknowledge: each holds every release
    /// of a term it was registered for to the whole gate lag.
    silent: HashSet<Arc<str>>,
    /// Gates whose last stream ended while they owed the current term, and
    /// when (so at most the registry's capacity).
    gone_since: HashMap<Arc<str>, std::time::Instant>,
    /// The current term, or the last one.
    term: Option<TermGates>,
    /// The term resumed from a previous process of this sidecar, if any,
    /// and when the gates unknown since the restart hold nothing of it.
    resumed: Option<(String, std::time::Instant)>,
    /// A gate acknowledged a term here once (so it is one that can tell,
    /// not a passing subscriber): the absence of every gate says that
    /// nothing runs.
    told: bool,
}

struct TermGates {
    term: String,
    leading: bool,
    /// Registered for this term and not yet acknowledged.
    open: HashSet<Arc<str>>,
    /// Registered for this term and acknowledged.
    closed: HashSet<Arc<str>>,
    /// Registered for this term as gates that never acknowledge.
    silent: HashSet<Arc<str>>,
    /// A gate that owed this term was forgotten to make room: nothing may
    /// end its release's gate lag early.
    forgot: bool,
    /// The term was resumed after a restart of the sidecar: the gates
    /// registered for it before are unknown until this instant, so
    /// likewise, and its release waits at least until then.
    resumed: Option<std::time::Instant>,
    /// Why its release waits the whole gate lag was said.
    said_why: bool,
}

impl Inner {
    /// Stops waiting for the gates gone for `after` or longer: their ids.
    fn forget_gone(&mut self, after: Duration) -> Vec<String> {
        let now = std::time::Instant::now();
        let gone: Vec<Arc<str>> = self
            .gone_since
            .iter()
            .filter(|(_, since)| now.saturating_duration_since(**since) >= after)
            .map(|(id, _)| id.clone())
            .collect();
        let mut forgotten = Vec::new();
        for id in gone {
            self.gone_since.remove(&id);
            if let Some(term) = self.term.as_mut()
                && (term.open.remove(&id) | term.silent.remove(&id))
            {
                term.forgot = true;
                forgotten.push(id.to_string());
            }
        }
        forgotten.sort();
        forgotten
    }

    /// Gates connected or still owing the current term's acknowledgement,
    /// each counted once.
    fn distinct_gates(&self) -> usize {
        let owing = self
            .term
            .iter()
            .flat_map(|t| t.open.iter().chain(&t.silent));
        self.connected.len() + owing.filter(|id| !self.connected.contains_key(*id)).count()
    }
}

impl Inner {
    /// Whether anything of the current term runs here, as far as the gates
    /// that can tell say (see the module docs); `None` when not leading or
    /// when no gate can tell.
    fn running(&self, gone_for_good: Duration) -> Option<bool> {
        let term = self.term.as_ref().filter(|t| t.leading)?;
        let now = std::time::Instant::now();
        let may_run = |id: &Arc<str>| {
            self.connected.contains_key(id)
                || self
                    .gone_since
                    .get(id)
                    .is_none_or(|since| now.saturating_duration_since(*since) < gone_for_good)
        };
        if term.open.iter().any(may_run) {
            Some(true)
        } else if self.told || !term.closed.is_empty() || !term.open.is_empty() {
            Some(false)
        } else {
            None
        }
    }
}

impl TermGates {
    /// `gate` is registered for this term and has not acknowledged it.
    fn owed_by(&self, gate: &str) -> bool {
        self.open.contains(gate) || self.silent.contains(gate)
    }
}

/// A gate id that cannot be registered.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum RegisterError {
    #[error("invalid gate id: 1 to 64 of A-Z a-z 0-9 . _ -")]
    InvalidId,
    #[error("too many gates registered")]
    Full,
}

/// What an acknowledgement did.
#[derive(Debug, PartialEq, Eq)]
pub enum Ack {
    /// Counted (or already was).
    Counted,
    /// This term is not the one the sidecar leads or last led.
    OtherTerm,
    /// No gate of this id was registered for the term.
    UnknownGate,
}

/// A subscription's registration; dropping it says the stream ended (the
/// gate still owes its acknowledgement for the term it was registered for).
pub struct Registration {
    acks: Arc<GateAcks>,
    gate: Arc<str>,
}

impl Drop for Registration {
    fn drop(&mut self) {
        let mut inner = self.acks.inner.lock().expect("gate acks lock");
        if let Some(count) = inner.connected.get_mut(&self.gate) {
            *count -= 1;
            if *count == 0 {
                inner.connected.remove(&self.gate);
                inner.silent.remove(&self.gate);
                let owing = inner
                    .term
                    .as_ref()
                    .is_some_and(|t| t.open.contains(&self.gate) || t.silent.contains(&self.gate));
                if owing {
                    inner
                        .gone_since
                        .insert(self.gate.clone(), std::time::Instant::now());
                    // Once gone for good, it runs nothing: say so then.
                    if let Ok(runtime) = tokio::runtime::Handle::try_current()
                        && self.acks.gone_for_good < Duration::MAX
                    {
                        let acks = Arc::downgrade(&self.acks);
                        let (gone_at, after) = (std::time::Instant::now(), self.acks.gone_for_good);
                        runtime.spawn(async move {
                            // Judged on the clock `running` reads: a timer
                            // that fires a little early sleeps the rest.
                            while let Some(left) = after.checked_sub(gone_at.elapsed())
                                && !left.is_zero()
                            {
                                tokio::time::sleep(left + Duration::from_millis(1)).await;
                            }
                            if let Some(acks) = acks.upgrade() {
                                let inner = acks.inner.lock().expect("gate acks lock");
                                acks.publish_running(&inner);
                            }
                        });
                    }
                }
                if inner.term.as_ref().is_some_and(|t| t.leading) {
                    self.acks.disconnects_while_leading.inc();
                }
            }
        }
    }
}

// === impl GateAcks ===

impl GateAcks {
    /// A registry of at most `capacity` gates that waits for every one.
    pub fn new(capacity: usize) -> Arc<Self> {
        Self::for_sidecar(capacity, true, Duration::MAX, Duration::MAX)
    }

    /// The sidecar's registry: `acknowledgements` false ignores them
    /// (`--gate-acks=false`); when full, gates gone for `forget_after` (the
    /// renew deadline) make room; gone for `gone_for_good` (the renew
    /// deadline plus the gate lag), a gate runs nothing.
    pub fn for_sidecar(
        capacity: usize,
        acknowledgements: bool,
        forget_after: Duration,
        gone_for_good: Duration,
    ) -> Arc<Self> {
        Self::for_sidecar_counting(
            capacity,
            acknowledgements,
            forget_after,
            gone_for_good,
            Counter::default(),
        )
    }

    /// [`Self::for_sidecar`], counting in `disconnects_while_leading` each
    /// gate whose last stream ends while this sidecar leads (the Lease's
    /// `leader_gate_gate_disconnects_while_leading_total`).
    pub fn for_sidecar_counting(
        capacity: usize,
        acknowledgements: bool,
        forget_after: Duration,
        gone_for_good: Duration,
        disconnects_while_leading: Counter,
    ) -> Arc<Self> {
        Arc::new(Self {
            disconnects_while_leading,
            inner: Mutex::default(),
            changed: watch::channel(0).0,
            running: watch::channel(None).0,
            capacity: capacity.max(1),
            ignored: !acknowledgements,
            forget_after,
            gone_for_good,
        })
    }

    /// Registers gate `id` for as long as the returned value lives, and for
    /// the current term if one is leading.
    /// A `silent` gate never acknowledges (see the module docs).
    pub fn register(
        self: &Arc<Self>,
        id: &str,
        silent: bool,
    ) -> Result<Registration, RegisterError> {
        if !valid_id(id) {
            return Err(RegisterError::InvalidId);
        }
        let mut inner = self.inner.lock().expect("gate acks lock");
        let known = inner.connected.contains_key(id)
            || inner.term.as_ref().is_some_and(|term| term.owed_by(id));
        if !known && inner.distinct_gates() >= self.capacity {
            let forgotten = inner.forget_gone(self.forget_after);
            if !forgotten.is_empty() {
                tracing::warn!(
                    gates = ?forgotten,
                    "too many gates registered: these, gone for longer than the renew deadline, make room; this term's graceful release waits the whole gate lag"
                );
            }
            if inner.distinct_gates() >= self.capacity {
                return Err(RegisterError::Full);
            }
        }
        inner.gone_since.remove(id);
        let gate: Arc<str> = id.into();
        *inner.connected.entry(gate.clone()).or_default() += 1;
        if silent {
            inner.silent.insert(gate.clone());
        }
        if let Some(term) = inner.term.as_mut().filter(|t| t.leading) {
            // Also one that acknowledged this term before: a restarted
            // gate under the same id may open for it again.
            term.closed.remove(id);
            if silent {
                term.silent.insert(gate.clone());
            } else {
                term.open.insert(gate.clone());
            }
        }
        self.publish_running(&inner);
        Ok(Registration {
            acks: self.clone(),
            gate,
        })
    }

    /// Term `term` is resumed from a previous process of this sidecar
    /// (`--state-dir`): whoever registered for it before the restart is
    /// unknown until `unknown_gone_at` (see the module docs), so when it
    /// starts here nothing may end its release's gate lag early, and its
    /// release waits until then at least ([`Self::release_not_before`]),
    /// until [`Self::unknown_gates_gone`]. Call before the election runs.
    pub fn resumed(&self, term: &str, unknown_gone_at: std::time::Instant) {
        let mut inner = self.inner.lock().expect("gate acks lock");
        inner.resumed = Some((term.to_owned(), unknown_gone_at));
    }

    /// The last term's release may not go out before this instant, whatever
    /// its gates say: a resumed term's, while gates registered before the
    /// restart may still run it (they lost the stream that would tell them
    /// it ended, and stop only when the old process's validity runs out);
    /// `None` otherwise.
    pub fn release_not_before(&self) -> Option<std::time::Instant> {
        let inner = self.inner.lock().expect("gate acks lock");
        inner.term.as_ref()?.resumed
    }

    /// The gates registered for resumed term `term` before the restart and
    /// not since hold nothing of it (the previous process's last validity
    /// and a gate lag ran out: see the module docs): from now on its
    /// release may end on the acknowledgements of the gates this process
    /// knows. Returns whether `term` was the resumed one.
    pub fn unknown_gates_gone(&self, term: &str) -> bool {
        let mut inner = self.inner.lock().expect("gate acks lock");
        if inner.resumed.as_ref().map(|(resumed, _)| resumed.as_str()) != Some(term) {
            return false;
        }
        inner.resumed = None;
        if let Some(gates) = inner.term.as_mut().filter(|g| g.term == term) {
            gates.resumed = None;
        }
        drop(inner);
        self.changed.send_modify(|n| *n += 1);
        true
    }

    /// The published state now says `leading` in `term`: call after it is
    /// published, on every publication.
    pub fn term_changed(&self, term: Option<&str>, leading: bool) {
        let mut inner = self.inner.lock().expect("gate acks lock");
        let current = inner.term.as_ref();
        let new_term = leading
            && current.is_none_or(|gates| !gates.leading || Some(gates.term.as_str()) != term);
        if new_term {
            let (silent, open) = inner
                .connected
                .keys()
                .cloned()
                .partition(|id| inner.silent.contains(id));
            let term = term.unwrap_or_default().to_owned();
            let resumed = inner
                .resumed
                .as_ref()
                .filter(|(resumed, _)| *resumed == term)
                .map(|(_, at)| *at);
            inner.term = Some(TermGates {
                term,
                leading: true,
                open,
                closed: HashSet::new(),
                silent,
                forgot: false,
                resumed,
                said_why: false,
            });
            // Only connected gates owe the new term.
            inner.gone_since.clear();
        } else if !leading && let Some(gates) = inner.term.as_mut().filter(|g| g.leading) {
            gates.leading = false;
        } else {
            return;
        }
        self.publish_running(&inner);
        drop(inner);
        self.changed.send_modify(|n| *n += 1);
    }

    /// Gate `id` says nothing of `term` runs or will run for it.
    pub fn acknowledge(&self, id: &str, term: &str) -> Ack {
        if self.ignored {
            return Ack::Counted;
        }
        let mut guard = self.inner.lock().expect("gate acks lock");
        let inner = &mut *guard;
        let Some(gates) = inner.term.as_mut().filter(|g| g.term == term) else {
            return Ack::OtherTerm;
        };
        let Some(gate) = gates.open.take(id) else {
            return if gates.closed.contains(id) {
                Ack::Counted
            } else {
                Ack::UnknownGate
            };
        };
        gates.closed.insert(gate.clone());
        if gates.closed.len() > self.capacity {
            // Gates that come and go (each exec has an id of its own):
            // keep the connected ones. With none kept, the release waits
            // the whole gate lag, which is always safe.
            let connected = &inner.connected;
            gates.closed.retain(|id| connected.contains_key(id));
        }
        inner.gone_since.remove(&gate);
        inner.told = true;
        self.publish_running(inner);
        drop(guard);
        self.changed.send_modify(|n| *n += 1);
        Ack::Counted
    }

    /// The last term is over, at least one gate was registered for it, and
    /// every one has acknowledged: there is nothing left to wait for.
    pub fn closed_now(&self) -> bool {
        let inner = self.inner.lock().expect("gate acks lock");
        inner.term.as_ref().is_some_and(|g| {
            !g.leading
                && !g.forgot
                && g.resumed.is_none()
                && g.open.is_empty()
                && g.silent.is_empty()
                && !g.closed.is_empty()
        })
    }

    /// Resolves once [`Self::closed_now`] holds (never, if it never does).
    pub async fn all_closed(self: Arc<Self>) {
        let mut changes = self.changed.subscribe();
        loop {
            if self.closed_now() {
                return;
            }
            if changes.changed().await.is_err() {
                return std::future::pending().await;
            }
        }
    }

    /// Why the last term's release waits the whole gate lag whatever its
    /// gates say, if for a reason of its own: given once per term (`None`
    /// after that), for the release to say it.
    pub fn whole_lag_reason(&self) -> Option<&'static str> {
        let mut inner = self.inner.lock().expect("gate acks lock");
        let gates = inner
            .term
            .as_mut()
            .filter(|g| g.resumed.is_some() && !g.said_why)?;
        gates.said_why = true;
        Some(RESUMED_WHY)
    }

    /// Whether anything of the current term runs here, on every change:
    /// `Some(false)` when every gate of the term that can tell says nothing
    /// runs (see the module docs); `None` when not leading, when no gate
    /// can tell, or with acknowledgements off.
    pub fn running(&self) -> watch::Receiver<Option<bool>> {
        self.running.subscribe()
    }

    fn publish_running(&self, inner: &Inner) {
        let running = if self.ignored {
            None
        } else {
            inner.running(self.gone_for_good)
        };
        self.running
            .send_if_modified(|published| std::mem::replace(published, running) != running);
    }

    /// Gates registered for the last term that have not acknowledged it.
    pub fn still_open(&self) -> Vec<String> {
        let inner = self.inner.lock().expect("gate acks lock");
        let mut open: Vec<String> = inner
            .term
            .iter()
            .flat_map(|g| g.open.iter().map(|id| id.to_string()))
            .collect();
        open.sort();
        open
    }
}

/// A gate that may take `stops_within` to stop its collector once a term
/// ends (`exec --grace`, told at registration) beside a gate lag that does
/// not cover it with a second to spare: the warning to log, if any. Only
/// its own acknowledgement proves such a gate stopped; should it die
/// first, the release that waits the gate lag may go out while its
/// collector still runs.
pub fn slower_than_the_gate_lag(
    gate: &str,
    stops_within: Duration,
    gate_lag: Duration,
) -> Option<String> {
    (stops_within + Duration::from_secs(1) > gate_lag).then(|| {
        format!(
            "gate {gate} may take up to {} to stop its collector (exec --grace), which --gate-lag {} does not cover with a second to spare: should the gate die before it says it stopped, the Lease may be released while its collector still runs; give exec a --grace at least 1s below the gate lag",
            crate::duration::HumanDuration(stops_within),
            crate::duration::HumanDuration(gate_lag),
        )
    })
}

/// 1 to 64 characters of `A-Z a-z 0-9 . _ -`: safe in a path, a query and a log.
pub fn valid_id(id: &str) -> bool {
    (1..=64).contains(&id.len())
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

#[cfg(test)]
mod properties;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_exec_whose_grace_the_gate_lag_does_not_cover_with_a_second_to_spare_is_warned_of() {
        let lag = Duration::from_secs(4);
        assert_eq!(
            slower_than_the_gate_lag("exec-1", Duration::from_secs(3), lag),
            None
        );
        for grace in [Duration::from_millis(3001), Duration::from_secs(4)] {
            let warning = slower_than_the_gate_lag("exec-1", grace, lag).expect("warned");
            assert!(
                warning.contains("exec-1") && warning.contains("--gate-lag 4s"),
                "{warning}"
            );
        }
    }

    #[test]
    fn a_gate_whose_stream_ends_while_leading_is_counted_once_per_restart() {
        let counter = Counter::default();
        let acks =
            GateAcks::for_sidecar_counting(8, true, Duration::MAX, Duration::MAX, counter.clone());
        // Following: a gate coming and going is not counted.
        drop(acks.register("exec-1", false).unwrap());
        assert_eq!(counter.get(), 0);
        let exec = acks.register("exec-1", false).unwrap();
        acks.term_changed(Some("u/1"), true);
        // A reconnect that overlaps the old stream is not an end.
        let again = acks.register("exec-1", false).unwrap();
        drop(exec);
        assert_eq!(counter.get(), 0);
        // Crash-looping while leading: every restart ends a stream, with
        // or without an acknowledgement first.
        drop(again);
        assert_eq!(counter.get(), 1);
        let restarted = acks.register("exec-2", false).unwrap();
        assert_eq!(acks.acknowledge("exec-2", "u/1"), Ack::Counted);
        drop(restarted);
        assert_eq!(counter.get(), 2);
        let silent = acks.register("file-gate-1", true).unwrap();
        drop(silent);
        assert_eq!(counter.get(), 3);
        // The term over: a gate stopping then is not counted.
        let exec = acks.register("exec-3", false).unwrap();
        acks.term_changed(Some("u/1"), false);
        drop(exec);
        assert_eq!(counter.get(), 3);
    }

    #[test]
    fn every_gate_registered_for_a_term_must_acknowledge_it_even_after_it_disconnected() {
        let acks = GateAcks::new(8);
        let exec = acks.register("exec-1", false).unwrap();
        acks.term_changed(Some("u/1"), true);
        let late = acks.register("file-gate-2", false).unwrap();
        drop(late); // it dies without a word: still owed
        acks.term_changed(Some("u/1"), false);
        assert!(!acks.closed_now());
        assert_eq!(acks.acknowledge("exec-1", "u/1"), Ack::Counted);
        assert!(!acks.closed_now(), "the dead gate still holds the term");
        assert_eq!(acks.still_open(), ["file-gate-2"]);
        assert_eq!(acks.acknowledge("file-gate-2", "u/1"), Ack::Counted);
        assert!(acks.closed_now());
        assert_eq!(
            acks.acknowledge("exec-1", "u/1"),
            Ack::Counted,
            "idempotent"
        );
        drop(exec);
    }

    #[test]
    fn no_registered_gate_means_nothing_can_say_the_term_is_closed() {
        let acks = GateAcks::new(8);
        acks.term_changed(Some("u/1"), true);
        acks.term_changed(Some("u/1"), false);
        assert!(!acks.closed_now());
        assert_eq!(acks.acknowledge("stranger", "u/1"), Ack::UnknownGate);
        assert!(!acks.closed_now());
    }

    #[test]
    fn an_acknowledgement_counts_only_for_its_own_term() {
        let acks = GateAcks::new(8);
        let _exec = acks.register("exec-1", false).unwrap();
        acks.term_changed(Some("u/1"), true);
        acks.term_changed(Some("u/1"), false);
        assert_eq!(acks.acknowledge("exec-1", "u/0"), Ack::OtherTerm);
        assert!(!acks.closed_now());
        // A new term counts every connected gate again, acknowledged before or not.
        acks.term_changed(Some("u/2"), true);
        assert_eq!(acks.acknowledge("exec-1", "u/1"), Ack::OtherTerm);
        acks.term_changed(Some("u/2"), false);
        assert!(!acks.closed_now());
        assert_eq!(acks.acknowledge("exec-1", "u/2"), Ack::Counted);
        assert!(acks.closed_now());
    }

    #[test]
    fn a_gate_that_acknowledged_and_registers_again_in_the_term_owes_it_again() {
        let acks = GateAcks::new(8);
        let gate = acks.register("my-collector", false).unwrap();
        acks.term_changed(Some("u/1"), true);
        // It exits while the term runs, with its last word ...
        assert_eq!(acks.acknowledge("my-collector", "u/1"), Ack::Counted);
        drop(gate);
        // ... and is restarted under the same id: it may open again.
        let _again = acks.register("my-collector", false).unwrap();
        acks.term_changed(Some("u/1"), false);
        assert!(!acks.closed_now());
        assert_eq!(acks.still_open(), ["my-collector"]);
        assert_eq!(acks.acknowledge("my-collector", "u/1"), Ack::Counted);
        assert!(acks.closed_now());
    }

    #[test]
    fn with_acknowledgements_off_an_acknowledgement_is_answered_and_changes_nothing() {
        let acks = GateAcks::for_sidecar(8, false, Duration::MAX, Duration::MAX);
        let _exec = acks.register("exec-1", false).unwrap();
        assert_eq!(acks.acknowledge("exec-1", "any/1"), Ack::Counted);
        assert!(!acks.closed_now());
    }

    #[test]
    fn a_silent_gate_holds_every_release_of_its_terms_to_the_gate_lag() {
        let acks = GateAcks::new(8);
        let _silent = acks.register("file-gate-0", true).unwrap();
        let _exec = acks.register("exec-1", false).unwrap();
        acks.term_changed(Some("u/1"), true);
        acks.term_changed(Some("u/1"), false);
        assert_eq!(acks.acknowledge("exec-1", "u/1"), Ack::Counted);
        assert!(!acks.closed_now(), "the silent gate still counts");
        assert_eq!(acks.acknowledge("file-gate-0", "u/1"), Ack::UnknownGate);
        assert!(acks.still_open().is_empty(), "and is not reported as late");
        // Registered while a term runs: counted for it too.
        let acks = GateAcks::new(8);
        let _exec = acks.register("exec-1", false).unwrap();
        acks.term_changed(Some("u/1"), true);
        let _late = acks.register("file-gate-1", true).unwrap();
        acks.term_changed(Some("u/1"), false);
        assert_eq!(acks.acknowledge("exec-1", "u/1"), Ack::Counted);
        assert!(!acks.closed_now());
    }

    #[test]
    fn a_gate_registered_after_the_step_down_is_not_waited_for() {
        let acks = GateAcks::new(8);
        let _exec = acks.register("exec-1", false).unwrap();
        acks.term_changed(Some("u/1"), true);
        acks.term_changed(Some("u/1"), false);
        let _late = acks.register("late", false).unwrap();
        assert_eq!(acks.acknowledge("exec-1", "u/1"), Ack::Counted);
        assert!(acks.closed_now());
    }

    #[test]
    fn a_resumed_term_waits_its_gate_lag_until_the_gates_unknown_since_the_restart_hold_nothing() {
        let acks = GateAcks::new(8);
        let gone_at = std::time::Instant::now() + Duration::from_secs(3600);
        acks.resumed("u/3", gone_at);
        let _exec = acks.register("exec-1", false).unwrap();
        acks.term_changed(Some("u/3"), true);
        let _late = acks.register("file-gate-1", false).unwrap();
        acks.term_changed(Some("u/3"), false);
        assert_eq!(acks.acknowledge("exec-1", "u/3"), Ack::Counted);
        assert_eq!(acks.acknowledge("file-gate-1", "u/3"), Ack::Counted);
        // Every gate it knows acknowledged; one registered before the
        // restart may still run its collector.
        assert!(!acks.closed_now());
        assert!(acks.still_open().is_empty());
        assert_eq!(acks.whole_lag_reason(), Some(RESUMED_WHY));
        // Its release waits for the gates it cannot know, at least.
        assert_eq!(acks.release_not_before(), Some(gone_at));
        assert_eq!(acks.whole_lag_reason(), None, "said once");
        // Another term's word changes nothing.
        assert!(!acks.unknown_gates_gone("u/2"));
        assert!(!acks.closed_now());
        // Once the gates it cannot know hold nothing, its own gates' word
        // ends the release's wait, at once.
        use std::future::Future as _;
        let waker = futures::task::noop_waker();
        let mut cx = std::task::Context::from_waker(&waker);
        let mut waiting = Box::pin(acks.clone().all_closed());
        assert!(waiting.as_mut().poll(&mut cx).is_pending());
        assert!(acks.unknown_gates_gone("u/3"));
        assert!(acks.closed_now());
        assert!(waiting.as_mut().poll(&mut cx).is_ready(), "all_closed woke");
        assert!(!acks.unknown_gates_gone("u/3"), "once");
        assert_eq!(acks.release_not_before(), None);
        // A term this process started itself is judged as usual.
        acks.term_changed(Some("u/4"), true);
        acks.term_changed(Some("u/4"), false);
        assert_eq!(acks.whole_lag_reason(), None);
        assert_eq!(acks.acknowledge("exec-1", "u/4"), Ack::Counted);
        assert_eq!(acks.acknowledge("file-gate-1", "u/4"), Ack::Counted);
        assert!(acks.closed_now());
    }

    #[test]
    fn ids_are_checked_and_the_registry_is_bounded() {
        let acks = GateAcks::new(2);
        for bad in ["", "a/b", "a b", &"x".repeat(65), "é"] {
            assert_eq!(
                acks.register(bad, false).err(),
                Some(RegisterError::InvalidId),
                "{bad:?}"
            );
        }
        let _a = acks.register("a", false).unwrap();
        let _b = acks.register("b", false).unwrap();
        assert_eq!(acks.register("c", false).err(), Some(RegisterError::Full));
        let _b_again = acks.register("b", false).expect("a known gate reconnects");
    }

    #[test]
    fn when_full_gates_gone_past_the_renew_deadline_make_room_and_the_term_waits_its_gate_lag() {
        let acks = GateAcks::for_sidecar(2, true, Duration::from_millis(50), Duration::MAX);
        acks.term_changed(Some("t/1"), true);
        let live = acks.register("live", false).unwrap();
        drop(acks.register("dead", false).unwrap());
        // Gone, but not long enough: it may still be closing.
        assert_eq!(acks.register("new", false).err(), Some(RegisterError::Full));
        std::thread::sleep(Duration::from_millis(60));
        let _new = acks
            .register("new", false)
            .expect("the dead gate made room");
        acks.term_changed(Some("t/1"), false);
        assert_eq!(acks.still_open(), ["live", "new"]);
        drop(live);
        assert_eq!(acks.acknowledge("live", "t/1"), Ack::Counted);
        assert_eq!(acks.acknowledge("new", "t/1"), Ack::Counted);
        // What the forgotten gate ran may still be stopping: the others'
        // word does not end this release's gate lag.
        assert!(!acks.closed_now());
        // The next term owes nothing to it.
        acks.term_changed(Some("t/2"), true);
        acks.term_changed(Some("t/2"), false);
        assert_eq!(acks.acknowledge("new", "t/2"), Ack::Counted);
        assert!(acks.closed_now());
    }

    #[test]
    fn gates_that_come_and_go_acknowledging_do_not_grow_the_registry() {
        let acks = GateAcks::new(4);
        let _stays = acks.register("stays", false).unwrap();
        acks.term_changed(Some("t/1"), true);
        for n in 0..100 {
            let id = format!("exec-{n}");
            let gate = acks
                .register(&id, false)
                .expect("room: the others acknowledged");
            assert_eq!(acks.acknowledge(&id, "t/1"), Ack::Counted);
            drop(gate);
        }
        let inner = acks.inner.lock().unwrap();
        let closed = inner.term.as_ref().map_or(0, |t| t.closed.len());
        assert!(closed <= 4, "{closed} acknowledged gates kept");
        assert!(inner.gone_since.is_empty());
    }

    #[test]
    fn only_gates_that_owe_the_current_term_are_remembered_as_gone() {
        let acks = GateAcks::new(8);
        acks.term_changed(Some("t/1"), true);
        drop(acks.register("owes", false).unwrap());
        let acked = acks.register("acked", false).unwrap();
        assert_eq!(acks.acknowledge("acked", "t/1"), Ack::Counted);
        drop(acked);
        acks.term_changed(Some("t/1"), false);
        drop(acks.register("after", false).unwrap());
        let gone = |acks: &GateAcks| {
            let inner = acks.inner.lock().unwrap();
            let mut ids: Vec<String> = inner.gone_since.keys().map(|id| id.to_string()).collect();
            ids.sort();
            ids
        };
        assert_eq!(gone(&acks), ["owes"]);
        acks.term_changed(Some("t/2"), true);
        assert!(gone(&acks).is_empty(), "nobody gone owes the new term");
    }

    #[test]
    fn a_connected_gate_registered_for_the_term_counts_once_against_the_bound() {
        let acks = GateAcks::new(2);
        acks.term_changed(Some("t/1"), true);
        let _a = acks.register("a", false).unwrap();
        let b = acks
            .register("b", false)
            .expect("two gates fit a bound of two");
        assert_eq!(acks.register("c", false).err(), Some(RegisterError::Full));
        // b's stream dropped: it still owes t/1, and still takes its place.
        drop(b);
        assert_eq!(acks.register("c", false).err(), Some(RegisterError::Full));
        assert_eq!(acks.acknowledge("b", "t/1"), Ack::Counted);
        let _c = acks
            .register("c", false)
            .expect("b no longer owes anything");
    }

    #[test]
    fn nothing_runs_once_every_gate_that_can_tell_acknowledged_mid_term_or_none_is_connected() {
        let acks = GateAcks::new(8);
        let running = acks.running();
        assert_eq!(*running.borrow(), None, "not leading");
        let _route = acks.register("routing", true).unwrap();
        acks.term_changed(Some("t/1"), true);
        assert_eq!(*running.borrow(), None, "a silent gate cannot tell");
        // A subscriber that came and went between terms proves nothing.
        let acks = GateAcks::new(8);
        let running = acks.running();
        drop(acks.register("passing", false).unwrap());
        acks.term_changed(Some("t/1"), true);
        assert_eq!(*running.borrow(), None, "nobody ever acknowledged here");
        let exec = acks.register("exec-1", false).unwrap();
        assert_eq!(*running.borrow(), Some(true));
        // The child exited on its own: exec acknowledges, then exits.
        assert_eq!(acks.acknowledge("exec-1", "t/1"), Ack::Counted);
        drop(exec);
        assert_eq!(*running.borrow(), Some(false));
        // Restarted, it runs the child again.
        let exec = acks.register("exec-2", false).unwrap();
        assert_eq!(*running.borrow(), Some(true));
        // A gate that dies without a word may still run something.
        drop(exec);
        assert_eq!(*running.borrow(), Some(true));
        acks.term_changed(Some("t/1"), false);
        assert_eq!(*running.borrow(), None, "not leading");
        // A new term with no gate connected, after one that can tell was
        // seen here: nothing runs.
        acks.acknowledge("exec-2", "t/1");
        acks.term_changed(Some("t/2"), true);
        assert_eq!(*running.borrow(), Some(false));
    }

    /// SIGKILLed without a word (its whole container OOM-killed): it may
    /// run until its validity runs out and its collector stopped, then it
    /// runs nothing — said on time, by the registry's own timer — though
    /// it still owes the term its acknowledgement for the release.
    #[tokio::test]
    async fn a_gate_gone_without_a_word_runs_nothing_once_gone_for_good() {
        let gone_for_good = Duration::from_millis(200);
        let acks = GateAcks::for_sidecar(8, true, Duration::MAX, gone_for_good);
        let mut running = acks.running();
        acks.term_changed(Some("t/1"), true);
        let exec = acks.register("exec-1", false).unwrap();
        assert_eq!(*running.borrow_and_update(), Some(true));
        let killed_at = std::time::Instant::now();
        drop(exec);
        assert_eq!(*running.borrow(), Some(true), "it may still be stopping");
        tokio::time::timeout(Duration::from_secs(5), running.changed())
            .await
            .expect("said once gone for good")
            .unwrap();
        assert!(killed_at.elapsed() >= gone_for_good);
        assert_eq!(*running.borrow(), Some(false));
        // A restarted gate runs again; the dead one still owes the term.
        let _exec = acks.register("exec-2", false).unwrap();
        assert_eq!(*running.borrow(), Some(true));
        acks.term_changed(Some("t/1"), false);
        assert_eq!(acks.acknowledge("exec-2", "t/1"), Ack::Counted);
        assert!(!acks.closed_now(), "exec-1 never acknowledged");
    }

    #[test]
    fn with_acknowledgements_off_whether_anything_runs_is_unknown() {
        let acks = GateAcks::for_sidecar(8, false, Duration::MAX, Duration::MAX);
        let exec = acks.register("exec-1", false).unwrap();
        acks.term_changed(Some("t/1"), true);
        acks.acknowledge("exec-1", "t/1");
        drop(exec);
        acks.term_changed(Some("t/2"), true);
        assert_eq!(*acks.running().borrow(), None);
    }

    #[tokio::test]
    async fn all_closed_resolves_on_the_last_acknowledgement() {
        let acks = GateAcks::new(8);
        let _exec = acks.register("exec-1", false).unwrap();
        acks.term_changed(Some("u/1"), true);
        acks.term_changed(Some("u/1"), false);
        let waiting = tokio::spawn(acks.clone().all_closed());
        tokio::task::yield_now().await;
        assert!(!waiting.is_finished());
        acks.acknowledge("exec-1", "u/1");
        tokio::time::timeout(std::time::Duration::from_secs(1), waiting)
            .await
            .expect("resolves")
            .unwrap();
    }
}
