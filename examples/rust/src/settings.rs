//! The operator's settings, from the environment (the table in examples/README.md).

/// Where the operator works and whom it notifies.
pub(crate) struct Settings {
    /// `EXAMPLE_NAMESPACE`: where the Greetings and the election's Lease live.
    pub(crate) namespace: String,
    /// `EXAMPLE_ELECTION`: the election, and the queue's name.
    pub(crate) election: String,
    /// `EXAMPLE_PEER` as given: a peer's "host:port", or "service/NAME"; `None` to notify nobody.
    pub(crate) peer: Option<String>,
}

impl Settings {
    pub(crate) fn from_env() -> Self {
        let var = |name: &str, default: &str| std::env::var(name).unwrap_or_else(|_| default.to_owned());
        Self {
            namespace: var("EXAMPLE_NAMESPACE", "default"),
            election: var("EXAMPLE_ELECTION", "greeting-operator"),
            peer: std::env::var("EXAMPLE_PEER").ok().filter(|p| !p.is_empty()),
        }
    }
}
