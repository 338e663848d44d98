//! Collector policy: whether this instance may hold, or contend for, the
//! Lease, judged from its collector's health checks and its own role.
//!
//! Health decides whether a leader *keeps* the Lease; it never keeps a group
//! leaderless because no collector could start — under `leader-gate exec`
//! the collector runs only on the leader, so a follower's check cannot pass.
//!
//! - A follower contends unless its collector is *known broken*: it failed
//!   while it was meant to run (see below). A collector that was never seen
//!   working is not known broken: it may simply not run on followers.
//! - A new leader gives its collector `grace` to pass. It releases the
//!   Lease when the grace runs out without a pass, or, once passed, after
//!   the tracker's failures in a row: the collector ran and failed.
//! - A follower whose collector is known broken stands back: it contends
//!   only once the group has had no leader for a wait that doubles with
//!   every such episode, up to the lease duration, so a healthy peer gets
//!   the Lease first but the group is never leaderless for good.
//! - A follower's collector counts as running on followers (not gated by
//!   `exec`) once it passed a check more than a lease duration after this
//!   instance last led; its failures then make it known broken too.
//! - Any pass ends an episode: the collector is no longer known broken and
//!   the wait starts again from the first.
//!
//! Pure: every input comes with its instant; the task in
//! [`crate::serve::collector_health`] feeds it and publishes the verdict.

use std::time::Duration;

use tokio::time::Instant;

use crate::backoff::Backoff;
use crate::serve::collector_health::Tracker;

/// Settings of the policy.
#[derive(Clone, Copy, Debug)]
pub struct Settings {
    /// Failed checks in a row after which a collector that passed fails.
    pub failures: u32,
    /// Time a new leader's collector has to pass its first check.
    pub grace: Duration,
    /// The first stand-back wait of a follower whose collector is known broken.
    pub first_wait: Duration,
    /// The lease duration: the longest stand-back wait, and how long after a
    /// term a pass still may come from the collector that term started.
    pub lease_duration: Duration,
}

/// What changed in this instance's role, as published.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Role {
    pub leading: bool,
    /// No live holder is known (the Lease is free, released or expired).
    pub leaderless: bool,
}

/// Why the verdict turned to "may not lead", for the log.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// May lead, or keep leading.
    MayLead,
    /// A leader whose collector did not pass within the grace.
    NoPassWithinGrace,
    /// A leader whose collector passed, then failed too many times in a row.
    FailedWhileLeading,
    /// A follower whose collector is known broken, standing back for `wait`
    /// of a leaderless group.
    StandingBack { wait: Duration },
}

/// The policy's state.
#[derive(Debug)]
pub struct Policy {
    settings: Settings,
    /// Passing: passed at least once since the last failures in a row.
    tracker: Tracker,
    /// The current term, if leading.
    term: Option<Term>,
    /// When this instance last stopped leading (its start, if it never led).
    following_since: Instant,
    /// Passed on a follower long after any term: the collector runs there.
    runs_on_followers: bool,
    /// Episodes of a known broken collector since its last pass (0: not broken).
    episodes: u32,
    /// The random fraction of this episode's wait (jitter).
    jitter: f64,
    /// Since when the group is seen without a leader.
    leaderless_since: Option<Instant>,
}

/// This instance's current term, as the policy sees it.
#[derive(Clone, Copy, Debug)]
struct Term {
    started: Instant,
    /// A check passed in it.
    passed: bool,
    /// Its release for the collector was counted as an episode.
    counted: bool,
}

/// The stand-back wait: `first`, doubling per episode, up to `max`; a
/// tenth of jitter so broken peers do not all contend at one instant.
fn backoff(settings: &Settings) -> Backoff {
    Backoff {
        first: settings.first_wait,
        max: settings.lease_duration.max(settings.first_wait),
        jitter: 0.1,
    }
}

// === impl Policy ===

impl Policy {
    pub fn new(settings: Settings, now: Instant) -> Self {
        Self {
            tracker: Tracker::new(settings.failures),
            settings,
            term: None,
            following_since: now,
            runs_on_followers: false,
            episodes: 0,
            jitter: 0.0,
            leaderless_since: None,
        }
    }

    /// One check's result.
    pub fn checked(&mut self, passed: bool, now: Instant) {
        let was_passing = self.tracker.healthy();
        let passing = self.tracker.record(passed);
        if passed {
            self.episodes = 0;
            match &mut self.term {
                Some(term) => term.passed = true,
                None if now >= self.following_since + self.settings.lease_duration => {
                    self.runs_on_followers = true;
                }
                None => {}
            }
            return;
        }
        if was_passing && !passing && self.term.is_none() && self.runs_on_followers {
            // It runs on followers, and it ran and failed here.
            self.new_episode();
        }
    }

