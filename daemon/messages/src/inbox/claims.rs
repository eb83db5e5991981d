//! The newest claim the inbox has stored per election: the receiver as the resource that checks the fencing
//! token. A message whose claim is older than one already stored for its election is refused for good.

use std::collections::HashMap;

use consistd_core::claim::Claim;

/// The highest term stored per election (`<lease namespace>/<lease name>`).
#[derive(Debug, Default)]
pub(super) struct Newest {
    terms: HashMap<String, u64>,
}

impl Newest {
    /// The newest terms as the store holds them.
    pub(super) fn new(terms: HashMap<String, u64>) -> Self {
        Self { terms }
    }

    /// Why a message's `claim` is refused: an older term than one stored for its election (naming both).
    pub(super) fn check(&self, claim: &Claim) -> Result<(), String> {
        let newest = self.terms.get(&claim.election()).copied().unwrap_or(0);
        claim.older_than(newest, "sent this daemon a message").map_or(Ok(()), Err)
    }

    /// A message with `claim` is being stored: its term is the newest of its election from now on, unless a
    /// newer one is.
    pub(super) fn raise(&mut self, claim: &Claim) {
        let newest = self.terms.entry(claim.election()).or_insert(0);
        *newest = (*newest).max(claim.term);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn claim(lease: &str, term: u64) -> Claim {
        Claim { namespace: "ns".into(), lease: lease.into(), term }
    }

    #[test]
    fn an_older_term_of_an_election_is_refused_once_a_newer_one_came_and_other_elections_are_apart() {
        let mut newest = Newest::default();
        assert_eq!(newest.check(&claim("e", 7)), Ok(()));
        newest.raise(&claim("e", 7));
        assert_eq!(newest.check(&claim("e", 7)), Ok(()), "the same term again");
        newest.raise(&claim("e", 8));
        newest.raise(&claim("e", 7));
        assert_eq!(
            newest.check(&claim("e", 7)),
            Err("election ns/e sent this daemon a message in term 8, and this was guarded by term 7".into()),
            "a later message of an older term lowers nothing"
        );
        assert_eq!(newest.check(&claim("f", 1)), Ok(()), "another election has terms of its own");
        let restored = Newest::new([("ns/e".to_owned(), 8)].into());
        assert!(restored.check(&claim("e", 7)).is_err(), "what the store held counts");
    }
}
