//! Serves one HTTP/1 connection (the admin endpoint's, the injector webhook's) as a task of a group,
//! closing it gracefully when the group stops: the request in hand is answered, a keep-alive connection
//! is not left holding shutdown up.

use std::convert::Infallible;

use bytes::Bytes;
use consistd_core::tasks::Tasks;
use http::{Request, Response};
use http_body_util::Full;
use hyper::{body::Incoming, server::conn::http1, service::Service};
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite};

/// Serves `service` on `stream` in a task of `tasks`; `what` names the connection in the debug log of a
/// connection that ended with an error.
pub fn spawn<S, F>(stream: S, service: F, tasks: &Tasks, what: &'static str)
where
    S: AsyncRead + AsyncWrite + Send + Unpin + 'static,
    F: Service<Request<Incoming>, Response = Response<Full<Bytes>>, Error = Infallible> + Send + 'static,
    F::Future: Send + 'static,
{
    let stop = tasks.signal().clone();
    tasks.spawn(async move {
        let connection = http1::Builder::new().serve_connection(TokioIo::new(stream), service);
        let mut connection = std::pin::pin!(connection);
        let ended = tokio::select! {
            ended = connection.as_mut() => ended,
            () = stop.cancelled() => {
                connection.as_mut().graceful_shutdown();
                connection.await
            }
        };
        if let Err(error) = ended {
            tracing::debug!(%error, "{what} connection ended with an error");
        }
    });
}