    /// The results of the checks so far.
    pub fn tracker(&self) -> &Tracker {
        &self.tracker
    }

    /// This instance's role as published.
    pub fn role(&mut self, role: Role, now: Instant) {
        match (role.leading, self.term) {
            (true, None) => {
                self.term = Some(Term {
                    started: now,
                    // Passing from before (it runs on followers): no grace.
                    passed: self.tracker.healthy(),
                    counted: false,
                });
            }
            (false, Some(_)) => {
                self.term = None;
                self.following_since = now;
            }
            _ => {}
        }
        self.leaderless_since = match (role.leaderless && !role.leading, self.leaderless_since) {
            (true, Some(since)) => Some(since),
            (true, None) => Some(now),
            (false, _) => None,
        };
    }

    /// The verdict at `now`. A leader that must release starts an episode.
    pub fn verdict(&mut self, now: Instant) -> Verdict {
        if let Some(term) = self.term {
            let verdict = if term.passed {
                if self.tracker.healthy() {
                    Verdict::MayLead
                } else {
                    Verdict::FailedWhileLeading
                }
            } else if now < term.started + self.settings.grace {
                // Still starting.
                Verdict::MayLead
            } else {
                Verdict::NoPassWithinGrace
            };
            if verdict != Verdict::MayLead && !term.counted {
                self.new_episode();
                if let Some(term) = &mut self.term {
                    term.counted = true;
                }
            }
            return verdict;
        }
        if self.episodes == 0 {
            return Verdict::MayLead;
        }
        let wait = self.wait();
        match self.leaderless_since {
            Some(since) if now >= since + wait => Verdict::MayLead,
            _ => Verdict::StandingBack { wait },
        }
    }

    /// The next instant after `now` at which the verdict may change without
    /// an input.
    pub fn next_change(&self, now: Instant) -> Option<Instant> {
        let at = match self.term {
            Some(term) if !term.passed => Some(term.started + self.settings.grace),
            Some(_) => None,
            None if self.episodes > 0 => self.leaderless_since.map(|since| since + self.wait()),
            None => None,
        };
        // Passed already: the verdict took it into account.
        at.filter(|at| *at > now)
    }

    /// Known broken: the episodes since the collector last passed.
    pub fn episodes(&self) -> u32 {
        self.episodes
    }

    /// The stand-back wait of the current episode.
    fn wait(&self) -> Duration {
        backoff(&self.settings).delay(self.episodes, self.jitter)
    }

