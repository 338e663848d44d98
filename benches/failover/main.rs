//! Failover, step-down, API server load, `/leader` throughput and footprint,
//! measured on real `leader-gate` processes against the fake API server.
//! Prints one markdown table; `docs/BENCHMARKS.md` records it.
//!
//!     cargo bench --bench failover                       # 30 rounds per row
//!     cargo bench --bench failover -- --quick            # 5 rounds, shorter load windows
//!     cargo bench --bench failover -- --only graceful,acquire
//!     ROUNDS=50 ONLY=crash QUICK=1 cargo bench --bench failover   # the same, by env
//!     cargo bench --bench failover -- --peer bench-peer/target/release/klm-gate
//!
//! Scenarios (names for `--only`, matched as substrings): `acquire`,
//! `graceful`, `routing`, `acknowledged`, `resume`, `crash`, `edit`, `forbidden`, `hang`, `startup`, `load10`,
//! `load100`, `wrk`, `fanout`, `swarm10`, `swarm1000` (these two matched
//! whole; `swarm` names both). Three more run only when named in `--only`:
//! `load1000` (1,000 processes, about 8 GiB resident in all) and `day` (a
//! day of renewals, 43,200 at retry 100 ms, about 73 min; 3,000 with
//! `--quick`, or `RENEWALS=n`), `swarm5000`, and `outage` (a follower's
//! requests per minute during a one-minute outage, 503 and refused: two
//! minutes a round; 1 round with `--quick`). `LEADER_GATE_BIN=/path` runs another build
//! of the binary (e.g. the previous commit's) under the same bench.
//!
//! `wrk` also runs the same wrk on Go's net/http answering the same body
//! (`benches/failover/go-leader`, built with the `go` on PATH; skipped with
//! a note without one): the baseline `/leader` is judged by.
//!
//! The peer: `acquire`, `graceful`, `crash`, `startup`, `load10`, `load100`,
//! `load1000` and `wrk` also run for a published elector (kube-lease-manager behind
//! leader-gate's flags and `/leader`, `bench-peer/`, built by
//! `scripts/build-peer.sh`), and a last table prints both programs' figures
//! with ratios leader-gate ÷ peer. `--peer PATH` or `PEER_BIN` names the peer
//! binary; by default `bench-peer/target/release/klm-gate` if it is built,
//! else the peer rows are skipped with a note.
//!
//! `shards1000` (by name only; `shards10` for a quick look): 1,000 pods
//! contending for the same 4 Leases, spread over them (see `shards.rs`);
//! `shards-memory` (in the default set): one sidecar with 1 Lease and with 4.
//!
//! `herd1000`, `herd5000` (`herd` names both; by name only): hand-overs
//! with no successor named — a graceful stop and a crash — among that many
//! candidates, with the 409s each costs (see `herd.rs`).
//!
//! `swarm10`, `swarm1000`, `swarm5000`: the scale rows of issue 13 (steady
//! load, graceful stop, expiry with the successor alive and dead, operator
//! hand-over, each with its writes and conflicts), many candidates in this
//! one process, each with its own client and watch (see `swarm.rs`). With
//! `--quick` they run 3 rounds unless `--rounds` says otherwise.
//!
//! Every latency row gives min / median / p99 / max over its rounds. The p99
//! is by nearest rank, so below 100 rounds it is the maximum: read it as
//! "the worst of N".

// The tests' support, of which the bench uses a part.
#[allow(dead_code)]
#[path = "../../tests/support/mod.rs"]
mod support;

mod acknowledged;
mod day;
mod fanout;
mod group;
mod herd;
mod latency;
mod load;
mod outage;
mod peer;
mod program;
mod resume;
mod routing;
mod shards;
mod swarm;
mod table;
mod wrk;

use std::time::{Duration, Instant};

use latency::*;
use load::load;
use program::Program;
use table::Table;
use wrk::{wrk_go, wrk_leader};

// ---------------------------------------------------------------- options

struct Opts {
    rounds: usize,
    quick: bool,
    only: Vec<String>,
    /// `--peer PATH` (else `PEER_BIN`, else the default build).
    peer: Option<String>,
}

