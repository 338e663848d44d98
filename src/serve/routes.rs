//! The HTTP surface: the routers, composed of the routes' handlers, built
//! in functions (tests call them without a socket);
//! [`crate::serve::server`] serves them on a pre-bound listener until a
//! cancellation token fires.
//!
//! - gate router (pod-local): `GET|HEAD /leader`
//!   ([`crate::serve::leader_route`]), `GET /events`
//!   ([`crate::serve::sse_route`]), `POST /gates/{gate}/closed`
//!   ([`crate::serve::ack_route`]), `POST /handover`
//!   ([`crate::serve::step_down`])
//! - admin router (kubelet, Prometheus): `/leader`, `/healthz`, `/readyz`,
//!   `/metrics` ([`crate::serve::admin_routes`])
//! - with several Leases, each Lease's routes behind [`several`]'s
//!   dispatcher (`/leader/{lease}`, `?lease=`), and `/leases`
//!
//! Only this module composes: the routes import none of each other.

use std::sync::Arc;

use axum::Router;
use axum::body::Body;
use axum::http::{Method, Request};
use axum::routing::{get, post};

use crate::serve::ack_route;
use crate::serve::admin_routes::{healthz, metrics, readyz};
use crate::serve::app_state::AppState;
use crate::serve::leader_route::{leader, leader_now, named_leader};
use crate::serve::server::Shortcut;
use crate::serve::sse_route;
use crate::serve::step_down;

mod several;

/// The gate listener's routes for the Leases `apps` (one, or several: see
/// [`several`]).
pub fn gate_router(apps: &[AppState]) -> Router {
    match apps {
        [app] => lease_gate_router(app.clone()),
        _ => several::gate_router(apps.iter().cloned().map(lease_gate_router).collect(), apps),
    }
}

/// The admin listener's routes for the Leases `apps`.
pub fn admin_router(apps: &[AppState]) -> Router {
    match apps {
        [app] => lease_admin_router(app.clone()),
        _ => several::admin_router(apps.iter().cloned().map(lease_admin_router).collect(), apps),
    }
}

/// `GET /leader` beside a Lease alone, answered before the router: the
/// route a collector may poll in a tight loop (the same answer as the
/// router's, `leader_now`; HEAD and every other request go through the
/// router).
pub fn shortcut(apps: &[AppState]) -> Option<Shortcut> {
    let [app] = apps else {
        return None;
    };
    let app = app.clone();
    Some(Arc::new(move |request: &Request<Body>| {
        (request.method() == Method::GET && request.uri().path() == "/leader")
            .then(|| leader_now(&app))
    }))
}

/// One Lease's gate routes: `/leader`, `/events`, `/gates/{gate}/closed`,
/// `/handover`.
/// The handlers share the state behind one `Arc` (one reference count per
/// request, not one per field).
pub fn lease_gate_router(app: AppState) -> Router {
    Router::new()
        .route("/leader", get(leader))
        .route("/leader/{lease}", get(named_leader))
        .route("/events", get(sse_route::events))
        .route("/gates/{gate}/closed", post(ack_route::closed))
        .route("/handover", post(step_down::handover))
        .with_state(Arc::new(app))
}

