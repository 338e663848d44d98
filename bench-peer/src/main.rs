//! `klm-gate`: the failover benchmark's peer. It runs the published
//! [`kube-lease-manager`](https://crates.io/crates/kube-lease-manager) elector
//! (0.13.1) the way its README recommends — `LeaseManagerBuilder::new(client,
//! lease).build()`, then the fully automated `manager.watch()` channel, and on
//! shutdown `drop(channel)` and a join of the watch task, which releases the
//! Lease — and answers leader-gate's HTTP contract, so the bench can spawn
//! either program with the same command line:
//!
//! ```text
//! klm-gate serve --lease-name L --identity N --listen ADDR --admin-listen ADDR \
//!     --lease-duration 15s --renew-deadline 10000ms --retry-period 2000ms
//! ```
//!
//! * `GET /leader` on `--listen`: 200 `{"leading":true,"identity":N}` while the
//!   watch channel says `true`, else 503 `{"leading":false,...}`.
//! * `GET /healthz` on `--admin-listen`: 200 `ok`.
//! * Once both listeners are bound, one stderr line `... listening gate=ADDR
//!   admin=ADDR` (the bench reads the addresses from it).
//! * Namespace and API server from `KUBECONFIG` (`kube::Client::try_default`).
//! * SIGTERM or SIGINT: `/leader` turns 503, the watch channel is dropped and
//!   the watch task joined (the crate releases the Lease there), then exit 0.
//! * Any other flag is rejected (exit 2).
//!
//! # How leader-gate's timings map onto the crate's knobs
//!
//! The crate has two knobs, both whole seconds: `duration` (written to
//! `spec.leaseDurationSeconds`) and `grace` (the holder renews `grace` seconds
//! before `renewTime + duration`, so every `duration - grace` seconds).
//!
//! * `--lease-duration D` → `duration = ceil(D)` seconds.
//! * `--retry-period R` → `grace = duration - ceil(R)` (clamped to `1 ..=
//!   duration - 1`), so the holder renews every `R`, the cadence at which
//!   leader-gate renews: the two programs write to the API server at the same
//!   rate. With the defaults 15 s / 2 s: duration 15, grace 13.
//! * `--renew-deadline` has no counterpart and is accepted and ignored: the
//!   crate's holder keeps saying "leader" until a renew *fails* or it observes
//!   another holder; it has no deadline after which it steps down on its own.
//!
//! Followers do not watch: each sleeps until `renewTime + duration` of the
//! Lease it last read and then reads it again (GET). The crate takes a free
//! Lease with a server-side apply (`PATCH`, `application/apply-patch+yaml`,
//! `fieldManager=kube-lease-manager-<identity>`, no force), renews, counts
//! transitions and releases with strategic merge patches, and creates an
//! absent Lease with a POST; so its Role needs `patch` on the Lease besides
//! leader-gate's `get`/`create`.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use kube_lease_manager::LeaseManagerBuilder;
use tokio::net::TcpListener;
use tokio::signal::unix::{SignalKind, signal};

/// The command line, leader-gate's `serve` subset.
#[derive(Debug)]
struct Args {
    lease_name: String,
    identity: String,
    listen: SocketAddr,
    admin_listen: SocketAddr,
    lease_duration: Duration,
    retry_period: Duration,
}

fn usage() -> &'static str {
    "usage: klm-gate serve --lease-name NAME --identity ID [--listen ADDR] [--admin-listen ADDR] \
     [--lease-duration DUR] [--renew-deadline DUR] [--retry-period DUR]"
}

/// `15s`, `10000ms`, `1m`, or bare seconds.
fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let (number, unit) = s.split_at(s.find(|c: char| c.is_ascii_alphabetic()).unwrap_or(s.len()));
    let n: f64 = number
        .parse()
        .map_err(|_| format!("not a duration: {s:?}"))?;
    let secs = match unit {
        "" | "s" => n,
        "ms" => n / 1000.0,
        "m" => n * 60.0,
        "h" => n * 3600.0,
        _ => return Err(format!("not a duration: {s:?} (use s, ms, m or h)")),
    };
    Duration::try_from_secs_f64(secs).map_err(|_| format!("not a duration: {s:?}"))
}

