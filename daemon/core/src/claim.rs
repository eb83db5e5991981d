//! A claim of authority: "made while this pod led the election of this Lease in this term". Guarded writes,
//! sends and publishes carry one; whatever checks it (the apiserver's policies, a channel's ConfigMap, a
//! receiving daemon's inbox) refuses a claim older than the newest it has seen for the same election.

use std::fmt;

/// What a guarded action claims: it was made while this daemon led the election of this Lease in `term`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Claim {
    /// Namespace of the election's Lease.
    pub namespace: String,
    /// Name of the election's Lease.
    pub lease: String,
    /// The fencing term the action was guarded by.
    pub term: u64,
}

impl Claim {
    /// Reads a claim in its written form, `<lease namespace>/<lease name>/<term>`, as [`fmt::Display`] writes it.
    pub fn parse(text: &str) -> Result<Self, String> {
        let malformed = || format!("claim {text:?} is not <lease namespace>/<lease name>/<term>");
        let mut parts = text.splitn(3, '/');
        let (Some(namespace), Some(lease), Some(term)) = (parts.next(), parts.next(), parts.next()) else {
            return Err(malformed());
        };
        let term: u64 = term.parse().map_err(|_| malformed())?;
        if namespace.is_empty() || lease.is_empty() || term == 0 {
            return Err(malformed());
        }
        Ok(Self { namespace: namespace.to_owned(), lease: lease.to_owned(), term })
    }

    /// Reads a claim as a message or a record carries it: the empty string for none.
    pub fn parse_carried(text: &str) -> Result<Option<Self>, String> {
        if text.is_empty() { Ok(None) } else { Self::parse(text).map(Some) }
    }

    /// Writes a claim as a message or a record carries it: the empty string for none.
    pub fn carried(claim: Option<&Self>) -> String {
        claim.map(ToString::to_string).unwrap_or_default()
    }

    /// The election, `<lease namespace>/<lease name>`: claims of one election compare by term.
    pub fn election(&self) -> String {
        format!("{}/{}", self.namespace, self.lease)
    }

    /// Why this claim is refused where `newest` is the highest term of its election already seen; None when it
    /// is not older.
    pub fn older_than(&self, newest: u64, seen: &str) -> Option<String> {
        (self.term < newest).then(|| {
            format!("election {} {seen} in term {newest}, and this was guarded by term {}", self.election(), self.term)
        })
    }
}

impl fmt::Display for Claim {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}/{}", self.namespace, self.lease, self.term)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_claim_reads_back_as_written_and_nothing_else_reads() {
        let claim = Claim { namespace: "ns".into(), lease: "e.v1".into(), term: 7 };
        assert_eq!(claim.to_string(), "ns/e.v1/7");
        assert_eq!(Claim::parse("ns/e.v1/7"), Ok(claim.clone()));
        assert_eq!(claim.election(), "ns/e.v1");
        for bad in ["", "ns/e", "ns/e/x", "ns/e/0", "/e/1", "ns//1", "ns/e/-1"] {
            assert!(Claim::parse(bad).is_err(), "{bad:?}");
        }
        assert_eq!(Claim::parse_carried(""), Ok(None), "carried: none is empty");
        assert_eq!(Claim::parse_carried(&Claim::carried(Some(&claim))), Ok(Some(claim.clone())));
        assert_eq!(Claim::carried(None), "");
        assert!(Claim::parse_carried("ns/e").is_err());
    }

    #[test]
    fn only_an_older_term_of_the_same_election_is_refused_naming_both() {
        let claim = Claim { namespace: "ns".into(), lease: "e".into(), term: 7 };
        assert_eq!(claim.older_than(7, "was written"), None);
        assert_eq!(claim.older_than(6, "was written"), None);
        assert_eq!(
            claim.older_than(8, "was written").as_deref(),
            Some("election ns/e was written in term 8, and this was guarded by term 7")
        );
    }
}
