//! W3C trace context (`traceparent`, `tracestate`) carried with an ACK-tracked message from the sending
//! app's Send to the receiving app's Inbox.Receive, checked as https://www.w3.org/TR/trace-context/ says.

/// The longest `tracestate` kept: the length W3C requires every hop to propagate.
pub(crate) const MAX_TRACESTATE_BYTES: usize = 512;

/// A message's trace context; both empty when it was sent under none.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TraceContext {
    /// `version-traceid-parentid-flags`, e.g. `00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01`.
    pub traceparent: String,
    /// Vendor entries going with it (may be empty).
    pub tracestate: String,
}

/// Which field of a trace context is malformed, and how.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BadTraceContext {
    /// `traceparent` or `tracestate`.
    pub field: &'static str,
    /// What is wrong with it.
    pub message: String,
}

impl TraceContext {
    /// The context a caller gave explicitly; an empty `traceparent` means none (its `tracestate` is
    /// then dropped, as W3C drops a tracestate without a traceparent).
    pub fn given(traceparent: String, tracestate: String) -> Result<Self, BadTraceContext> {
        if traceparent.is_empty() {
            return Ok(Self::default());
        }
        check_traceparent(&traceparent).map_err(|message| BadTraceContext { field: "traceparent", message })?;
        check_tracestate(&tracestate).map_err(|message| BadTraceContext { field: "tracestate", message })?;
        Ok(Self { traceparent, tracestate })
    }

    /// The context of a call's `traceparent` and `tracestate` headers. A malformed traceparent is
    /// ignored and a malformed tracestate dropped, as W3C requires of a receiver.
    pub fn of_headers(headers: &http::HeaderMap) -> Self {
        let header = |name| headers.get(name).and_then(|v| v.to_str().ok()).unwrap_or_default().trim().to_owned();
        let traceparent = header("traceparent");
        if check_traceparent(&traceparent).is_err() {
            return Self::default();
        }
        let tracestate = Some(header("tracestate")).filter(|s| check_tracestate(s).is_ok()).unwrap_or_default();
        Self { traceparent, tracestate }
    }

    /// Whether the message was sent under no trace.
    pub fn is_empty(&self) -> bool {
        self.traceparent.is_empty()
    }
}

/// Checks `version-traceid-parentid-flags`: lowercase hex, version not `ff`, ids not all zero; a version
/// above 00 may carry more fields after its flags.
fn check_traceparent(value: &str) -> Result<(), String> {
    let bad = |why: &str| Err(format!("{value:?} is not a W3C traceparent: {why}"));
    let hex =
        |s: &str, len: usize| s.len() == len && s.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
    let mut parts = value.splitn(5, '-');
    let (Some(version), Some(trace_id), Some(parent_id), Some(flags)) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return bad("want version-traceid-parentid-flags");
    };
    let rest = parts.next();
    if !hex(version, 2) || version == "ff" {
        return bad("the version is not 2 lowercase hex digits below ff");
    }
    if !hex(trace_id, 32) || trace_id.bytes().all(|b| b == b'0') {
        return bad("the trace id is not 32 lowercase hex digits, not all zero");
    }
    if !hex(parent_id, 16) || parent_id.bytes().all(|b| b == b'0') {
        return bad("the parent id is not 16 lowercase hex digits, not all zero");
    }
    if !hex(flags, 2) {
        return bad("the flags are not 2 lowercase hex digits");
    }
    if version == "00" && rest.is_some() {
        return bad("version 00 has exactly four fields");
    }
    Ok(())
}

/// Checks a tracestate's size and characters (printable ASCII, at most [`MAX_TRACESTATE_BYTES`]).
fn check_tracestate(value: &str) -> Result<(), String> {
    if value.len() > MAX_TRACESTATE_BYTES {
        return Err(format!("is {} bytes; at most {MAX_TRACESTATE_BYTES}", value.len()));
    }
    if !value.bytes().all(|b| (0x20..=0x7e).contains(&b)) {
        return Err("must be printable ASCII (W3C list-members)".to_owned());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const VALID: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    #[test]
    fn a_valid_context_is_kept_and_an_empty_one_means_none() {
        let c = TraceContext::given(VALID.to_owned(), "congo=t61rcWkgMzE".to_owned()).expect("valid");
        assert_eq!(c.traceparent, VALID);
        assert_eq!(c.tracestate, "congo=t61rcWkgMzE");
        let none = TraceContext::given(String::new(), "congo=1".to_owned()).expect("empty is none");
        assert!(none.is_empty());
        assert_eq!(none.tracestate, "", "a tracestate without traceparent is dropped");
        let future = "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra";
        assert!(TraceContext::given(future.to_owned(), String::new()).is_ok(), "later versions may add fields");
    }

    #[test]
    fn malformed_fields_are_named() {
        for bad in [
            "garbage",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-1",
        ] {
            let e = TraceContext::given(bad.to_owned(), String::new()).expect_err(bad);
            assert_eq!(e.field, "traceparent", "{bad}");
        }
        let e = TraceContext::given(VALID.to_owned(), "a=".repeat(300)).expect_err("too long");
        assert_eq!(e.field, "tracestate");
        let e = TraceContext::given(VALID.to_owned(), "a=\n".to_owned()).expect_err("control character");
        assert_eq!(e.field, "tracestate");
    }

    #[test]
    fn headers_with_a_malformed_traceparent_are_ignored() {
        let mut headers = http::HeaderMap::new();
        headers.insert("traceparent", "00-nope".parse().expect("header"));
        headers.insert("tracestate", "a=1".parse().expect("header"));
        assert!(TraceContext::of_headers(&headers).is_empty());
        headers.insert("traceparent", VALID.parse().expect("header"));
        assert_eq!(TraceContext::of_headers(&headers).tracestate, "a=1");
        headers.insert("tracestate", "a=1".repeat(200).parse().expect("header"));
        let c = TraceContext::of_headers(&headers);
        assert_eq!((c.traceparent.as_str(), c.tracestate.as_str()), (VALID, ""), "a bad tracestate is dropped");
    }
}
