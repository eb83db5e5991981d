//! consistd's messages between pods: the durable [`store`] (one redb file, group commit; it keeps the
//! reconcile queues' timers too), the [`transport`] that dials other daemons over mutual TLS, the ACK-tracked
//! [`outbox`], the [`inbox`] that holds what arrived until the app ACKs it, and the replica barrier
//! ([`rollout`]) built on them.

pub mod inbox;
pub mod outbox;
pub mod rollout;
pub mod store;
pub mod transport;