impl Opts {
    fn parse() -> Opts {
        let mut quick = std::env::var("QUICK").is_ok_and(|v| !v.is_empty() && v != "0");
        let mut only: Vec<String> = std::env::var("ONLY").map(|v| split(&v)).unwrap_or_default();
        let mut rounds: Option<usize> = std::env::var("ROUNDS").ok().and_then(|r| r.parse().ok());
        let mut peer = None;
        let mut args = std::env::args().skip(1);
        while let Some(arg) = args.next() {
            match arg.as_str() {
                "--quick" => quick = true,
                "--only" => only.extend(args.next().map(|v| split(&v)).unwrap_or_default()),
                "--rounds" => rounds = args.next().and_then(|r| r.parse().ok()),
                "--peer" => peer = args.next(),
                _ => {} // `--bench` from cargo, and anything else
            }
        }
        Opts {
            rounds: rounds.unwrap_or(if quick { 5 } else { 30 }),
            quick,
            only,
            peer,
        }
    }

    /// Named in `--only` (the rows too long for every run).
    fn named(&self, name: &str) -> bool {
        self.only.iter().any(|o| name.contains(o.as_str()))
    }

    fn wants(&self, name: &str) -> bool {
        self.only.is_empty() || self.only.iter().any(|o| name.contains(o.as_str()))
    }
}

fn split(v: &str) -> Vec<String> {
    v.split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(str::to_string)
        .collect()
}

