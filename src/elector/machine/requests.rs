//! What the machine asks of the API server, and what the answers mean: the
//! one request in flight, the next one (a renew every retry period, an
//! acquisition spread after the expiry, the fallback read after a silent
//! 409, the marked release), the writes themselves — CAS on the last full
//! object seen, with its resourceVersion (G4) — their results, backoff and
//! `Retry-After`, request timeouts, and when to wake up next.

use std::time::Duration;

use tokio::time::Instant;

use super::view::{OwnWrite, Source, View};
use super::{Action, Election, Now, Purpose, Role, StopReason, Write, WriteOp};
use crate::backoff::Backoff;
use crate::clock::BootInstant;
use crate::elector::api_error::ApiError;
use crate::elector::lease::{self, Lease};

/// The request in flight, at most one.
#[derive(Clone, Debug)]
pub(super) enum Pending {
    Write {
        purpose: Purpose,
        sent_at: Instant,
        sent_boot: BootInstant,
        base_rv: Option<String>,
    },
    Read {
        /// The resourceVersion known when the read was sent.
        issued_on: Option<String>,
    },
}

// === impl Election ===

impl Election {
    /// The earliest instant after `handled` (the instant of the last input)
    /// at which a [`Tick`](super::Input::Tick) may change something.
    /// Whatever was due at `handled` has been done then, or waits for the
    /// request in flight.
    pub fn next_wakeup(&self, handled: Instant) -> Option<Instant> {
        let mut wake: Option<Instant> = None;
        let mut at = |i: Instant| {
            if i > handled {
                wake = Some(wake.map_or(i, |w| w.min(i)));
            }
        };
        if let Role::Leading {
            deadline, renew_at, ..
        } = self.role
        {
            at(deadline);
            if self.pending.is_none() && self.conflict_at.is_none() {
                at(self.not_before.map_or(renew_at, |nb| nb.max(renew_at)));
            }
        }
        if let Some(conflict_at) = self.conflict_at {
            at(conflict_at + self.settings.retry_period);
        }
        if let Some(not_before) = self.not_before {
            at(not_before);
        }
        if let Some(claim_at) = self.successor.claim_at {
            at(claim_at);
        }
        if let Some(until) = self.aside_until {
            at(until);
        }
        if let Some((_, attempt)) = self.acquire_at {
            at(self.not_before.map_or(attempt, |nb| nb.max(attempt)));
        }
        if let Some(held_until) = self.view.as_ref().and_then(View::held_until) {
            // The holder shown to readers changes at expiry.
            at(held_until);
        }
        wake
    }

    /// The marked release of G6, if the Lease is still ours and nothing is
    /// in flight; `None` otherwise. Asked for by `Input::Release` on
    /// shutdown, and by the machine itself for an unhealthy collector.
    pub(super) fn release(&mut self, now: Now, timeout: Duration) -> Option<Write> {
        if self.is_leading() || self.pending.is_some() {
            return None;
        }
        let lease = self.view.as_ref()?.lease.as_ref()?;
        if !self.is_own(&lease.record()) {
            return None;
        }
        let mut object = lease.released();
        self.release_names_successor(lease, &mut object);
        lease::mark_writer(&mut object, &self.writer);
        let base_rv = lease.resource_version().map(str::to_owned);
        self.write_in_flight(Purpose::Release, now, base_rv);
        Some(Write {
            purpose: Purpose::Release,
            op: WriteOp::Replace(Box::new(object)),
            timeout,
        })
    }

    // --- the next request ---

