//! Bidirectional copy between a plain byte stream (the application's TCP socket) and an
//! HBONE tunnel, tuned for the data path.
//!
//! - Half-close propagates both ways: EOF from the socket becomes END_STREAM; the peer's
//!   END_STREAM becomes `shutdown()` (FIN) on the socket; the other direction keeps going.
//! - Socket → tunnel reads into one reusable buffer and hands h2 zero-copy slices of it;
//!   tunnel → socket writes h2's received chunks directly, without an intermediate copy.
//! - The read buffer starts at 4 KiB (cheap for the many small, mostly idle connections),
//!   grows to 16 KiB after 64 KiB and to 256 KiB when a flow proves to be bulk (1 MiB), so
//!   large transfers move in big frames without per-chunk allocation.

use std::fmt;
use std::future::poll_fn;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use bytes::{Buf, Bytes, BytesMut};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use crate::stream::H2Stream;

const TINY_BUF: usize = 4 * 1024;
const SMALL_BUF: usize = 16 * 1024;
const LARGE_BUF: usize = 256 * 1024;
/// Bytes moved in one direction after which a flow is more than a chatty exchange.
const CHATTY_THRESHOLD: u64 = 64 * 1024;
/// Bytes moved in one direction after which the flow counts as bulk.
const BULK_THRESHOLD: u64 = 1024 * 1024;

/// Bytes moved by [`copy_bidirectional`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Transferred {
    /// From the local socket into the tunnel.
    pub to_tunnel: u64,
    /// From the tunnel to the local socket.
    pub from_tunnel: u64,
}

/// Which end of the copy failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CopySide {
    /// The local byte stream (application socket or upstream connection).
    Socket,
    /// The HBONE tunnel (the remote peer or its HTTP/2 connection).
    Tunnel,
}

impl fmt::Display for CopySide {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            CopySide::Socket => "socket",
            CopySide::Tunnel => "tunnel",
        })
    }
}

/// A copy that ended with an I/O error on one side.
#[derive(Debug, thiserror::Error)]
#[error("{side} side failed while copying ({} bytes to tunnel, {} from tunnel)", transferred.to_tunnel, transferred.from_tunnel)]
pub struct CopyError {
    pub side: CopySide,
    /// What had been moved before the failure (for metrics).
    pub transferred: Transferred,
    #[source]
    pub source: io::Error,
}

/// Copies both ways between `socket` and `tunnel` until both directions have seen EOF.
pub async fn copy_bidirectional<S>(
    socket: &mut S,
    tunnel: &mut H2Stream,
) -> Result<Transferred, CopyError>
where
    S: AsyncRead + AsyncWrite + Unpin + ?Sized,
{
    let mut up = Upstream::default();
    let mut down = Downstream::default();
    poll_fn(|cx| {
        let fail = |side, source, up: &Upstream, down: &Downstream| {
            let transferred = Transferred {
                to_tunnel: up.total,
                from_tunnel: down.total,
            };
            Poll::Ready(Err(CopyError {
                side,
                transferred,
                source,
            }))
        };
        let up_done = match up.poll(cx, &mut *socket, tunnel) {
            Poll::Ready(Err((side, e))) => return fail(side, e, &up, &down),
            Poll::Ready(Ok(())) => true,
            Poll::Pending => false,
        };
        let down_done = match down.poll(cx, tunnel, &mut *socket) {
            Poll::Ready(Err((side, e))) => return fail(side, e, &up, &down),
            Poll::Ready(Ok(())) => true,
            Poll::Pending => false,
        };
        if up_done && down_done {
            Poll::Ready(Ok(Transferred {
                to_tunnel: up.total,
                from_tunnel: down.total,
            }))
        } else {
            Poll::Pending
        }
    })
    .await
}

type SideResult = Result<(), (CopySide, io::Error)>;

/// Socket → tunnel.
#[derive(Default)]
struct Upstream {
    /// Initialised, unused buffer space; reads land here and are split off zero-copy.
    buf: BytesMut,
    /// Read from the socket, not yet accepted by h2 (waiting for send capacity).
    pending: Bytes,
    eof: bool,
    done: bool,
    total: u64,
}

