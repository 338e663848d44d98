//! Event-stream fan-out: 1,000 and 10,000 subscribers of the leader's
//! `/events`, from the publication of a `stopped-leading` to its delivery to
//! the last of them, and the leader's resident memory per subscriber.
//!
//! The subscribers are lean (a raw socket each, no HTTP client, no JSON
//! until the event is found) so that the bench's side is not what is
//! measured: every read also takes the kernel's receive timestamp of the
//! data (`SO_TIMESTAMPING`, software, on the wall clock), which says when
//! the sidecar's write reached the subscriber's socket, however late the
//! bench gets round to reading it. "In the socket" is that timestamp;
//! "read" is the bench's wall clock after the read. A read that returns the
//! stop together with a later write (the `new-leader` that follows it)
//! carries the later one's timestamp: the figure errs late, never early.
//!
//! Readers are *active* (each reads as data arrives, as the former 1,000
//! row did) or *passive* (they read only once the fan-out is over, 2 s
//! later, so that the bench's two threads do not compete with the sidecar
//! for the machine's two cores while it writes: real subscribers run on
//! other nodes). The 10,000 goal row is passive; one active round shows
//! what the competition costs.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use futures::StreamExt;
use serde_json::json;
use tokio::io::{AsyncWriteExt, Interest};
use tokio::net::TcpStream;

use crate::group::Group;
use crate::program::{DEFAULTS, LEASE};
use crate::table::Table;

/// One round with `n` subscribers.
pub struct FanoutRound {
    pub subscribers: usize,
    pub passive: bool,
    /// Publication → the stop is in the last subscriber's socket.
    pub in_socket: Duration,
    /// Publication → the bench has read it on the last subscriber.
    pub read: Duration,
    /// Publication → in the first subscriber's socket.
    pub first_in_socket: Duration,
    pub rss_before_kib: u64,
    pub rss_connected_kib: u64,
    pub rss_after_kib: u64,
    /// Time to connect every subscriber (each up to its `state` event).
    pub connect: Duration,
}

impl FanoutRound {
    pub fn kib_per_subscriber(&self) -> f64 {
        (self.rss_connected_kib as f64 - self.rss_before_kib as f64) / self.subscribers as f64
    }
}

/// The fan-out rows: 1,000 subscribers (up to 5 rounds) and 10,000 (up to 3,
/// 1 when quick); returns the rounds for the footprint lines.
pub async fn run(rounds: usize, quick: bool, table: &mut Table) -> Vec<FanoutRound> {
    let mut all = Vec::new();
    for (n, count, passive, goal) in [
        (1_000, rounds.min(5), false, ""),
        (10_000, if quick { 2 } else { rounds.min(5) }, true, "≤ 200"),
        (10_000, 1, false, ""),
    ] {
        let mut v = Vec::new();
        for _ in 0..count {
            v.push(fanout(n, passive).await);
        }
        let in_socket: Vec<Duration> = v.iter().map(|r| r.in_socket).collect();
        let n = thousands(n);
        let readers = if passive {
            "passive readers"
        } else {
            "readers active"
        };
        table.durations(
            &format!(
                "stopped-leading published → in the socket of the last of {n} /events subscribers (kernel receive timestamp; {readers})"
            ),
            goal,
            &in_socket,
            |p| goal.is_empty() || p <= 200.0,
        );
        if !passive {
            let read: Vec<Duration> = v.iter().map(|r| r.read).collect();
            table.durations(
                &format!("the same → read by the bench on the last of {n}"),
                "",
                &read,
                |_| true,
            );
        }
        all.extend(v);
    }
    all
}

/// The footprint lines of the fan-out rounds (after the main table).
pub fn print(rounds: &[FanoutRound]) {
    if rounds.is_empty() {
        return;
    }
    println!();
    println!(
        "| /events fan-out (leader, defaults) | subscribers | RSS before / connected / after the stop, KiB | KiB per subscriber | connect all | first / last in socket | goal |"
    );
    println!("|---|---|---|---|---|---|---|");
    for r in rounds {
        let per = r.kib_per_subscriber();
        let goal = if r.subscribers >= 10_000 {
            if per <= 8.0 {
                "≤ 8 KiB: met"
            } else {
                "≤ 8 KiB: **not met**"
            }
        } else {
            ""
        };
        println!(
            "| {} | {} | {} / {} / {} | {:.2} | {:.2} s | {:.1} / {:.1} ms | {} |",
            if r.passive { "passive" } else { "active" },
            thousands(r.subscribers),
            r.rss_before_kib,
            r.rss_connected_kib,
            r.rss_after_kib,
            per,
            r.connect.as_secs_f64(),
            r.first_in_socket.as_secs_f64() * 1000.0,
            r.in_socket.as_secs_f64() * 1000.0,
            goal
        );
    }
}