fn parse_args(argv: impl IntoIterator<Item = String>) -> Result<Args, String> {
    let mut argv = argv.into_iter();
    match argv.next().as_deref() {
        Some("serve") => {}
        Some(other) => return Err(format!("unknown command {other:?}\n{}", usage())),
        None => return Err(usage().to_string()),
    }
    let mut lease_name = None;
    let mut identity = None;
    let mut listen: SocketAddr = ([0, 0, 0, 0], 8080).into();
    let mut admin_listen: SocketAddr = ([0, 0, 0, 0], 8081).into();
    let mut lease_duration = Duration::from_secs(15);
    let mut retry_period = Duration::from_secs(2);
    while let Some(flag) = argv.next() {
        // `--flag=value` and `--flag value`.
        let (flag, inline) = match flag.split_once('=') {
            Some((f, v)) => (f.to_string(), Some(v.to_string())),
            None => (flag, None),
        };
        let mut value = || {
            inline
                .clone()
                .or_else(|| argv.next())
                .ok_or_else(|| format!("{flag} needs a value"))
        };
        let addr = |v: String| {
            v.parse::<SocketAddr>()
                .map_err(|e| format!("{flag}: {v:?}: {e}"))
        };
        match flag.as_str() {
            "--lease-name" => lease_name = Some(value()?),
            "--identity" => identity = Some(value()?),
            "--listen" => listen = addr(value()?)?,
            "--admin-listen" => admin_listen = addr(value()?)?,
            "--lease-duration" => lease_duration = parse_duration(&value()?)?,
            "--retry-period" => retry_period = parse_duration(&value()?)?,
            // No counterpart in the crate (see the module docs): checked, then ignored.
            "--renew-deadline" => {
                parse_duration(&value()?)?;
            }
            other => {
                return Err(format!(
                    "klm-gate (the kube-lease-manager peer) does not support {other}\n{}",
                    usage()
                ));
            }
        }
    }
    Ok(Args {
        lease_name: lease_name.ok_or("--lease-name is required")?,
        identity: identity.ok_or("--identity is required")?,
        listen,
        admin_listen,
        lease_duration,
        retry_period,
    })
}

/// The crate's `(duration, grace)` in whole seconds (see the module docs).
fn crate_timing(lease_duration: Duration, retry_period: Duration) -> (u64, u64) {
    let ceil = |d: Duration| d.as_secs() + u64::from(d.subsec_nanos() > 0);
    let duration = ceil(lease_duration).max(2);
    let grace = duration
        .saturating_sub(ceil(retry_period))
        .clamp(1, duration - 1);
    (duration, grace)
}

type Body = Full<Bytes>;

fn json(status: StatusCode, body: String) -> Response<Body> {
    Response::builder()
        .status(status)
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body)))
        .expect("static response parts")
}

