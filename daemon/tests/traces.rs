//! OpenTelemetry traces against the real apiserver, exported to an OTLP/gRPC receiver this test runs: with
//! `OTEL_EXPORTER_OTLP_ENDPOINT` set, a call is a server span named after its method, child of the caller's
//! W3C `traceparent`, and the apiserver request it makes is a client span under it. The span records the
//! call's status code; the caller's errors (NOT_FOUND) do not mark it failed. An ACK-tracked send made
//! under a trace is a span of that trace, and the message reaches the receiving app with the trace's
//! `traceparent`.

use std::{
    sync::{Arc, Mutex},
    time::Duration,
};

use consistd_client::proto::{
    AckRequest, CreateRequest, Destination, GetRequest, ReceiveRequest, SendRequest, destination::Target,
};
use consistd_testkit::Daemon;
use opentelemetry_proto::tonic::{
    collector::trace::v1::{
        ExportTraceServiceRequest, ExportTraceServiceResponse,
        trace_service_server::{TraceService, TraceServiceServer},
    },
    common::v1::any_value::Value,
    trace::v1::{Span, span::SpanKind, status::StatusCode},
};
use tokio_stream::wrappers::TcpListenerStream;
use tonic::{Request, Response, Status};

const BIN: &str = env!("CARGO_BIN_EXE_consistd");
const TRACE_ID: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const PARENT_ID: &str = "00f067aa0ba902b7";
/// The trace of an ACK-tracked send.
const SEND_TRACE_ID: &str = "5ce0e9a56015fec5aadfa328ae398115";
/// The trace of a call that fails with the caller's error (NOT_FOUND).
const MISSING_TRACE_ID: &str = "0af7651916cd43dd8448eb211c80319c";

/// The spans received, with their resource's service.name.
#[derive(Clone, Default)]
struct Collector(Arc<Mutex<Vec<(String, Span)>>>);

