//! The claim a guarded request (a write, a send, a publish) carries: its WriteGuard, checked against this
//! daemon's elections when the request arrives.

use consistd_cluster::{fencing::Claim, leadership::Leadership};
use consistd_proto::v1 as pb;
use tonic::Status;

use super::status;

/// A guarded request goes ahead only while this daemon leads the named election in the named term; it then
/// carries that claim, for whatever checks it later (the apiserver, a channel, a receiving daemon) to refuse
/// once the election has moved on. None without a guard.
pub(crate) fn claim(leadership: &Leadership, guard: Option<&pb::WriteGuard>) -> Result<Option<Claim>, Status> {
    let Some(g) = guard else { return Ok(None) };
    if g.election.is_empty() {
        return Err(status::invalid_argument("guard.election", "must not be empty"));
    }
    if g.term == 0 {
        return Err(status::invalid_argument(
            "guard.term",
            "must be at least 1: fencing terms start at 1, and 0 is what an unset term reads as",
        ));
    }
    let key = leadership.key(&g.election, &g.namespace).map_err(status::leadership_error)?;
    leadership.claim(&key, g.term).map(Some).map_err(|why| status::failed_precondition("guard", why))
}