    pub(super) fn next_request(&mut self, now: Now, actions: &mut Vec<Action>) {
        if self.pending.is_some() || self.shutting_down || self.view.is_none() {
            return;
        }
        if self.not_before.is_some_and(|nb| now.instant < nb) {
            return;
        }
        if let Some(conflict_at) = self.conflict_at {
            // The watch normally answers a 409 within milliseconds; a read is
            // the fallback for a watch that stays silent.
            if now.instant >= conflict_at + self.settings.retry_period {
                self.conflict_at = Some(now.instant);
                self.pending = Some(Pending::Read {
                    issued_on: self.current_version(),
                });
                actions.push(Action::Read {
                    timeout: self.request_timeout(now.instant),
                });
            }
            return;
        }
        if !self.collector_healthy() {
            // No acquisition for an unhealthy collector; our own record (a
            // term just ended, or an acquisition that landed meanwhile) is
            // released once, with the mark, so a healthy peer takes it now.
            if !self.released_while_unhealthy {
                let timeout = self.request_timeout(now.instant);
                if let Some(release) = self.release(now, timeout) {
                    self.released_while_unhealthy = true;
                    actions.push(Action::Write(release));
                }
            }
            return;
        }
        let Some(view) = &self.view else { return };
        match &self.role {
            Role::Leading { renew_at, .. } => {
                if now.instant >= *renew_at
                    && let Some(lease) = view.lease.clone()
                {
                    let write = self.write(Purpose::Renew, &lease, now);
                    actions.push(Action::Write(write));
                }
            }
            // A pod asked to stand aside makes no attempt until it is over.
            Role::Following if self.standing_aside(now.instant) => {}
            Role::Following => {
                let free_at = view.free_at();
                let attempt = match self.acquire_at {
                    Some((expiry, attempt)) if expiry == free_at => attempt,
                    _ => {
                        // Spread the herd at an expiry, where every follower's
                        // clock fires at about the same instant. A free Lease
                        // (absent, or released with the mark) is an
                        // unambiguous hand-over: take it at once; the CAS lets
                        // one candidate win and the others wait for the watch
                        // after their 409 (DESIGN "Contention").
                        // With a named successor: it goes first, the others
                        // later as a fallback (DESIGN "Named successor").
                        let spread = super::successor::acquisition_delay(
                            &self.settings,
                            &mut self.rng,
                            view,
                            self.spread.held_elsewhere,
                        );
                        let attempt = free_at.max(now.instant) + spread;
                        self.acquire_at = Some((free_at, attempt));
                        attempt
                    }
                };
                if now.instant >= attempt {
                    if view.lease.is_none() && self.watch_interrupted {
                        // A POST from a view the watch no longer confirms
                        // could pass on an ABA (G7 creating): wait for it.
                        return;
                    }
                    self.acquire_at = None;
                    let lease = view.lease.clone();
                    let write = match lease {
                        Some(lease) => self.write(Purpose::Acquire, &lease, now),
                        None => self.create(now),
                    };
                    actions.push(Action::Write(write));
                }
            }
        }
    }

    /// A request may take no longer than the time left to the next deadline.
    pub(super) fn request_timeout(&self, now: Instant) -> Duration {
        let limit = self.settings.renew_deadline / 2;
        match self.lead_deadline() {
            Some(deadline) => limit.min(deadline.saturating_duration_since(now)),
            None => limit,
        }
    }

    fn write(&mut self, purpose: Purpose, lease: &Lease, now: Now) -> Write {
        let micros = self.next_renew_micros(now);
        let (mut object, transitions) = match purpose {
            Purpose::Acquire => {
                let mut object = lease.acquired(
                    &self.settings.identity,
                    micros,
                    self.settings.lease_duration,
                );
                super::successor::on_acquired(&mut object);
                super::revision::on_acquired(&mut object, self.successor.revision.as_deref());
                lease::label_holder(&mut object, &self.settings.holder_labels);
                (object, lease.next_transitions())
            }
            Purpose::Renew => (lease.renewed(micros), lease.record().transitions),
            Purpose::Release => (lease.released(), lease.record().transitions),
            Purpose::Successor => (lease.object().clone(), lease.record().transitions),
        };
        lease::mark_writer(&mut object, &self.writer);
        self.sent(
            purpose,
            micros,
            transitions,
            now,
            lease.resource_version().map(str::to_owned),
        );
        Write {
            purpose,
            op: WriteOp::Replace(Box::new(object)),
            timeout: self.request_timeout(now.instant),
        }
    }