    fn new_episode(&mut self) {
        self.episodes = self.episodes.saturating_add(1);
        self.jitter = fastrand::f64();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: Duration = Duration::from_secs(1);

    fn settings() -> Settings {
        Settings {
            failures: 3,
            grace: 30 * S,
            first_wait: 4 * S,
            lease_duration: 15 * S,
        }
    }

    const LEADING: Role = Role {
        leading: true,
        leaderless: false,
    };
    const FOLLOWING: Role = Role {
        leading: false,
        leaderless: false,
    };
    const LEADERLESS: Role = Role {
        leading: false,
        leaderless: true,
    };

    #[test]
    fn a_follower_whose_collector_never_ran_contends() {
        let t0 = Instant::now();
        let mut policy = Policy::new(settings(), t0);
        for i in 0..100 {
            policy.checked(false, t0 + i * S);
        }
        policy.role(LEADERLESS, t0 + 100 * S);
        assert_eq!(policy.verdict(t0 + 100 * S), Verdict::MayLead);
        policy.role(FOLLOWING, t0 + 101 * S);
        assert_eq!(policy.verdict(t0 + 101 * S), Verdict::MayLead);
    }

    #[test]
    fn a_new_leader_keeps_the_lease_for_the_grace_then_releases_without_a_pass() {
        let t0 = Instant::now();
        let mut policy = Policy::new(settings(), t0);
        policy.role(LEADING, t0);
        for i in 0..29 {
            policy.checked(false, t0 + i * S);
            assert_eq!(policy.verdict(t0 + i * S), Verdict::MayLead, "{i} s");
        }
        assert_eq!(policy.next_change(t0 + 29 * S), Some(t0 + 30 * S));
        assert_eq!(policy.verdict(t0 + 30 * S), Verdict::NoPassWithinGrace);
        assert_eq!(policy.episodes(), 1);
        // Released: it stands back while a peer leads, and for the wait of
        // a leaderless group, then contends again.
        policy.role(FOLLOWING, t0 + 31 * S);
        assert!(matches!(
            policy.verdict(t0 + 100 * S),
            Verdict::StandingBack { .. }
        ));
        policy.role(LEADERLESS, t0 + 100 * S);
        let Verdict::StandingBack { wait } = policy.verdict(t0 + 100 * S) else {
            panic!("stands back")
        };
        assert!(wait >= 4 * S && wait <= 4 * S + 4 * S / 10, "{wait:?}");
        assert_eq!(policy.next_change(t0 + 100 * S), Some(t0 + 100 * S + wait));
        assert_eq!(policy.verdict(t0 + 100 * S + wait), Verdict::MayLead);
        assert_eq!(
            policy.next_change(t0 + 100 * S + wait),
            None,
            "nothing left to wait for"
        );
    }

    #[test]
    fn a_pass_within_the_grace_keeps_the_lease_until_failures_in_a_row() {
        let t0 = Instant::now();
        let mut policy = Policy::new(settings(), t0);
        policy.role(LEADING, t0);
        policy.checked(false, t0 + S);
        policy.checked(true, t0 + 2 * S);
        assert_eq!(policy.next_change(t0 + 2 * S), None);
        assert_eq!(policy.verdict(t0 + 60 * S), Verdict::MayLead, "passed");
        policy.checked(false, t0 + 61 * S);
        policy.checked(false, t0 + 62 * S);
        assert_eq!(policy.verdict(t0 + 62 * S), Verdict::MayLead);
        policy.checked(false, t0 + 63 * S);
        assert_eq!(policy.verdict(t0 + 63 * S), Verdict::FailedWhileLeading);
    }

    #[test]
    fn a_collector_passing_when_the_term_starts_gets_no_grace() {
        let t0 = Instant::now();
        let mut policy = Policy::new(settings(), t0);
        policy.checked(true, t0);
        policy.role(LEADING, t0 + S);
        for i in 2..5 {
            policy.checked(false, t0 + i * S);
        }
        assert_eq!(policy.verdict(t0 + 4 * S), Verdict::FailedWhileLeading);
    }

    #[test]
    fn the_wait_doubles_per_episode_up_to_the_lease_duration_and_a_pass_resets_it() {
        let t0 = Instant::now();
        let mut policy = Policy::new(settings(), t0);
        let mut at = t0;
        let mut waits = Vec::new();
        for _ in 0..5 {
            policy.role(LEADING, at);
            at += 30 * S;
            assert_eq!(policy.verdict(at), Verdict::NoPassWithinGrace);
            policy.role(LEADERLESS, at);
            let Verdict::StandingBack { wait } = policy.verdict(at) else {
                panic!("stands back")
            };
            waits.push(wait.as_secs());
            at += wait;
            assert_eq!(policy.verdict(at), Verdict::MayLead);
        }
        assert_eq!(waits, [4, 8, 15, 15, 15]);
        policy.role(LEADING, at);
        policy.checked(true, at + S);
        assert_eq!(policy.episodes(), 0, "a pass ends the episode");
    }

    #[test]
    fn a_collector_seen_working_on_a_follower_is_known_broken_when_it_fails_there() {
        let t0 = Instant::now();
        let mut policy = Policy::new(settings(), t0);
        policy.role(FOLLOWING, t0);
        // A pass a lease duration after start: it runs on followers.
        policy.checked(true, t0 + 16 * S);
        for i in 17..20 {
            policy.checked(false, t0 + i * S);
        }
        assert!(matches!(
            policy.verdict(t0 + 20 * S),
            Verdict::StandingBack { .. }
        ));
        policy.checked(true, t0 + 21 * S);
        assert_eq!(policy.verdict(t0 + 21 * S), Verdict::MayLead);
    }

    #[test]
    fn a_pass_soon_after_a_term_may_be_the_stopping_collector_and_proves_nothing() {
        let t0 = Instant::now();
        let mut policy = Policy::new(settings(), t0);
        policy.role(LEADING, t0);
        policy.checked(true, t0 + S);
        policy.role(FOLLOWING, t0 + 10 * S);
        // `exec` stops the collector within the margin: its last answers
        // come from a collector that is on its way out.
        policy.checked(true, t0 + 11 * S);
        for i in 12..20 {
            policy.checked(false, t0 + i * S);
        }
        assert_eq!(policy.verdict(t0 + 20 * S), Verdict::MayLead);
    }
}
