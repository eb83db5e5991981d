//! Who may act, and in which term: the one notion of authority the reconcile queue hands work out under;
//! guarded requests are checked against the same elections ([`Leadership::claim`]). Today one kind, the
//! holder of an election in its term; a sharded queue adds a second (the owner of a range in its epoch).

use std::sync::Arc;

use tokio::sync::watch;

use crate::leadership::{Key, Leadership, Observation, Role};

/// The authority work is handed out under.
#[derive(Debug)]
pub(crate) enum Authority {
    /// Anyone may act: work goes out in term 0 and carries no claim.
    Anyone,
    /// The holder of an election, in its term.
    Elected {
        /// The election.
        key: Key,
        /// This daemon's view of it; None once it is no longer followed (the daemon is stopping): then
        /// nobody here may act.
        observation: Option<watch::Receiver<Observation>>,
    },
}

impl Authority {
    /// Follows the holder of `election`, or anyone without one.
    pub(crate) fn follow(leadership: &Arc<Leadership>, election: Option<&Key>) -> Self {
        match election {
            None => Self::Anyone,
            Some(key) => Self::Elected { key: key.clone(), observation: Some(leadership.observe(key)) },
        }
    }

    /// The term this daemon may act in now: Some(0) for anyone, the term while it leads the election, None
    /// while it does not.
    pub(crate) fn term(&self) -> Option<u64> {
        match self {
            Self::Anyone => Some(0),
            Self::Elected { observation: None, .. } => None,
            Self::Elected { observation: Some(rx), .. } => {
                let observation = rx.borrow();
                (observation.role == Role::Leader).then_some(observation.term)
            }
        }
    }

    /// Resolves when who may act may have changed; never for anyone.
    pub(crate) async fn changed(&mut self) {
        let Self::Elected { key, observation } = self else { return std::future::pending().await };
        let Some(rx) = observation else { return std::future::pending().await };
        if rx.changed().await.is_err() {
            tracing::debug!(election = %key, "election no longer followed: nobody here may act");
            *observation = None;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_holder_acts_in_its_term_and_nobody_once_the_election_is_no_longer_followed() {
        assert_eq!(Authority::Anyone.term(), Some(0));
        let (tx, rx) = watch::channel(Observation::unknown("me"));
        let key = Key { namespace: "ns".into(), name: "e".into() };
        let mut authority = Authority::Elected { key, observation: Some(rx) };
        assert_eq!(authority.term(), None, "not leading");
        tx.send_replace(Observation { role: Role::Leader, term: 3, ..Observation::unknown("me") });
        authority.changed().await;
        assert_eq!(authority.term(), Some(3));
        drop(tx);
        authority.changed().await;
        assert_eq!(authority.term(), None, "fail closed: never as if there were no election");
    }
}