fn thousands(n: usize) -> String {
    if n >= 1000 {
        format!("{},{:03}", n / 1000, n % 1000)
    } else {
        n.to_string()
    }
}

/// One round: a fresh pair of candidates, `n` subscribers of the leader,
/// then an external holder edit makes the leader publish `stopped-leading`.
pub async fn fanout(n: usize, passive: bool) -> FanoutRound {
    let cap = (n + 100).to_string();
    let group = Group::start_with("fanout", DEFAULTS, 2, &["--max-subscribers", &cap]).await;
    let (leader, _) = group.leader_other_than(None, DEFAULTS.lease * 2).await;
    let gate = group.sidecars[leader].gate;
    group.wait_renew(leader).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let rss_before_kib = group.sidecars[leader].rss_kib();

    let started = Instant::now();
    let subscribers: Vec<Subscriber> = futures::stream::iter(0..n)
        .map(|_| Subscriber::connect(gate))
        .buffer_unordered(64)
        .collect()
        .await;
    let connect = started.elapsed();
    // Let the sidecar settle (freed connection-time buffers, timers).
    tokio::time::sleep(Duration::from_secs(1)).await;
    let rss_connected_kib = group.sidecars[leader].rss_kib();

    let (go, wait) = tokio::sync::watch::channel(false);
    let readers: Vec<_> = subscribers
        .into_iter()
        .map(|s| {
            let mut wait = wait.clone();
            tokio::spawn(async move {
                if passive {
                    let _ = wait.wait_for(|go| *go).await;
                }
                s.until_stop(Duration::from_secs(30)).await
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(200)).await;
    group
        .api
        .update_lease(LEASE, |l| l["spec"]["holderIdentity"] = json!("ghost"));
    if passive {
        tokio::time::sleep(Duration::from_secs(2)).await;
        let _ = go.send(true);
    }
    let mut published = 0;
    let (mut last_socket, mut first_socket, mut last_read) = (0, i64::MAX, 0);
    for reader in readers {
        let stop = reader.await.unwrap();
        published = stop.published_us;
        last_socket = last_socket.max(stop.in_socket_us);
        first_socket = first_socket.min(stop.in_socket_us);
        last_read = last_read.max(stop.read_us);
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let rss_after_kib = group.sidecars[leader].rss_kib();
    let since = |us: i64| Duration::from_micros(us.saturating_sub(published).max(0) as u64);
    FanoutRound {
        subscribers: n,
        passive,
        in_socket: since(last_socket),
        read: since(last_read),
        first_in_socket: since(first_socket),
        rss_before_kib,
        rss_connected_kib,
        rss_after_kib,
        connect,
    }
}

/// A subscriber on a raw socket.
struct Subscriber {
    stream: TcpStream,
    /// What arrived after the `state` event.
    text: Vec<u8>,
    /// (kernel timestamp, read time) of the read that brought the stop.
    stop_read: Option<(i64, i64)>,
}

/// The stop as one subscriber saw it.
struct Stop {
    published_us: i64,
    in_socket_us: i64,
    read_us: i64,
}

impl Subscriber {
    /// `GET /events`, up to the end of the first (`state`) event.
    async fn connect(gate: SocketAddr) -> Subscriber {
        let mut stream = TcpStream::connect(gate).await.expect("connect to the gate");
        rx_timestamps(&stream);
        stream
            .write_all(b"GET /events HTTP/1.1\r\nHost: bench\r\nAccept: text/event-stream\r\n\r\n")
            .await
            .unwrap();
        let mut text = Vec::new();
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            assert!(Instant::now() < deadline, "no state event");
            read(&stream, &mut text).await;
            assert!(
                !text.starts_with(b"HTTP/1.1 503"),
                "subscriber refused: {}",
                String::from_utf8_lossy(&text)
            );
            if let Some(at) = find(&text, b"event: state\n")
                && let Some(end) = find(&text[at..], b"\n\n")
            {
                text.drain(..at + end + 2);
                return Subscriber {
                    stream,
                    text,
                    stop_read: None,
                };
            }
        }
    }

    /// Reads until a `stopped-leading` event is complete.
    async fn until_stop(mut self, timeout: Duration) -> Stop {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(at) = find(&self.text, b"event: stopped-leading\n") {
                let rest = &self.text[at..];
                if let Some(data) = find(rest, b"data: ")
                    && let Some(end) = find(&rest[data..], b"\n")
                {
                    let json: serde_json::Value =
                        serde_json::from_slice(&rest[data + 6..data + end]).expect("event data");
                    let published_us = json["published_at_us"].as_i64().expect("published_at_us");
                    let (in_socket_us, read_us) = self.stop_read.expect("read");
                    return Stop {
                        published_us,
                        in_socket_us,
                        read_us,
                    };
                }
            }
            let left = deadline
                .checked_duration_since(Instant::now())
                .expect("no stopped-leading in time");
            let stamp = tokio::time::timeout(left, read(&self.stream, &mut self.text))
                .await
                .expect("no stopped-leading in time");
            if self.stop_read.is_none() && find(&self.text, b"event: stopped-leading\n").is_some() {
                self.stop_read = Some(stamp);
            }
        }
    }
}

const SO_TIMESTAMPING: libc::c_int = 37;
const SCM_TIMESTAMPING: libc::c_int = SO_TIMESTAMPING;

/// Asks the kernel to stamp received data (software timestamps, wall clock).
fn rx_timestamps(stream: &TcpStream) {
    use std::os::fd::AsRawFd;
    let flags: libc::c_uint = libc::SOF_TIMESTAMPING_RX_SOFTWARE | libc::SOF_TIMESTAMPING_SOFTWARE;
    // SAFETY: setsockopt on an open socket with a pointer to a c_uint and its size.
    let rc = unsafe {
        libc::setsockopt(
            stream.as_raw_fd(),
            libc::SOL_SOCKET,
            SO_TIMESTAMPING,
            (&flags as *const libc::c_uint).cast(),
            std::mem::size_of::<libc::c_uint>() as libc::socklen_t,
        )
    };
    assert_eq!(
        rc,
        0,
        "SO_TIMESTAMPING: {}",
        std::io::Error::last_os_error()
    );
}

/// One read into `text`: (kernel receive timestamp, wall clock after the
/// read), both µs since the epoch. Panics on end of stream.
async fn read(stream: &TcpStream, text: &mut Vec<u8>) -> (i64, i64) {
    let mut buf = [0u8; 4096];
    loop {
        stream.readable().await.expect("readable");
        match stream.try_io(Interest::READABLE, || recv_stamped(stream, &mut buf)) {
            Ok((0, _)) => panic!("the stream ended"),
            Ok((n, kernel_us)) => {
                let read_us = leader_gate::clock::wall_micros();
                text.extend_from_slice(&buf[..n]);
                return (kernel_us.unwrap_or(read_us), read_us);
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
            Err(e) => panic!("read: {e}"),
        }
    }
}

/// `recvmsg` with the `SCM_TIMESTAMPING` control message parsed out.
fn recv_stamped(stream: &TcpStream, buf: &mut [u8]) -> std::io::Result<(usize, Option<i64>)> {
    use std::os::fd::AsRawFd;
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    let mut control = [0u64; 32];
    // SAFETY: a zeroed msghdr is valid; it points at live buffers below.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr().cast();
    msg.msg_controllen = std::mem::size_of_val(&control) as _;
    // SAFETY: msg points at an iovec over `buf` and at `control`, both live.
    let n = unsafe { libc::recvmsg(stream.as_raw_fd(), &mut msg, libc::MSG_DONTWAIT) };
    if n < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // Walk the control messages: cmsghdr { len, level, type } then data.
    let bytes: &[u8] = unsafe {
        // SAFETY: `control` is a live buffer of this size.
        std::slice::from_raw_parts(control.as_ptr().cast(), msg.msg_controllen as usize)
    };
    let header = std::mem::size_of::<libc::cmsghdr>();
    let align = std::mem::size_of::<usize>();
    let mut at = 0;
    let mut stamp = None;
    while at + header <= bytes.len() {
        // SAFETY: at + header is within `bytes`; read_unaligned tolerates any alignment.
        let cmsg: libc::cmsghdr = unsafe { std::ptr::read_unaligned(bytes[at..].as_ptr().cast()) };
        let len = cmsg.cmsg_len as usize;
        if len < header || at + len > bytes.len() {
            break;
        }
        if cmsg.cmsg_level == libc::SOL_SOCKET
            && cmsg.cmsg_type == SCM_TIMESTAMPING
            && len >= header + std::mem::size_of::<libc::timespec>()
        {
            // SAFETY: the data holds three timespecs; the first is software.
            let ts: libc::timespec =
                unsafe { std::ptr::read_unaligned(bytes[at + header..].as_ptr().cast()) };
            if ts.tv_sec != 0 || ts.tv_nsec != 0 {
                stamp = Some(ts.tv_sec * 1_000_000 + ts.tv_nsec / 1000);
            }
        }
        at += len.div_ceil(align) * align;
    }
    Ok((n as usize, stamp))
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}
