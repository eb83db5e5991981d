//! The one place where internal errors become gRPC statuses, so every RPC answers with the same codes
//! and messages that name the operation that failed.

use tonic::{Code, Status};

use crate::{
    inbox::InboxError,
    leadership::LeadershipError,
    objects::ObjectsError,
    outbox::OutboxError,
    rollout::{RolloutError, versions::VersionsError},
    watch::{WatchError, resolve::ResolveError},
};

/// A request field is wrong: `field: why`.
pub(crate) fn invalid_argument(field: &str, why: impl std::fmt::Display) -> Status {
    Status::new(Code::InvalidArgument, format!("{field}: {why}"))
}

/// A stream ended because the daemon is stopping; clients reconnect (to its successor) and resume.
pub(crate) fn shutting_down(rpc: &'static str) -> Status {
    Status::new(Code::Unavailable, format!("{rpc}: consistd is shutting down; reconnect and resume from your cursor"))
}

/// A refused subscription.
pub(crate) fn watch_error(error: WatchError) -> Status {
    match &error {
        WatchError::InvalidArgument { .. } => Status::new(Code::InvalidArgument, error.to_string()),
        WatchError::Resolve(e) => resolve_error(e, error.to_string()),
        WatchError::Apiserver { op, source } => kube_error(op, source),
    }
}

/// A refused election request.
pub(crate) fn leadership_error(error: LeadershipError) -> Status {
    match &error {
        LeadershipError::InvalidArgument { .. } => Status::new(Code::InvalidArgument, error.to_string()),
        LeadershipError::IdentityConflict { .. } | LeadershipError::NotMember { .. } => {
            Status::new(Code::FailedPrecondition, error.to_string())
        }
        LeadershipError::NotRecorded { .. } => Status::new(Code::Unavailable, error.to_string()),
    }
}

/// A failed read or write.
pub(crate) fn objects_error(error: ObjectsError) -> Status {
    match &error {
        ObjectsError::InvalidArgument { .. } => Status::new(Code::InvalidArgument, error.to_string()),
        ObjectsError::NotFound { .. } => Status::new(Code::NotFound, error.to_string()),
        ObjectsError::Resolve(e) => resolve_error(e, error.to_string()),
        ObjectsError::Apiserver { op, source } => kube_error(op, source),
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
    Status::new(code, crate::error::chain(&error))
}

/// A channel's versions could not be read or written.
pub(crate) fn versions_error(error: VersionsError) -> Status {
    match &error {
        VersionsError::Apiserver { op, name, source } => kube_error(&format!("{op} {name}"), source),
        VersionsError::Contended { .. } => Status::new(Code::Aborted, error.to_string()),
        VersionsError::Malformed { .. } => Status::new(Code::FailedPrecondition, error.to_string()),
    }
}

/// A failed rollout request.
pub(crate) fn rollout_error(error: RolloutError) -> Status {
    let message = crate::error::chain(&error);
    match error {
        RolloutError::NoLeader { .. } => Status::new(Code::Unavailable, message),
        RolloutError::NotLeader { .. } => Status::new(Code::FailedPrecondition, message),
        RolloutError::Forwarded { code, .. } => Status::new(code, message),
        RolloutError::Versions(e) => versions_error(e),
        RolloutError::Outbox(e) => outbox_error(e),
        RolloutError::Watch(e) => watch_error(e),
        RolloutError::Leadership(e) => leadership_error(e),
        RolloutError::Inbox(e) => inbox_error(e),
    }
}

/// A refused Ack or Nack.
pub(crate) fn inbox_error(error: InboxError) -> Status {
    let code = match &error {
        InboxError::NotFound(_) => Code::NotFound,
        InboxError::Store(_) => Code::Unavailable,
    };
    Status::new(code, crate::error::chain(&error))
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

fn resolve_error(e: &ResolveError, message: String) -> Status {
    match e {
        ResolveError::NotFound(_) => Status::new(Code::NotFound, message),
        ResolveError::Malformed(_) | ResolveError::NotWatchable(_) => Status::new(Code::InvalidArgument, message),
        ResolveError::Discovery(source) => kube_error("discover apiserver resources", source),
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
        let s = watch_error(WatchError::Resolve(ResolveError::NotFound("widgets".into())));
        assert_eq!(s.code(), Code::NotFound);
        assert!(s.message().starts_with("resource:"), "{}", s.message());
        let s = watch_error(WatchError::Resolve(ResolveError::Malformed("a/b/c/d".into())));
        assert_eq!(s.code(), Code::InvalidArgument);
    }
}
