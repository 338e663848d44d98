//! A day of renewals in an hour: the leader's and an idle follower's
//! resident memory over as many successful renews as 24 hours bring at the
//! default retry period (2 s → 43,200), at retry 100 ms. Growth here would be
//! a leak per renew or per watch event (the follower sees every renew).

use std::time::{Duration, Instant};

use crate::group::Group;
use crate::support::sidecar::Timing;

/// Renewals in 24 hours at the default retry period of 2 s.
pub const DAY_OF_RENEWALS: usize = 24 * 3600 / 2;

/// As short as the flags allow: the renew period is what is counted.
const DAY: Timing = Timing {
    lease: Duration::from_secs(2),
    renew_deadline: Duration::from_millis(1500),
    retry: Duration::from_millis(100),
};

/// RSS samples (KiB) of the leader and the follower after a number of
/// renewals.
pub struct Sample {
    pub renewals: usize,
    pub leader_kib: u64,
    pub follower_kib: u64,
}

pub struct DayRun {
    pub renewals: usize,
    pub took: Duration,
    /// Changes of holder during the run (0 when the leader never lost it).
    pub holder_changes: usize,
    /// After the first 1,000 renewals (allocator warmed up) and at the end.
    pub warm: Sample,
    pub end: Sample,
    pub max_leader_kib: u64,
    pub max_follower_kib: u64,
}

pub async fn day(renewals: usize) -> DayRun {
    let group = Group::start("day", DAY, 2).await;
    let (mut leader, _) = group.leader_other_than(None, DAY.lease * 3).await;
    let started = Instant::now();
    let mut counted = 0;
    let mut holder_changes = 0;
    let mut warm = None;
    let mut max_leader_kib = 0;
    let mut max_follower_kib = 0;
    let sample = |leader: usize, counted: usize| Sample {
        renewals: counted,
        leader_kib: group.sidecars[leader].rss_kib(),
        follower_kib: group.sidecars[1 - leader].rss_kib(),
    };
    group.api.clear_requests();
    loop {
        tokio::time::sleep(Duration::from_secs(5)).await;
        // Successful PUTs by either candidate (the acquisition after a
        // change of holder counts as a renew of the new term).
        for s in &group.sidecars {
            counted += group.successful_updates(&s.name).len();
        }
        group.api.clear_requests();
        if let Some(holder) = group.holder()
            && let Some(now_leading) = group.index_of(&holder)
            && now_leading != leader
        {
            holder_changes += 1;
            leader = now_leading;
        }
        let now = sample(leader, counted);
        max_leader_kib = max_leader_kib.max(now.leader_kib);
        max_follower_kib = max_follower_kib.max(now.follower_kib);
        if warm.is_none() && counted >= 1_000.min(renewals) {
            warm = Some(now);
        } else if counted >= renewals {
            return DayRun {
                renewals: counted,
                took: started.elapsed(),
                holder_changes,
                warm: warm.unwrap_or(Sample {
                    renewals: 0,
                    leader_kib: 0,
                    follower_kib: 0,
                }),
                end: now,
                max_leader_kib,
                max_follower_kib,
            };
        }
    }
}