fn main() {
    let opts = Opts::parse();
    let rounds = opts.rounds;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    support::raise_fd_limit(20_000); // 10,000 subscribers (fanout); children inherit it
    let binary = std::env::var("LEADER_GATE_BIN")
        .unwrap_or_else(|_| env!("CARGO_BIN_EXE_leader-gate").to_string());
    let peer_bin = program::resolve(opts.peer.as_deref());
    runtime.block_on(async {
        let mut table = Table { rows: Vec::new() };
        // leader-gate's figures, for the side-by-side table with the peer.
        let mut lg = peer::Side::default();
        let started = Instant::now();
        let note = |what: &str| eprintln!("[{:>6.1} s] {what}", started.elapsed().as_secs_f64());

        if opts.wants("acquire") {
            note("acquire");
            let mut v = Vec::new();
            for _ in 0..rounds {
                v.push(first_acquisition(&Program::LeaderGate).await);
            }
            table.durations(
                "first acquisition: 3 fresh candidates, no Lease → first 200 (from the first spawn)",
                "≤ 50",
                &v,
                |p| p <= 50.0,
            );
            lg.acquire = v;
        }
        if opts.wants("graceful") {
            note("graceful");
            let v = graceful(&Program::LeaderGate, rounds).await;
            table.durations(
                "graceful: SIGTERM of the leader → another answers 200 (defaults 15s/10s/2s, 3 candidates)",
                "≤ 50",
                &v,
                |p| p <= 50.0,
            );
            lg.graceful = v;
        }
        if opts.wants("routing") {
            note("routing");
            let v = routing::run(rounds).await;
            table.durations(
                "routing: the slice names nobody during a graceful hand-over (SIGTERM of the leader → the new one named; defaults, gate lag 0s, 3 candidates)",
                "0",
                &v.iter().map(|r| r.empty).collect::<Vec<_>>(),
                |p| p == 0.0,
            );
            table.durations(
                "routing: acquisition → the slice names the new leader (its one compare-and-swap replaces the old leader's entry)",
                "≤ 50",
                &v.iter().map(|r| r.named_after_acquisition).collect::<Vec<_>>(),
                |p| p <= 50.0,
            );
            table.durations(
                "routing: the old leader listed as terminating (still serving) → the new leader named",
                "",
                &v.iter().map(|r| r.marked).collect::<Vec<_>>(),
                |_| true,
            );
            table.durations(
                "routing: SIGTERM of the leader → the slice names the new leader",
                "",
                &v.iter().map(|r| r.switched).collect::<Vec<_>>(),
                |_| true,
            );
        }
        if opts.wants("acknowledged") {
            note("acknowledged");
            let (acked, unacked) = acknowledged::run(rounds).await;
            table.durations(
                "acknowledged: exec pod deleted (exec exits, then its sidecar) → the peer's collector starts (defaults, gate lag 4s)",
                "≤ 500",
                &acked,
                |p| p <= 500.0,
            );
            table.durations(
                "acknowledged: the same with --gate-acks=false (the release waits the gate lag)",
                "",
                &unacked,
                |_| true,
            );
            let (released, started) = acknowledged::exec_hands_over(rounds).await;
            table.durations(
                "acknowledged: exec alone gets SIGTERM (a pod deletion, before its sidecar's) → the tree gone → the release",
                "≤ 50",
                &released,
                |p| p <= 50.0,
            );
            table.durations(
                "acknowledged: the same → the peer's collector starts",
                "≤ 500",
                &started,
                |p| p <= 500.0,
            );
            for (status, goal) in [(200, "≤ 50"), (500, "= the gate lag")] {
                let v = acknowledged::file_gate(rounds, status).await;
                table.durations(
                    &format!(
                        "acknowledged: file-gate --reload-url, SIGTERM → release, the collector's reload answers {status} (gate lag {:?})",
                        acknowledged::FILE_GATE_LAG
                    ),
                    goal,
                    &v,
                    |p| if status == 200 { p <= 50.0 } else { p >= 4000.0 },
                );
            }
        }
        if opts.wants("resume") {
            note("resume");
            let v = resume::run(rounds).await;
            table.durations(
                "resume: SIGKILL of the leader, restarted at once with its --state-dir → it answers 200 in the same term (defaults)",
                "≤ 500",
                &v,
                |p| p <= 500.0,
            );
        }
        if opts.wants("crash") {
            note("crash");
            let v = crash(&Program::LeaderGate, rounds).await;
            table.durations(
                "crash: SIGKILL → another answers 200, overshoot beyond last renew + lease (4s/3s/1s)",
                "≤ 100",
                &v,
                |p| p <= 100.0,
            );
            lg.crash = v;
        }
        if opts.wants("edit") {
            note("edit");
            let v = edit(rounds).await;
            table.durations(
                "step-down: external holder edit → old leader answers 503 (defaults)",
                "≤ 50",
                &v,
                |p| p <= 50.0,
            );
        }
        if opts.wants("forbidden") {
            note("forbidden");
            let (from_403, lateness) = forbidden(rounds).await;
            table.durations(
                "step-down: renew answered 403 (received by the fake) → 503 (defaults)",
                "",
                &from_403,
                |_| true,
            );
            table.signed(
                "step-down: 403 → 503, lateness vs last renew + renew deadline (negative = early, by design for 403)",
                "",
                &lateness,
                |_| true,
            );
        }
        if opts.wants("hang") {
            note("hang");
            let v = hang(rounds).await;
            let never_early = v.iter().all(|l| *l >= 0.0);
            table.signed(
                "step-down: renews hang → 503, lateness vs last renew received + renew deadline (4s/3s/1s)",
                "0 ≤ x ≤ 10",
                &v,
                |p| never_early && p <= 10.0,
            );
        }
        if opts.wants("startup") {
            note("startup");
            let mut v = Vec::new();
            for _ in 0..rounds {
                v.push(startup(&Program::LeaderGate).await);
            }
            table.durations(
                "start: spawn → first /leader answer (one process)",
                "≤ 100",
                &v,
                |p| p <= 100.0,
            );
            lg.startup = v;
        }
        let mut fanouts = Vec::new();
        if opts.wants("fanout") {
            note("fanout");
            fanouts = fanout::run(rounds, opts.quick, &mut table).await;
        }

        let steady = if opts.quick {
            Duration::from_secs(5)
        } else {
            Duration::from_secs(10)
        };
        let mut loads = Vec::new();
        if opts.wants("load10") {
            note("load10");
            loads.push(load(&Program::LeaderGate, 10, steady).await);
        }
        if opts.wants("load100") && !opts.quick {
            note("load100");
            loads.push(load(&Program::LeaderGate, 100, steady).await);
        }
        // 1,000 processes (~10 GiB resident in all): asked for by name only.
        if opts.named("load1000") {
            note("load1000");
            loads.push(load(&Program::LeaderGate, 1000, steady).await);
        }
        // An hour and more: asked for by name only; --quick: 3,000 renewals.
        let day_run = if opts.named("day") {
            note("day");
            let renewals = std::env::var("RENEWALS")
                .ok()
                .and_then(|r| r.parse().ok())
                .unwrap_or(if opts.quick { 3_000 } else { day::DAY_OF_RENEWALS });
            Some(day::day(renewals).await)
        } else {
            None
        };
        // Scale (issue 13): many candidates in this process.
        let mut swarms = Vec::new();
        let swarm_rounds = if opts.quick && std::env::var("ROUNDS").is_err() && !std::env::args().any(|a| a == "--rounds") { 3 } else { rounds };
        let swarm_steady = if opts.quick { Duration::from_secs(10) } else { Duration::from_secs(30) };
        for size in [10usize, 1000, 5000] {
            let name = format!("swarm{size}");
            // Matched whole (`swarm10` is not `swarm1000`); `swarm` names 10 and 1,000.
            let exact = opts.only.iter().any(|o| *o == name || (o == "swarm" && size < 5000));
            let asked = exact || (opts.only.is_empty() && size < 5000);
            if asked {
                note(&name);
                swarms.push(swarm::run(size, swarm_rounds, swarm_steady, &binary, &note).await);
            }
        }
        swarm::print(&swarms, &mut table);
        // The herd before a successor is named: asked for by name only.
        let mut herds = Vec::new();
        for size in [1000usize, 5000] {
            let name = format!("herd{size}");
            if opts.only.iter().any(|o| *o == name || o == "herd") {
                note(&name);
                herds.push(herd::run(size, swarm_rounds, &note).await);
            }
        }
        herd::print(&herds, &mut table);
        // Several Leases over a large group (`shards1000`; `shards10` for a
        // quick look): by name only, matched whole.
        let mut shard_row = shards::Row::default();
        for size in [10usize, 1000] {
            let name = format!("shards{size}");
            if opts.only.contains(&name) {
                note(&name);
                shard_row = shards::run(size, swarm_rounds, swarm_steady, &note).await;
            }
        }
        shards::rows(&shard_row, &mut table);
        let shard_memory = if opts.wants("shards-memory") {
            note("shards-memory");
            shards::memory(rounds.min(5)).await
        } else {
            Vec::new()
        };
        // Two minutes a round: asked for by name only.
        let outage_run = if opts.named("outage") {
            note("outage");
            let outage_rounds = if opts.quick && std::env::var("ROUNDS").is_err() && !std::env::args().any(|a| a == "--rounds") { 1 } else { rounds };
            Some(outage::run(outage_rounds).await)
        } else {
            None
        };
        let (wrk, go) = if opts.wants("wrk") {
            note("wrk");
            let seconds = if opts.quick { 3 } else { 10 };
            let wrk = wrk_leader(&Program::LeaderGate, seconds).await;
            (wrk, Some(wrk_go(seconds).await))
        } else {
            (None, None)
        };
        let peer_side = match &peer_bin {
            Ok(path) => {
                let plan = peer::Plan {
                    wants: &|name: &str| opts.wants(name),
                    named: &|name: &str| opts.named(name),
                    rounds,
                    quick: opts.quick,
                    steady,
                    wrk_seconds: if opts.quick { 3 } else { 10 },
                    note: &note,
                };
                Some(peer::measure(path, &plan).await)
            }
            Err(_) => None,
        };
        note("done");

        println!();
        println!("binary: {binary}");
        println!(
            "rounds: {rounds}{}; 2 worker threads in the bench; p99 by nearest rank\n",
            if opts.quick { " (quick)" } else { "" }
        );
        table.print();
        swarm::print_writes(&swarms);
        herd::print_conflicts(&herds);
        shards::print(&shard_row, &shard_memory);
        fanout::print(&fanouts);
        if let Some(outage_run) = &outage_run {
            outage::print(outage_run);
        }
        if !loads.is_empty() {
            println!();
            println!(
                "| API server load (defaults) | steady s | non-watch req/s | watch events/s | bookmarks/s | bytes/s | hand-over: writes (409s) in 1 s over ms, took | expiry: writes (409s) in 1 s over ms, took | mean RSS KiB |"
            );
            println!("|---|---|---|---|---|---|---|---|---|");
            for l in &loads {
                println!(
                    "| {} candidates | {:.1} | {:.2} | {:.2} | {:.2} | {:.0} | {} ({}) over {:.0}, {:.0} ms | {} ({}) over {:.0}, {:.0} ms | {} |",
                    l.candidates,
                    l.seconds,
                    l.requests_per_s,
                    l.events_per_s,
                    l.bookmarks_per_s,
                    l.bytes_per_s,
                    l.handover.writes,
                    l.handover.conflicts,
                    l.handover.span.as_secs_f64() * 1000.0,
                    l.handover.took.as_secs_f64() * 1000.0,
                    l.expiry.writes,
                    l.expiry.conflicts,
                    l.expiry.span.as_secs_f64() * 1000.0,
                    l.expiry.took.as_secs_f64() * 1000.0,
                    l.rss_mean_kib,
                );
            }
        }
        println!();
        let verdict = |ok: bool| if ok { "met" } else { "**not met**" };
        println!("| footprint and /leader load | value | goal | |");
        println!("|---|---|---|---|");
        let size = std::fs::metadata(&binary).map(|m| m.len()).unwrap_or(0);
        println!(
            "| binary size | {:.1} MiB | | |",
            size as f64 / (1024.0 * 1024.0)
        );
        if let Some(d) = day_run {
            println!(
                "| a day of renewals: {} successful renews in {:.0} min (retry 100 ms), holder changes | {} | no growth | |",
                d.renewals,
                d.took.as_secs_f64() / 60.0,
                d.holder_changes,
            );
            println!(
                "| leader RSS after {} / after {} renewals (max) | {} / {} KiB ({}) | ≤ 8192, no growth | {} |",
                d.warm.renewals,
                d.end.renewals,
                d.warm.leader_kib,
                d.end.leader_kib,
                d.max_leader_kib,
                verdict(d.end.leader_kib <= 8192 && d.end.leader_kib <= d.warm.leader_kib + 256)
            );
            println!(
                "| follower RSS after {} / after {} renewals (max) | {} / {} KiB ({}) | ≤ 8192, no growth | {} |",
                d.warm.renewals,
                d.end.renewals,
                d.warm.follower_kib,
                d.end.follower_kib,
                d.max_follower_kib,
                verdict(d.end.follower_kib <= 8192 && d.end.follower_kib <= d.warm.follower_kib + 256)
            );
        }
        if let Some(w) = &wrk {
            println!(
                "| wrk -t2 -c64 /leader on the leader: requests/s | {:.0} | ≥ 100000 | {} |",
                w.requests_per_s,
                verdict(w.requests_per_s >= 100_000.0)
            );
            match &go {
                Some(Ok(g)) => {
                    println!(
                        "| the same on Go net/http answering the same body: requests/s; p50 / p99 | {:.0}; {:.2} / {:.2} ms | leader-gate ≥ 1.3x, p99 below | {:.2}x, {} |",
                        g.requests_per_s,
                        g.p50_ms,
                        g.p99_ms,
                        w.requests_per_s / g.requests_per_s,
                        verdict(w.requests_per_s >= 1.3 * g.requests_per_s && w.p99_ms < g.p99_ms)
                    );
                }
                Some(Err(why)) => println!("| Go net/http baseline | skipped: {why} | | |"),
                None => {}
            }
            println!(
                "| wrk latency p50 / p99 | {:.2} / {:.2} ms | p99 ≤ 2 ms | {} |",
                w.p50_ms,
                w.p99_ms,
                verdict(w.p99_ms <= 2.0)
            );
            println!(
                "| renews during the load: count, longest gap (retry 2 s) | {}, {:.0} ms; still leading: {} | no missed renew | {} |",
                w.renews,
                w.max_renew_gap.as_secs_f64() * 1000.0,
                w.still_leading,
                verdict(w.still_leading && w.max_renew_gap < Duration::from_millis(2500))
            );
            println!(
                "| idle follower RSS | {} KiB | ≤ 8192 | {} |",
                w.follower_rss,
                verdict(w.follower_rss <= 8192)
            );
            println!(
                "| leader RSS before / right after / 5 s after the load | {} / {} / {} KiB | ≤ 8192 after | {} |",
                w.rss_before,
                w.rss_after,
                w.rss_after_5s,
                verdict(w.rss_after_5s <= 8192)
            );
        }
        match (&peer_bin, peer_side) {
            (Ok(path), Some(peer_side)) => {
                lg.loads = loads;
                lg.wrk = wrk;
                lg.binary = binary.clone().into();
                peer::print(&format!("kube-lease-manager 0.13.1 as {}", path.display()), &lg, &peer_side);
            }
            (Err(skipped), _) => println!("\n{skipped}"),
            _ => {}
        }
    });
}
