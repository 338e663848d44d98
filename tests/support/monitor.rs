//! The overlap monitor: samples every instance's `/leader` continuously and
//! records when each request was sent and its answer received, on the test's
//! monotonic clock (the same clock the fake API server stamps requests with).
//!
//! Overlap is judged from timestamps, not from arrival order: it is a
//! violation if an instance's 200 for an older term was *sent* after another
//! instance's 200 for a newer term had been *received* — the old leader then
//! certainly claimed leadership after the new one had.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::sidecar::{Sidecar, get};

/// One sample of one instance's `/leader`.
#[derive(Clone, Debug)]
pub struct Sample {
    pub instance: String,
    pub sent: Instant,
    pub received: Instant,
    pub status: u16,
    pub term: Option<String>,
}

impl Sample {
    pub fn leading(&self) -> bool {
        self.status == 200
    }
}

pub struct Monitor {
    samples: Arc<Mutex<Vec<Sample>>>,
    stop: Arc<AtomicBool>,
}

/// How often each instance is sampled.
const PERIOD: Duration = Duration::from_millis(20);

impl Monitor {
    pub fn start(sidecars: &[&Sidecar]) -> Monitor {
        let monitor = Monitor {
            samples: Arc::default(),
            stop: Arc::default(),
        };
        for sidecar in sidecars {
            monitor.watch(sidecar);
        }
        monitor
    }

    /// Starts sampling one more instance.
    pub fn watch(&self, sidecar: &Sidecar) {
        let (name, addr) = (sidecar.name.clone(), sidecar.gate);
        let (samples, stop) = (self.samples.clone(), self.stop.clone());
        tokio::spawn(sample_loop(name, addr, samples, stop));
    }

    pub fn samples(&self) -> Vec<Sample> {
        self.samples.lock().unwrap().clone()
    }

    pub fn samples_of(&self, instance: &str) -> Vec<Sample> {
        self.samples()
            .into_iter()
            .filter(|s| s.instance == instance)
            .collect()
    }

    /// The first sample of `instance` sent at or after `after` that satisfies `pred`.
    pub fn first(
        &self,
        instance: &str,
        after: Instant,
        pred: impl Fn(&Sample) -> bool,
    ) -> Option<Sample> {
        self.samples_of(instance)
            .into_iter()
            .find(|s| s.sent >= after && pred(s))
    }

    /// Panics with the evidence if two instances ever led at once.
    pub fn assert_no_overlap(&self) {
        assert_no_overlap(&self.samples());
    }
}

/// The check behind [`Monitor::assert_no_overlap`], on any samples.
pub fn assert_no_overlap(samples: &[Sample]) {
    let leading: Vec<&Sample> = samples.iter().filter(|s| s.leading()).collect();
    // Order terms by when a 200 for them was first received.
    let mut term_start: HashMap<(&str, &str), Instant> = HashMap::new();
    for s in &leading {
        let key = (s.instance.as_str(), s.term.as_deref().unwrap_or(""));
        let start = term_start.entry(key).or_insert(s.received);
        *start = (*start).min(s.received);
    }
    // For each instance and term, the last 200 sent; for each newer term of
    // another instance, the first 200 received.
    let mut last_sent: HashMap<(&str, &str), &Sample> = HashMap::new();
    let mut first_received: HashMap<(&str, &str), &Sample> = HashMap::new();
    for s in &leading {
        let key = (s.instance.as_str(), s.term.as_deref().unwrap_or(""));
        let last = last_sent.entry(key).or_insert(s);
        if s.sent > last.sent {
            *last = s;
        }
        let first = first_received.entry(key).or_insert(s);
        if s.received < first.received {
            *first = s;
        }
    }
    for (old_key, old_last) in &last_sent {
        for (new_key, new_first) in &first_received {
            if old_key.0 == new_key.0 || term_start[old_key] >= term_start[new_key] {
                continue;
            }
            assert!(
                old_last.sent <= new_first.received,
                "two leaders: {} answered 200 for term {:?} to a request sent {:?} after {} \
                     had answered 200 for the newer term {:?}",
                old_last.instance,
                old_last.term,
                old_last.sent - new_first.received,
                new_first.instance,
                new_first.term,
            );
        }
    }
}

impl Drop for Monitor {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
    }
}

async fn sample_loop(
    instance: String,
    addr: SocketAddr,
    samples: Arc<Mutex<Vec<Sample>>>,
    stop: Arc<AtomicBool>,
) {
    while !stop.load(Ordering::SeqCst) {
        let sent = Instant::now();
        if let Some(probe) = get(addr, "/leader").await {
            let received = Instant::now();
            samples.lock().unwrap().push(Sample {
                instance: instance.clone(),
                sent,
                received,
                status: probe.status,
                term: probe.term().map(str::to_owned),
            });
        }
        tokio::time::sleep(PERIOD).await;
    }
}
