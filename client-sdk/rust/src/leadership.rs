//! Leadership as a `Stream` of states: campaign while the stream lives, or observe without taking part.

use std::{
    sync::{Arc, Mutex, PoisonError},
    time::{Duration, SystemTime},
};

use futures::{Stream, StreamExt as _};

use crate::{
    Client, Error,
    proto::{CampaignRequest, LeadershipState, LeadershipStatus, ObserveRequest, WriteGuard},
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
    /// While LEADER, the deadline the sidecar's renewals keep moving (see [`Leadership::leader_until`]).
    until: Deadline,
}

/// A LEADER state's deadline, shared by the state the stream yielded and the stream, which moves it on
/// each renewal without yielding anything. Not part of what a state is: two states compare equal
/// whatever their deadlines.
#[derive(Debug, Clone, Default)]
struct Deadline(Arc<Mutex<Option<SystemTime>>>);

impl Deadline {
    fn new(until: Option<SystemTime>) -> Self {
        Self(Arc::new(Mutex::new(until)))
    }

    fn get(&self) -> Option<SystemTime> {
        *self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn set(&self, until: Option<SystemTime>) {
        *self.0.lock().unwrap_or_else(PoisonError::into_inner) = until;
    }
}

impl PartialEq for Deadline {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

impl Eq for Deadline {}

impl Leadership {
    fn from_proto(s: LeadershipStatus) -> Self {
        Self {
            state: s.state(),
            holder: s.holder,
            term: s.term,
            identity: s.identity,
            election: s.election,
            namespace: s.namespace,
            until: Deadline::new(s.leader_until.and_then(|t| SystemTime::try_from(t).ok())),
        }
    }

    /// While LEADER: the moment (this node's clock, which the sidecar shares) until which the sidecar says
    /// LEADER without renewing again; each renewal moves it on, in this state too (renewals are not
    /// yielded). When it passes with no renewal the stream demotes the app by itself, yielding UNKNOWN: a
    /// stopped or cut-off sidecar cannot say that it no longer leads. None in other states.
    pub fn leader_until(&self) -> Option<SystemTime> {
        self.until.get().filter(|_| self.state == LeadershipState::Leader)
    }

    /// Whether this sidecar leads now: the only state in which the app may act as leader. False once
    /// [`Leadership::leader_until`] has passed, even before the stream has yielded the UNKNOWN that follows.
    pub fn is_leader(&self) -> bool {
        self.state == LeadershipState::Leader && self.leader_until().is_none_or(|until| SystemTime::now() < until)
    }

    /// A guard for this election and term, for a write, a send or a publish: it goes only while this term
    /// lasts, and whatever checks it later refuses it once a later term has acted there.
    pub fn guard(&self) -> WriteGuard {
        WriteGuard { election: self.election.clone(), namespace: self.namespace.clone(), term: self.term }
    }

    /// Whether `next` only renews this state (same state, holder and term; a later `leader_until`): the
    /// app is not told, only the deadline moves.
    fn renewed_by(&self, next: &Self) -> bool {
        self.state == next.state && self.holder == next.holder && self.term == next.term
    }

    /// How long until this LEADER state lapses; None when it does not (not LEADER, or no deadline).
    fn lapses_in(&self) -> Option<Duration> {
        let until = self.leader_until()?;
        Some(until.duration_since(SystemTime::now()).unwrap_or(Duration::ZERO))
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
            until: Deadline::default(),
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
    /// current state first, then every change (rapid changes coalesced, the last one always current;
    /// renewals are not changes). Dropping the stream resigns at once. If the connection to the sidecar is
    /// lost, or a LEADER state reaches its `leader_until` with no renewal (the sidecar stopped or cut off),
    /// the stream yields UNKNOWN straight away (stop acting as leader); after a lost connection it
    /// campaigns again with backoff. Any other error ends the stream with that error.
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
                        // A LEADER state lapses at its leader_until unless a renewal comes first.
                        let lapse = last.as_ref().and_then(Leadership::lapses_in);
                        let next = tokio::select! {
                            next = states.next() => next,
                            () = tokio::time::sleep(lapse.unwrap_or_default()), if lapse.is_some() => {
                                let unknown = Leadership::unknown(last.as_ref());
                                last = Some(unknown.clone());
                                yield Ok(unknown);
                                continue;
                            }
                        };
                        match next {
                            Some(Ok(Some(status))) => {
                                backoff.reset();
                                let mut state = Leadership::from_proto(status);
                                if state.state == LeadershipState::Leader && !state.is_leader() {
                                    // Lapsed on arrival: as good as no renewal.
                                    state = Leadership::unknown(Some(&state));
                                }
                                match &last {
                                    // A renewal: the state the app holds gets the later deadline.
                                    Some(l) if l.renewed_by(&state) => l.until.set(state.until.get()),
                                    _ => {
                                        last = Some(state.clone());
                                        yield Ok(state);
                                    }
                                }
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
