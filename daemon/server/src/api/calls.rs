//! gRPC server metrics as go-grpc-prometheus names them: every call counted when it starts and when it is
//! handled (with its status code), and timed from its start until its last message or trailers, per
//! service, method and type. A call whose client goes away before the end counts as CANCELLED. With traces
//! on, each call is also an OpenTelemetry server span, child of the caller's `traceparent`.

use std::{
    collections::HashMap,
    pin::Pin,
    sync::Arc,
    task::{Context, Poll},
};

use bytes::Bytes;
use consistd_observe::{
    metrics::{GrpcCall, Metrics},
    telemetry,
};
use futures::future::BoxFuture;
use hyper::body::{Frame, SizeHint};
use prost::Message as _;
use tokio::time::Instant;
use tonic::{Code, body::Body};
use tower::{Layer, Service};
use tracing::Instrument as _;
use tracing_opentelemetry::OpenTelemetrySpanExt as _;

/// The methods served, by path ("/consistd.v1.WatchService/Subscribe"), with their go-grpc-prometheus
/// type: unary, client_stream, server_stream or bidi_stream.
#[derive(Debug, Default)]
pub(crate) struct Methods(HashMap<String, &'static str>);

impl Methods {
    /// The methods of every service in the encoded file descriptor sets.
    pub(crate) fn from_descriptor_sets(sets: &[&[u8]]) -> Self {
        let mut methods = HashMap::new();
        for set in sets {
            let Ok(set) = prost_types::FileDescriptorSet::decode(*set) else { continue };
            for file in set.file {
                for service in &file.service {
                    let full = format!("{}.{}", file.package(), service.name());
                    for m in &service.method {
                        let kind = match (m.client_streaming(), m.server_streaming()) {
                            (false, false) => "unary",
                            (true, false) => "client_stream",
                            (false, true) => "server_stream",
                            (true, true) => "bidi_stream",
                        };
                        methods.insert(format!("/{full}/{}", m.name()), kind);
                    }
                }
            }
        }
        Self(methods)
    }

    /// The labels of the call to `path`; None for a path that names no served method.
    fn call(&self, path: &str) -> Option<GrpcCall> {
        let kind = self.0.get(path)?;
        let (service, method) = path.trim_start_matches('/').split_once('/')?;
        Some(GrpcCall {
            grpc_type: (*kind).to_owned(),
            grpc_service: service.to_owned(),
            grpc_method: method.to_owned(),
        })
    }
}

/// The tower layer that counts and times every call on the socket.
#[derive(Debug, Clone)]
pub(crate) struct CallsLayer {
    methods: Arc<Methods>,
    metrics: Metrics,
}

impl CallsLayer {
    /// Counts calls to `methods` in `metrics`, each of them starting at 0 so that dashboards and alerts see
    /// every method before its first call.
    pub(crate) fn new(methods: Methods, metrics: Metrics) -> Self {
        for path in methods.0.keys() {
            if let Some(call) = methods.call(path) {
                metrics.grpc_method(&call);
            }
        }
        Self { methods: Arc::new(methods), metrics }
    }
}

impl<S> Layer<S> for CallsLayer {
    type Service = Calls<S>;

    fn layer(&self, inner: S) -> Self::Service {
        Calls { inner, methods: self.methods.clone(), metrics: self.metrics.clone() }
    }
}

/// Counts and times each call, passing it on unchanged.
#[derive(Debug, Clone)]
pub(crate) struct Calls<S> {
    inner: S,
    methods: Arc<Methods>,
    metrics: Metrics,
}

impl<S, B> Service<http::Request<B>> for Calls<S>
where
    S: Service<http::Request<B>, Response = http::Response<Body>>,
    S::Future: Send + 'static,
{
    type Response = http::Response<Body>;
    type Error = S::Error;
    type Future = BoxFuture<'static, Result<Self::Response, Self::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        let call = self.methods.call(request.uri().path());
        let Some(call) = call else { return Box::pin(self.inner.call(request)) };
        let span = server_span(&call, request.headers());
        let response = span.in_scope(|| self.inner.call(request));
        self.metrics.grpc_started(&call);
        let timing = CallTiming { call, started: Instant::now(), metrics: self.metrics.clone(), span: span.clone() };
        let answer = async move {
            let response = response.await?;
            // A trailers-only answer (an error before any message) carries its status in the headers.
            if let Some(code) = code_of(response.headers()) {
                timing.handled(code);
                return Ok(response);
            }
            Ok(response.map(|inner| Body::new(TimedBody { inner, timing: Some(timing) })))
        };
        Box::pin(answer.instrument(span))
    }
}

