//! The faults that aim at a named successor (issue 13): SIGKILL of the
//! candidate the Lease names successor (alone, or just before the holder is
//! SIGTERMed or SIGKILLed), an operator's `leader-gate handover` (the real
//! binary, run as a separate process: to the successor, to a live
//! candidate, to an identity that does not exist), and a hand-over to a
//! candidate SIGSTOPped first; and what they did, for the summary and the
//! check that they happened at all.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use serde_json::Value;
use tokio::task::JoinHandle;

use super::{Chaos, Draw, Heal, Kind, NAMES, NAMESPACE, Proc, TIMING, Until, secs};
use crate::support::fake_apiserver::lease_holder;
use crate::support::history::rel;

const SUCCESSOR: &str = "leader-gate.dev/successor";
/// `leader-gate handover --timeout`: shorter than the quiet period at the end.
const HANDOVER_TIMEOUT: &str = "10s";

/// What follows a successor's SIGKILL (variant 0, 1, 2).
const KILL_VARIANTS: [&str; 3] = [
    "alone",
    "then the leader SIGTERMed",
    "then the leader SIGKILLed",
];
/// `leader-gate handover` (variant 0, 1, 2).
const HANDOVER_VARIANTS: [&str; 3] = ["to the successor", "to a live peer", "to a ghost"];

/// An operator's `leader-gate handover`, running as its own process.
pub(super) struct PendingHandover {
    /// The span it reports its outcome on.
    span: usize,
    /// Whether the span is the hand-over's own (healed when it returns) or
    /// the SIGSTOP's it came with (healed by the SIGCONT).
    owns_span: bool,
    /// Which kind of hand-over.
    what: &'static str,
    task: JoinHandle<std::io::Result<std::process::Output>>,
}

/// What the named-successor faults did, for the summary and the check that
/// they happened at all.
#[derive(Default)]
pub struct SuccessorStats {
    /// SIGKILLs of the named successor, by what followed.
    pub kills: BTreeMap<&'static str, usize>,
    /// Successor kills not done: no live candidate other than the holder
    /// was named.
    pub kills_skipped: usize,
    /// Hand-overs asked for, by kind.
    pub requested: BTreeMap<&'static str, usize>,
    /// `leader-gate handover` returned 0: the one asked for took over ...
    pub by_target: usize,
    /// ... or 1, another candidate did ("… did not take over …").
    pub by_fallback: usize,
    /// Hand-overs that ended with a new holder, by kind.
    pub completed: BTreeMap<&'static str, usize>,
    /// It returned non-zero otherwise: refused or failed (its message).
    pub refused: Vec<String>,
}

