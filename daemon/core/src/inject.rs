//! Adding consistd to pods as a native sidecar: the one mutation ([`sidecar`]) that both the offline
//! injector ([`offline`], `consistd inject -f FILE` and `kubectl consistd inject`) and the daemon's
//! admission webhook make, and the flags that set its defaults ([`flags`]).

pub mod flags;
pub mod offline;
pub mod sidecar;

pub use self::{flags::SidecarArgs, sidecar::Defaults};
