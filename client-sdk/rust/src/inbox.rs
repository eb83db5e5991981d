//! Messages from peer pods: a handler that ACKs when it succeeds and NACKs when it fails, or a stream
//! of deliveries to ACK by hand.

use std::{fmt::Display, future::Future, sync::Arc, time::Duration};

use futures::{Stream, StreamExt as _};
use opentelemetry::{context::FutureExt as _, trace::TraceContextExt as _};

use crate::{
    Client, Error,
    ordered::Ordered,
    proto::{
        AckStreamRequest, AckStreamResponse, InboxMessage, NackRequest, ReceiveRequest,
        inbox_service_client::InboxServiceClient,
    },
    retry::{Backoff, is_retryable},
    trace,
};

/// How long a NACKed message waits before it is delivered again, unless the caller says otherwise.
pub const DEFAULT_RETRY_AFTER: Duration = Duration::from_secs(1);

/// The longest NACK reason the daemon takes, in bytes; longer ones are cut at a character boundary.
const MAX_REASON_BYTES: usize = 4096;

/// One message handed to this app; the sidecar redelivers it until it is ACKed.
#[derive(Debug)]
pub struct Delivery {
    /// The message.
    pub message: InboxMessage,
    inbox: InboxServiceClient<tonic::transport::Channel>,
    acks: Arc<Ordered<AckStreamRequest, AckStreamResponse>>,
}

impl Delivery {
    /// The OpenTelemetry context the message was sent under, to parent the span of its processing
    /// (empty when it was sent under none).
    pub fn context(&self) -> opentelemetry::Context {
        trace::context(&self.message)
    }

    /// Confirms the message was processed; answers once the ACK is stored (it then travels back to the
    /// sender). ACKs from one client share one `AckStream` call, so concurrent ACKs share a disk flush.
    pub async fn ack(self) -> Result<(), Error> {
        let inbox = self.inbox;
        let answer = self
            .acks
            .call(AckStreamRequest { message_id: self.message.message_id }, |requests| {
                let mut inbox = inbox.clone();
                async move { Ok(inbox.ack_stream(requests).await?.into_inner()) }
            })
            .await?;
        match answer.refusal {
            Some(refusal) => Err(crate::outbox::refused(refusal)),
            None => Ok(()),
        }
    }

    /// Asks for the message again after `retry_after`, logging `reason` at the sidecar (cut to 4096
    /// bytes).
    pub async fn nack(mut self, reason: impl Into<String>, retry_after: Duration) -> Result<(), Error> {
        let retry_after = prost_types::Duration::try_from(retry_after).ok();
        let reason = cut(reason.into(), MAX_REASON_BYTES);
        let request = NackRequest { message_id: self.message.message_id, retry_after, reason };
        self.inbox.nack(request).await?;
        Ok(())
    }
}

impl Client {
    /// Streams the messages peers sent to this pod, oldest first, one at a time: the next arrives once
    /// this one is ACKed or NACKed. Reconnects when the sidecar restarts (a message not yet ACKed then
    /// comes again); any other error ends the stream.
    pub fn receive(&self) -> impl Stream<Item = Result<Delivery, Error>> + Send + 'static {
        let mut inbox = self.inbox();
        let acks = self.inbox_acks.clone();
        async_stream::stream! {
            let mut backoff = Backoff::new();
            loop {
                let failure = match inbox.receive(ReceiveRequest {}).await {
                    Err(status) => status,
                    Ok(response) => {
                        let mut messages = response.into_inner();
                        loop {
                            match messages.next().await {
                                Some(Ok(r)) => {
                                    backoff.reset();
                                    if let Some(message) = r.message {
                                        yield Ok(Delivery { message, inbox: inbox.clone(), acks: acks.clone() });
                                    }
                                }
                                Some(Err(status)) => break status,
                                None => break tonic::Status::unavailable("the sidecar ended the inbox stream"),
                            }
                        }
                    }
                };
                if !is_retryable(&failure) {
                    yield Err(Error::Status(failure));
                    return;
                }
                backoff.wait().await;
            }
        }
    }

    /// Calls `handler` with each message from peers: when it returns `Ok` the message is ACKed, when it
    /// returns `Err` it is NACKed with the error as reason and comes again after `retry_after`. Runs
    /// until a call to the sidecar fails with an error that reconnecting cannot mend.
    ///
    /// Each call runs inside an OpenTelemetry CONSUMER span, child of the trace the message was sent
    /// under and current while the handler runs ([`opentelemetry::Context::current`]); an `Err` marks
    /// it failed. The spans come from the global tracer provider, a no-op unless the app installs one.
    pub async fn serve_inbox<F, Fut, E>(&self, retry_after: Duration, mut handler: F) -> Result<(), Error>
    where
        F: FnMut(InboxMessage) -> Fut,
        Fut: Future<Output = Result<(), E>>,
        E: Display,
    {
        let mut deliveries = std::pin::pin!(self.receive());
        while let Some(delivery) = deliveries.next().await {
            let delivery = delivery?;
            let cx = trace::process(&delivery.message);
            let settled = match handler(delivery.message.clone()).with_context(cx.clone()).await {
                Ok(()) => delivery.ack().await,
                Err(e) => {
                    cx.span().set_status(opentelemetry::trace::Status::error(e.to_string()));
                    delivery.nack(e.to_string(), retry_after).await
                }
            };
            cx.span().end();
            // An ACK or NACK lost to a restarting sidecar is harmless: the message comes again.
            if let Err(Error::Status(status)) = &settled
                && is_retryable(status)
            {
                continue;
            }
            settled?;
        }
        Ok(())
    }
}

/// `text` cut to `max` bytes without splitting a character.
pub(crate) fn cut(mut text: String, max: usize) -> String {
    if text.len() > max {
        let end = (0..=max).rev().find(|&i| text.is_char_boundary(i)).unwrap_or(0);
        text.truncate(end);
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_long_reason_is_cut_at_a_character_boundary() {
        assert_eq!(cut("short".into(), MAX_REASON_BYTES), "short");
        let long = "€".repeat(2000); // 6000 bytes, three per character: 4096 falls inside one
        let cut = cut(long, MAX_REASON_BYTES);
        assert_eq!(cut.len(), MAX_REASON_BYTES - 1);
        assert!(cut.chars().all(|c| c == '€'));
        assert_eq!(super::cut("x".repeat(MAX_REASON_BYTES + 1), MAX_REASON_BYTES).len(), MAX_REASON_BYTES);
    }
}
