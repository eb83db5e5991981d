//! The one place where internal errors become gRPC statuses, so every RPC answers with the same codes
//! and messages that name the operation that failed. A message is the error and each of its causes,
//! once each ([`error::chain`]); an apiserver refusal keeps the apiserver's own message.
#![allow(clippy::disallowed_methods, reason = "the one place gRPC statuses are built")]

use consistd_cluster::{
    leadership::LeadershipError,
    objects::ObjectsError,
    reconcile::ReconcileError,
    watch::{ResourceError, resolve::ResolveError},
};
use consistd_core::{error, versions::VersionsError};
use consistd_messages::{
    inbox::InboxError,
    outbox::{OutboxError, OutcomeError},
    rollout::RolloutError,
};
use tonic::{Code, Status};

/// A status whose message is `error` with its causes.
fn from_error(code: Code, error: &dyn std::error::Error) -> Status {
    Status::new(code, error::chain(error))
}

/// The answer to one refused request of a streaming call (SendStream, AckStream): the status the unary
/// call would have answered, while the stream goes on.
pub(crate) fn refusal(status: &Status) -> consistd_proto::v1::Refusal {
    consistd_proto::v1::Refusal { code: status.code() as i32, message: status.message().to_owned() }
}

/// A request field is wrong: `field: why`.
pub(crate) fn invalid_argument(field: &str, why: impl std::fmt::Display) -> Status {
    Status::new(Code::InvalidArgument, format!("{field}: {why}"))
}

/// The request is valid but the daemon is not in the state it needs: `what: why`.
pub(crate) fn failed_precondition(what: &str, why: impl std::fmt::Display) -> Status {
    Status::new(Code::FailedPrecondition, format!("{what}: {why}"))
}

/// What was asked cannot be done here now but may be soon, e.g. at another daemon: `what: why`; the
/// caller asks again.
pub(crate) fn unavailable(what: &str, why: impl std::fmt::Display) -> Status {
    Status::new(Code::Unavailable, format!("{what}: {why}"))
}

/// Something the call waits for did not come in time: `what: why`.
pub(crate) fn deadline_exceeded(what: &str, why: impl std::fmt::Display) -> Status {
    Status::new(Code::DeadlineExceeded, format!("{what}: {why}"))
}

/// The caller (as `Caller` displays it) is not in `socket.allowedUids` / `socket.allowedGids`.
pub(crate) fn caller_not_allowed(caller: impl std::fmt::Display, method: &str) -> Status {
    Status::new(
        Code::PermissionDenied,
        format!("{method}: {caller} may not call this socket (socket.allowedUids, socket.allowedGids)"),
    )
}

/// No access rule grants what was asked; the message names it.
pub(crate) fn access_denied(asked: impl std::fmt::Display) -> Status {
    Status::new(Code::PermissionDenied, format!("access.rules grant no {asked}"))
}

/// A stream ended because the daemon is stopping; clients reconnect (to its successor) and resume.
pub(crate) fn shutting_down(rpc: &'static str) -> Status {
    Status::new(Code::Unavailable, format!("{rpc}: consistd is shutting down; reconnect and resume from your cursor"))
}

/// A watch ended, or was refused at its first list, because its objects would pass the memory budget:
/// `rpc: why`, naming the limit and the bytes it needed.
pub(crate) fn watch_exhausted(rpc: &str, exhausted: &consistd_cluster::watch::budget::Exhausted) -> Status {
    Status::new(Code::ResourceExhausted, format!("{rpc}: {exhausted}"))
}

/// A call that waits ended because the daemon is stopping; the client calls again (to its successor).
pub(crate) fn shutting_down_call(rpc: &'static str) -> Status {
    Status::new(Code::Unavailable, format!("{rpc}: consistd is shutting down; call again"))
}

/// No first outcome to answer: NOT_FOUND for an id never given out or an outcome not kept.
pub(crate) fn outcome_error(error: OutcomeError) -> Status {
    let code = match &error {
        OutcomeError::NeverSent(_) | OutcomeError::Forgotten(_) => Code::NotFound,
        OutcomeError::Closed(_) => Code::Unavailable,
    };
    from_error(code, &error)
}

/// A refused subscription, or a failed read or write of an object.
pub(crate) fn resource_error(error: ResourceError) -> Status {
    match &error {
        ResourceError::InvalidArgument { .. } => from_error(Code::InvalidArgument, &error),
        ResourceError::Resolve(ResolveError::Discovery(source)) => kube_error("discover apiserver resources", source),
        ResourceError::Resolve(e) => from_error(resolve_code(e), &error),
        ResourceError::Apiserver { op, source } => kube_error(op, source),
    }
}

