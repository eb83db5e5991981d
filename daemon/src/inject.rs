//! `consistd inject`: adds consistd to pods as a native sidecar, offline (`-f FILE`, [`offline`]) or as
//! a mutating admission webhook; both make the one mutation in [`sidecar`].

pub mod offline;
pub mod sidecar;

pub use self::sidecar::Defaults;
