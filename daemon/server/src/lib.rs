//! What calls consistd: the gRPC [`api`] apps call on the Unix socket (claimed by [`socket`], its
//! connections bounded by [`connections`], a socket-path `:authority` fixed by [`authority`]), the [`peer`]
//! server other daemons call, the [`admin`] endpoint (metrics, probes, the report), the daemon's
//! [`health`], and the [`http1`] connections of the admin endpoint and the injector webhook.

pub mod admin;
pub mod api;
pub mod authority;
pub mod connections;
pub mod health;
pub mod http1;
pub mod peer;
pub mod socket;

pub use api::SERVICE_NAMES;