/// A refused election request: a bad field INVALID_ARGUMENT, another identity or not a member
/// FAILED_PRECONDITION, a member Lease not written in time UNAVAILABLE, one whose write the apiserver
/// refused with the apiserver's code and message.
pub(crate) fn leadership_error(error: LeadershipError) -> Status {
    let code = match &error {
        LeadershipError::InvalidArgument { .. } => Code::InvalidArgument,
        LeadershipError::IdentityConflict { .. }
        | LeadershipError::NotMember { .. }
        | LeadershipError::NotThisMember { .. } => Code::FailedPrecondition,
        LeadershipError::NotRecorded { .. } => Code::Unavailable,
        LeadershipError::NotWritten { source, .. } => return kube_error(&error.to_string(), source),
    };
    from_error(code, &error)
}

/// A failed read or write.
pub(crate) fn objects_error(error: ObjectsError) -> Status {
    match error {
        ObjectsError::Resource(e) => resource_error(e),
        ObjectsError::NotFound { .. } => from_error(Code::NotFound, &error),
        ObjectsError::Fenced { .. } | ObjectsError::Unfenced { .. } => {
            failed_precondition("guard", consistd_core::error::chain(&error))
        }
    }
}

/// A refused `Send`: bounds are RESOURCE_EXHAUSTED, a missing transport FAILED_PRECONDITION, a store
/// failure UNAVAILABLE (nothing was stored; retrying is safe).
pub(crate) fn outbox_error(error: OutboxError) -> Status {
    let code = match &error {
        OutboxError::Exhausted(_) => Code::ResourceExhausted,
        OutboxError::NotConfigured | OutboxError::Unsupported(_) => Code::FailedPrecondition,
        OutboxError::Store(_) => Code::Unavailable,
    };
    from_error(code, &error)
}

/// A channel's versions could not be read or written.
pub(crate) fn versions_error(error: VersionsError) -> Status {
    match &error {
        VersionsError::Apiserver { op, name, source } => kube_error(&format!("{op} {name}"), source),
        VersionsError::Contended { .. } => from_error(Code::Aborted, &error),
        VersionsError::Fenced { .. } => failed_precondition("guard", error::chain(&error)),
        VersionsError::Malformed { .. } => from_error(Code::FailedPrecondition, &error),
    }
}

/// A failed rollout request: no leader to ask, or a daemon asked as leader that does not lead (leadership
/// is moving), UNAVAILABLE, so clients ask again. A cause the rollout wraps keeps its own code, and its
/// message is named after what the rollout was doing.
pub(crate) fn rollout_error(error: RolloutError) -> Status {
    let doing = error.to_string();
    match error {
        RolloutError::NoLeader { .. } => from_error(Code::Unavailable, &error),
        RolloutError::NotLeader { .. } => from_error(Code::Unavailable, &error),
        RolloutError::Forwarded { code, .. } => from_error(code, &error),
        RolloutError::Versions(e) => versions_error(e),
        RolloutError::Outbox(e) => within(&doing, outbox_error(e)),
        RolloutError::Resource(e) => within(&doing, resource_error(e)),
        RolloutError::Leadership(e) => leadership_error(e),
        RolloutError::Inbox(e) => within(&doing, inbox_error(e)),
    }
}

/// `inner`, its message prefixed with what was being done.
fn within(doing: &str, inner: Status) -> Status {
    Status::new(inner.code(), format!("{doing}: {}", inner.message()))
}

/// A refused reconcile queue or completion: a bad field INVALID_ARGUMENT, a lease not this stream's or a
/// spec unlike the running queue's FAILED_PRECONDITION, a refused watch its own code with the query's
/// field first, a stopping daemon UNAVAILABLE.
pub(crate) fn reconcile_error(error: ReconcileError) -> Status {
    match error {
        ReconcileError::InvalidArgument { .. } => from_error(Code::InvalidArgument, &error),
        ReconcileError::FailedPrecondition { .. } => from_error(Code::FailedPrecondition, &error),
        ReconcileError::Stopped(_) => from_error(Code::Unavailable, &error),
        ReconcileError::Exhausted { .. } => from_error(Code::ResourceExhausted, &error),
        ReconcileError::Query { field, source } => within(&field, resource_error(source)),
    }
}

/// A refused Ack or Nack.
pub(crate) fn inbox_error(error: InboxError) -> Status {
    let code = match &error {
        InboxError::NotFound(_) => Code::NotFound,
        InboxError::Store(_) => Code::Unavailable,
    };
    from_error(code, &error)
}

/// A WatchAcks subscriber fell too far behind; outcomes were skipped, so the stream ends.
pub(crate) fn acks_lagged(skipped: u64) -> Status {
    Status::new(
        Code::DataLoss,
        format!(
            "OutboxService.WatchAcks: this subscriber fell behind and missed {skipped} outcomes; \
             call GetOutboxStatus for what is still pending and watch again"
        ),
    )
}

