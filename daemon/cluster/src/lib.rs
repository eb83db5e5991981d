//! consistd's side of the apiserver: the Kubernetes [`client`] (keepalives, and every answer noted for
//! readiness), the shared [`watch`]es with own-write tracking and CONSISTENT delivery, [`objects`] (reads
//! and the writes that record expectations, guarded writes), [`fencing`] (whether the apiserver refuses
//! stale terms), [`leadership`] (Lease elections and election groups), [`authority`] (who may act, in which
//! term) and [`reconcile`] queues.

pub mod client;
pub mod fencing;
pub mod leadership;
pub mod objects;
pub mod reconcile;
pub mod watch;
