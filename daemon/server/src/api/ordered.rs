//! Answers a stream of requests in request order while their work runs concurrently: what SendStream
//! and AckStream share.

use std::future::Future;

use consistd_core::tasks::Tasks;
use futures::{FutureExt as _, StreamExt as _, future::BoxFuture};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Status, Streaming};

/// Requests of one stream whose answers may be outstanding at once: reading stops while this many are
/// unanswered, which holds a fast client back without refusing anything.
pub(crate) const IN_FLIGHT: usize = 1024;

/// Reads `requests` one at a time and hands each to `accept`, which checks it in arrival order and
/// returns the future of its answer (work that must not be lost to a cancelled call runs in a task of
/// its own); the answers come out in request order. The answers end after the requests end, or with
/// the status of a broken request stream after the answers before it. Reading stops as soon as nobody
/// reads the answers (the caller went away, or shutdown ended the call), even while the client keeps its
/// request stream open: otherwise the call, and the server's drain, would wait for that client.
pub(crate) fn answer_in_order<Req, Resp, Accept, Fut>(
    tasks: &Tasks,
    mut requests: Streaming<Req>,
    mut accept: Accept,
) -> impl futures::Stream<Item = Result<Resp, Status>> + Send + 'static
where
    Req: Send + 'static,
    Resp: Send + 'static,
    Accept: FnMut(Req) -> Fut + Send + 'static,
    Fut: Future<Output = BoxFuture<'static, Result<Resp, Status>>> + Send,
{
    let (answers, pending) = mpsc::channel::<BoxFuture<'static, Result<Resp, Status>>>(IN_FLIGHT);
    tasks.spawn(async move {
        loop {
            let next = tokio::select! {
                next = requests.message() => next,
                () = answers.closed() => return,
            };
            let (answer, last) = match next {
                Ok(Some(request)) => (accept(request).await, false),
                Ok(None) => return,
                // A broken request stream ends the answers with its status.
                Err(status) => (futures::future::ready(Err(status)).boxed(), true),
            };
            // A failed send means the caller went away: nothing reads the answers any more.
            if answers.send(answer).await.is_err() || last {
                return;
            }
        }
    });
    ReceiverStream::new(pending).then(|answer| answer)
}
