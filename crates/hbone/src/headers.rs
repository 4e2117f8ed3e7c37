//! The request/response headers HBONE carries besides `:authority` (spec §3.2):
//! `baggage` (workload metadata for metrics), `forwarded` (client address and service
//! host) and `traceparent` (W3C trace context).
//!
//! Parsers here take peer-controlled text: each is a total, bounded function over `&str`
//! (fuzz targets call them directly).

mod baggage;
mod forwarded;
mod traceparent;

pub use baggage::{Baggage, BaggageError, MAX_BAGGAGE_LEN, WorkloadKind};
pub use forwarded::{
    Forwarded, ForwardedElement, ForwardedError, ForwardedNode, MAX_FORWARDED_LEN, build_forwarded,
    parse_forwarded,
};
pub use traceparent::new_traceparent;

/// Header name for workload metadata.
pub const BAGGAGE: &str = "baggage";
/// Header name for the RFC 7239 client address.
pub const FORWARDED: &str = "forwarded";
/// Header name for W3C trace context.
pub const TRACEPARENT: &str = "traceparent";
/// Header carried on the inner CONNECT of double HBONE with the client's network.
pub const X_FORWARDED_NETWORK: &str = "x-forwarded-network";
