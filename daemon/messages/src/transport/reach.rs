//! How an election leader reaches its group's members for its roll call: a Reach call to each, over one
//! kept connection per peer, forgotten once no roll call used it for a while.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex, PoisonError},
    time::Duration,
};

use consistd_cluster::leadership::rollcall::{Call, REACH_TIMEOUT, Reacher};
use consistd_proto::peer::v1::{ReachRequest, peer_service_client::PeerServiceClient};
use futures::future::BoxFuture;
use tokio::time::Instant;
use tonic::transport::Channel;

use super::Transport;

/// How long a connection no roll call used is kept.
const IDLE_CONNECTION: Duration = Duration::from_secs(120);

/// By peer address: its connection, and when a roll call last used it.
type Clients = HashMap<String, (PeerServiceClient<Channel>, Instant)>;

/// Reaches members over the peer transport.
#[derive(Debug, Clone)]
pub struct PeerReacher {
    transport: Transport,
    clients: Arc<Mutex<Clients>>,
}

impl PeerReacher {
    /// A reacher dialling peers with `transport`.
    pub fn new(transport: Transport) -> Self {
        Self { transport, clients: Arc::default() }
    }

    /// The kept connection to `peer`, dialled when there is none; drops connections idle too long.
    async fn client(&self, peer: &str) -> Result<PeerServiceClient<Channel>, String> {
        {
            let mut clients = self.clients.lock().unwrap_or_else(PoisonError::into_inner);
            clients.retain(|_, (_, used)| used.elapsed() < IDLE_CONNECTION);
            if let Some((client, used)) = clients.get_mut(peer) {
                *used = Instant::now();
                return Ok(client.clone());
            }
        }
        let client = self
            .transport
            .connect(peer, Some(REACH_TIMEOUT))
            .await
            .map_err(|error| consistd_core::error::chain(&error))?;
        let mut clients = self.clients.lock().unwrap_or_else(PoisonError::into_inner);
        clients.insert(peer.to_owned(), (client.clone(), Instant::now()));
        Ok(client)
    }
}

impl Reacher for PeerReacher {
    fn reach(&self, peer: &str, call: Call) -> BoxFuture<'static, Result<String, String>> {
        let (this, peer) = (self.clone(), peer.to_owned());
        Box::pin(async move {
            let mut client = this.client(&peer).await?;
            let request = ReachRequest {
                namespace: call.key.namespace,
                election: call.key.name,
                identity: call.identity,
                incarnation: call.incarnation,
                recorded_contact_age_ms: call
                    .recorded_age
                    .map(|age| u64::try_from(age.as_millis()).unwrap_or(u64::MAX)),
                recorded_applied_version: call.recorded_applied,
            };
            match client.reach(request).await {
                Ok(answer) => Ok(answer.into_inner().incarnation),
                Err(status) => Err(format!("{:?}: {}", status.code(), status.message())),
            }
        })
    }
}
