//! HTTP/2 settings for HBONE connections (spec §3.3).
//!
//! One struct carries both sides' values because a proxy is always client and server at
//! once; the builders below pick the side-specific ones.

use std::time::Duration;

/// HTTP/2 tuning for HBONE client and server connections. Defaults match upstream ztunnel.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct H2Settings {
    /// SETTINGS_INITIAL_WINDOW_SIZE advertised by both sides.
    pub stream_window: u32,
    /// Connection-level receive window (sent as a WINDOW_UPDATE on stream 0).
    pub connection_window: u32,
    /// SETTINGS_MAX_FRAME_SIZE advertised by both sides.
    pub max_frame_size: u32,
    /// SETTINGS_MAX_HEADER_LIST_SIZE advertised by the client (response headers).
    pub client_max_header_list_size: u32,
    /// SETTINGS_MAX_HEADER_LIST_SIZE advertised by the server (request headers).
    pub server_max_header_list_size: u32,
    /// SETTINGS_MAX_CONCURRENT_STREAMS advertised by the server.
    pub server_max_concurrent_streams: u32,
    /// Streams the client assumes it may open before the server's SETTINGS arrive.
    pub client_initial_max_send_streams: usize,
    /// Bytes the client buffers per stream before applying back-pressure.
    pub client_max_send_buffer: usize,
    /// Bytes the server buffers per stream before applying back-pressure.
    pub server_max_send_buffer: usize,
    /// Interval between keepalive PINGs; `None` disables keepalive.
    pub keepalive_interval: Option<Duration>,
    /// How long to wait for a PONG before the connection is declared dead and dropped.
    pub keepalive_timeout: Duration,
    /// After a server drain starts (GOAWAY sent), how long in-flight streams may run before
    /// the connection is closed abruptly.
    pub drain_deadline: Duration,
    /// How long a server waits for the client's HTTP/2 preface once the transport is up; a
    /// peer that never sends it is dropped instead of holding the connection forever.
    pub server_handshake_timeout: Duration,
}

const MIB: u32 = 1024 * 1024;
const KIB: u32 = 1024;

impl Default for H2Settings {
    fn default() -> Self {
        Self {
            stream_window: 4 * MIB,
            connection_window: 16 * MIB,
            max_frame_size: MIB,
            client_max_header_list_size: 16 * KIB,
            server_max_header_list_size: 64 * KIB,
            server_max_concurrent_streams: 200,
            client_initial_max_send_streams: 100,
            client_max_send_buffer: 4 * MIB as usize,
            server_max_send_buffer: 400 * KIB as usize,
            keepalive_interval: Some(Duration::from_secs(10)),
            keepalive_timeout: Duration::from_secs(20),
            drain_deadline: Duration::from_secs(5),
            server_handshake_timeout: Duration::from_secs(5),
        }
    }
}

impl H2Settings {
    pub(crate) fn client_builder(&self) -> h2::client::Builder {
        let mut b = h2::client::Builder::new();
        b.initial_window_size(self.stream_window)
            .initial_connection_window_size(self.connection_window)
            .max_frame_size(self.max_frame_size)
            .max_header_list_size(self.client_max_header_list_size)
            .max_send_buffer_size(self.client_max_send_buffer)
            .initial_max_send_streams(self.client_initial_max_send_streams)
            .enable_push(false);
        b
    }

    pub(crate) fn server_builder(&self) -> h2::server::Builder {
        let mut b = h2::server::Builder::new();
        b.initial_window_size(self.stream_window)
            .initial_connection_window_size(self.connection_window)
            .max_frame_size(self.max_frame_size)
            .max_header_list_size(self.server_max_header_list_size)
            .max_concurrent_streams(self.server_max_concurrent_streams)
            .max_send_buffer_size(self.server_max_send_buffer);
        b
    }
}
