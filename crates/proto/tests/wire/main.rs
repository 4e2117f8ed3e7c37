//! Wire-level tests of the generated types: golden encodings pin the field numbers of
//! the specs, round trips cover every message, a property test feeds garbage to every
//! decoder, and loopback gRPC calls pin the service paths.

mod samples;

mod golden;
mod grpc;
mod malformed;
mod roundtrip;