#[tonic::async_trait]
impl TraceService for Collector {
    async fn export(
        &self,
        request: Request<ExportTraceServiceRequest>,
    ) -> Result<Response<ExportTraceServiceResponse>, Status> {
        let mut spans = self.0.lock().expect("spans");
        for resource in request.into_inner().resource_spans {
            let attributes = resource.resource.map(|r| r.attributes).unwrap_or_default();
            let service = attributes.iter().find(|a| a.key == "service.name").and_then(|a| match &a.value {
                Some(v) => match &v.value {
                    Some(Value::StringValue(s)) => Some(s.clone()),
                    _ => None,
                },
                None => None,
            });
            for scope in resource.scope_spans {
                spans.extend(scope.spans.into_iter().map(|s| (service.clone().unwrap_or_default(), s)));
            }
        }
        Ok(Response::new(ExportTraceServiceResponse { partial_success: None }))
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Starts an OTLP/gRPC receiver on loopback; returns what it collects and its endpoint.
async fn otlp_receiver() -> (Collector, String) {
    let collector = Collector::default();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind the OTLP receiver");
    let endpoint = format!("http://{}", listener.local_addr().expect("address"));
    let server = TraceServiceServer::new(collector.clone());
    consistd_testkit::spawn(
        tonic::transport::Server::builder().add_service(server).serve_with_incoming(TcpListenerStream::new(listener)),
    );
    (collector, endpoint)
}

/// Waits until `collector` holds a span of `trace_id` for which `wanted` holds.
async fn span_where(collector: &Collector, trace_id: &str, wanted: impl Fn(&Span) -> bool) -> (String, Span) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let spans = collector.0.lock().expect("spans").clone();
        if let Some(found) = spans.iter().find(|(_, s)| hex(&s.trace_id) == trace_id && wanted(s)) {
            return found.clone();
        }
        let names: Vec<&str> = spans.iter().map(|(_, s)| s.name.as_str()).collect();
        assert!(tokio::time::Instant::now() < deadline, "no such span in trace {trace_id}; received: {names:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_is_a_server_span_under_the_callers_trace_with_its_apiserver_request_under_it() {
    let (collector, endpoint) = otlp_receiver().await;
    let kube = consistd_testkit::kube_client().await;
    let ns = consistd_testkit::namespace(&kube).await;
    let daemon = Daemon::builder(BIN)
        .env("OTEL_EXPORTER_OTLP_ENDPOINT", &endpoint)
        .env("OTEL_BSP_SCHEDULE_DELAY", "100")
        .start()
        .await;
    let object = br#"{"metadata":{"name":"traced"}}"#.to_vec();
    let mut request = Request::new(CreateRequest {
        resource: "configmaps".to_owned(),
        namespace: ns.clone(),
        object,
        ..Default::default()
    });
    let traceparent = format!("00-{TRACE_ID}-{PARENT_ID}-01");
    request.metadata_mut().insert("traceparent", traceparent.parse().expect("metadata value"));
    daemon.client().objects().create(request).await.expect("Create");
    let mut missing = Request::new(GetRequest {
        resource: "configmaps".to_owned(),
        namespace: ns.clone(),
        name: "missing".to_owned(),
        ..Default::default()
    });
    let traceparent = format!("00-{MISSING_TRACE_ID}-{PARENT_ID}-01");
    missing.metadata_mut().insert("traceparent", traceparent.parse().expect("metadata value"));
    let status = daemon.client().objects().get(missing).await.expect_err("no such ConfigMap");
    assert_eq!(status.code(), tonic::Code::NotFound);

    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    let (server, client) = loop {
        let spans = collector.0.lock().expect("spans").clone();
        let in_trace: Vec<&(String, Span)> = spans.iter().filter(|(_, s)| hex(&s.trace_id) == TRACE_ID).collect();
        let server = in_trace.iter().find(|(_, s)| s.kind == SpanKind::Server as i32).cloned();
        let client = in_trace.iter().find(|(_, s)| s.kind == SpanKind::Client as i32).cloned();
        if let (Some(server), Some(client)) = (server, client) {
            break (server.clone(), client.clone());
        }
        let names: Vec<&str> = spans.iter().map(|(_, s)| s.name.as_str()).collect();
        assert!(
            tokio::time::Instant::now() < deadline,
            "no server and client span in trace {TRACE_ID}; received: {names:?}\nlog:\n{}",
            daemon.logs()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(server.0, "consistd", "service.name");
    assert_eq!(server.1.name, "consistd.v1.ObjectsService/Create");
    assert_eq!(hex(&server.1.parent_span_id), PARENT_ID, "the server span is the caller's child");
    assert_eq!(client.1.name, format!("POST /api/v1/namespaces/{ns}/configmaps"));
    assert_eq!(client.1.parent_span_id, server.1.span_id, "the apiserver request is the call's child");

    let (_, get) = span_where(&collector, MISSING_TRACE_ID, |s| s.kind == SpanKind::Server as i32).await;
    assert_eq!(get.name, "consistd.v1.ObjectsService/Get");
    let code = get.attributes.iter().find(|a| a.key == "rpc.grpc.status_code").and_then(|a| a.value.clone());
    assert_eq!(code.and_then(|v| v.value), Some(Value::IntValue(5)), "NOT_FOUND is recorded");
    let status = get.status.map(|s| s.code).unwrap_or_default();
    assert_ne!(status, StatusCode::Error as i32, "NOT_FOUND is the caller's error, not the server's");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_send_under_a_trace_is_a_span_of_it_and_reaches_the_receiving_app_with_its_traceparent() {
    let (collector, endpoint) = otlp_receiver().await;
    let peer = format!("127.0.0.1:{}", consistd_testkit::free_port());
    let traced = |config: String| {
        Daemon::builder(BIN)
            .config(config)
            .env("OTEL_EXPORTER_OTLP_ENDPOINT", &endpoint)
            .env("OTEL_BSP_SCHEDULE_DELAY", "100")
            .start()
    };
    let sender = traced("identity: traced-sender\npeer:\n  insecure: true\n".to_owned()).await;
    let receiver = traced(format!("identity: traced-receiver\npeer:\n  listen: {peer}\n  insecure: true\n")).await;

    let traceparent = format!("00-{SEND_TRACE_ID}-{PARENT_ID}-01");
    let mut send = Request::new(SendRequest {
        destination: Some(Destination { target: Some(Target::Peer(peer)) }),
        resource_id: "traced".to_owned(),
        event_id: "1".to_owned(),
        ..Default::default()
    });
    send.metadata_mut().insert("traceparent", traceparent.parse().expect("metadata value"));
    send.metadata_mut().insert("tracestate", "vendor=1".parse().expect("metadata value"));
    sender.client().outbox().send(send).await.expect("Send");

    let mut inbox = receiver.client().inbox().receive(ReceiveRequest {}).await.expect("Receive").into_inner();
    let message = tokio::time::timeout(Duration::from_secs(20), inbox.message())
        .await
        .expect("a message in time")
        .expect("Receive stream")
        .and_then(|r| r.message)
        .expect("a message");
    assert_eq!((message.traceparent.as_str(), message.tracestate.as_str()), (traceparent.as_str(), "vendor=1"));
    receiver.client().inbox().ack(AckRequest { message_id: message.message_id }).await.expect("Ack");

    let (service, span) = span_where(&collector, SEND_TRACE_ID, |s| s.kind == SpanKind::Server as i32).await;
    assert_eq!((service.as_str(), span.name.as_str()), ("consistd", "consistd.v1.OutboxService/Send"));
    assert_eq!(hex(&span.parent_span_id), PARENT_ID, "the Send span is the sending app's child");
}