fn resolve_code(e: &ResolveError) -> Code {
    match e {
        ResolveError::NotFound(_) => Code::NotFound,
        ResolveError::Malformed(_) | ResolveError::NotWatchable(_) => Code::InvalidArgument,
        ResolveError::Discovery(_) => Code::Unavailable,
    }
}

/// An apiserver answer, keeping its meaning: 400/422 INVALID_ARGUMENT, 401 UNAUTHENTICATED,
/// 403 PERMISSION_DENIED, 404 NOT_FOUND, 409 ALREADY_EXISTS or ABORTED (conflict), 410 ABORTED,
/// 429 RESOURCE_EXHAUSTED, 5xx and transport failures UNAVAILABLE. The message keeps the apiserver's.
pub(crate) fn kube_error(op: &str, error: &kube::Error) -> Status {
    let kube::Error::Api(status) = error else {
        return Status::new(Code::Unavailable, format!("{op}: {error}"));
    };
    let code = match status.code {
        400 | 422 => Code::InvalidArgument,
        401 => Code::Unauthenticated,
        403 => Code::PermissionDenied,
        404 => Code::NotFound,
        409 if status.reason == "AlreadyExists" => Code::AlreadyExists,
        409 | 410 => Code::Aborted,
        429 => Code::ResourceExhausted,
        500..=599 => Code::Unavailable,
        _ => Code::Unknown,
    };
    Status::new(code, format!("{op}: {}", status.message))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn api_error(code: u16, reason: &str) -> kube::Error {
        kube::Error::Api(Box::new(kube::core::Status {
            code,
            reason: reason.to_owned(),
            message: format!("apiserver says {code}"),
            ..Default::default()
        }))
    }

    #[test]
    fn apiserver_answers_keep_their_meaning_and_message() {
        for (code, reason, want) in [
            (400, "BadRequest", Code::InvalidArgument),
            (422, "Invalid", Code::InvalidArgument),
            (401, "Unauthorized", Code::Unauthenticated),
            (403, "Forbidden", Code::PermissionDenied),
            (404, "NotFound", Code::NotFound),
            (409, "AlreadyExists", Code::AlreadyExists),
            (409, "Conflict", Code::Aborted),
            (410, "Expired", Code::Aborted),
            (429, "TooManyRequests", Code::ResourceExhausted),
            (503, "ServiceUnavailable", Code::Unavailable),
        ] {
            let status = kube_error("list configmaps", &api_error(code, reason));
            assert_eq!(status.code(), want, "{code} {reason}");
            assert_eq!(status.message(), format!("list configmaps: apiserver says {code}"));
        }
    }

    #[test]
    fn resolution_failures_map_to_not_found_and_invalid_argument() {
        let s = resource_error(ResourceError::Resolve(ResolveError::NotFound("widgets".into())));
        assert_eq!(s.code(), Code::NotFound);
        assert!(s.message().starts_with("resource:"), "{}", s.message());
        let s = resource_error(ResourceError::Resolve(ResolveError::Malformed("a/b/c/d".into())));
        assert_eq!(s.code(), Code::InvalidArgument);
    }

    #[test]
    fn a_refused_member_lease_write_keeps_the_apiservers_code_and_message() {
        let refused = LeadershipError::NotWritten {
            election: "ns/config".into(),
            version: 3,
            source: std::sync::Arc::new(api_error(403, "Forbidden")),
        };
        let s = leadership_error(refused);
        assert_eq!(s.code(), Code::PermissionDenied);
        assert_eq!(s.message(), "election ns/config: record applied version 3 on the member Lease: apiserver says 403");
    }

    fn disk_on_fire(op: &'static str) -> consistd_messages::store::StoreError {
        consistd_messages::store::StoreError::Failed {
            op,
            source: std::sync::Arc::new(redb::Error::Io(std::io::Error::other("disk on fire"))),
        }
    }

    #[test]
    fn a_nested_error_reaches_the_client_naming_each_cause_once() {
        let s = outbox_error(OutboxError::Store(disk_on_fire("store outbox message")));
        assert_eq!(s.code(), Code::Unavailable);
        assert_eq!(s.message(), "send: message store: store outbox message: I/O error: disk on fire");
        let s = rollout_error(RolloutError::Inbox(InboxError::Store(disk_on_fire("record ACK"))));
        assert_eq!(s.code(), Code::Unavailable);
        assert_eq!(s.message(), "ACK applied versions: message store: record ACK: I/O error: disk on fire");
        let s = objects_error(ObjectsError::Resource(ResourceError::Resolve(ResolveError::NotFound("widgets".into()))));
        assert_eq!(s.code(), Code::NotFound);
        assert_eq!(s.message(), r#"resource: the apiserver serves no resource named "widgets""#);
    }
}
