//! The labels and annotations on consistd's Leases: the daemon writes them, `kubectl consistd` lists and
//! reads Leases by them.

/// The label on every Lease consistd writes, election and member Leases alike, and its value: what
/// `kubectl consistd` lists them by (the Kubernetes recommended label; a Lease already labelled as
/// managed by something else keeps that label).
pub const MANAGED_BY_LABEL: &str = "app.kubernetes.io/managed-by";
/// The value of [`MANAGED_BY_LABEL`] on consistd's Leases.
pub const MANAGED_BY: &str = "consistd";

/// Label every member Lease of an election carries: its value is the election's group label.
pub const MEMBER_OF_LABEL: &str = "consistd.io/member-of";
/// Annotation with the member's peer address ("host:port").
pub const PEER_ADDRESS_ANNOTATION: &str = "consistd.io/peer-address";
/// Annotation with the election's full name (labels are limited to 63 characters).
pub const ELECTION_ANNOTATION: &str = "consistd.io/election";
/// Annotation with the newest version of the election's rollout channel this member's app applied.
pub const APPLIED_VERSION_ANNOTATION: &str = "consistd.io/applied-version";
/// How long a member counts after a renewal when its Lease has no leaseDurationSeconds.
pub const DEFAULT_MEMBER_TTL_SECONDS: u32 = 30;