    fn create(&mut self, now: Now) -> Write {
        let micros = self.next_renew_micros(now);
        let s = &self.settings;
        let mut object = lease::created(
            &s.namespace,
            &s.lease_name,
            &s.identity,
            micros,
            s.lease_duration,
        );
        lease::label_holder(&mut object, &s.holder_labels);
        super::revision::on_acquired(&mut object, self.successor.revision.as_deref());
        lease::mark_writer(&mut object, &self.writer);
        // A new Lease starts at term 0.
        self.sent(Purpose::Acquire, micros, 0, now, None);
        Write {
            purpose: Purpose::Acquire,
            op: WriteOp::Create(Box::new(object)),
            timeout: self.request_timeout(now.instant),
        }
    }

    fn sent(
        &mut self,
        purpose: Purpose,
        renew_micros: i64,
        transitions: i64,
        now: Now,
        base_rv: Option<String>,
    ) {
        self.remember_own_write(OwnWrite {
            renew_micros,
            sent_at: now.instant,
            sent_boot: now.boot,
            purpose,
            transitions,
            overtaken: false,
            confirmed: false,
        });
        self.write_in_flight(purpose, now, base_rv);
    }

    /// A write sent at `now` on the object of `base_rv` is the one request
    /// in flight.
    pub(super) fn write_in_flight(&mut self, purpose: Purpose, now: Now, base_rv: Option<String>) {
        self.pending = Some(Pending::Write {
            purpose,
            sent_at: now.instant,
            sent_boot: now.boot,
            base_rv,
        });
    }

    /// Every write gets a distinct `renewTime`, so each is recognisable (G7).
    fn next_renew_micros(&self, now: Now) -> i64 {
        let last = self.own_writes.back().map_or(i64::MIN, |w| w.renew_micros);
        now.wall_micros.max(last + 1)
    }

    // --- write and read results ---

    pub(super) fn written(
        &mut self,
        result: Result<Lease, ApiError>,
        now: Now,
        actions: &mut Vec<Action>,
    ) {
        let Some(Pending::Write {
            purpose,
            sent_at,
            sent_boot,
            base_rv,
        }) = self.pending.take()
        else {
            return;
        };
        match result {
            // A PUT that changed nothing keeps the resourceVersion: it proves
            // nothing about our claim (G4).
            Ok(lease) if base_rv.is_some() && lease.resource_version() == base_rv.as_deref() => {
                self.failures += 1;
                self.not_before = Some(now.instant + self.settings.retry_period);
            }
            Ok(lease) => {
                self.failures = 0;
                self.not_before = None;
                self.renew_unreachable = false;
                // The write landed on `base_rv`. If the view has moved since,
                // the watch showed this write or what came after it (another
                // holder, a deletion, a recreated Lease): the answer is then
                // older than the view and must not move it back — a view of a
                // dead Lease would skip every event of the live one as a
                // repeat (G1).
                if self.current_version() == base_rv {
                    self.observe(Some(lease), now, false, Source::Event);
                }
                // It counts only if the record we now hold is this very write.
                let current = self.view.as_ref().and_then(|v| v.lease.as_ref());
                let this_write = current.and_then(|lease| {
                    let write = self.own_write_of(&lease.record())?;
                    (write.sent_at == sent_at).then(|| (write.term(lease), write.overtaken))
                });
                let Some((term, overtaken)) = this_write else {
                    return;
                };
                match purpose {
                    Purpose::Acquire
                        if !overtaken
                            && !self.shutting_down
                            && self.collector_healthy()
                            && !self.is_leading() =>
                    {
                        self.start_leading(term, sent_at, sent_boot);
                    }
                    Purpose::Renew => {
                        if let Role::Leading {
                            deadline,
                            valid_until,
                            renew_at,
                            ..
                        } = &mut self.role
                        {
                            *deadline = (*deadline).max(sent_at + self.settings.renew_deadline);
                            *valid_until =
                                (*valid_until).max(sent_boot.plus(self.settings.renew_deadline));
                            *renew_at = sent_at + self.settings.retry_period;
                        }
                    }
                    _ => {}
                }
            }
            Err(error) => {
                match (&error, purpose) {
                    (ApiError::Forbidden(_), Purpose::Renew) => {
                        self.step_down(StopReason::Forbidden);
                    }
                    (ApiError::NotFound, Purpose::Renew) => {
                        self.step_down(StopReason::LeaseDeleted);
                    }
                    _ => {}
                }
                if purpose == Purpose::Renew {
                    self.renew_unreachable = error.is_unreachable();
                }
                let conflict = matches!(error, ApiError::Conflict(_));
                if purpose == Purpose::Successor
                    && (conflict || self.holds_elsewhere() && !self.shutting_down)
                {
                    // A 409 is someone else's write (a renew, most often):
                    // the decision stands, so a name we failed to clear is
                    // cleared again from the newer object — or the next
                    // graceful release names a pod that stands back, and the
                    // group waits the fallback. Holding another Lease may
                    // last a whole term: cleared again after any failure
                    // (after the backoff), or no pod holding none could
                    // claim the slot. A stopping or unhealthy successor
                    // whose write failed otherwise tries once; its fallback
                    // covers it.
                    self.successor.resigned = false;
                }
                let current_rv = self
                    .view
                    .as_ref()
                    .and_then(|v| v.lease.as_ref())
                    .and_then(Lease::resource_version);
                let explained = matches!(error, ApiError::Conflict(_) | ApiError::NotFound)
                    && current_rv != base_rv.as_deref();
                if !explained {
                    // Otherwise the watch already showed what changed: act on it now.
                    self.failed(&error, now, actions);
                }
            }
        }
    }

