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
//! The gates give a second input, whether the collector runs at all
//! ([`Policy::gates_running`], from [`crate::serve::gate_acks`]): a leader
//! whose gates all say that nothing of its term runs, for `not_running`
//! without a break, releases the Lease as for a failed health check, and
//! counts an episode. Continuously, because the kubelet restarts a
//! crash-looping container after a delay that doubles up to five minutes:
//! every crash loop is soon "not running" for longer than any bound of a
//! minute or two, while a collector that exits once and is restarted at
//! once never is. Running without a break for `not_running` is the pass of
//! this input: it ends the episode. A leader whose collector is known
//! broken when its term starts (every peer's failed too, so it got the
//! Lease back) keeps it longer: `not_running` doubled per episode, up to
//! [`MAX_DOUBLINGS`] times, so a group whose every collector fails hands
//! the Lease round ever more slowly instead of flapping.
//!
//! Pure: every input comes with its instant; the task in
//! [`crate::serve::collector_health`] feeds it and publishes the verdict
//! (and logs each check from the policy's [`Tracker`] of passes and
//! failures in a row).

use std::time::Duration;

use tokio::time::Instant;

use crate::backoff::Backoff;

/// A term's `not_running` bound doubles per episode of its instance at
/// most this many times (8 × the bound: 4 minutes with the default 30 s).
pub const MAX_DOUBLINGS: u32 = 3;

/// Settings of the policy.
#[derive(Clone, Copy, Debug)]
pub struct Settings {
    /// The collector's health is checked: without checks only the gates
    /// (`not_running`) may make a leader release.
    pub health_checks: bool,
    /// Failed checks in a row after which a collector that passed fails.
    pub failures: u32,
    /// Time a new leader's collector has to pass its first check.
    pub grace: Duration,
    /// The first stand-back wait of a follower whose collector is known broken.
    pub first_wait: Duration,
    /// The lease duration: the longest stand-back wait, and how long after a
    /// term a pass still may come from the collector that term started.
    pub lease_duration: Duration,
    /// How long a leader's gates may say that nothing runs before it
    /// releases the Lease; `None`: never.
    pub not_running: Option<Duration>,
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
    /// A leader whose gates said for `not_running` that nothing runs.
    NotRunning,
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
    /// The gates' last word on whether anything runs (`None`: cannot tell).
    running: Option<bool>,
    /// The cause of the last episode: nothing ran (else a health check).
    not_running_episode: bool,
}

/// This instance's current term, as the policy sees it.
#[derive(Clone, Copy, Debug)]
struct Term {
    started: Instant,
    /// A check passed in it.
    passed: bool,
    /// Its release for the collector was counted as an episode.
    counted: bool,
    /// Since when its gates say that nothing runs, without a break.
    not_running_since: Option<Instant>,
    /// Since when its gates say that something runs, without a break.
    running_since: Option<Instant>,
    /// Nothing running for this long ends it: `not_running`, doubled per
    /// episode at its start.
    bound: Option<Duration>,
}

impl Term {
    /// The gates say `running` at `now`.
    fn gates(&mut self, running: Option<bool>, now: Instant) {
        match running {
            Some(false) => {
                self.not_running_since.get_or_insert(now);
                self.running_since = None;
            }
            Some(true) => {
                self.running_since.get_or_insert(now);
                self.not_running_since = None;
            }
            None => {
                self.running_since = None;
                self.not_running_since = None;
            }
        }
    }
}

