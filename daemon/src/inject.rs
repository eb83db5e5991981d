//! `consistd inject webhook`: the mutating admission webhook ([`webhook`], its certificates in [`certs`])
//! that adds consistd to labelled pods with the mutation in `consistd_core::inject`, the same one
//! `consistd inject -f FILE` makes offline.

pub mod certs;
pub mod webhook;