/// The OpenTelemetry server span of a call, child of the caller's W3C trace context; none while traces
/// are off.
fn server_span(call: &GrpcCall, headers: &http::HeaderMap) -> tracing::Span {
    if !telemetry::traces_on() {
        return tracing::Span::none();
    }
    let span = tracing::info_span!(
        "grpc call",
        otel.name = format!("{}/{}", call.grpc_service, call.grpc_method),
        otel.kind = "server",
        otel.status_code = tracing::field::Empty,
        rpc.system = "grpc",
        rpc.service = call.grpc_service,
        rpc.method = call.grpc_method,
        rpc.grpc.status_code = tracing::field::Empty,
    );
    let _ = span.set_parent(telemetry::remote_context(headers));
    span
}

/// The `grpc-status` of headers or trailers.
fn code_of(headers: &http::HeaderMap) -> Option<Code> {
    let value = headers.get("grpc-status")?.to_str().ok()?.parse::<i32>().ok()?;
    Some(Code::from_i32(value))
}

/// A call being timed; recorded once, when its status is known.
#[derive(Debug)]
struct CallTiming {
    call: GrpcCall,
    started: Instant,
    metrics: Metrics,
    /// The call's server span (none while traces are off): open until the call's status is known.
    span: tracing::Span,
}

impl CallTiming {
    fn handled(self, code: Code) {
        self.span.record("rpc.grpc.status_code", code as i32);
        // OpenTelemetry's gRPC conventions: on the server side only these codes are the server's errors
        // (NOT_FOUND or INVALID_ARGUMENT, say, are the caller's).
        let server_error = matches!(
            code,
            Code::Unknown
                | Code::DeadlineExceeded
                | Code::Unimplemented
                | Code::Internal
                | Code::Unavailable
                | Code::DataLoss
        );
        if server_error {
            self.span.record("otel.status_code", "ERROR");
        }
        self.metrics.grpc_handled(&self.call, code_name(code), self.started.elapsed());
    }
}

/// A response body that records its call when the trailers pass, or as CANCELLED if it is dropped first.
struct TimedBody {
    inner: Body,
    timing: Option<CallTiming>,
}

impl hyper::body::Body for TimedBody {
    type Data = Bytes;
    type Error = tonic::Status;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let polled = Pin::new(&mut self.inner).poll_frame(cx);
        let code = match &polled {
            Poll::Ready(Some(Ok(frame))) => frame.trailers_ref().map(|t| code_of(t).unwrap_or(Code::Unknown)),
            Poll::Ready(Some(Err(status))) => Some(status.code()),
            Poll::Ready(None) => Some(Code::Unknown),
            Poll::Pending => None,
        };
        if let Some(code) = code
            && let Some(timing) = self.timing.take()
        {
            timing.handled(code);
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

impl Drop for TimedBody {
    fn drop(&mut self) {
        if let Some(timing) = self.timing.take() {
            timing.handled(Code::Cancelled);
        }
    }
}

/// A code as gRPC's own libraries spell it in metrics (go-grpc-prometheus' `grpc_code`).
fn code_name(code: Code) -> &'static str {
    match code {
        Code::Ok => "OK",
        Code::Cancelled => "Canceled",
        Code::Unknown => "Unknown",
        Code::InvalidArgument => "InvalidArgument",
        Code::DeadlineExceeded => "DeadlineExceeded",
        Code::NotFound => "NotFound",
        Code::AlreadyExists => "AlreadyExists",
        Code::PermissionDenied => "PermissionDenied",
        Code::ResourceExhausted => "ResourceExhausted",
        Code::FailedPrecondition => "FailedPrecondition",
        Code::Aborted => "Aborted",
        Code::OutOfRange => "OutOfRange",
        Code::Unimplemented => "Unimplemented",
        Code::Internal => "Internal",
        Code::Unavailable => "Unavailable",
        Code::DataLoss => "DataLoss",
        Code::Unauthenticated => "Unauthenticated",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_consistd_method_is_typed_from_the_descriptors() {
        let methods = Methods::from_descriptor_sets(&[consistd_proto::v1::FILE_DESCRIPTOR_SET]);
        let call = |path: &str| methods.call(path).map(|c| (c.grpc_service, c.grpc_method, c.grpc_type));
        let s = |a: &str, b: &str, c: &str| Some((a.to_owned(), b.to_owned(), c.to_owned()));
        assert_eq!(
            call("/consistd.v1.WatchService/Subscribe"),
            s("consistd.v1.WatchService", "Subscribe", "server_stream")
        );
        assert_eq!(call("/consistd.v1.OutboxService/Send"), s("consistd.v1.OutboxService", "Send", "unary"));
        assert_eq!(call("/consistd.v1.WatchService/Nope"), None);
        assert_eq!(call("/nope"), None);
    }
}
