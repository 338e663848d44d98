//! `leader-gate handover`: asks the current holder of the Lease to hand it
//! over — to a named candidate (`--to`) or to the successor the Lease names —
//! and waits until a new holder is seen.
//!
//! It writes `leader-gate.dev/handover-to: <identity>` with a CAS PUT of the
//! Lease as read (retried on a 409). The holder closes its gates
//! (`stopped-leading`, reason `handover-requested`), waits its gate lag and
//! releases naming that identity as the successor, which takes the Lease at
//! once; if it never does, the other candidates fall back a retry period
//! later (DESIGN "Named successor"). Kubeconfig as `serve` finds it.

use std::process::ExitCode;
use std::time::Duration;

use clap::Args;
use futures::StreamExt;
use tokio::time::Instant;

use crate::config::{is_dns1123_subdomain, parse_duration, resolve_namespace};
use crate::elector::api_error::ApiError;
use crate::elector::lease::Lease;
use crate::elector::lease_client::{self, KubeLeaseStore, LeaseStore};
use crate::elector::machine::{HANDOVER_ANNOTATION, set_annotation, successor_of};
use crate::exit;

/// PUTs answered 409 before giving up (a renew lands every retry period).
const ATTEMPTS: u32 = 5;

#[derive(Debug, Args)]
pub struct HandoverArgs {
    /// Name of the Lease the candidates contend for.
    #[arg(long, env = "LEADER_GATE_LEASE_NAME")]
    pub lease_name: String,

    /// Namespace of the Lease [default: the kubeconfig context's, then "default"].
    #[arg(long, env = "LEADER_GATE_LEASE_NAMESPACE")]
    pub lease_namespace: Option<String>,

    /// The candidate to hand over to [default: the successor the Lease names].
    #[arg(long)]
    pub to: Option<String>,

    /// Give up waiting for the new holder after this long (exit 1).
    #[arg(long, default_value = "30s", value_parser = parse_duration)]
    pub timeout: Duration,
}

/// Why the hand-over could not be asked for or was not seen done.
#[derive(Debug)]
struct Failure {
    code: u8,
    message: String,
}

fn fail(message: impl Into<String>) -> Failure {
    Failure {
        code: 1,
        message: message.into(),
    }
}

pub async fn run(args: HandoverArgs) -> ExitCode {
    match hand_over(args).await {
        Ok(line) => {
            println!("{line}");
            ExitCode::SUCCESS
        }
        Err(failure) => {
            eprintln!("leader-gate handover: {}", failure.message);
            ExitCode::from(failure.code)
        }
    }
}

async fn hand_over(args: HandoverArgs) -> Result<String, Failure> {
    let usage = |message: String| Failure {
        code: exit::USAGE,
        message,
    };
    if !is_dns1123_subdomain(&args.lease_name) {
        return Err(usage(format!(
            "invalid --lease-name: {:?} must be a DNS-1123 subdomain",
            args.lease_name
        )));
    }
    if args.timeout.is_zero() {
        return Err(usage("invalid --timeout: must be more than 0".into()));
    }
    if args.to.as_deref().is_some_and(|to| to.trim().is_empty()) {
        return Err(usage("invalid --to: must not be empty".into()));
    }
    let config = lease_client::infer_config()
        .await
        .map_err(|error| Failure {
            code: exit::CONFIG,
            message: format!("no kube configuration ({error}): set KUBECONFIG"),
        })?;
    let namespace = resolve_namespace(args.lease_namespace.as_deref(), &config.default_namespace)
        .map_err(|error| usage(error.to_string()))?;
    let store =
        KubeLeaseStore::new(config, &namespace, &args.lease_name).map_err(|error| Failure {
            code: exit::CONFIG,
            message: format!("cannot build a Kubernetes client: {error}"),
        })?;
    let lease = format!("{namespace}/{}", args.lease_name);
    let deadline = Instant::now() + args.timeout;

    let mut attempt = 0;
    let (holder, term, target) = loop {
        attempt += 1;
        let current = store
            .get()
            .await
            .map_err(|error| fail(format!("cannot read lease {lease}: {error}")))?
            .ok_or_else(|| {
                fail(format!(
                    "lease {lease} does not exist: nobody to hand over from"
                ))
            })?;
        let record = current.record();
        let Some(holder) = record
            .holder
            .clone()
            .filter(|_| !current.is_marked_released())
        else {
            return Err(fail(format!(
                "nobody holds lease {lease}: nothing to hand over"
            )));
        };
        let target = match args.to.clone().or_else(|| successor_of(&current)) {
            Some(target) if target == holder => {
                return Err(fail(format!("{holder} already holds lease {lease}")));
            }
            Some(target) => target,
            None => {
                return Err(fail(format!(
                    "no successor is named in lease {lease} yet: name a candidate with --to"
                )));
            }
        };
        let mut object = current.object().clone();
        set_annotation(&mut object, HANDOVER_ANNOTATION, Some(&target));
        match store.replace(object).await {
            Ok(_) => break (holder, current.term_id(), target),
            Err(ApiError::Conflict(_)) if attempt < ATTEMPTS => continue,
            Err(error) => {
                return Err(fail(format!(
                    "cannot ask {holder} to hand over lease {lease}: {error}"
                )));
            }
        }
    };
    eprintln!("leader-gate handover: asked {holder} to hand lease {lease} over to {target}");

    let mut watch = store.watch();
    loop {
        let next = tokio::time::timeout_at(deadline, watch.next()).await;
        let Ok(Some(item)) = next else {
            return Err(fail(format!(
                "no new holder of lease {lease} within {:?} (the request stays in the lease until the next acquisition)",
                args.timeout
            )));
        };
        let Ok(Some(current)) = item else { continue };
        if let Some(new) = new_holder(&current, &term) {
            return Ok(if new == target {
                format!("{new} holds lease {lease}")
            } else {
                format!("{new} holds lease {lease} ({target} did not take over; the fallback did)")
            });
        }
    }
}

/// The holder of a term after `old`, if `lease` shows one.
fn new_holder(lease: &Lease, old: &crate::elector::lease::TermId) -> Option<String> {
    if lease.is_marked_released() || &lease.term_id() == old {
        return None;
    }
    lease.record().holder
}
