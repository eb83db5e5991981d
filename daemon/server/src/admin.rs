//! The admin HTTP endpoint: /healthz, /readyz, /metrics, /outbox, /queues and /debug/state on its own Unix
//! socket, for kubelet probes, Prometheus and `consistd status` (plus the client `consistd status` uses),
//! and optionally all but /debug/state on a TCP port (`admin.listen`) for scrapes, httpGet probes and
//! `kubectl consistd outbox` / `queues` (through the apiserver's pod proxy).

use std::{convert::Infallible, path::Path};

use bytes::Bytes;
use consistd_core::{
    report::{OutboxReport, QueuesReport, Report},
    tasks::Tasks,
};
use consistd_observe::metrics::Metrics;
use http::{Method, Request, Response, StatusCode, header};
use http_body_util::{BodyExt, Full};
use hyper::{body::Incoming, service::service_fn};
use hyper_util::client::legacy::Client;
use hyperlocal::{UnixClientExt, UnixConnector};
use tokio::{
    io::{AsyncRead, AsyncWrite},
    net::{TcpListener, UnixListener},
};

use crate::health::Health;

/// Why `consistd status` could not read the daemon's report.
#[derive(Debug, thiserror::Error)]
pub enum AdminError {
    /// The admin socket did not answer.
    #[error("query admin socket {path}")]
    Request {
        /// Path of the admin socket asked (`--admin-socket`).
        path: String,
        /// hyper's error: no such socket, connection refused, or the connection broke.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// It answered something that is not a report.
    #[error("decode /debug/state from {path}")]
    Decode {
        /// Path of the admin socket asked (`--admin-socket`).
        path: String,
        /// Why the body is not a [`Report`], e.g. another program answers on the socket.
        #[source]
        source: serde_json::Error,
    },
}

/// Where the admin endpoint listens.
#[derive(Debug)]
pub enum AdminListener {
    /// The admin socket: every path.
    Unix(UnixListener),
    /// `admin.listen`: the probes, /metrics, /outbox and /queues, not /debug/state (it is reachable from
    /// other pods).
    Tcp(TcpListener),
}

/// Which paths a listener serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Paths {
    All,
    ProbesAndMetrics,
}

/// Serves the admin endpoint on `listener` until `tasks` stops, each connection a task of `tasks`
/// that finishes the request in hand and closes when it does.
pub async fn serve(listener: AdminListener, health: Health, metrics: Metrics, tasks: Tasks) {
    loop {
        let accepted = tokio::select! {
            () = tasks.stopping() => return,
            accepted = accept(&listener, &health, &metrics, &tasks) => accepted,
        };
        if let Err(error) = accepted {
            tracing::warn!(%error, "admin endpoint accept failed");
        }
    }
}

async fn accept(listener: &AdminListener, health: &Health, metrics: &Metrics, tasks: &Tasks) -> std::io::Result<()> {
    match listener {
        AdminListener::Unix(l) => spawn_connection(l.accept().await?.0, Paths::All, (health, metrics), tasks),
        AdminListener::Tcp(l) => {
            spawn_connection(l.accept().await?.0, Paths::ProbesAndMetrics, (health, metrics), tasks);
        }
    }
    Ok(())
}

fn spawn_connection<S>(stream: S, paths: Paths, (health, metrics): (&Health, &Metrics), tasks: &Tasks)
where
    S: AsyncRead + AsyncWrite + Send + Unpin + 'static,
{
    let (health, metrics) = (health.clone(), metrics.clone());
    let service = service_fn(move |req| {
        let response = route(&req, paths, &health, &metrics);
        async move { Ok::<_, Infallible>(response) }
    });
    crate::http1::spawn(stream, service, tasks, "admin");
}

fn route(req: &Request<Incoming>, paths: Paths, health: &Health, metrics: &Metrics) -> Response<Full<Bytes>> {
    if req.method() != Method::GET {
        return text(StatusCode::METHOD_NOT_ALLOWED, "only GET is served\n".to_owned());
    }
    match req.uri().path() {
        "/healthz" => text(StatusCode::OK, "ok\n".to_owned()),
        "/readyz" => {
            let report = health.report();
            if report.ready {
                text(StatusCode::OK, "ok\n".to_owned())
            } else {
                text(StatusCode::SERVICE_UNAVAILABLE, format!("not ready: {}\n", report.not_ready_reasons.join("; ")))
            }
        }
        "/metrics" => {
            let (content_type, body) =
                metrics.encode_for(req.headers().get(header::ACCEPT).and_then(|accept| accept.to_str().ok()));
            Response::builder()
                .header(header::CONTENT_TYPE, content_type)
                .body(Full::new(Bytes::from(body)))
                .unwrap_or_default()
        }
        "/outbox" => json(&OutboxReport::from(health.report())),
        "/queues" => json(&QueuesReport::from(health.report())),
        "/debug/state" if paths == Paths::All => json(&health.report()),
        other => {
            let known = if paths == Paths::All {
                "/healthz /readyz /metrics /outbox /queues /debug/state"
            } else {
                "/healthz /readyz /metrics /outbox /queues"
            };
            text(StatusCode::NOT_FOUND, format!("no such path {other}; try {known}\n"))
        }
    }
}

fn json(value: &impl serde::Serialize) -> Response<Full<Bytes>> {
    let body = serde_json::to_vec_pretty(value).unwrap_or_default();
    Response::builder()
        .header(header::CONTENT_TYPE, "application/json")
        .body(Full::new(Bytes::from(body)))
        .unwrap_or_default()
}

fn text(status: StatusCode, body: String) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::from(body)));
    *response.status_mut() = status;
    response.headers_mut().insert(header::CONTENT_TYPE, header::HeaderValue::from_static("text/plain; charset=utf-8"));
    response
}

/// GETs `path` (e.g. "/debug/state") from the admin socket: the status code and body.
pub async fn get(socket: &Path, path: &str) -> Result<(StatusCode, Bytes), AdminError> {
    let request_err = |source: Box<dyn std::error::Error + Send + Sync>| AdminError::Request {
        path: socket.display().to_string(),
        source,
    };
    let client: Client<UnixConnector, Full<Bytes>> = Client::unix();
    let uri = hyperlocal::Uri::new(socket, path);
    let response = client.get(uri.into()).await.map_err(|e| request_err(Box::new(e)))?;
    let status = response.status();
    let body = response.into_body().collect().await.map_err(|e| request_err(Box::new(e)))?.to_bytes();
    Ok((status, body))
}

/// The daemon's report, as `consistd status` shows it.
pub async fn fetch_report(socket: &Path) -> Result<Report, AdminError> {
    let (_, body) = get(socket, "/debug/state").await?;
    serde_json::from_slice(&body).map_err(|source| AdminError::Decode { path: socket.display().to_string(), source })
}
