//! The names Kubernetes and the peer transport accept: Lease, Service and namespace names, finalizers, and the
//! "host:port" peer addresses daemons announce and dial. Checked where requests and config arrive, so a
//! bad name is refused naming its field instead of failing later at the apiserver.

/// RFC 1123 subdomain: what Kubernetes accepts as the name of a Lease, a Service, a ConfigMap.
pub fn is_dns_subdomain(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 253
        && s.split('.').all(|label| {
            !label.is_empty()
                && label.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                && !label.starts_with('-')
                && !label.ends_with('-')
        })
}

/// A qualified name with a prefix, "example.com/cleanup": what Kubernetes asks a finalizer's name to be (a
/// DNS subdomain, '/', and a name of at most 63 letters, digits, '-', '_' and '.' that starts and ends
/// alphanumeric).
pub fn is_prefixed_qualified_name(s: &str) -> bool {
    let Some((prefix, name)) = s.split_once('/') else { return false };
    let alnum = |b: Option<&u8>| b.is_some_and(u8::is_ascii_alphanumeric);
    is_dns_subdomain(prefix)
        && name.len() <= 63
        && alnum(name.as_bytes().first())
        && alnum(name.as_bytes().last())
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
}

/// FNV-1a, 64 bits: a short, stable digest for names too long to be read (and what KEP-5866's
/// `shardRange` hashes a field with).
pub fn fnv1a64(text: &str) -> u64 {
    text.bytes().fold(0xcbf2_9ce4_8422_2325, |hash, byte| (hash ^ u64::from(byte)).wrapping_mul(0x0100_0000_01b3))
}

/// A namespace name: an RFC 1123 label (a subdomain without dots, at most 63 characters).
pub fn is_namespace_name(s: &str) -> bool {
    s.len() <= 63 && !s.contains('.') && is_dns_subdomain(s)
}

/// Checks a peer address, "host:port" with an IPv6 host in brackets; the error says what is wrong.
pub fn check_peer_address(address: &str) -> Result<(), String> {
    let (host, port) = address.rsplit_once(':').ok_or_else(|| format!("{address:?} is not host:port"))?;
    let host = host.strip_prefix('[').and_then(|h| h.strip_suffix(']')).unwrap_or(host);
    let valid_host = !host.is_empty()
        && (host.parse::<std::net::IpAddr>().is_ok()
            || host.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '.'));
    if !valid_host {
        return Err(format!("{address:?} has no valid host"));
    }
    match port.parse::<u16>() {
        Ok(p) if p > 0 => Ok(()),
        _ => Err(format!("{address:?} has no valid port (1-65535)")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finalizers_are_qualified_names_with_a_prefix() {
        for good in ["example.com/cleanup", "a.b/c", "x/Y_z.1-2"] {
            assert!(is_prefixed_qualified_name(good), "{good}");
        }
        let long = format!("example.com/{}", "n".repeat(64));
        for bad in ["cleanup", "/cleanup", "example.com/", "Example.com/x", "a/-x", "a/x-", "a/b/c", long.as_str()] {
            assert!(!is_prefixed_qualified_name(bad), "{bad}");
        }
    }

    #[test]
    fn lease_names_are_dns_subdomains() {
        for good in ["a", "my-app", "my.app.v1", "x1"] {
            assert!(is_dns_subdomain(good), "{good}");
        }
        for bad in ["", "My-App", "-a", "a-", "a..b", "a_b", &"x".repeat(254)] {
            assert!(!is_dns_subdomain(bad), "{bad}");
        }
    }

    #[test]
    fn namespaces_are_labels_without_dots() {
        assert!(is_namespace_name("apps"));
        assert!(!is_namespace_name("a.b"));
        assert!(!is_namespace_name(&"x".repeat(64)));
    }

    #[test]
    fn peer_addresses_are_host_and_port() {
        for ok in ["10.0.0.1:7070", "[::1]:7070", "consistd-0.consistd.ns.svc:7070"] {
            assert_eq!(check_peer_address(ok), Ok(()), "{ok}");
        }
        for bad in ["", "10.0.0.1", "10.0.0.1:0", "10.0.0.1:99999", ":7070", "a b:1"] {
            assert!(check_peer_address(bad).is_err(), "{bad}");
        }
    }
}
