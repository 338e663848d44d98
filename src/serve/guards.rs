//! Request guards shared by several routes: a request for another Lease
//! (`?lease=`, 404), one from outside this pod's gate channel (403), and
//! the query values they read.
//!
//! A lower room: the routes call it first thing, and it imports no route.

use std::sync::Arc;

use axum::extract::Extension;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};

use crate::serve::app_state::AppState;
use crate::serve::gate_channel::GateChannel;
use crate::serve::server::Peer;

/// 404 for a `?lease=` that names another Lease than `app`'s: a client
/// following one Lease must never act on another's leadership.
pub fn not_this_lease(app: &AppState, query: Option<&str>) -> Option<Response> {
    let lease = query_param(query, "lease")?;
    (lease != *app.lease_name).then(|| no_such_lease(app, &lease))
}

/// The 404 for a request naming Lease `lease`, which is not `app`'s.
pub fn no_such_lease(app: &AppState, lease: &str) -> Response {
    (
        StatusCode::NOT_FOUND,
        format!(
            "no Lease {lease:?} here: this sidecar contends for {:?} only\n",
            app.lease_name
        ),
    )
        .into_response()
}

/// Whether a request came from this pod's own containers, by the gate
/// channel of the listener's router (a loopback address when it has none):
/// only they may register a gate, acknowledge for one or ask for a
/// step-down. Otherwise the 403 to answer, in the words of `what` (as
/// [`not_this_lease`] answers for another Lease).
pub fn not_from_this_pod(
    peer: Option<&Extension<Peer>>,
    channel: Option<&Extension<Arc<GateChannel>>>,
    what: &str,
) -> Option<Response> {
    let peer = peer.map(|Extension(peer)| peer);
    let admitted = match channel {
        Some(Extension(channel)) => channel.admits(peer, what),
        None => GateChannel::Loopback.admits(peer, what),
    };
    admitted
        .err()
        .map(|refusal| (StatusCode::FORBIDDEN, refusal).into_response())
}

/// The guards of a request that acts for this pod (an acknowledgement, a
/// step-down): the 403 of [`not_from_this_pod`], else the 404 of
/// [`not_this_lease`], if either refuses it.
pub fn not_this_pods_for_this_lease(
    app: &AppState,
    peer: Option<&Extension<Peer>>,
    channel: Option<&Extension<Arc<GateChannel>>>,
    query: Option<&str>,
    what: &str,
) -> Option<Response> {
    not_from_this_pod(peer, channel, what).or_else(|| not_this_lease(app, query))
}

/// The value of `name` in a query string, percent-decoded.
pub fn query_param(query: Option<&str>, name: &str) -> Option<String> {
    query?.split('&').find_map(|pair| {
        let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
        (key == name).then(|| percent_decode(value))?
    })
}

fn percent_decode(text: &str) -> Option<String> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'%' => {
                let hex = text.get(i + 1..i + 3)?;
                out.push(u8::from_str_radix(hex, 16).ok()?);
                i += 3;
            }
            b'+' => {
                out.push(b' ');
                i += 1;
            }
            byte => {
                out.push(byte);
                i += 1;
            }
        }
    }
    String::from_utf8(out).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn query_values_are_found_and_decoded() {
        assert_eq!(
            query_param(Some("term=ab%2Fc-1&x=y"), "term").as_deref(),
            Some("ab/c-1")
        );
        assert_eq!(
            query_param(Some("x=1&gate=exec-1"), "gate").as_deref(),
            Some("exec-1")
        );
        assert_eq!(query_param(Some("gate"), "gate").as_deref(), Some(""));
        assert_eq!(query_param(Some("term=%zz"), "term"), None);
        assert_eq!(query_param(None, "term"), None);
    }
}
