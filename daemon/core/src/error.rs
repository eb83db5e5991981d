//! Errors as people read them: an error and each of its causes on one line, `outer: inner: root`.
//! Every error type in the daemon says its own part once and leaves its cause to `source()`, so this
//! is the one place a chain is spelled out, for logs, the command line and gRPC status messages.

use std::error::Error;

/// An error with its causes, `outer: inner: root`.
pub fn chain(error: &dyn Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text += ": ";
        text += &cause.to_string();
        source = cause.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("outer")]
    struct Outer(#[source] Inner);

    #[derive(Debug, thiserror::Error)]
    #[error("inner")]
    struct Inner(#[source] std::io::Error);

    #[test]
    fn every_cause_is_named_once_in_order() {
        let error = Outer(Inner(std::io::Error::other("root")));
        assert_eq!(chain(&error), "outer: inner: root");
    }
}
