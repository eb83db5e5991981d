//! Leadership as a `Stream` of states: campaign while the stream lives, or observe without taking part.

use futures::{Stream, StreamExt as _};

use crate::{
    Client, Error,
    proto::{CampaignRequest, LeadershipState, LeadershipStatus, ObserveRequest},
    retry::{Backoff, is_retryable},
};

/// One state of an election as this sidecar sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Leadership {
    /// LEADER, FOLLOWER or UNKNOWN.
    pub state: LeadershipState,
    /// The current holder's identity; empty when nobody holds the Lease.
    pub holder: String,
    /// The fencing term: 1 for an election's first leader, higher on every change of holder; 0 only in an
    /// UNKNOWN state before any Lease was read. Pass it in a write's guard: a guard with term 0 (what an
    /// unset term reads as) is refused with INVALID_ARGUMENT naming `guard.term`.
    pub term: u64,
    /// This sidecar's identity in the election.
    pub identity: String,
    /// The election (the Lease's name).
    pub election: String,
    /// The Lease's namespace.
    pub namespace: String,
}

impl Leadership {
    fn from_proto(s: LeadershipStatus) -> Self {
        Self {
            state: s.state(),
            holder: s.holder,
            term: s.term,
            identity: s.identity,
            election: s.election,
            namespace: s.namespace,
        }
    }

    /// Whether this sidecar leads: the only state in which the app may act as leader.
    pub fn is_leader(&self) -> bool {
        self.state == LeadershipState::Leader
    }

    /// The state reported when the sidecar cannot be reached: nobody is known to lead.
    fn unknown(last: Option<&Self>) -> Self {
        Self {
            state: LeadershipState::Unknown,
            holder: String::new(),
            term: last.map_or(0, |l| l.term),
            identity: last.map(|l| l.identity.clone()).unwrap_or_default(),
            election: last.map(|l| l.election.clone()).unwrap_or_default(),
            namespace: last.map(|l| l.namespace.clone()).unwrap_or_default(),
        }
    }
}

/// Which side of an election a stream takes.
#[derive(Debug, Clone)]
enum Role {
    Candidate(CampaignRequest),
    Observer(ObserveRequest),
}

impl Client {
    /// Campaigns in `request.election` while the stream lives and streams this sidecar's view: the
    /// current state first, then every change (rapid changes coalesced, the last one always current).
    /// Dropping the stream resigns at once. If the connection to the sidecar is lost the stream yields
    /// UNKNOWN straight away (stop acting as leader) and campaigns again with backoff; any other error
    /// ends the stream with that error.
    pub fn campaign(&self, request: CampaignRequest) -> impl Stream<Item = Result<Leadership, Error>> + Send + 'static {
        self.election_states(Role::Candidate(request))
    }

    /// Streams an election's state without taking part, like [`Client::campaign`].
    pub fn observe(&self, request: ObserveRequest) -> impl Stream<Item = Result<Leadership, Error>> + Send + 'static {
        self.election_states(Role::Observer(request))
    }

    fn election_states(&self, role: Role) -> impl Stream<Item = Result<Leadership, Error>> + Send + 'static {
        let mut service = self.leadership();
        async_stream::stream! {
            let mut backoff = Backoff::new();
            let mut last: Option<Leadership> = None;
            loop {
                let opened = match &role {
                    Role::Candidate(r) => service
                        .campaign(r.clone())
                        .await
                        .map(|s| s.into_inner().map(|m| m.map(|m| m.status)).boxed()),
                    Role::Observer(r) => service
                        .observe(r.clone())
                        .await
                        .map(|s| s.into_inner().map(|m| m.map(|m| m.status)).boxed()),
                };
                let failure = match opened {
                    Err(status) => status,
                    Ok(mut states) => loop {
                        match states.next().await {
                            Some(Ok(Some(status))) => {
                                backoff.reset();
                                let state = Leadership::from_proto(status);
                                last = Some(state.clone());
                                yield Ok(state);
                            }
                            Some(Ok(None)) => {}
                            Some(Err(status)) => break status,
                            None => break tonic::Status::unavailable("the sidecar ended the election stream"),
                        }
                    },
                };
                if !is_retryable(&failure) {
                    yield Err(Error::Status(failure));
                    return;
                }
                // Tell the app at once that it may no longer lead, then try again.
                if last.as_ref().is_none_or(|l| l.state != LeadershipState::Unknown) {
                    let unknown = Leadership::unknown(last.as_ref());
                    last = Some(unknown.clone());
                    yield Ok(unknown);
                }
                backoff.wait().await;
            }
        }
    }
}