fn term_bound(term: Option<Term>) -> Option<Duration> {
    term?.bound
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
            running: None,
            not_running_episode: false,
        }
    }

    /// The gates' word on whether anything of this instance's term runs
    /// (see [`crate::serve::gate_acks::GateAcks::running`]).
    pub fn gates_running(&mut self, running: Option<bool>, now: Instant) {
        self.running = running;
        if let Some(term) = &mut self.term {
            term.gates(running, now);
        }
    }

    /// The last episode was counted because nothing ran (not for a health
    /// check): what a follower standing back says, and the stop reason.
    pub fn not_running_episode(&self) -> bool {
        self.not_running_episode
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
                let mut term = Term {
                    started: now,
                    // Passing from before (it runs on followers): no grace.
                    // Without checks: nothing to pass.
                    passed: self.tracker.healthy() || !self.settings.health_checks,
                    counted: false,
                    not_running_since: None,
                    running_since: None,
                    bound: self
                        .settings
                        .not_running
                        .map(|bound| bound * 2u32.pow(self.episodes.min(MAX_DOUBLINGS))),
                };
                term.gates(self.running, now);
                self.term = Some(term);
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
            let not_running = self.settings.not_running;
            if let (Some(bound), Some(since)) = (not_running, term.running_since)
                && now >= since + bound
                && self.not_running_episode
            {
                // It ran without a break for the bound: this input's pass.
                self.episodes = 0;
            }
            let verdict = if let (Some(bound), Some(since)) = (term.bound, term.not_running_since)
                && now >= since + bound
            {
                Verdict::NotRunning
            } else if term.passed {
                if self.tracker.healthy() || !self.settings.health_checks {
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
                self.not_running_episode = verdict == Verdict::NotRunning;
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
        if let (Some(term), Some(bound), Some(pass)) =
            (self.term, term_bound(self.term), self.settings.not_running)
        {
            let gates = [
                term.not_running_since.map(|since| since + bound),
                term.running_since
                    .filter(|_| self.episodes > 0 && self.not_running_episode)
                    .map(|since| since + pass),
            ];
            let health = (!term.passed).then(|| term.started + self.settings.grace);
            return gates
                .into_iter()
                .flatten()
                .chain(health)
                .filter(|at| *at > now)
                .min();
        }
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

/// Health from the results of consecutive checks.
#[derive(Debug)]
pub struct Tracker {
    threshold: u32,
    failures_in_a_row: u32,
    healthy: bool,
    ever_passed: bool,
}

// === impl Tracker ===

impl Tracker {
    /// Unhealthy until the first pass; then unhealthy after `threshold`
    /// failures in a row.
    pub fn new(threshold: u32) -> Self {
        Self {
            threshold,
            failures_in_a_row: 0,
            healthy: false,
            ever_passed: false,
        }
    }

    pub fn healthy(&self) -> bool {
        self.healthy
    }

    pub fn threshold(&self) -> u32 {
        self.threshold
    }

    /// A check has passed since the start.
    pub fn ever_passed(&self) -> bool {
        self.ever_passed
    }

    pub fn failures_in_a_row(&self) -> u32 {
        self.failures_in_a_row
    }

    /// Records one check; returns whether the collector counts as healthy.
    pub fn record(&mut self, passed: bool) -> bool {
        if passed {
            self.failures_in_a_row = 0;
            self.healthy = true;
            self.ever_passed = true;
        } else {
            self.failures_in_a_row = self.failures_in_a_row.saturating_add(1);
            if self.failures_in_a_row >= self.threshold {
                self.healthy = false;
            }
        }
        self.healthy
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unhealthy_until_the_first_pass_then_after_n_failures_in_a_row() {
        let mut tracker = Tracker::new(3);
        assert!(!tracker.healthy(), "a collector never seen is unhealthy");
        for _ in 0..5 {
            assert!(!tracker.record(false));
        }
        assert!(tracker.record(true), "one pass is enough");
        assert!(tracker.record(false));
        assert!(tracker.record(false));
        assert!(tracker.record(true), "a pass resets the count");
        assert!(tracker.record(false));
        assert!(tracker.record(false));
        assert!(!tracker.record(false), "the third failure in a row");
        assert!(tracker.record(true));
    }

    const S: Duration = Duration::from_secs(1);

    fn settings() -> Settings {
        Settings {
            health_checks: true,
            failures: 3,
            grace: 30 * S,
            first_wait: 4 * S,
            lease_duration: 15 * S,
            not_running: None,
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

    /// No health check; a leader releases after 10 s of nothing running.
    fn gates_only() -> Settings {
        Settings {
            health_checks: false,
            not_running: Some(10 * S),
            ..settings()
        }
    }

    #[test]
    fn a_leader_whose_gates_say_nothing_runs_for_the_bound_releases() {
        let t0 = Instant::now();
        let mut policy = Policy::new(gates_only(), t0);
        policy.role(LEADING, t0);
        policy.gates_running(Some(true), t0);
        assert_eq!(
            policy.verdict(t0 + 60 * S),
            Verdict::MayLead,
            "no grace to pass"
        );
        // The child exited on its own, and exec with it.
        policy.gates_running(Some(false), t0 + 61 * S);
        assert_eq!(policy.next_change(t0 + 61 * S), Some(t0 + 71 * S));
        assert_eq!(policy.verdict(t0 + 70 * S), Verdict::MayLead);
        assert_eq!(policy.verdict(t0 + 71 * S), Verdict::NotRunning);
        assert_eq!(policy.episodes(), 1);
        assert!(policy.not_running_episode());
        // Released: it stands back like a pod whose health check failed.
        policy.role(LEADERLESS, t0 + 72 * S);
        assert!(matches!(
            policy.verdict(t0 + 72 * S),
            Verdict::StandingBack { .. }
        ));
    }

    #[test]
    fn a_collector_restarted_within_the_bound_keeps_the_lease() {
        let t0 = Instant::now();
        let mut policy = Policy::new(gates_only(), t0);
        policy.role(LEADING, t0);
        // Exits and restarts, each gap shorter than the bound.
        for (i, gap) in [9, 5, 9, 1].into_iter().enumerate() {
            let at = t0 + (i as u32) * 20 * S;
            policy.gates_running(Some(false), at);
            assert_eq!(policy.verdict(at + gap * S), Verdict::MayLead);
            policy.gates_running(Some(true), at + gap * S);
        }
        assert_eq!(policy.next_change(t0 + 100 * S), None);
        assert_eq!(policy.verdict(t0 + 200 * S), Verdict::MayLead);
        assert_eq!(policy.episodes(), 0);
    }

    #[test]
    fn gates_that_cannot_tell_never_make_a_leader_release() {
        let t0 = Instant::now();
        let mut policy = Policy::new(gates_only(), t0);
        policy.role(LEADING, t0);
        policy.gates_running(Some(false), t0);
        policy.gates_running(None, t0 + 9 * S);
        assert_eq!(policy.next_change(t0 + 9 * S), None);
        assert_eq!(policy.verdict(t0 + 100 * S), Verdict::MayLead);
        // Off: the gates' word changes nothing.
        let mut off = Policy::new(
            Settings {
                not_running: None,
                ..gates_only()
            },
            t0,
        );
        off.role(LEADING, t0);
        off.gates_running(Some(false), t0);
        assert_eq!(off.verdict(t0 + 100 * S), Verdict::MayLead);
    }

    #[test]
    fn nothing_running_when_a_term_starts_counts_from_its_start() {
        let t0 = Instant::now();
        let mut policy = Policy::new(gates_only(), t0);
        // Heard while following (the registry says it as the term starts,
        // before or after the role reaches the policy).
        policy.gates_running(Some(false), t0);
        assert_eq!(policy.verdict(t0 + 50 * S), Verdict::MayLead);
        policy.role(LEADING, t0 + 50 * S);
        assert_eq!(policy.verdict(t0 + 59 * S), Verdict::MayLead);
        assert_eq!(policy.verdict(t0 + 60 * S), Verdict::NotRunning);
    }

    #[test]
    fn with_every_collector_down_terms_and_waits_double_until_one_runs() {
        let t0 = Instant::now();
        let mut policy = Policy::new(gates_only(), t0);
        let mut at = t0;
        let mut waits = Vec::new();
        let mut terms = Vec::new();
        for _ in 0..5 {
            policy.role(LEADING, at);
            policy.gates_running(Some(false), at);
            let Some(end) = policy.next_change(at) else {
                panic!("the term ends")
            };
            terms.push((end - at).as_secs());
            assert_eq!(policy.verdict(end - S), Verdict::MayLead, "never sooner");
            at = end;
            assert_eq!(policy.verdict(at), Verdict::NotRunning);
            policy.role(LEADERLESS, at);
            let Verdict::StandingBack { wait } = policy.verdict(at) else {
                panic!("stands back")
            };
            waits.push(wait.as_secs());
            assert_eq!(policy.next_change(at), Some(at + wait));
            at += wait;
            assert_eq!(
                policy.verdict(at),
                Verdict::MayLead,
                "never leaderless for good"
            );
        }
        assert_eq!(waits, [4, 8, 15, 15, 15]);
        // Each term of a known broken collector lasts longer: no flapping.
        assert_eq!(terms, [10, 20, 40, 80, 80]);
        // It runs again: a start alone proves nothing, a run of the bound
        // without a break ends the episode.
        policy.role(LEADING, at);
        policy.gates_running(Some(true), at);
        assert_eq!(policy.verdict(at + 9 * S), Verdict::MayLead);
        assert_eq!(policy.episodes(), 5);
        assert_eq!(policy.next_change(at + 9 * S), Some(at + 10 * S));
        assert_eq!(policy.verdict(at + 10 * S), Verdict::MayLead);
        assert_eq!(policy.episodes(), 0, "ran for the bound");
    }

    #[test]
    fn a_health_check_and_the_gates_each_make_a_leader_release() {
        let t0 = Instant::now();
        let both = Settings {
            not_running: Some(10 * S),
            ..settings()
        };
        let mut policy = Policy::new(both, t0);
        policy.role(LEADING, t0);
        policy.checked(true, t0 + S);
        policy.gates_running(Some(false), t0 + 2 * S);
        assert_eq!(policy.verdict(t0 + 12 * S), Verdict::NotRunning);
        let mut policy = Policy::new(both, t0);
        policy.role(LEADING, t0);
        policy.gates_running(Some(true), t0);
        assert_eq!(policy.verdict(t0 + 30 * S), Verdict::NoPassWithinGrace);
        assert!(!policy.not_running_episode());
    }
}
