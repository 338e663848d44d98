//! The herd before a successor is named: 1,000 and 5,000 candidates (in
//! this one process, as in `swarm.rs`) whose claim window is so long that
//! no successor is named during the run; each round is a hand-over that nobody is first
//! in line for — a graceful stop of the leader (its release names nobody)
//! or a crash (every follower's clock expires the record at about the same
//! instant). What it costs is the 409s of the candidates that wrote before
//! the winner's record reached them on the watch, and the time from the
//! record becoming free to the winner's acquisition.
//!
//! The fan-out of one event to 5,000 watches by the fake, with 5,000 clients
//! on the same 2 cores, takes far longer than a real API server's 10–50 ms,
//! which widens the window in which a write still conflicts: these figures
//! are an upper bound for the same draw against a real server.

use std::time::{Duration, Instant};

use crate::program::DEFAULTS;
use crate::swarm::{Round, Swarm, med, ms};
use crate::table::Table;

#[derive(Default)]
pub struct Row {
    pub candidates: usize,
    /// `ms`: the release's arrival (graceful) or the expiry — the last
    /// renew's arrival + the lease duration — to the acquisition's arrival.
    pub graceful: Vec<Round>,
    pub expiry: Vec<Round>,
    /// The fake alone: one event written to every watch (ms).
    pub fake_fanout_ms: Vec<f64>,
}

pub async fn run(size: usize, rounds: usize, note: &dyn Fn(&str)) -> Row {
    let t = DEFAULTS;
    // Claims fall within [retry, window], the earliest of N about
    // window × N^(-1/3) in: with the flag's largest window (1 h), 210 s at
    // 5,000 — before this bench has started them all. This window keeps the
    // slot empty for the whole run.
    let window = Duration::from_secs(1_000_000);
    let mut swarm = Swarm::start_with(size, t, Some(window)).await;
    note(&format!(
        "herd{size}: {size} candidates watching, no successor named"
    ));
    let mut row = Row {
        candidates: size,
        ..Row::default()
    };
    let holder = |swarm: &Swarm| swarm.lease().0;
    swarm.holder_other_than("", t.lease * 3).await;
    for _ in 0..3 {
        row.fake_fanout_ms.push(swarm.fake_fanout().await);
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    note(&format!("herd{size}: graceful, nobody named"));
    for _ in 0..rounds {
        let h = holder(&swarm).expect("a holder");
        assert_eq!(swarm.lease().1, None, "a successor was named");
        swarm.api.clear_requests();
        let t0 = Instant::now();
        swarm.stop(&h).await;
        let new = swarm.holder_other_than(&h, t.lease * 2).await;
        let acq = swarm.wait_write(&new, Some(t0)).await;
        let release = swarm.last_write(&h, acq.at);
        let seen = swarm.all_see(&new, Duration::from_secs(60)).await;
        tokio::time::sleep(Duration::from_millis(500)).await;
        let (writes, conflicts) = swarm.writes(release.at, Instant::now(), &[], &acq);
        row.graceful.push(Round {
            ms: ms(acq.at - release.at),
            writes,
            conflicts,
            fanout_ms: ms(seen - acq.at),
            ..Round::default()
        });
        swarm.replace(1).await;
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    note(&format!("herd{size}: expiry, nobody named"));
    for _ in 0..rounds {
        let h = holder(&swarm).expect("a holder");
        swarm.api.clear_requests();
        let renew = swarm.wait_write(&h, Some(Instant::now())).await;
        swarm.crash(&h);
        let t0 = Instant::now();
        let new = swarm.holder_other_than(&h, t.lease * 3).await;
        let acq = swarm.wait_write(&new, Some(renew.at)).await;
        let seen = swarm.all_see(&new, Duration::from_secs(60)).await;
        tokio::time::sleep(Duration::from_millis(500)).await;
        let (writes, conflicts) = swarm.writes(t0, Instant::now(), &[], &acq);
        row.expiry.push(Round {
            ms: ms(acq.at - renew.at) - ms(t.lease),
            writes,
            conflicts,
            fanout_ms: ms(seen - acq.at),
            ..Round::default()
        });
        swarm.replace(1).await;
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    swarm.abort_all();
    row
}

/// Rows of the main table (times) and a table of conflicts per hand-over.
pub fn print(rows: &[Row], table: &mut Table) {
    let half_retry = ms(DEFAULTS.retry) / 2.0;
    for r in rows {
        let n = r.candidates;
        let v = |rs: &[Round]| rs.iter().map(|x| x.ms).collect::<Vec<_>>();
        table.signed(
            &format!(
                "herd {n}: graceful stop, no successor named → acquisition, after the release"
            ),
            &format!("≤ {:.0}", 2.0 * half_retry),
            &v(&r.graceful),
            |p| p <= 2.0 * half_retry,
        );
        table.signed(
            &format!("herd {n}: crash, no successor named → acquisition, after the expiry (last renew + 15 s)"),
            &format!("≤ {:.0}", 2.0 * half_retry),
            &v(&r.expiry),
            |p| p <= 2.0 * half_retry,
        );
    }
}

pub fn print_conflicts(rows: &[Row]) {
    if rows.is_empty() {
        return;
    }
    println!();
    println!(
        "| no successor named (defaults 15s/10s/2s, in one process) | graceful: writes / 409s, median (max) | expiry: writes / 409s, median (max) | 409s per round (graceful; expiry) | fan-out ms, acquisition → all candidates (median / max) | the fake alone, one event to every watch (ms) |"
    );
    println!("|---|---|---|---|---|---|");
    for r in rows {
        let wc = |rs: &[Round]| {
            let w: Vec<usize> = rs.iter().map(|x| x.writes).collect();
            let c: Vec<usize> = rs.iter().map(|x| x.conflicts).collect();
            format!(
                "{} / {} ({} / {})",
                med(&w),
                med(&c),
                w.iter().max().unwrap_or(&0),
                c.iter().max().unwrap_or(&0)
            )
        };
        let mut fan: Vec<f64> = [&r.graceful, &r.expiry]
            .iter()
            .flat_map(|rs| rs.iter().map(|x| x.fanout_ms))
            .collect();
        fan.sort_by(|a, b| a.total_cmp(b));
        let each = |rs: &[Round]| {
            rs.iter()
                .map(|x| x.conflicts.to_string())
                .collect::<Vec<_>>()
                .join(", ")
        };
        println!(
            "| {} candidates | {} | {} | {}; {} | {:.0} / {:.0} | {} |",
            r.candidates,
            wc(&r.graceful),
            wc(&r.expiry),
            each(&r.graceful),
            each(&r.expiry),
            fan.get(fan.len() / 2).copied().unwrap_or(0.0),
            fan.last().copied().unwrap_or(0.0),
            r.fake_fanout_ms
                .iter()
                .map(|m| format!("{m:.0}"))
                .collect::<Vec<_>>()
                .join(", "),
        );
    }
}