    /// What an error means for the next attempt.
    fn failed(&mut self, error: &ApiError, now: Now, actions: &mut Vec<Action>) {
        let retry = self.settings.retry_period;
        match error {
            // Someone else wrote: the watch will say what (DESIGN "Contention").
            ApiError::Conflict(_) | ApiError::NotFound => {
                self.conflict_at = Some(now.instant);
            }
            ApiError::TooManyRequests { retry_after } => {
                // A server may ask for anything; a candidate that waited
                // longer than a lease duration would miss whole terms.
                let wait = retry_after
                    .unwrap_or(retry)
                    .min(self.settings.lease_duration);
                let mut at = now.instant + wait;
                if let Some(deadline) = self.lead_deadline() {
                    // Honour Retry-After, but keep one last try before the
                    // deadline — one, not one per 429 once it has come.
                    let last_chance = deadline.checked_sub(retry / 2).unwrap_or(now.instant);
                    if now.instant < last_chance {
                        at = at.min(last_chance);
                    }
                }
                self.not_before = Some(at);
            }
            ApiError::Unauthorized => {
                actions.push(Action::ReloadCredentials);
                self.backoff(now);
            }
            _ => self.backoff(now),
        }
    }

    /// Exponential backoff from the retry period up to the lease duration,
    /// with jitter so candidates spread out.
    fn backoff(&mut self, now: Now) {
        self.failures = self.failures.saturating_add(1);
        if self.is_leading() {
            // A leader retries every retry period until its deadline.
            self.not_before = Some(now.instant + self.settings.retry_period);
            return;
        }
        let backoff = Backoff {
            first: self.settings.retry_period,
            max: self.settings.lease_duration,
            jitter: 0.2,
        };
        self.not_before = Some(now.instant + backoff.delay(self.failures, self.rng.f64()));
    }

    /// The answer to a fallback read sent when the version was `issued_on`.
    pub(super) fn read(
        &mut self,
        result: Result<Option<Lease>, ApiError>,
        issued_on: Option<String>,
        now: Now,
        actions: &mut Vec<Action>,
    ) {
        match result {
            // The watch showed something newer while the read was in flight
            // (e.g. a recreated Lease): the answer is older than what we
            // know, and a 404 in it would mark the live Lease as deleted (G1).
            Ok(_) if self.current_version() != issued_on => self.conflict_at = None,
            Ok(lease) => {
                // The server's truth, even with an older resourceVersion.
                self.conflict_at = None;
                self.observe(lease, now, self.watch_interrupted, Source::Read);
            }
            Err(error) => self.failed(&error, now, actions),
        }
    }
}