fn gate_response(leading: bool, identity: &str, req: &Request<Incoming>) -> Response<Body> {
    if req.uri().path() != "/leader" {
        return json(StatusCode::NOT_FOUND, "{\"error\":\"not found\"}".into());
    }
    let body = format!("{{\"leading\":{leading},\"identity\":{identity:?}}}");
    let status = if leading {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    json(status, body)
}

/// Serves one listener forever, each connection on its own task.
async fn serve(
    listener: TcpListener,
    handler: impl Fn(&Request<Incoming>) -> Response<Body> + Clone + Send + Sync + 'static,
) {
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            continue;
        };
        let _ = stream.set_nodelay(true);
        let handler = handler.clone();
        tokio::spawn(async move {
            let service = service_fn(move |req| {
                let response = handler(&req);
                async move { Ok::<_, Infallible>(response) }
            });
            let _ = http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}

/// One stderr line, with the wall-clock time (UTC, microseconds).
fn log(line: std::fmt::Arguments) {
    let now = k8s_openapi::jiff::Timestamp::now().strftime("%Y-%m-%dT%H:%M:%S%.6fZ");
    eprintln!("{now} klm-gate: {line}");
}

#[tokio::main]
async fn main() -> ExitCode {
    let args = match parse_args(std::env::args().skip(1)) {
        Ok(a) => a,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::from(2);
        }
    };
    // The crate logs through `tracing`; RUST_LOG=kube_lease_manager=debug shows it.
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_writer(std::io::stderr)
        .init();

    let gate = match TcpListener::bind(args.listen).await {
        Ok(l) => l,
        Err(e) => {
            log(format_args!("cannot listen on {}: {e}", args.listen));
            return ExitCode::FAILURE;
        }
    };
    let admin = match TcpListener::bind(args.admin_listen).await {
        Ok(l) => l,
        Err(e) => {
            log(format_args!("cannot listen on {}: {e}", args.admin_listen));
            return ExitCode::FAILURE;
        }
    };
    let (gate_addr, admin_addr) = (
        gate.local_addr().expect("bound"),
        admin.local_addr().expect("bound"),
    );
    log(format_args!(
        "listening gate={gate_addr} admin={admin_addr}"
    ));

    let leading = Arc::new(AtomicBool::new(false));
    let identity: Arc<str> = args.identity.clone().into();
    {
        let leading = leading.clone();
        tokio::spawn(serve(gate, move |req| {
            gate_response(leading.load(Ordering::Relaxed), &identity, req)
        }));
    }
    tokio::spawn(serve(admin, |req| {
        if req.uri().path() == "/healthz" {
            Response::new(Full::new(Bytes::from_static(b"ok")))
        } else {
            json(StatusCode::NOT_FOUND, "{\"error\":\"not found\"}".into())
        }
    }));

    let mut sigterm = signal(SignalKind::terminate()).expect("SIGTERM handler");
    let mut sigint = signal(SignalKind::interrupt()).expect("SIGINT handler");

    let (duration, grace) = crate_timing(args.lease_duration, args.retry_period);
    // The crate's README: the default client, a builder, `watch()`.
    let build = async {
        let client = kube::Client::try_default().await?;
        let namespace = client.default_namespace().to_string();
        let manager = LeaseManagerBuilder::new(client, &args.lease_name)
            .with_namespace(namespace)
            .with_identity(args.identity.clone())
            .with_duration(duration)
            .with_grace(grace)
            .build()
            .await?;
        Ok::<_, Box<dyn std::error::Error>>(manager)
    };
    let manager = tokio::select! {
        m = build => match m {
            Ok(m) => m,
            Err(e) => {
                log(format_args!("cannot start the lease manager: {e}"));
                return ExitCode::FAILURE;
            }
        },
        _ = sigterm.recv() => return ExitCode::SUCCESS,
        _ = sigint.recv() => return ExitCode::SUCCESS,
    };
    log(format_args!(
        "electing lease={} identity={} duration={duration}s grace={grace}s",
        args.lease_name, args.identity
    ));
    let (mut channel, task) = manager.watch().await;
    loop {
        tokio::select! {
            changed = channel.changed() => {
                if changed.is_err() {
                    log(format_args!("the lease manager stopped"));
                    break;
                }
                let now = *channel.borrow_and_update();
                leading.store(now, Ordering::Relaxed);
                log(format_args!("{}", if now { "leading" } else { "not leading" }));
            }
            _ = sigterm.recv() => break,
            _ = sigint.recv() => break,
        }
    }
    // Shutdown as the README shows it: close the channel, join the task (which
    // releases the Lease when this instance holds it).
    leading.store(false, Ordering::Relaxed);
    drop(channel);
    match task.await {
        Ok(Ok(_manager)) => {
            log(format_args!("released; exiting"));
            ExitCode::SUCCESS
        }
        Ok(Err(e)) => {
            log(format_args!("release failed: {e}"));
            ExitCode::FAILURE
        }
        Err(e) => {
            log(format_args!("lease manager task failed: {e}"));
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(s: &str) -> Result<Args, String> {
        parse_args(s.split_whitespace().map(str::to_string))
    }

    #[test]
    fn takes_the_bench_command_line() {
        let a = args(
            "serve --lease-name L --identity p0 --listen 127.0.0.1:0 --admin-listen 127.0.0.1:0 \
             --lease-duration 15s --renew-deadline 10000ms --retry-period 2000ms",
        )
        .unwrap();
        assert_eq!((a.lease_name.as_str(), a.identity.as_str()), ("L", "p0"));
        assert_eq!(a.lease_duration, Duration::from_secs(15));
        assert_eq!(a.retry_period, Duration::from_secs(2));
        assert!(args("serve --lease-name L --identity p0 --max-subscribers 5").is_err());
        assert!(args("serve --identity p0").is_err());
    }

    #[test]
    fn timings_map_to_whole_seconds() {
        let s = Duration::from_secs;
        assert_eq!(crate_timing(s(15), s(2)), (15, 13));
        assert_eq!(crate_timing(s(4), s(1)), (4, 3));
        assert_eq!(crate_timing(s(4), Duration::from_millis(1500)), (4, 2));
        assert_eq!(crate_timing(s(2), s(5)), (2, 1));
    }
}