/// One Lease's admin routes: `/leader`, `/healthz`, `/readyz`, `/metrics`.
pub fn lease_admin_router(app: AppState) -> Router {
    Router::new()
        .route("/leader", get(leader))
        .route("/leader/{lease}", get(named_leader))
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .with_state(Arc::new(app))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::time::Duration;
    use tokio::sync::watch;
    use tokio_util::sync::CancellationToken;

    use crate::clock::BootInstant;
    use crate::elector::driver::Heartbeat;
    use crate::serve::metrics::Metrics;
    use crate::serve::published::{LeaderState, Publisher};
    use crate::serve::transitions::{EventLog, LeaseLabel};
    use axum::body::Body;
    use axum::http::{Request, StatusCode, header};
    use tower::ServiceExt;

    fn app(state: LeaderState) -> AppState {
        let (_, rx) = watch::channel(state);
        AppState {
            state: rx,
            identity: "me".into(),
            namespace: "ns".into(),
            lease_name: "demo".into(),
            heartbeat: Heartbeat::new(),
            stuck_after: Duration::from_secs(15),
            events: EventLog::new("me", LeaseLabel::alone("ns", "demo"), 16, 16),
            metrics: Arc::new(Metrics::new("ns", "demo")),
            subscribers: crate::serve::app_state::StreamSlots::new(2),
            keep_alive: Duration::from_secs(15),
            shutdown: CancellationToken::new(),
            gate_acks: crate::serve::gate_acks::GateAcks::new(8),
            gate_lag: Duration::from_secs(4),
            step_aside: Default::default(),
        }
    }

    fn leading(valid_until: BootInstant) -> LeaderState {
        LeaderState {
            leading: true,
            holder: Some("me".into()),
            term: Some("uid/1".into()),
            since_micros: 0,
            valid_until: Some(valid_until),
            seq: 1,
            last_stop: None,
            last_term: None,
            observed: true,
            collector_healthy: None,
            successor: None,
            own_record: true,
        }
    }

    async fn get(router: Router, method: &str, path: &str) -> (StatusCode, serde_json::Value) {
        let response = router
            .oneshot(
                Request::builder()
                    .method(method)
                    .uri(path)
                    .body(Body::empty())
                    .unwrap(),
            )
            .await
            .unwrap();
        let status = response.status();
        let bytes = axum::body::to_bytes(response.into_body(), 1 << 16)
            .await
            .unwrap();
        let json = serde_json::from_slice(&bytes).unwrap_or(serde_json::Value::Null);
        (status, json)
    }

    #[tokio::test]
    async fn leader_answers_200_with_the_contract_body_while_valid() {
        let router = lease_gate_router(app(leading(BootInstant::after(Duration::from_secs(10)))));
        let (status, body) = get(router, "GET", "/leader").await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(body["leading"], true);
        assert_eq!(body["identity"], "me");
        assert_eq!(body["holder"], "me");
        assert_eq!(body["lease"]["namespace"], "ns");
        assert_eq!(body["lease"]["name"], "demo");
        assert_eq!(body["term"], "uid/1");
        assert_eq!(body["seq"], 1);
        let valid_for = body["valid_for_ms"].as_u64().unwrap();
        assert!(valid_for > 9_000 && valid_for <= 10_000, "{valid_for}");
    }

    #[tokio::test]
    async fn acknowledgements_are_taken_from_this_pod_only_and_for_a_known_gate_and_term() {
        use crate::serve::server::Peer;
        let app = app(leading(BootInstant::after(Duration::from_secs(10))));
        let acks = app.gate_acks.clone();
        let _exec = acks.register("exec-1", false).unwrap();
        acks.term_changed(Some("uid/1"), true);
        acks.term_changed(Some("uid/1"), false);
        let router = lease_gate_router(app);
        let post = |peer: &str, path: &str| {
            let mut request = Request::builder()
                .method("POST")
                .uri(path)
                .body(Body::empty())
                .unwrap();
            request
                .extensions_mut()
                .insert(Peer::Network(peer.parse().unwrap()));
            let router = router.clone();
            async move { router.oneshot(request).await.unwrap().status() }
        };
        let ok = "/gates/exec-1/closed?term=uid%2F1";
        assert_eq!(post("10.0.0.7:5000", ok).await, StatusCode::FORBIDDEN);
        assert!(
            !acks.closed_now(),
            "a peer elsewhere cannot let the release go"
        );
        assert_eq!(
            post("127.0.0.1:5000", "/gates/exec-1/closed").await,
            StatusCode::BAD_REQUEST
        );
        assert_eq!(
            post("127.0.0.1:5000", "/gates/exec-1/closed?term=uid%2F0").await,
            StatusCode::CONFLICT
        );
        assert_eq!(
            post("127.0.0.1:5000", "/gates/other/closed?term=uid%2F1").await,
            StatusCode::NOT_FOUND
        );
        assert!(!acks.closed_now());
        // A dual-stack listener sees IPv4 clients as IPv4-mapped addresses.
        assert_eq!(
            post("[::ffff:10.0.0.7]:5000", ok).await,
            StatusCode::FORBIDDEN
        );
        assert_eq!(
            post(
                "[::ffff:127.0.0.1]:5000",
                "/gates/exec-1/closed?term=uid%2F0"
            )
            .await,
            StatusCode::CONFLICT
        );
        assert_eq!(post("[::1]:5000", ok).await, StatusCode::NO_CONTENT);
        assert!(acks.closed_now());
    }

    #[tokio::test]
    async fn a_step_down_is_asked_from_this_pod_only() {
        use crate::serve::server::Peer;
        let app = app(leading(BootInstant::after(Duration::from_secs(10))));
        let asked = app.step_aside.clone();
        let router = lease_gate_router(app);
        let post = |peer: &str, path: &str| {
            let mut request = Request::builder()
                .method("POST")
                .uri(path)
                .body(Body::empty())
                .unwrap();
            request
                .extensions_mut()
                .insert(Peer::Network(peer.parse().unwrap()));
            let router = router.clone();
            async move { router.oneshot(request).await.unwrap().status() }
        };
        let not_yet = || async {
            tokio::time::timeout(Duration::from_millis(20), asked.notified())
                .await
                .is_err()
        };
        assert_eq!(
            post("10.0.0.7:5000", "/handover").await,
            StatusCode::FORBIDDEN
        );
        assert!(not_yet().await, "nobody elsewhere may take this pod out");
        assert_eq!(
            post("127.0.0.1:5000", "/handover?lease=other").await,
            StatusCode::NOT_FOUND
        );
        assert!(not_yet().await);
        assert_eq!(
            post("127.0.0.1:5000", "/handover?lease=demo").await,
            StatusCode::ACCEPTED
        );
        assert!(!not_yet().await, "the election was asked");
    }

    #[tokio::test]
    async fn beside_several_leases_a_step_down_names_its_lease() {
        use crate::serve::server::Peer;
        let first = app(leading(BootInstant::after(Duration::from_secs(10))));
        let mut second = app(leading(BootInstant::after(Duration::from_secs(10))));
        second.lease_name = "other".into();
        second.step_aside = Default::default();
        let (asked_first, asked_second) = (first.step_aside.clone(), second.step_aside.clone());
        let router = gate_router(&[first, second]);
        let post = |path: &str| {
            let mut request = Request::builder()
                .method("POST")
                .uri(path)
                .body(Body::empty())
                .unwrap();
            request
                .extensions_mut()
                .insert(Peer::Network("127.0.0.1:5000".parse().unwrap()));
            let router = router.clone();
            async move { router.oneshot(request).await.unwrap().status() }
        };
        let asked = |notify: Arc<crate::serve::step_aside::StepAsideRequests>| async move {
            tokio::time::timeout(Duration::from_millis(20), notify.notified())
                .await
                .is_ok()
        };
        assert_eq!(post("/handover").await, StatusCode::BAD_REQUEST);
        assert_eq!(post("/handover?lease=none").await, StatusCode::NOT_FOUND);
        assert_eq!(post("/handover?lease=other").await, StatusCode::ACCEPTED);
        assert!(asked(asked_second).await, "the Lease named");
        assert!(!asked(asked_first).await, "and no other");
    }

    #[tokio::test]
    async fn gates_register_from_this_pod_only() {
        use crate::serve::server::Peer;
        let app = app(leading(BootInstant::after(Duration::from_secs(10))));
        let acks = app.gate_acks.clone();
        let router = lease_gate_router(app);
        let subscribe = |peer: &str, path: &str| {
            let mut request = Request::builder().uri(path).body(Body::empty()).unwrap();
            request
                .extensions_mut()
                .insert(Peer::Network(peer.parse().unwrap()));
            let router = router.clone();
            async move { router.oneshot(request).await.unwrap().status() }
        };
        assert_eq!(
            subscribe("10.0.0.7:5000", "/events?gate=far").await,
            StatusCode::FORBIDDEN
        );
        assert_eq!(
            subscribe("10.0.0.7:5000", "/events").await,
            StatusCode::OK,
            "a plain subscriber from anywhere"
        );
        assert_eq!(
            subscribe("127.0.0.1:5000", "/events?gate=near&acknowledges=maybe").await,
            StatusCode::BAD_REQUEST
        );
        acks.term_changed(Some("uid/1"), true);
        acks.term_changed(Some("uid/1"), false);
        assert!(acks.still_open().is_empty(), "nobody registered");
    }

    #[tokio::test]
    async fn a_leading_snapshot_past_its_deadline_answers_503() {
        // Published as leading, but the deadline passed before the read: G2
        // says no 200 is computed after the deadline.
        let router = lease_gate_router(app(leading(BootInstant::now())));
        let (status, body) = get(router, "GET", "/leader").await;
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(body["leading"], false);
        assert_eq!(body["valid_for_ms"], 0);
        assert_eq!(body["term"], serde_json::Value::Null);
    }

    /// The shortcut answers `GET /leader` as the router does (status,
    /// headers, body but for the time left), and only that.
    #[tokio::test]
    async fn the_shortcut_answers_get_leader_as_the_router_does_and_nothing_else() {
        let request = |method: &str, path: &str| {
            Request::builder()
                .method(method)
                .uri(path)
                .body(Body::empty())
                .unwrap()
        };
        // Content-Length aside: the router writes it, the server (hyper)
        // writes it from the body's exact size, which the shortcut's has.
        async fn parts(
            mut response: axum::response::Response,
        ) -> (StatusCode, String, serde_json::Value) {
            use hyper::body::Body as _;
            let status = response.status();
            let length = response.headers_mut().remove(header::CONTENT_LENGTH);
            let headers = format!("{:?}", response.headers());
            let exact = response.body().size_hint().exact();
            let bytes = axum::body::to_bytes(response.into_body(), 1 << 16)
                .await
                .unwrap();
            assert_eq!(exact, Some(bytes.len() as u64));
            if let Some(length) = length {
                assert_eq!(length.to_str().unwrap(), bytes.len().to_string());
            }
            let mut json: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
            json["valid_for_ms"] = json["valid_for_ms"].as_u64().map(|ms| ms / 1000).into();
            (status, headers, json)
        }
        for state in [
            leading(BootInstant::after(Duration::from_secs(10))),
            LeaderState {
                valid_until: None,
                ..leading(BootInstant::after(Duration::ZERO))
            },
        ] {
            let apps = [app(state)];
            let shortcut = shortcut(&apps).expect("a Lease alone has one");
            let fast = shortcut(&request("GET", "/leader?x=1")).expect("taken");
            let routed = lease_gate_router(apps[0].clone())
                .oneshot(request("GET", "/leader?x=1"))
                .await
                .unwrap();
            let (fast, routed) = (parts(fast).await, parts(routed).await);
            assert_eq!(fast, routed);
            assert!(fast.1.contains("application/json"), "{fast:?}");
            for (method, path) in [
                ("HEAD", "/leader"),
                ("POST", "/leader"),
                ("GET", "/leader/demo"),
                ("GET", "/events"),
            ] {
                assert!(
                    shortcut(&request(method, path)).is_none(),
                    "{method} {path}"
                );
            }
        }
        let two = [
            app(leading(BootInstant::after(Duration::from_secs(10)))),
            app(leading(BootInstant::after(Duration::from_secs(10)))),
        ];
        assert!(
            shortcut(&two).is_none(),
            "several Leases: the router's /leader"
        );
    }

    #[tokio::test]
    async fn head_leader_has_the_status_and_no_body() {
        let router = lease_gate_router(app(leading(BootInstant::after(Duration::from_secs(5)))));
        let (status, body) = get(router, "HEAD", "/leader").await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(body, serde_json::Value::Null);
    }

    #[tokio::test]
    async fn readyz_waits_for_the_api_server_and_healthz_for_a_live_loop() {
        let events = EventLog::new("me", LeaseLabel::alone("ns", "demo"), 16, 16);
        let metrics = Arc::new(Metrics::new("ns", "demo"));
        let (_publisher, rx) = Publisher::new(events, metrics);
        let mut app = app(rx.borrow().clone());
        app.state = rx;
        let (status, _) = get(lease_admin_router(app.clone()), "GET", "/readyz").await;
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
        let (status, _) = get(lease_admin_router(app.clone()), "GET", "/healthz").await;
        assert_eq!(status, StatusCode::OK);
        app.heartbeat.end();
        let (status, _) = get(lease_admin_router(app), "GET", "/healthz").await;
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    }

    /// `GET /metrics` on the admin router with these `Accept` headers:
    /// content type, `Vary`, body.
    async fn get_metrics(app: AppState, accept: &[&str]) -> (String, String, String) {
        let mut request = Request::builder().uri("/metrics");
        for value in accept {
            request = request.header(header::ACCEPT, *value);
        }
        let response = lease_admin_router(app)
            .oneshot(request.body(Body::empty()).unwrap())
            .await
            .unwrap();
        assert_eq!(response.status(), StatusCode::OK);
        let header_text = |name| response.headers()[name].to_str().unwrap().to_owned();
        let (content_type, vary) = (header_text(header::CONTENT_TYPE), header_text(header::VARY));
        let bytes = axum::body::to_bytes(response.into_body(), 1 << 16)
            .await
            .unwrap();
        (
            content_type,
            vary,
            String::from_utf8(bytes.to_vec()).unwrap(),
        )
    }

    fn samples(exposition: &str) -> Vec<&str> {
        exposition.lines().filter(|l| !l.starts_with('#')).collect()
    }

    #[tokio::test]
    async fn the_leading_gauge_follows_the_read_time_deadline() {
        let live = app(leading(BootInstant::after(Duration::from_secs(5))));
        let (_, _, text) = get_metrics(live, &[]).await;
        assert!(
            text.contains("leader_gate_leading{lease=\"ns/demo\"} 1"),
            "{text}"
        );
        // Published as leading, but the deadline has passed: no 1 any more.
        let stale = app(leading(BootInstant::now()));
        let (_, _, text) = get_metrics(stale, &[]).await;
        assert!(
            text.contains("leader_gate_leading{lease=\"ns/demo\"} 0"),
            "{text}"
        );
    }

    #[tokio::test]
    async fn metrics_are_classic_text_unless_openmetrics_is_asked_for() {
        let app = app(leading(BootInstant::after(Duration::from_secs(5))));
        app.metrics.api_request("update", Ok(())); // a counter sample
        let (content_type, vary, text) = get_metrics(app.clone(), &[]).await;
        assert_eq!(content_type, "text/plain; version=0.0.4; charset=utf-8");
        assert_eq!(vary, "Accept");
        assert!(text.contains("# HELP leader_gate_api_requests_total Lease API requests"));
        assert!(text.contains("# TYPE leader_gate_api_requests_total counter\n"));
        assert!(text.contains("# TYPE leader_gate_renew_duration_seconds histogram\n"));
        assert!(
            !text.contains("# EOF") && !text.contains("# UNIT"),
            "{text}"
        );

        // Prometheus 2.42's header, verbatim.
        let prometheus = "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1";
        let (content_type, vary, om) = get_metrics(app.clone(), &[prometheus]).await;
        assert_eq!(
            content_type,
            "application/openmetrics-text; version=1.0.0; charset=utf-8"
        );
        assert_eq!(vary, "Accept");
        assert!(om.contains("# TYPE leader_gate_api_requests counter\n"));
        assert!(om.contains("# UNIT leader_gate_renew_duration_seconds seconds\n"));
        assert!(om.ends_with("# EOF\n"), "{om}");
        assert!(samples(&text).contains(
            &r#"leader_gate_api_requests_total{lease="ns/demo",verb="update",outcome="ok"} 1"#
        ));
        assert_eq!(
            samples(&text),
            samples(&om),
            "the same samples in both formats"
        );

        let (content_type, _, _) = get_metrics(app.clone(), &["*/*"]).await;
        assert!(content_type.starts_with("text/plain"), "{content_type}");
        // Two Accept headers count as one list.
        let (content_type, _, _) =
            get_metrics(app, &["text/plain;q=0.5", "application/openmetrics-text"]).await;
        assert!(
            content_type.starts_with("application/openmetrics-text"),
            "{content_type}"
        );
    }

    #[tokio::test]
    async fn the_gate_listener_serves_no_admin_routes() {
        for path in ["/healthz", "/readyz", "/metrics"] {
            let router = lease_gate_router(app(leading(BootInstant::now())));
            let (status, _) = get(router, "GET", path).await;
            assert_eq!(status, StatusCode::NOT_FOUND, "{path}");
        }
    }
}
