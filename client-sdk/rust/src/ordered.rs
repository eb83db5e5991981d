//! One long-lived bidirectional stream shared by many calls (SendStream, AckStream): each call's request
//! goes out on it and its answer comes back in request order, so calls made together share the
//! sidecar's disk flush instead of each paying for a unary call of its own.

use std::{
    collections::VecDeque,
    future::Future,
    sync::{Arc, Mutex, PoisonError},
};

use tokio::sync::{mpsc, oneshot};
use tokio_stream::wrappers::ReceiverStream;

use crate::{Error, retry::cut_off};

/// Requests queued for the stream beyond those the sidecar is working on; a caller beyond it waits.
const QUEUED: usize = 1024;

/// A shared stream, opened by the first call and again by the first call after it broke.
#[derive(Debug)]
pub(crate) struct Ordered<Req, Resp> {
    open: tokio::sync::Mutex<Option<Open<Req, Resp>>>,
}

impl<Req, Resp> Default for Ordered<Req, Resp> {
    fn default() -> Self {
        Self { open: tokio::sync::Mutex::new(None) }
    }
}

#[derive(Debug)]
struct Open<Req, Resp> {
    requests: mpsc::Sender<Req>,
    waiting: Arc<Mutex<Waiting<Resp>>>,
}

/// The calls waiting for answers, oldest first, and whether the stream broke (then none waits).
#[derive(Debug)]
struct Waiting<Resp> {
    queue: VecDeque<oneshot::Sender<Result<Resp, tonic::Status>>>,
    broken: bool,
}

impl<Req: Send + 'static, Resp: Send + 'static> Ordered<Req, Resp> {
    /// Sends `request` on the stream, opening it with `start` (which makes the call from a stream of
    /// requests) if none is open or the open one broke, and waits for its answer. A broken stream fails
    /// the calls waiting on it with its status (UNAVAILABLE for a lost connection); the next call opens
    /// a new one.
    pub(crate) async fn call<Start, Fut>(&self, request: Req, start: Start) -> Result<Resp, Error>
    where
        Start: Fn(ReceiverStream<Req>) -> Fut,
        Fut: Future<Output = Result<tonic::Streaming<Resp>, tonic::Status>>,
    {
        let (tx, answer) = oneshot::channel();
        {
            let mut open = self.open.lock().await;
            let mut tx = Some(tx);
            let requests = loop {
                if let Some(o) = open.as_ref() {
                    let mut waiting = lock(&o.waiting);
                    // Queued under the reader's lock, so a stream that breaks meanwhile fails this call too.
                    if !waiting.broken {
                        waiting.queue.extend(tx.take());
                        break o.requests.clone();
                    }
                }
                *open = Some(Self::start(&start).await?);
            };
            // Fails only when the stream is gone; its reader then fails the waiter just queued.
            let _ = requests.send(request).await;
        }
        match answer.await {
            Ok(result) => Ok(result?),
            Err(_) => Err(Error::Status(tonic::Status::unavailable("the sidecar ended the stream"))),
        }
    }

    async fn start<Start, Fut>(start: &Start) -> Result<Open<Req, Resp>, Error>
    where
        Start: Fn(ReceiverStream<Req>) -> Fut,
        Fut: Future<Output = Result<tonic::Streaming<Resp>, tonic::Status>>,
    {
        let (requests, rx) = mpsc::channel(QUEUED);
        let mut answers = start(ReceiverStream::new(rx)).await?;
        let waiting = Arc::new(Mutex::new(Waiting { queue: VecDeque::new(), broken: false }));
        let reader = waiting.clone();
        tokio::spawn(async move {
            let failure = loop {
                match answers.message().await {
                    Ok(Some(answer)) => {
                        let next = lock(&reader).queue.pop_front();
                        if let Some(waiter) = next {
                            let _ = waiter.send(Ok(answer));
                        }
                    }
                    Ok(None) => break tonic::Status::unavailable("the sidecar ended the stream"),
                    Err(status) => break cut_off(status),
                }
            };
            let mut waiting = lock(&reader);
            waiting.broken = true;
            for waiter in waiting.queue.drain(..) {
                let _ = waiter.send(Err(failure.clone()));
            }
        });
        Ok(Open { requests, waiting })
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}