impl Upstream {
    fn poll<S>(
        &mut self,
        cx: &mut Context<'_>,
        socket: &mut S,
        tunnel: &mut H2Stream,
    ) -> Poll<SideResult>
    where
        S: AsyncRead + Unpin + ?Sized,
    {
        loop {
            if self.done {
                return Poll::Ready(Ok(()));
            }
            if !self.pending.is_empty() {
                ready!(tunnel.poll_send_bytes(cx, &mut self.pending))
                    .map_err(|e| (CopySide::Tunnel, e))?;
                continue;
            }
            if self.eof {
                tunnel.close_write().map_err(|e| (CopySide::Tunnel, e))?;
                self.done = true;
                continue;
            }
            self.refill();
            let mut rb = ReadBuf::new(&mut self.buf[..]);
            ready!(Pin::new(&mut *socket).poll_read(cx, &mut rb))
                .map_err(|e| (CopySide::Socket, e))?;
            let n = rb.filled().len();
            if n == 0 {
                self.eof = true;
            } else {
                self.total += n as u64;
                self.pending = self.buf.split_to(n).freeze();
            }
        }
    }

    /// Makes sure a worthwhile amount of initialised space is available to read into.
    /// Reserving reclaims the old allocation once h2 has dropped every chunk split from
    /// it, so a steady flow reuses one buffer; zero-filling (`resize`) is the price of
    /// staying in safe code and is paid once per byte of buffer, not per read.
    fn refill(&mut self) {
        // Most connections are small and then sit idle for a long time: a 4 KiB buffer keeps
        // their memory low; flows that keep going earn bigger reads.
        let target = if self.total >= BULK_THRESHOLD {
            LARGE_BUF
        } else if self.total >= CHATTY_THRESHOLD {
            SMALL_BUF
        } else {
            TINY_BUF
        };
        if self.buf.len() >= target / 4 {
            return;
        }
        self.buf.clear();
        self.buf.reserve(target);
        self.buf.resize(target, 0);
    }
}

/// Tunnel → socket.
#[derive(Default)]
struct Downstream {
    chunk: Bytes,
    need_flush: bool,
    eof: bool,
    done: bool,
    total: u64,
}

impl Downstream {
    fn poll<S>(
        &mut self,
        cx: &mut Context<'_>,
        tunnel: &mut H2Stream,
        socket: &mut S,
    ) -> Poll<SideResult>
    where
        S: AsyncWrite + Unpin + ?Sized,
    {
        let sock = |e| (CopySide::Socket, e);
        loop {
            if self.done {
                return Poll::Ready(Ok(()));
            }
            if !self.chunk.is_empty() {
                let n = ready!(Pin::new(&mut *socket).poll_write(cx, &self.chunk)).map_err(sock)?;
                if n == 0 {
                    return Poll::Ready(Err(sock(io::ErrorKind::WriteZero.into())));
                }
                self.chunk.advance(n);
                self.total += n as u64;
                self.need_flush = true;
                continue;
            }
            if self.eof {
                // shutdown flushes first (for TLS it also sends close_notify).
                ready!(Pin::new(&mut *socket).poll_shutdown(cx)).map_err(sock)?;
                self.done = true;
                continue;
            }
            match tunnel.poll_recv_bytes(cx) {
                Poll::Ready(Ok(Some(chunk))) => self.chunk = chunk,
                Poll::Ready(Ok(None)) => self.eof = true,
                Poll::Ready(Err(e)) => return Poll::Ready(Err((CopySide::Tunnel, e))),
                Poll::Pending => {
                    // Nothing more to write for now: push out anything a buffering writer
                    // (TLS) still holds, so the peer is not left waiting on us.
                    if self.need_flush {
                        ready!(Pin::new(&mut *socket).poll_flush(cx)).map_err(sock)?;
                        self.need_flush = false;
                    }
                    return Poll::Pending;
                }
            }
        }
    }
}
