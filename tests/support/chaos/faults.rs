//! The faults a chaos run knows, and the seeded draw of the next decision.
//! A world weights the kinds it injects ([`super::World::kinds`]); a kind
//! it gives no weight never happens there.

use std::time::{Duration, Instant};

use crate::support::history::LEASE_DELETED;

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Kind {
    Kill,
    Term,
    Stop,
    Partition,
    Forbidden,
    ServerErrors,
    Throttle,
    Latency,
    Hang,
    DropWatches,
    Gone,
    HolderEdit,
    Delete,
    ApiRestart,
    RotateToken,
    SuccessorKill,
    Handover,
    HandoverStopped,
    Squeeze,
}

impl Kind {
    pub fn name(self) -> &'static str {
        match self {
            Kind::Kill => "sigkill+restart",
            Kind::Term => "sigterm+restart",
            Kind::Stop => "sigstop+sigcont",
            Kind::Partition => "partition",
            Kind::Forbidden => "403",
            Kind::ServerErrors => "5xx",
            Kind::Throttle => "429",
            Kind::Latency => "latency",
            Kind::Hang => "hang",
            Kind::DropWatches => "dropped-watches",
            Kind::Gone => "410-gone",
            Kind::HolderEdit => "holder-edit",
            // The checker's name: a start blind to a just-deleted Lease is
            // counted apart (rule 3).
            Kind::Delete => LEASE_DELETED,
            Kind::ApiRestart => "apiserver-restart",
            Kind::RotateToken => "token-rotation",
            Kind::SuccessorKill => "successor-sigkill",
            Kind::Handover => "handover",
            Kind::HandoverStopped => "handover-to-stopped",
            Kind::Squeeze => "squeeze",
        }
    }

    /// Per-client faults of the API server (one at a time per client, so
    /// healing one never clears another).
    pub fn is_api_fault(self) -> bool {
        matches!(
            self,
            Kind::Partition
                | Kind::Forbidden
                | Kind::ServerErrors
                | Kind::Throttle
                | Kind::Latency
                | Kind::Hang
                | Kind::Gone
        )
    }

    pub fn is_process_fault(self) -> bool {
        matches!(self, Kind::Kill | Kind::Term | Kind::Stop)
    }

    /// See rule 2 of the history checker: faults that by design never delay
    /// a takeover by the healthy peers do not suspend the gap check.
    pub fn suspends_gap_check(self) -> bool {
        !matches!(
            self,
            Kind::DropWatches | Kind::Gone | Kind::RotateToken | Kind::Handover
        )
    }

    /// How many of the slots of active faults it takes.
    pub fn slots(self) -> usize {
        if self == Kind::Squeeze { 2 } else { 1 }
    }
}

/// One decision, drawn the same way whatever the cluster's state.
#[derive(Clone, Copy, Debug)]
pub struct Draw {
    pub kind: Kind,
    /// The Lease whose holder a fault aims at, or that it concerns (always
    /// the first with one Lease).
    pub lease: usize,
    pub index: usize,
    pub aim_at_holder: bool,
    pub frac: f64,
    pub variant: u32,
    pub max_active: usize,
    pub pause: Duration,
}

/// The next decision, of `kinds` (weighted) for `members` processes of
/// `leases` Leases each. A Lease is drawn only when there is a choice, so
/// a world of one Lease draws what it always drew.
pub fn draw(rng: &mut fastrand::Rng, kinds: &[(Kind, u32)], leases: usize, members: usize) -> Draw {
    let total: u32 = kinds.iter().map(|(_, w)| w).sum();
    let mut pick = rng.u32(0..total);
    let mut kind = kinds[0].0;
    for (k, w) in kinds {
        if pick < *w {
            kind = *k;
            break;
        }
        pick -= w;
    }
    Draw {
        kind,
        lease: if leases > 1 { rng.usize(0..leases) } else { 0 },
        index: rng.usize(0..members),
        aim_at_holder: rng.f64() < 0.6,
        frac: rng.f64(),
        variant: rng.u32(0..3),
        max_active: 1 + rng.usize(0..2),
        pause: Duration::from_millis(300 + rng.u64(0..2700)),
    }
}

pub fn secs(s: f64) -> Duration {
    Duration::from_secs_f64(s)
}

/// How an active fault heals.
#[derive(Debug)]
pub enum Heal {
    Restart(usize),
    Cont(usize),
    ClearFaults(usize),
    RoleBinding(usize),
    ApiRestart,
    /// Healed by the member's exit and restart (SIGTERM).
    AfterExit(usize),
    /// SIGCONT of the stopped, then the restart of the killed.
    Squeeze {
        stopped: Vec<usize>,
        killed: usize,
    },
}

/// When an injected fault's span closes.
pub enum Until {
    /// At once: it happened in an instant.
    Now,
    /// When something else closes it (a hand-over, when it returns); it
    /// takes no slot.
    Closed,
    /// When it heals, after the given time (`None`: when the member's exit
    /// says).
    Heals(Option<Duration>, Heal),
}

pub struct Active {
    pub span: usize,
    pub heal_at: Option<Instant>,
    pub heal: Heal,
    pub slots: usize,
}
