//! `consistd inject`: adds consistd to pods as a native sidecar, offline (`-f FILE`, [`offline`]) or as
//! a mutating admission webhook ([`webhook`], its certificates in [`certs`]); both make the one mutation
//! in [`sidecar`].

pub mod certs;
pub mod offline;
pub mod sidecar;
pub mod webhook;

pub use self::sidecar::Defaults;
