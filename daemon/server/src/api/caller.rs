//! Who is calling: each connection's peer credentials (SO_PEERCRED), logged at debug and counted per uid
//! on every call, checked against `socket.allowedUids` / `socket.allowedGids` before any handler runs,
//! and handed to the handlers (for `access.rules`) as a request extension.

use std::{
    fmt,
    sync::Arc,
    task::{Context, Poll},
};

use consistd_core::config::Live;
use consistd_observe::metrics::Metrics;
use futures::future::{Either, Ready, ready};
use tonic::{body::Body, transport::server::UdsConnectInfo};
use tower::{Layer, Service};

use super::status;

/// The process at the other end of a connection, as the kernel reports it when the connection was made.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct Caller {
    /// Effective user id; None where the kernel gave no credentials.
    pub uid: Option<u32>,
    /// Effective group id.
    pub gid: Option<u32>,
    /// Process id.
    pub pid: Option<i32>,
}

impl Caller {
    /// The caller of a request whose extensions hold the connection's info.
    fn of(extensions: &http::Extensions) -> Self {
        let cred = extensions.get::<UdsConnectInfo>().and_then(|info| info.peer_cred);
        Self { uid: cred.map(|c| c.uid()), gid: cred.map(|c| c.gid()), pid: cred.and_then(|c| c.pid()) }
    }

    /// The uid as per-caller metrics label it: the number, or "unknown" without peer credentials.
    pub(crate) fn uid_label(&self) -> String {
        self.uid.map_or_else(|| "unknown".to_owned(), |uid| uid.to_string())
    }

    /// The caller recorded on a request by [`CallerLayer`]; unknown if there is none.
    pub(crate) fn from_request<T>(request: &tonic::Request<T>) -> Self {
        request.extensions().get::<Self>().copied().unwrap_or_default()
    }
}

impl fmt::Display for Caller {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.uid {
            Some(uid) => write!(f, "uid {uid}")?,
            None => write!(f, "a caller of unknown uid")?,
        }
        if let Some(gid) = self.gid {
            write!(f, " (gid {gid})")?;
        }
        Ok(())
    }
}

/// Which callers may use the socket at all.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Allowlist {
    /// Allowed user ids; empty with `gids` empty allows everyone.
    pub uids: Vec<u32>,
    /// Allowed primary group ids.
    pub gids: Vec<u32>,
}

impl Allowlist {
    /// Whether `caller` may call; a caller without credentials passes only an empty allowlist.
    fn admits(&self, caller: &Caller) -> bool {
        if self.uids.is_empty() && self.gids.is_empty() {
            return true;
        }
        caller.uid.is_some_and(|uid| self.uids.contains(&uid)) || caller.gid.is_some_and(|gid| self.gids.contains(&gid))
    }
}

/// The tower layer that puts [`CallerService`] in front of every service on the socket.
#[derive(Debug, Clone)]
pub(crate) struct CallerLayer {
    allowlist: Live<Arc<Allowlist>>,
    metrics: Metrics,
}

impl CallerLayer {
    /// Checks callers against `allowlist` (as reloads change it) and counts calls in `metrics`.
    pub(crate) fn new(allowlist: Live<Arc<Allowlist>>, metrics: Metrics) -> Self {
        Self { allowlist, metrics }
    }
}

impl<S> Layer<S> for CallerLayer {
    type Service = CallerService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        CallerService { inner, allowlist: self.allowlist.clone(), metrics: self.metrics.clone() }
    }
}

/// Logs, counts and admits (or refuses) each call, then passes it on with its [`Caller`] attached.
#[derive(Debug, Clone)]
pub(crate) struct CallerService<S> {
    inner: S,
    allowlist: Live<Arc<Allowlist>>,
    metrics: Metrics,
}

impl<S, B> Service<http::Request<B>> for CallerService<S>
where
    S: Service<http::Request<B>, Response = http::Response<Body>>,
{
    type Response = http::Response<Body>;
    type Error = S::Error;
    type Future = Either<Ready<Result<Self::Response, Self::Error>>, S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut request: http::Request<B>) -> Self::Future {
        let caller = Caller::of(request.extensions());
        let method = request.uri().path();
        tracing::debug!(uid = caller.uid, gid = caller.gid, pid = caller.pid, method, "call");
        let uid = caller.uid_label();
        self.metrics.count_call(&uid);
        if !self.allowlist.get().admits(&caller) {
            self.metrics.count_refused_call(&uid);
            tracing::info!(uid = caller.uid, gid = caller.gid, pid = caller.pid, method, "call refused: not allowed");
            let refused = status::caller_not_allowed(caller, method);
            return Either::Left(ready(Ok(refused.into_http())));
        }
        request.extensions_mut().insert(caller);
        Either::Right(self.inner.call(request))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn caller(uid: u32, gid: u32) -> Caller {
        Caller { uid: Some(uid), gid: Some(gid), pid: Some(1) }
    }

    #[test]
    fn an_empty_allowlist_admits_everyone_even_without_credentials() {
        let all = Allowlist::default();
        assert!(all.admits(&caller(1000, 1000)));
        assert!(all.admits(&Caller::default()));
    }

    #[test]
    fn a_caller_passes_if_its_uid_or_its_gid_is_listed() {
        let list = Allowlist { uids: vec![1000], gids: vec![2000] };
        assert!(list.admits(&caller(1000, 1)));
        assert!(list.admits(&caller(7, 2000)));
        assert!(!list.admits(&caller(7, 1)));
        assert!(!list.admits(&Caller::default()), "no credentials, no entry");
    }
}
