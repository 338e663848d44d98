//! A published elector side by side with leader-gate: `bench-peer/` wraps
//! kube-lease-manager behind leader-gate's command line and `/leader`
//! contract (`klm-gate`); the same scenarios run for it in the same
//! invocation, and the figures print with ratios leader-gate ÷ peer.
//!
//! The peer binary: `--peer PATH`, else `PEER_BIN`, else
//! `bench-peer/target/release/klm-gate` if `scripts/build-peer.sh` built it;
//! without one the peer rows are skipped with a note.

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::latency;
use crate::load::{Load, load};
use crate::program::Program;
use crate::wrk::{WrkRun, wrk_leader};

/// One program's figures from one run.
#[derive(Default)]
pub struct Side {
    pub acquire: Vec<Duration>,
    pub graceful: Vec<Duration>,
    pub crash: Vec<Duration>,
    pub startup: Vec<Duration>,
    pub loads: Vec<Load>,
    pub wrk: Option<WrkRun>,
    pub binary: PathBuf,
}

/// What to run: the bench's `--only`, rounds and window lengths.
pub struct Plan<'a> {
    pub wants: &'a dyn Fn(&str) -> bool,
    /// Named in `--only`: the rows too long for every run.
    pub named: &'a dyn Fn(&str) -> bool,
    pub rounds: usize,
    pub quick: bool,
    pub steady: Duration,
    pub wrk_seconds: u64,
    pub note: &'a dyn Fn(&str),
}

/// Runs the failover, start, load and `/leader` scenarios for the peer.
pub async fn measure(peer: &Path, plan: &Plan<'_>) -> Side {
    let program = Program::Peer(peer.to_path_buf());
    let mut side = Side {
        binary: peer.to_path_buf(),
        ..Side::default()
    };
    if (plan.wants)("acquire") {
        (plan.note)("peer acquire");
        for _ in 0..plan.rounds {
            side.acquire
                .push(latency::first_acquisition(&program).await);
        }
    }
    if (plan.wants)("graceful") {
        (plan.note)("peer graceful");
        side.graceful = latency::graceful(&program, plan.rounds).await;
    }
    if (plan.wants)("crash") {
        (plan.note)("peer crash");
        side.crash = latency::crash(&program, plan.rounds).await;
    }
    if (plan.wants)("startup") {
        (plan.note)("peer startup");
        for _ in 0..plan.rounds {
            side.startup.push(latency::startup(&program).await);
        }
    }
    if (plan.wants)("load10") {
        (plan.note)("peer load10");
        side.loads.push(load(&program, 10, plan.steady).await);
    }
    if (plan.wants)("load100") && !plan.quick {
        (plan.note)("peer load100");
        side.loads.push(load(&program, 100, plan.steady).await);
    }
    if (plan.named)("load1000") {
        (plan.note)("peer load1000");
        side.loads.push(load(&program, 1000, plan.steady).await);
    }
    if (plan.wants)("wrk") {
        (plan.note)("peer wrk");
        side.wrk = wrk_leader(&program, plan.wrk_seconds).await;
    }
    side
}

