//! How consistd is observed: [`metrics`], one Prometheus registry with every counter, gauge and histogram
//! of the daemon's parts and the standard `process_*` metrics; [`telemetry`], structured logs with a level
//! a reload can swap, OpenTelemetry traces over OTLP, and the W3C trace context an ACK-tracked message
//! carries.

pub mod metrics;
pub mod telemetry;
