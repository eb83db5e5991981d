//! A ReconcileService stream as an app opens it, for tests: the spec first, then completions out and the
//! daemon's answers (work items, refusals) in.

use std::time::Duration;

use consistd_client::proto::{
    Completion, Outcome, QueueSpec, ReconcileRequest, ReconcileResponse, WorkItem, reconcile_request,
    reconcile_response, reconcile_service_client::ReconcileServiceClient,
};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Code, Streaming};

use crate::Daemon;

/// How long one message is waited for before the test fails.
const WAIT: Duration = Duration::from_secs(20);

/// One open Reconcile stream: requests go out on `tx`, answers come in on `rx`.
pub struct Queue {
    /// The stream's requests.
    pub tx: mpsc::Sender<ReconcileRequest>,
    /// The daemon's answers.
    pub rx: Streaming<ReconcileResponse>,
}

/// Opens a stream with `spec` on `daemon`: the daemon's STARTED, or the status that refused the spec.
pub async fn open(daemon: &Daemon, spec: QueueSpec) -> Result<Queue, tonic::Status> {
    let (tx, requests) = mpsc::channel(256);
    tx.send(ReconcileRequest { request: Some(reconcile_request::Request::Spec(spec)) }).await.expect("queue the spec");
    let mut client = ReconcileServiceClient::new(daemon.client().channel());
    let mut rx = client.reconcile(ReceiverStream::new(requests)).await?.into_inner();
    match tokio::time::timeout(WAIT, rx.message()).await.expect("an answer to the spec")? {
        Some(ReconcileResponse { response: Some(reconcile_response::Response::Started(_)) }) => Ok(Queue { tx, rx }),
        other => panic!("expected STARTED, got {other:?}"),
    }
}

impl Queue {
    /// The next answer within `wait`, if any; the stream ending or failing fails the test.
    pub async fn message(&mut self, wait: Duration) -> Option<reconcile_response::Response> {
        match tokio::time::timeout(wait, self.rx.message()).await {
            Err(_) => None,
            Ok(Ok(Some(m))) => m.response,
            Ok(Ok(None)) => panic!("the reconcile stream ended"),
            Ok(Err(status)) => panic!("the reconcile stream failed: {status}"),
        }
    }

    /// The next work item, failing the test after 20 s or on any other answer.
    pub async fn item(&mut self) -> WorkItem {
        match self.message(WAIT).await {
            Some(reconcile_response::Response::Item(item)) => item,
            other => panic!("expected a work item, got {other:?}"),
        }
    }

    /// A work item within `wait`, if any; any other answer fails the test.
    pub async fn item_within(&mut self, wait: Duration) -> Option<WorkItem> {
        match self.message(wait).await {
            Some(reconcile_response::Response::Item(item)) => Some(item),
            None => None,
            other => panic!("expected a work item, got {other:?}"),
        }
    }

    /// Sends one request on the stream.
    pub async fn send(&self, request: reconcile_request::Request) {
        self.tx.send(ReconcileRequest { request: Some(request) }).await.expect("send on the reconcile stream");
    }

    /// Completes `item`'s lease with `outcome`.
    pub async fn complete(&self, item: &WorkItem, outcome: Outcome) {
        let c = Completion { lease_id: item.lease_id.clone(), outcome: outcome.into(), ..Default::default() };
        self.send(reconcile_request::Request::Complete(c)).await;
    }

    /// The refusal of the last bad request: its code and message.
    pub async fn refusal(&mut self) -> (Code, String) {
        match self.message(WAIT).await {
            Some(reconcile_response::Response::Refused(r)) => {
                let refusal = r.refusal.expect("refusal");
                (Code::from(refusal.code), refusal.message)
            }
            other => panic!("expected a refusal, got {other:?}"),
        }
    }
}