fn ms(d: &Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// min, median, p99 (nearest rank), max in ms.
fn stats(v: &[Duration]) -> Option<[f64; 4]> {
    let mut v: Vec<f64> = v.iter().map(ms).collect();
    if v.is_empty() {
        return None;
    }
    v.sort_by(|a, b| a.total_cmp(b));
    let n = v.len();
    let p99 = v[((n as f64 * 0.99).ceil() as usize).clamp(1, n) - 1];
    Some([v[0], v[n / 2], p99, v[n - 1]])
}

/// `a ÷ b` to three significant digits (at least two decimals).
fn ratio(a: f64, b: f64) -> String {
    let r = a / b;
    if !r.is_finite() {
        return "–".to_string();
    }
    if r == 0.0 {
        return "0".to_string();
    }
    let decimals = (2 - r.abs().log10().floor() as i64).clamp(2, 8) as usize;
    format!("{r:.decimals$}")
}

fn dist(s: &Option<[f64; 4]>) -> String {
    match s {
        Some([min, med, p99, max]) => format!("{min:.1} / {med:.1} / {p99:.1} / {max:.1}"),
        None => "–".to_string(),
    }
}

/// Prints the side-by-side tables: distributions first, then single figures.
pub fn print(peer_name: &str, lg: &Side, peer: &Side) {
    println!();
    println!(
        "Side by side: leader-gate and {peer_name} (same run, same fake API server and timings; \
         a ratio below 1: leader-gate's figure is the smaller)"
    );
    println!();
    println!(
        "| measurement (ms) | rounds | leader-gate min / median / p99 / max | peer min / median / p99 / max | median ratio (leader-gate ÷ peer) | p99 ratio |"
    );
    println!("|---|---|---|---|---|---|");
    let rows: [(&str, &Vec<Duration>, &Vec<Duration>); 4] = [
        (
            "first acquisition: 3 fresh candidates, no Lease → first 200",
            &lg.acquire,
            &peer.acquire,
        ),
        (
            "graceful: SIGTERM of the leader → another answers 200 (15s/10s/2s, 3 candidates)",
            &lg.graceful,
            &peer.graceful,
        ),
        (
            "crash: SIGKILL → another answers 200, overshoot beyond last renew + lease (4s/3s/1s)",
            &lg.crash,
            &peer.crash,
        ),
        (
            "start: spawn → first /leader answer",
            &lg.startup,
            &peer.startup,
        ),
    ];
    for (name, a, b) in rows {
        if a.is_empty() && b.is_empty() {
            continue;
        }
        let (sa, sb) = (stats(a), stats(b));
        let r = |i: usize| match (sa, sb) {
            (Some(x), Some(y)) => ratio(x[i], y[i]),
            _ => "–".to_string(),
        };
        println!(
            "| {name} | {} / {} | {} | {} | {} | {} |",
            a.len(),
            b.len(),
            dist(&sa),
            dist(&sb),
            r(1),
            r(2)
        );
    }

    println!();
    println!("| figure | leader-gate | peer | ratio (leader-gate ÷ peer) |");
    println!("|---|---|---|---|");
    let row = |name: &str, a: f64, b: f64, digits: usize| {
        println!("| {name} | {a:.digits$} | {b:.digits$} | {} |", ratio(a, b));
    };
    for l in &lg.loads {
        let Some(p) = peer.loads.iter().find(|p| p.candidates == l.candidates) else {
            continue;
        };
        let c = l.candidates;
        row(
            &format!("{c} candidates: steady non-watch requests/s"),
            l.requests_per_s,
            p.requests_per_s,
            2,
        );
        row(
            &format!("{c} candidates: watch events/s (bookmarks excluded)"),
            l.events_per_s,
            p.events_per_s,
            2,
        );
        row(
            &format!("{c} candidates: bookmarks/s"),
            l.bookmarks_per_s,
            p.bookmarks_per_s,
            2,
        );
        row(
            &format!("{c} candidates: bytes/s sent by the API server"),
            l.bytes_per_s,
            p.bytes_per_s,
            0,
        );
        for (what, a, b) in [
            ("hand-over", &l.handover, &p.handover),
            ("expiry", &l.expiry, &p.expiry),
        ] {
            println!(
                "| {c} candidates: {what}: writes (409s) in the 1 s after the first | {} ({}) | {} ({}) | {} |",
                a.writes,
                a.conflicts,
                b.writes,
                b.conflicts,
                ratio(a.writes as f64, b.writes as f64)
            );
            row(
                &format!("{c} candidates: {what}: signal → new holder in the Lease, ms"),
                ms(&a.took),
                ms(&b.took),
                0,
            );
        }
        println!(
            "| {c} candidates: expiry: most candidates answering 200 at once, 3 s after the new holder | {} | {} | |",
            l.leaders_after_expiry, p.leaders_after_expiry
        );
        row(
            &format!("{c} candidates: mean RSS, KiB"),
            l.rss_mean_kib as f64,
            p.rss_mean_kib as f64,
            0,
        );
    }
    if let (Some(a), Some(b)) = (&lg.wrk, &peer.wrk) {
        row(
            "wrk -t2 -c64 /leader on the leader: requests/s",
            a.requests_per_s,
            b.requests_per_s,
            0,
        );
        row("wrk latency p50, ms", a.p50_ms, b.p50_ms, 2);
        row("wrk latency p99, ms", a.p99_ms, b.p99_ms, 2);
        println!(
            "| renews during the load: count, longest gap ms; still leading | {}, {:.0}; {} | {}, {:.0}; {} | |",
            a.renews,
            ms(&a.max_renew_gap),
            a.still_leading,
            b.renews,
            ms(&b.max_renew_gap),
            b.still_leading
        );
        row(
            "idle follower RSS, KiB",
            a.follower_rss as f64,
            b.follower_rss as f64,
            0,
        );
        row(
            "leader RSS before the load, KiB",
            a.rss_before as f64,
            b.rss_before as f64,
            0,
        );
        row(
            "leader RSS right after the load, KiB",
            a.rss_after as f64,
            b.rss_after as f64,
            0,
        );
        row(
            "leader RSS 5 s after the load, KiB",
            a.rss_after_5s as f64,
            b.rss_after_5s as f64,
            0,
        );
    }
    let size = |p: &Path| std::fs::metadata(p).map(|m| m.len()).unwrap_or(0) as f64 / 1048576.0;
    row("binary size, MiB", size(&lg.binary), size(&peer.binary), 2);
}
