//! OpenTelemetry through the Rust SDK, between two real daemons: a message sent under a span reaches the
//! receiving handler inside a CONSUMER span that is that span's child; a send under no span, or with its
//! own traceparent, is delivered as such. Spans go to the OpenTelemetry SDK's in-memory exporter (its
//! own binary: the tracer provider is global).

use std::{pin::pin, sync::OnceLock, time::Duration};

use consistd_client::{Client, proto::SendRequest, to_peer};
use consistd_testkit::{Daemon, consistd_bin, free_port};
use futures::StreamExt as _;
use opentelemetry::{
    Context, SpanId, TraceId, Value,
    context::FutureExt as _,
    trace::{Span as _, SpanKind, Status, TraceContextExt as _, Tracer as _},
};
use opentelemetry_sdk::trace::{InMemorySpanExporter, SdkTracerProvider, SpanData};

const WAIT: Duration = Duration::from_secs(20);

/// The exporter behind the global tracer provider, installed once for the binary.
fn spans() -> &'static InMemorySpanExporter {
    static EXPORTER: OnceLock<InMemorySpanExporter> = OnceLock::new();
    EXPORTER.get_or_init(|| {
        let exporter = InMemorySpanExporter::default();
        let provider = SdkTracerProvider::builder().with_simple_exporter(exporter.clone()).build();
        opentelemetry::global::set_tracer_provider(provider);
        exporter
    })
}

/// Two daemons: `a` sends, `b` receives at its peer address.
async fn sender_and_receiver() -> (Daemon, Daemon, String) {
    let addr = format!("127.0.0.1:{}", free_port());
    let a = Daemon::builder(consistd_bin()).config("identity: sdk-rust-traced-sender\npeer:\n  insecure: true");
    let b = Daemon::builder(consistd_bin())
        .config(format!("identity: sdk-rust-traced-receiver\npeer:\n  listen: \"{addr}\"\n  insecure: true"));
    let (a, b) = tokio::join!(a.start(), b.start());
    (a, b, addr)
}

fn message(to: &str, resource: &str) -> SendRequest {
    SendRequest {
        destination: Some(to_peer(to)),
        resource_id: resource.into(),
        event_id: "1".into(),
        payload: b"{}".to_vec(),
        content_type: "application/json".into(),
        ..Default::default()
    }
}

/// Sends `request` under `cx` and waits for its ACK.
async fn send_acked(client: &Client, request: SendRequest, cx: Context) {
    let sent = client.send(request).with_context(cx).await.expect("stored");
    let outcome = tokio::time::timeout(WAIT, sent).await.expect("an outcome in time").expect("an outcome");
    assert!(outcome.is_acked(), "{outcome:?}");
}

/// The finished CONSUMER span of message `message_id`, once exported.
async fn consumer_span(message_id: &str) -> SpanData {
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let finished = spans().get_finished_spans().expect("finished spans");
        let found = finished.into_iter().find(|s| {
            s.span_kind == SpanKind::Consumer
                && s.attributes
                    .iter()
                    .any(|a| a.key.as_str() == "messaging.message.id" && a.value == Value::from(message_id.to_owned()))
        });
        if let Some(span) = found {
            return span;
        }
        assert!(tokio::time::Instant::now() < deadline, "no consumer span for message {message_id}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn a_handler_runs_in_a_consumer_span_under_the_senders_span_and_a_failure_marks_it() {
    spans();
    let (a, b, addr) = sender_and_receiver().await;
    let (sender, receiver) = (a.client(), b.client());
    let (seen_tx, mut seen) = tokio::sync::mpsc::unbounded_channel();
    let handler = tokio::spawn(async move {
        receiver
            .serve_inbox(Duration::from_millis(50), move |m| {
                let seen_tx = seen_tx.clone();
                async move {
                    let current = Context::current().span().span_context().clone();
                    let _ = seen_tx.send((m.message_id.clone(), m.delivery_attempt, current, m.traceparent.clone()));
                    if m.delivery_attempt == 1 {
                        return Err("not yet".to_owned());
                    }
                    Ok(())
                }
            })
            .await
    });

    let producer = opentelemetry::global::tracer("test").start("producer");
    let (trace_id, producer_id) = (producer.span_context().trace_id(), producer.span_context().span_id());
    send_acked(&sender, message(&addr, "traced"), Context::current_with_span(producer)).await;

    let (message_id, attempt, first, traceparent) = seen.recv().await.expect("first delivery");
    assert_eq!(attempt, 1);
    assert_eq!(traceparent, format!("00-{trace_id}-{producer_id}-01"), "the message carries the sender's span");
    assert_eq!(first.trace_id(), trace_id, "the handler runs in the sender's trace");
    assert_ne!(first.span_id(), producer_id, "in a span of its own");
    let (_, attempt, second, _) = seen.recv().await.expect("redelivery after the failure");
    assert_eq!((attempt, second.trace_id()), (2, trace_id));

    let span = consumer_span(&message_id).await;
    assert_eq!(span.name, "process consistd.inbox");
    assert_eq!(span.span_context.trace_id(), trace_id);
    assert_eq!(span.parent_span_id, producer_id, "the consumer span is the sending span's child");
    assert_eq!(span.status, Status::error("not yet"), "the first, failed handling is marked");
    assert!(span.attributes.iter().any(|a| a.key.as_str() == "messaging.system" && a.value == Value::from("consistd")));
    handler.abort();
}

#[tokio::test]
async fn a_send_under_no_span_or_with_its_own_traceparent_is_delivered_as_such() {
    spans();
    let (a, b, addr) = sender_and_receiver().await;
    let sender = a.client();
    let untraced = sender.send(message(&addr, "untraced")).with_context(Context::new()).await.expect("stored");
    let own = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
    let explicit = SendRequest { traceparent: own.to_owned(), tracestate: "v=1".to_owned(), ..message(&addr, "own") };
    let producer = opentelemetry::global::tracer("test").start("producer");
    let explicit = sender.send(explicit).with_context(Context::current_with_span(producer)).await.expect("stored");

    let mut deliveries = pin!(b.client().receive());
    for _ in 0..2 {
        let delivery =
            tokio::time::timeout(WAIT, deliveries.next()).await.expect("in time").expect("open").expect("ok");
        let m = &delivery.message;
        let parent = delivery.context().span().span_context().clone();
        match m.resource_id.as_str() {
            "untraced" => {
                assert_eq!((m.traceparent.as_str(), m.tracestate.as_str()), ("", ""));
                assert!(!parent.is_valid(), "no parent for a message sent under no span");
            }
            _ => {
                assert_eq!(
                    (m.traceparent.as_str(), m.tracestate.as_str()),
                    (own, "v=1"),
                    "the request's own context wins"
                );
                assert!(parent.is_remote());
                assert_eq!(parent.trace_id(), TraceId::from_hex("0af7651916cd43dd8448eb211c80319c").expect("hex"));
                assert_eq!(parent.span_id(), SpanId::from_hex("b7ad6b7169203331").expect("hex"));
                assert_eq!(parent.trace_state().header(), "v=1");
            }
        }
        delivery.ack().await.expect("ACK stored");
    }
    for sent in [untraced, explicit] {
        let outcome = tokio::time::timeout(WAIT, sent).await.expect("an outcome in time").expect("an outcome");
        assert!(outcome.is_acked(), "{outcome:?}");
    }
}
