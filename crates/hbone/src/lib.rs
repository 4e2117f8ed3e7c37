//! ambit-hbone: HBONE — HTTP/2 CONNECT tunnels — for ambit's ztunnel (spec
//! `ztunnel.md` §3.2–§3.4).
//!
//! Owns the HTTP/2 layer only: it runs over any `AsyncRead + AsyncWrite` stream (ztunnel
//! hands it mTLS streams) and knows nothing of TLS, network namespaces or Kubernetes;
//! [`readahead`] is the one piece that sits under TLS (read batching on the TCP socket).
//!
//! - [`client`]: handshake and CONNECT requests ([`HboneClient`]).
//! - [`server`]: serving CONNECT on one connection ([`serve_connection`]), with drain.
//! - [`pool`]: keyed, multiplexed client connections ([`Pool`]).
//! - [`stream`]: a tunnel as a byte stream ([`H2Stream`]); [`copy`]: the data-path copy.
//! - [`tasks`]: the tasks of one owner ([`TaskSet`]: aborted with it, no wake-up per finished task).
//! - [`authority`] and [`headers`]: pure, bounded parsers for peer-controlled text
//!   (fuzz entry points: [`parse_authority`], [`Baggage::parse`], [`parse_forwarded`]).

#![forbid(unsafe_code)]

pub mod authority;
pub mod client;
pub mod copy;
pub mod headers;
mod keepalive;
pub mod pool;
pub mod readahead;
pub mod server;
pub mod settings;
pub mod stream;
pub mod tasks;

pub use authority::{AuthorityError, ConnectTarget, parse_authority};
pub use client::{ClientError, ConnectResponse, EarlyData, HboneClient};
pub use copy::{CopyError, CopySide, Transferred, copy_bidirectional};
pub use headers::{Baggage, BaggageError, Forwarded, ForwardedError, parse_forwarded};
pub use pool::{Pool, PoolConfig, PoolError};
pub use readahead::ReadAhead;
pub use server::{
    ConnectRequest, ConnectionEnd, RequestError, Responder, ServerError, serve_connection,
    validate_request,
};
pub use settings::H2Settings;
pub use stream::H2Stream;
pub use tasks::TaskSet;
