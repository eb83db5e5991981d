//! Which failures are a lost connection to the sidecar (worth repeating, and reported as UNAVAILABLE),
//! and how long to wait before opening a stream again: the values proto/consistd/v1/watch.proto states
//! for every client.

use std::time::Duration;

/// First pause before reconnecting.
const INITIAL: Duration = Duration::from_millis(100);
/// Longest pause between reconnects.
const CAP: Duration = Duration::from_secs(5);

/// Whether a failed call is worth repeating: the sidecar restarted, shut down or was not reachable, or
/// the connection broke mid-stream (a status made here from the transport's error, which has that error
/// as its source; the daemon's own answers have none). Such a status is UNKNOWN or INTERNAL for an h2
/// error, and CANCELLED for a request hyper cancelled because its connection closed; a CANCELLED made
/// from tonic's own timeout is not a broken connection. Every other status is the daemon's answer to
/// this request and is handed to the caller.
pub(crate) fn is_retryable(status: &tonic::Status) -> bool {
    match status.code() {
        tonic::Code::Unavailable => true,
        tonic::Code::Unknown | tonic::Code::Internal | tonic::Code::Cancelled => {
            let mut source = std::error::Error::source(status);
            let made_here = source.is_some();
            while let Some(e) = source {
                if e.is::<tonic::TimeoutExpired>() {
                    return false;
                }
                source = e.source();
            }
            made_here
        }
        _ => false,
    }
}

/// The status of the calls a broken stream cuts off: UNAVAILABLE when the connection was lost, whatever
/// status the transport made of that (UNKNOWN or CANCELLED from an h2 or hyper error), as the other SDKs
/// report it, so an app retries on one code; the daemon's own answers unchanged.
pub(crate) fn cut_off(status: tonic::Status) -> tonic::Status {
    if status.code() != tonic::Code::Unavailable && is_retryable(&status) {
        return tonic::Status::unavailable(format!("lost the connection to the sidecar: {}", status.message()));
    }
    status
}

/// Doubling pauses from 100 ms up to 5 s, back to the start after a success.
#[derive(Debug)]
pub(crate) struct Backoff {
    next: Duration,
}

impl Backoff {
    pub(crate) fn new() -> Self {
        Self { next: INITIAL }
    }

    /// Waits the current pause and doubles the next one.
    pub(crate) async fn wait(&mut self) {
        tokio::time::sleep(self.next).await;
        self.next = (self.next * 2).min(CAP);
    }

    /// Starts again from the shortest pause (after the stream delivered something).
    pub(crate) fn reset(&mut self) {
        self.next = INITIAL;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_unavailable_is_retried() {
        assert!(is_retryable(&tonic::Status::unavailable("restarting")));
        assert!(!is_retryable(&tonic::Status::invalid_argument("resource: empty")));
        assert!(!is_retryable(&tonic::Status::cancelled("by caller")));
        assert!(!is_retryable(&tonic::Status::unknown("the daemon's own answer")));
        let broken = std::io::Error::new(std::io::ErrorKind::BrokenPipe, "stream closed");
        assert!(is_retryable(&tonic::Status::from_error(Box::new(broken))), "a connection broken mid-stream");
    }

    /// A request hyper cancels because its connection is gone: "Cancelled: operation was canceled", with
    /// hyper's Canceled error as source. An ACK made as the sidecar was SIGKILLed failed this way
    /// ("connection closed"), and `serve_inbox` used to return it.
    #[tokio::test]
    async fn a_request_cancelled_because_its_connection_closed_is_retried_but_a_timeout_is_not() {
        let (client, server) = tokio::io::duplex(1 << 16);
        let (mut sender, connection) = hyper::client::conn::http2::handshake::<_, _, String>(
            hyper_util::rt::TokioExecutor::new(),
            hyper_util::rt::TokioIo::new(client),
        )
        .await
        .expect("an HTTP/2 handshake");
        drop(server);
        connection.await.expect_err("the connection closed without a SETTINGS frame");
        let cancelled =
            sender.send_request(hyper::Request::new(String::new())).await.expect_err("the connection is closed");
        let status = tonic::Status::from_error(Box::new(cancelled));
        assert_eq!(status.code(), tonic::Code::Cancelled, "{status:?}");
        assert!(is_retryable(&status), "{status:?}");
        let timeout = tonic::Status::from_error(Box::new(tonic::TimeoutExpired(())));
        assert_eq!(timeout.code(), tonic::Code::Cancelled, "{timeout:?}");
        assert!(!is_retryable(&timeout), "a deadline that passed");
    }

    #[test]
    fn calls_cut_off_by_a_lost_connection_fail_as_unavailable_and_the_daemons_answers_are_kept() {
        let broken = std::io::Error::new(std::io::ErrorKind::BrokenPipe, "stream closed");
        let lost = cut_off(tonic::Status::from_error(Box::new(broken)));
        assert_eq!(lost.code(), tonic::Code::Unavailable, "{lost:?}");
        assert_eq!(lost.message(), "lost the connection to the sidecar: stream closed");
        let answer = cut_off(tonic::Status::unknown("the daemon's own answer"));
        assert_eq!((answer.code(), answer.message()), (tonic::Code::Unknown, "the daemon's own answer"));
        let restarting = cut_off(tonic::Status::unavailable("restarting"));
        assert_eq!((restarting.code(), restarting.message()), (tonic::Code::Unavailable, "restarting"));
    }

    #[tokio::test(start_paused = true)]
    async fn pauses_double_up_to_the_cap_and_reset() {
        let mut backoff = Backoff::new();
        let mut seen = Vec::new();
        for _ in 0..8 {
            let start = tokio::time::Instant::now();
            backoff.wait().await;
            seen.push(start.elapsed().as_millis());
        }
        assert_eq!(seen, [100, 200, 400, 800, 1600, 3200, 5000, 5000]);
        backoff.reset();
        let start = tokio::time::Instant::now();
        backoff.wait().await;
        assert_eq!(start.elapsed().as_millis(), 100);
    }
}
