//! The one place where internal errors become gRPC statuses, so every RPC answers with the same codes
//! and messages that name the operation that failed.

use tonic::{Code, Status};

/// An RPC whose behaviour this daemon version does not provide yet.
pub(crate) fn unimplemented(rpc: &'static str) -> Status {
    Status::new(Code::Unimplemented, format!("{rpc} is not implemented in consistd {} yet", env!("CARGO_PKG_VERSION")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unimplemented_names_the_rpc() {
        let status = unimplemented("WatchService.Subscribe");
        assert_eq!(status.code(), Code::Unimplemented);
        assert!(status.message().starts_with("WatchService.Subscribe is not implemented"));
    }
}