/// The variant done least so far (by `done`), ties broken against `last`
/// and then from the drawn one on: a short run still covers every variant,
/// and the choice is still fixed by the seed and what happened before.
fn least_used(
    drawn: u32,
    variants: &[&'static str; 3],
    done: &BTreeMap<&str, usize>,
    last: Option<u32>,
) -> u32 {
    (0..3)
        .map(|k| (drawn + k) % 3)
        .min_by_key(|&v| {
            (
                done.get(variants[v as usize]).copied().unwrap_or(0),
                Some(v) == last,
            )
        })
        .unwrap_or(drawn)
}

/// `POST /handover` on a sidecar's gate listener, as `leader-gate prestop`
/// sends it: the status (`None`: no answer within half a second).
pub(super) async fn ask_step_down(gate: SocketAddr) -> Option<u16> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let exchange = async {
        let mut stream = tokio::net::TcpStream::connect(gate).await.ok()?;
        stream
            .write_all(b"POST /handover HTTP/1.1\r\nHost: localhost\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
            .await
            .ok()?;
        let mut head = [0u8; 12];
        stream.read_exact(&mut head).await.ok()?;
        std::str::from_utf8(&head[9..12]).ok()?.parse().ok()
    };
    tokio::time::timeout(Duration::from_millis(500), exchange)
        .await
        .ok()
        .flatten()
}

/// The successor the Lease names, if any.
fn successor_of(lease: &Value) -> Option<String> {
    lease
        .pointer(&format!(
            "/metadata/annotations/{}",
            SUCCESSOR.replace('/', "~1")
        ))
        .and_then(Value::as_str)
        .filter(|s| !s.is_empty())
        .map(str::to_owned)
}

impl Chaos {
    /// The Lease `lease`'s record: its holder and the successor it names.
    fn holder_and_successor(&self, lease: usize) -> (Option<String>, Option<String>) {
        let lease = self.api.lease(self.world.leases[lease]);
        let holder = lease.as_ref().and_then(lease_holder);
        (holder, lease.as_ref().and_then(successor_of))
    }

    /// A running candidate other than `holder`, the first from `index` on.
    fn live_peer(&self, index: usize, holder: Option<&str>) -> Option<usize> {
        (0..NAMES.len())
            .map(|k| (index + k) % NAMES.len())
            .find(|&i| self.members[i].state == Proc::Running && Some(NAMES[i]) != holder)
    }

    /// The running candidate the Lease names successor, other than the
    /// holder.
    pub(super) fn live_successor(&self, lease: usize) -> Option<usize> {
        let (holder, named) = self.holder_and_successor(lease);
        named
            .filter(|s| Some(s) != holder.as_ref())
            .and_then(|s| self.running(&s))
    }

    /// SIGKILL of the candidate the Lease names successor; variant 1 then
    /// SIGTERMs the leader at once, variant 2 SIGKILLs it (the successor's
    /// crash found out at the hand-over, or at the expiry).
    pub(super) async fn kill_successor(&mut self, d: &Draw) {
        let (holder, named) = self.holder_and_successor(d.lease);
        let Some(s) = self.live_successor(d.lease) else {
            self.skipped += 1;
            self.successor.kills_skipped += 1;
            eprintln!(
                "{} {}: successor-sigkill skipped (holder {holder:?}, successor {named:?})",
                self.world.label,
                rel(self.origin, Instant::now())
            );
            return;
        };
        self.kill(s).await;
        let down = secs(0.2 + d.frac * 5.8);
        self.record(
            Kind::SuccessorKill,
            None,
            NAMES[s],
            format!("the successor of {holder:?}, down {down:?}"),
            Instant::now(),
            Until::Heals(Some(down), Heal::Restart(s)),
        );
        let leader = holder.as_deref().and_then(|h| self.running(h));
        // The kills just before the leader stops first: they are the point.
        let variant = least_used(d.variant, &KILL_VARIANTS, &self.successor.kills, Some(0));
        let what = match (variant, leader) {
            (1, Some(l)) => {
                let down_for = secs(d.frac * 3.0);
                self.terminate(l, down_for);
                let detail = format!(
                    "the leader, just after its successor's SIGKILL; down {down_for:?} after the \
                     exit"
                );
                let until = Until::Heals(None, Heal::AfterExit(l));
                self.record(Kind::Term, None, NAMES[l], detail, Instant::now(), until);
                KILL_VARIANTS[1]
            }
            (2, Some(l)) => {
                self.kill(l).await;
                let down = secs(0.2 + (1.0 - d.frac) * 5.8);
                let detail =
                    format!("the leader, just after its successor's SIGKILL; down {down:?}");
                let until = Until::Heals(Some(down), Heal::Restart(l));
                self.record(Kind::Kill, None, NAMES[l], detail, Instant::now(), until);
                KILL_VARIANTS[2]
            }
            _ => KILL_VARIANTS[0],
        };
        *self.successor.kills.entry(what).or_default() += 1;
    }

    /// `leader-gate handover`: variant 0 to the successor (no `--to`), 1 to
    /// a live candidate other than the holder, 2 to an identity that does
    /// not exist.
    pub(super) fn request_handover(&mut self, d: &Draw) {
        let (holder, named) = self.holder_and_successor(d.lease);
        let variant = least_used(
            d.variant,
            &HANDOVER_VARIANTS,
            &self.successor.completed,
            None,
        );
        let what = HANDOVER_VARIANTS[variant as usize];
        let to = match variant {
            0 => None,
            1 => {
                let Some(peer) = self.live_peer(d.index, holder.as_deref()) else {
                    self.skipped += 1;
                    return;
                };
                Some(NAMES[peer].to_owned())
            }
            _ => Some(format!("ghost-{}", self.spans.len())),
        };
        let span = self.record(
            Kind::Handover,
            None,
            to.as_deref().unwrap_or("(successor)"),
            format!("{what}; holder {holder:?}, successor {named:?}"),
            Instant::now(),
            Until::Closed,
        );
        *self.successor.requested.entry(what).or_default() += 1;
        self.launch_handover(d.lease, span, true, what, to);
    }

    /// SIGSTOP of a candidate (the successor if one is named and live, else
    /// a live peer of the holder), then a hand-over to it; SIGCONT after
    /// more than a lease duration.
    pub(super) fn handover_to_stopped(&mut self, d: &Draw) {
        let (holder, named) = self.holder_and_successor(d.lease);
        let target = named
            .as_deref()
            .filter(|s| Some(*s) != holder.as_deref())
            .and_then(|s| self.running(s))
            .or_else(|| self.live_peer(d.index, holder.as_deref()));
        let Some(i) = target else {
            self.skipped += 1;
            return;
        };
        self.freeze(i);
        let stopped = secs(TIMING.lease.as_secs_f64() + 0.5 + d.frac * TIMING.lease.as_secs_f64());
        let span = self.record(
            Kind::HandoverStopped,
            None,
            NAMES[i],
            format!(
                "stopped {stopped:?}, then asked to take over from {holder:?} (successor {named:?})"
            ),
            Instant::now(),
            Until::Heals(Some(stopped), Heal::Cont(i)),
        );
        let what = "to a stopped peer";
        *self.successor.requested.entry(what).or_default() += 1;
        self.launch_handover(d.lease, span, false, what, Some(NAMES[i].to_owned()));
    }

    /// Runs the real `leader-gate handover` of Lease `lease` as its own
    /// process.
    fn launch_handover(
        &mut self,
        lease: usize,
        span: usize,
        owns_span: bool,
        what: &'static str,
        to: Option<String>,
    ) {
        let mut command = tokio::process::Command::new(env!("CARGO_BIN_EXE_leader-gate"));
        command
            .args([
                "handover",
                "--lease-name",
                self.world.leases[lease],
                "--lease-namespace",
                NAMESPACE,
                "--timeout",
                HANDOVER_TIMEOUT,
            ])
            .args(to.iter().flat_map(|to| ["--to", to.as_str()]))
            .env("KUBECONFIG", &self.operator)
            .stdin(std::process::Stdio::null())
            .kill_on_drop(true);
        let task = tokio::spawn(async move { command.output().await });
        self.handovers.push(PendingHandover {
            span,
            owns_span,
            what,
            task,
        });
    }

    /// Collects the outcome of every `leader-gate handover` that returned
    /// (all of them with `wait`).
    pub async fn poll_handovers(&mut self, wait: bool) {
        let mut k = 0;
        while k < self.handovers.len() {
            if !wait && !self.handovers[k].task.is_finished() {
                k += 1;
                continue;
            }
            let pending = self.handovers.remove(k);
            let output = pending.task.await.expect("the hand-over task");
            let now = Instant::now();
            let outcome = match output {
                Ok(output) if output.status.success() => {
                    let line = String::from_utf8_lossy(&output.stdout).trim().to_owned();
                    *self.successor.completed.entry(pending.what).or_default() += 1;
                    self.successor.by_target += 1;
                    line
                }
                // Exit 1: the hand-over happened, to another candidate than
                // the one asked for (the fallback), and it says so.
                Ok(output)
                    if output.status.code() == Some(1)
                        && String::from_utf8_lossy(&output.stderr)
                            .contains("did not take over") =>
                {
                    let line = String::from_utf8_lossy(&output.stderr).trim().to_owned();
                    *self.successor.completed.entry(pending.what).or_default() += 1;
                    self.successor.by_fallback += 1;
                    line
                }
                Ok(output) => {
                    let line = format!(
                        "{}: {}",
                        output.status,
                        String::from_utf8_lossy(&output.stderr).trim()
                    );
                    self.successor.refused.push(line.clone());
                    line
                }
                Err(error) => panic!("cannot run leader-gate handover: {error}"),
            };
            let span = &mut self.spans[pending.span].1;
            let _ = write!(span.detail, " => {outcome}");
            if pending.owns_span {
                span.healed = Some(now);
            }
            eprintln!(
                "{} {}: {} on {} returned after {:?}: {outcome}",
                self.world.label,
                rel(self.origin, now),
                span.kind,
                span.target,
                now - span.injected
            );
        }
    }
}
