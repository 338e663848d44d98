//! Carrying out a drawn decision, recording the fault it became, and
//! healing it: the injection of every kind but the named-successor ones
//! (`successor.rs`), on the member, the client, the Lease or the API server
//! the decision aims at.

use std::time::{Duration, Instant};

use serde_json::json;

use super::{Active, Chaos, Draw, Heal, Kind, NAMES, Proc, TIMING, Until, secs, successor};
use crate::support::fake_apiserver::{Fault, FaultKind, Verb, lease_holder};
use crate::support::history::{FaultSpan, rel};

impl Chaos {
    /// The Leases `name` holds, by the records.
    fn held_by(&self, name: &str) -> Vec<&'static str> {
        self.world
            .leases
            .iter()
            .zip(self.holders())
            .filter(|(_, h)| h.as_deref() == Some(name))
            .map(|(l, _)| *l)
            .collect()
    }

    pub(super) async fn inject(&mut self, d: Draw) {
        match d.kind {
            Kind::SuccessorKill => return self.kill_successor(&d).await,
            Kind::Handover => return self.request_handover(&d),
            Kind::HandoverStopped => return self.handover_to_stopped(&d),
            Kind::Squeeze => return self.squeeze(&d).await,
            Kind::HolderEdit | Kind::Delete | Kind::ApiRestart => {
                return self.cluster_fault(&d).await;
            }
            _ => {}
        }
        let start = if d.aim_at_holder {
            self.holder_index(d.lease).unwrap_or(d.index)
        } else {
            d.index
        };
        let Some(i) = (0..NAMES.len())
            .map(|k| (start + k) % NAMES.len())
            .find(|&i| self.eligible(d.kind, i))
        else {
            self.skipped += 1;
            return;
        };
        let name = self.members[i].name;
        let held = self.held_by(name);
        let lease = TIMING.lease.as_secs_f64();
        let now = Instant::now();
        let clear = |t: Duration| Until::Heals(Some(t), Heal::ClearFaults(i));
        let (detail, until) = match d.kind {
            Kind::Kill => {
                self.kill(i).await;
                // A third come back within a second, as a kubelet restarts
                // a crashed container: a holder among them resumes its term
                // from its state directory.
                let down = if d.variant == 0 {
                    secs(0.2 + d.frac * 0.8)
                } else {
                    secs(0.2 + d.frac * 5.8)
                };
                (
                    format!("down {down:?}"),
                    Until::Heals(Some(down), Heal::Restart(i)),
                )
            }
            Kind::Term => {
                // Variants 0 and 1: a pod deletion with the collector's
                // pre-stop hook — a step-down asked of the sidecar (POST
                // /handover), then its SIGTERM up to 1.5 s later, while it
                // hands over. Variant 2: a deletion without the hook.
                let hook = self.world.prestop_hook && d.variant != 2;
                let mut asked = String::new();
                if hook && let Some(s) = &self.members[i].sidecar {
                    let status = successor::ask_step_down(s.gate).await;
                    let wait = secs(d.frac * 1.5);
                    tokio::time::sleep(wait).await;
                    asked = format!("a pre-stop step-down ({status:?}), SIGTERM {wait:?} later; ");
                }
                let down_for = secs(d.frac * 3.0);
                self.terminate(i, down_for);
                let detail = format!("{asked}down {down_for:?} after the exit");
                (detail, Until::Heals(None, Heal::AfterExit(i)))
            }
            Kind::Stop => {
                self.freeze(i);
                let stopped = secs(lease + 0.5 + d.frac * lease);
                (
                    format!("stopped {stopped:?}"),
                    Until::Heals(Some(stopped), Heal::Cont(i)),
                )
            }
            Kind::Partition => {
                self.api.set_fault(name, Fault::all(FaultKind::Partition));
                let t = secs(0.5 + d.frac * 7.5);
                (format!("{t:?}"), clear(t))
            }
            Kind::Forbidden => {
                let t = secs(1.0 + d.frac * 5.0);
                match (d.variant, self.world.forbid_every_verb) {
                    (0, _) => {
                        self.api.set_role_binding(name, false);
                        let heal = Until::Heals(Some(t), Heal::RoleBinding(i));
                        (format!("role binding deleted {t:?}"), heal)
                    }
                    (2, true) => {
                        self.api.set_fault(name, Fault::all(FaultKind::Status(403)));
                        (format!("all verbs 403 {t:?}"), clear(t))
                    }
                    _ => {
                        self.api
                            .set_fault(name, Fault::on(&[Verb::Update], FaultKind::Status(403)));
                        (format!("update 403 {t:?}"), clear(t))
                    }
                }
            }
            Kind::ServerErrors => {
                let t = secs(0.5 + d.frac * 3.5);
                let (fault, what) = match d.variant {
                    0 => (Fault::all(FaultKind::Status(500)), "all verbs 500"),
                    1 => (Fault::all(FaultKind::Status(503)), "all verbs 503"),
                    _ => (
                        Fault::on(&[Verb::Update, Verb::Get], FaultKind::Status(504)),
                        "update/get 504",
                    ),
                };
                self.api.set_fault(name, fault);
                (format!("{what} {t:?}"), clear(t))
            }
            Kind::Throttle => {
                let t = secs(0.5 + d.frac * 3.0);
                let retry_after = Duration::from_secs(if d.variant == 2 { 3 } else { 1 });
                self.api
                    .set_fault(name, Fault::all(FaultKind::TooManyRequests { retry_after }));
                (format!("Retry-After {retry_after:?} for {t:?}"), clear(t))
            }
            Kind::Latency => {
                let t = secs(2.0 + d.frac * 6.0);
                let delay = [100, 800, 2500][d.variant as usize];
                self.api.set_fault(
                    name,
                    Fault::all(FaultKind::Latency(Duration::from_millis(delay))),
                );
                (format!("{delay} ms for {t:?}"), clear(t))
            }
            Kind::Hang => {
                let t = secs(1.0 + d.frac * 4.0);
                let (fault, what) = match d.variant {
                    0 => (Fault::on(&[Verb::Update], FaultKind::Hang), "updates"),
                    1 => (Fault::on(&[Verb::Watch], FaultKind::Hang), "watches"),
                    _ => (Fault::all(FaultKind::Hang), "all requests"),
                };
                self.api.set_fault(name, fault);
                (format!("{what} hang for {t:?}"), clear(t))
            }
            Kind::DropWatches => {
                self.api.drop_watches(name);
                ("open watches cut".to_owned(), Until::Now)
            }
            Kind::Gone => {
                let t = secs(d.frac * 3.0);
                self.api.expire_watches(name);
                let compacted = d.variant == 0;
                if compacted {
                    self.api.compact();
                }
                self.api
                    .set_fault(name, Fault::on(&[Verb::Watch], FaultKind::Status(410)));
                let detail =
                    format!("watches expired, compacted {compacted}, re-watches 410 for {t:?}");
                (detail, clear(t))
            }
            Kind::RotateToken => {
                self.api.rotate_token(name);
                ("token rotated".to_owned(), Until::Now)
            }
            _ => unreachable!("injected above"),
        };
        if d.kind.is_api_fault() {
            self.members[i].api_faulted = true;
        }
        let detail = format!("{detail}; it held {held:?}");
        self.record(d.kind, None, name, detail, now, until);
    }

    /// Faults of the cluster, not of one member: an edit of the drawn
    /// Lease's holder, its deletion, a restart of the API server.
    async fn cluster_fault(&mut self, d: &Draw) {
        let lease = self.world.leases[d.lease];
        let now = Instant::now();
        let plan = match d.kind {
            Kind::HolderEdit => self.api.lease(lease).map(|_| {
                let holder = self.api.lease(lease).as_ref().and_then(lease_holder);
                let peer = NAMES
                    .iter()
                    .copied()
                    .cycle()
                    .skip(d.index)
                    .take(NAMES.len())
                    .find(|n| Some(*n) != holder.as_deref())
                    .unwrap_or("c0");
                let what = match d.variant {
                    0 => {
                        self.api
                            .update_lease(lease, |l| l["spec"]["holderIdentity"] = json!("ghost"));
                        "holder := ghost".to_owned()
                    }
                    1 => {
                        self.api
                            .update_lease(lease, |l| l["spec"]["holderIdentity"] = json!(peer));
                        format!("holder := {peer} (a live peer)")
                    }
                    _ => {
                        self.api.update_lease(lease, |l| {
                            if let Some(spec) = l["spec"].as_object_mut() {
                                spec.remove("holderIdentity");
                            }
                        });
                        "holder cleared without the release mark".to_owned()
                    }
                };
                (
                    Some(d.lease),
                    "cluster",
                    format!("{what} (was {holder:?})"),
                    Until::Now,
                )
            }),
            Kind::Delete => self.api.delete_lease(lease).map(|l| {
                let detail = format!("was held by {:?}", lease_holder(&l));
                (Some(d.lease), lease, detail, Until::Now)
            }),
            Kind::ApiRestart if !self.api_down => {
                let down = self.stop_api(lease, d).await;
                let until = Until::Heals(Some(down), Heal::ApiRestart);
                Some((None, "cluster", format!("down {down:?}"), until))
            }
            _ => None,
        };
        match plan {
            Some((lease, target, detail, until)) => {
                self.record(d.kind, lease, target, detail, now, until);
            }
            None => self.skipped += 1,
        }
    }

    /// Stops the API server (its restart keeps the store and cuts every
    /// connection and watch), for a time drawn by `d`.
    async fn stop_api(&mut self, lease: &str, d: &Draw) -> Duration {
        let rv = self.api.resource_version();
        let before = self.api.lease(lease);
        self.api.shutdown().await;
        assert_eq!(self.api.open_watches(None), 0, "shutdown cuts every watch");
        // A write already admitted may land while the server stops (a renew
        // or a successor claim in flight): the store is kept, never reset,
        // and from here nothing writes until the restart (checked when it
        // heals).
        let down_rv = self.api.resource_version();
        if down_rv != rv {
            let after = self.api.lease(lease);
            eprintln!(
                "{}: a write landed while the API server stopped (rv {rv} -> {down_rv}): {:?} \
                 -> {:?}",
                self.world.label,
                before
                    .as_ref()
                    .map(|l| (&l["spec"], &l["metadata"]["annotations"])),
                after
                    .as_ref()
                    .map(|l| (&l["spec"], &l["metadata"]["annotations"])),
            );
        }
        assert!(down_rv >= rv, "the store is kept: rv {rv} -> {down_rv}");
        self.api_down_rv = down_rv;
        self.api_down = true;
        secs(0.2 + d.frac * 5.8)
    }

    /// SIGSTOP of every pod holding none, and SIGKILL of a holder (of the
    /// drawn Lease if it has one): its Lease can only go to a pod holding
    /// one already. Both heal together after two to three lease durations,
    /// long enough for that Lease to be taken, a tier late.
    async fn squeeze(&mut self, d: &Draw) {
        let holders = self.holders();
        let holds = |i: usize| holders.iter().flatten().any(|h| h == NAMES[i]);
        let running = |i: usize| self.members[i].state == Proc::Running;
        let killed = self
            .holder_index(d.lease)
            .filter(|&i| running(i))
            .or_else(|| (0..NAMES.len()).find(|&i| running(i) && holds(i)));
        let idle: Vec<usize> = (0..NAMES.len())
            .filter(|&i| running(i) && !holds(i))
            .collect();
        let Some(killed) = killed.filter(|_| !idle.is_empty()) else {
            self.skipped += 1;
            eprintln!(
                "{} {}: squeeze skipped (holders {holders:?})",
                self.world.label,
                rel(self.origin, Instant::now())
            );
            return;
        };
        for &i in &idle {
            self.freeze(i);
        }
        self.kill(killed).await;
        self.squeezes += 1;
        let lease = TIMING.lease.as_secs_f64();
        let t = secs(lease * 2.0 + d.frac * lease);
        let stopped: Vec<&str> = idle.iter().map(|&i| NAMES[i]).collect();
        let heal = Heal::Squeeze {
            stopped: idle,
            killed,
        };
        self.record(
            Kind::Squeeze,
            None,
            &format!("{} killed, {} stopped", NAMES[killed], stopped.join("+")),
            format!("for {t:?}; holders were {holders:?}"),
            Instant::now(),
            Until::Heals(Some(t), heal),
        );
    }

    /// Records a fault injected at `injected` and schedules its heal.
    pub(super) fn record(
        &mut self,
        kind: Kind,
        lease: Option<usize>,
        target: &str,
        detail: String,
        injected: Instant,
        until: Until,
    ) -> usize {
        *self.counts.entry(kind.name()).or_default() += 1;
        let span = self.spans.len();
        eprintln!(
            "{} {}: {} on {target} ({detail})",
            self.world.label,
            rel(self.origin, injected),
            kind.name()
        );
        self.spans.push((
            lease,
            FaultSpan {
                kind: kind.name().to_owned(),
                target: target.to_owned(),
                detail,
                injected,
                healed: matches!(until, Until::Now).then_some(injected),
                suspends_gap_check: kind.suspends_gap_check(),
            },
        ));
        if let Until::Heals(after, heal) = until {
            self.active.push(Active {
                span,
                heal_at: after.map(|t| injected + t),
                heal,
                slots: kind.slots(),
            });
        }
        span
    }

    /// Heals every fault whose time has come.
    pub(super) async fn heal_due(&mut self) {
        let now = Instant::now();
        let due: Vec<usize> = self
            .active
            .iter()
            .enumerate()
            .filter(|(_, a)| a.heal_at.is_some_and(|t| t <= now))
            .map(|(k, _)| k)
            .collect();
        for k in due.into_iter().rev() {
            let active = self.active.remove(k);
            self.heal(active).await;
        }
    }

    async fn heal(&mut self, active: Active) {
        self.before_heal = self.holders();
        let span = active.span;
        match active.heal {
            Heal::Restart(i) | Heal::AfterExit(i) => {
                // Healed when the new process starts: it contends from then.
                self.spans[span].1.healed = Some(Instant::now());
                self.spawn(i).await;
            }
            Heal::Cont(i) => self.cont(i),
            Heal::ClearFaults(i) => {
                self.api.clear_faults(self.members[i].name);
                self.members[i].api_faulted = false;
            }
            Heal::RoleBinding(i) => {
                self.api.set_role_binding(self.members[i].name, true);
                self.members[i].api_faulted = false;
            }
            Heal::ApiRestart => {
                assert_eq!(
                    self.api.resource_version(),
                    self.api_down_rv,
                    "nothing writes while the API server is down"
                );
                self.api.restart().await;
                assert_eq!(
                    self.api.resource_version(),
                    self.api_down_rv,
                    "the store is kept"
                );
                self.api_down = false;
            }
            Heal::Squeeze { stopped, killed } => {
                for i in stopped {
                    self.cont(i);
                }
                self.spawn(killed).await;
            }
        }
        let span = &mut self.spans[span].1;
        let healed = *span.healed.get_or_insert_with(Instant::now);
        eprintln!(
            "{} {}: {} on {} healed",
            self.world.label,
            rel(self.origin, healed),
            span.kind,
            span.target
        );
    }
}
