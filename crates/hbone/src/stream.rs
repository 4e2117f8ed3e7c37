//! [`H2Stream`]: one CONNECT tunnel as a byte stream.
//!
//! Writes go through h2's send flow control: data is only handed to h2 once the stream has
//! been assigned capacity, so a slow peer back-pressures the writer instead of growing an
//! unbounded buffer. Reads release flow-control capacity as chunks are taken from h2.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use bytes::{Bytes, BytesMut};
use h2::{RecvStream, SendStream};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use crate::pool::Lease;

/// Largest chunk handed to h2 in one `send_data`; bigger writes are split. Bounded so one
/// stream cannot reserve the whole connection window at once.
const MAX_SEND_CHUNK: usize = 1024 * 1024;

/// A bidirectional byte stream over an established HTTP/2 CONNECT tunnel.
///
/// `shutdown()` sends END_STREAM (the TCP half-close equivalent); reading returns EOF when
/// the peer's END_STREAM arrives. Dropping the stream before both directions are closed
/// resets it (RST_STREAM CANCEL), which is what h2 does for abandoned streams.
#[derive(Debug)]
pub struct H2Stream {
    send: SendStream<Bytes>,
    recv: RecvStream,
    /// Received data not yet consumed by a reader.
    read_pending: Bytes,
    /// Staging buffer for `poll_write`: its allocation is reused once h2 has written and
    /// dropped the previous chunk, so steady-state writes do not allocate.
    write_buf: BytesMut,
    write_closed: bool,
    read_closed: bool,
    /// Keeps the pool's per-connection stream count until the stream is dropped.
    _lease: Option<Lease>,
}

impl H2Stream {
    pub(crate) fn new(send: SendStream<Bytes>, recv: RecvStream, lease: Option<Lease>) -> Self {
        Self {
            send,
            recv,
            read_pending: Bytes::new(),
            write_buf: BytesMut::new(),
            write_closed: false,
            read_closed: false,
            _lease: lease,
        }
    }

    /// Sends as much of `chunk` as the stream has capacity for, splitting it without
    /// copying. Ready once the whole chunk is handed to h2.
    pub(crate) fn poll_send_bytes(
        &mut self,
        cx: &mut Context<'_>,
        chunk: &mut Bytes,
    ) -> Poll<io::Result<()>> {
        while !chunk.is_empty() {
            let n = ready!(self.poll_capacity(cx, chunk.len()))?;
            let part = chunk.split_to(n.min(chunk.len()));
            self.send.send_data(part, false).map_err(h2_to_io)?;
        }
        Poll::Ready(Ok(()))
    }

    /// Waits until h2 has assigned at least one byte of send capacity; returns how much.
    fn poll_capacity(&mut self, cx: &mut Context<'_>, want: usize) -> Poll<io::Result<usize>> {
        if self.write_closed {
            return Poll::Ready(Err(io::Error::new(
                io::ErrorKind::BrokenPipe,
                "write after shutdown of the HBONE stream",
            )));
        }
        loop {
            let cap = self.send.capacity();
            if cap > 0 {
                return Poll::Ready(Ok(cap));
            }
            self.send.reserve_capacity(want.min(MAX_SEND_CHUNK));
            match ready!(self.send.poll_capacity(cx)) {
                Some(Ok(_)) => continue,
                Some(Err(e)) => return Poll::Ready(Err(h2_to_io(e))),
                // The stream can no longer send: the peer reset it or the connection died.
                None => {
                    return Poll::Ready(Err(io::Error::new(
                        io::ErrorKind::BrokenPipe,
                        "HBONE stream closed by peer",
                    )));
                }
            }
        }
    }

    /// Takes the next received chunk, releasing its flow-control capacity. `None` at EOF.
    pub(crate) fn poll_recv_bytes(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<io::Result<Option<Bytes>>> {
        if !self.read_pending.is_empty() {
            return Poll::Ready(Ok(Some(std::mem::take(&mut self.read_pending))));
        }
        if self.read_closed {
            return Poll::Ready(Ok(None));
        }
        loop {
            match ready!(self.recv.poll_data(cx)) {
                Some(Ok(chunk)) => {
                    // Released as soon as it leaves h2: we hold at most one chunk, so the
                    // window still bounds memory, and the peer is not stalled on us.
                    let _ = self.recv.flow_control().release_capacity(chunk.len());
                    if chunk.is_empty() {
                        continue;
                    }
                    return Poll::Ready(Ok(Some(chunk)));
                }
                Some(Err(e)) => return Poll::Ready(Err(h2_to_io(e))),
                None => {
                    self.read_closed = true;
                    return Poll::Ready(Ok(None));
                }
            }
        }
    }

    /// Sends END_STREAM. Idempotent.
    pub(crate) fn close_write(&mut self) -> io::Result<()> {
        if self.write_closed {
            return Ok(());
        }
        self.write_closed = true;
        self.send.send_data(Bytes::new(), true).map_err(h2_to_io)
    }
}

/// Maps h2 errors onto io kinds callers act on: a reset or GOAWAY is a reset connection.
pub(crate) fn h2_to_io(e: h2::Error) -> io::Error {
    if e.is_io() {
        return e
            .into_io()
            .unwrap_or_else(|| io::Error::other("h2 io error"));
    }
    let kind = if e.is_reset() || e.is_go_away() {
        io::ErrorKind::ConnectionReset
    } else {
        io::ErrorKind::Other
    };
    io::Error::new(kind, e)
}

impl AsyncRead for H2Stream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if buf.remaining() == 0 {
            return Poll::Ready(Ok(()));
        }
        let Some(mut chunk) = ready!(this.poll_recv_bytes(cx))? else {
            return Poll::Ready(Ok(()));
        };
        let n = chunk.len().min(buf.remaining());
        buf.put_slice(&chunk[..n]);
        crate::copy::consume(&mut chunk, n);
        this.read_pending = chunk;
        Poll::Ready(Ok(()))
    }
}

impl AsyncWrite for H2Stream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        if buf.is_empty() {
            return Poll::Ready(Ok(0));
        }
        let cap = ready!(this.poll_capacity(cx, buf.len()))?;
        let n = cap.min(buf.len());
        this.write_buf.reserve(n);
        this.write_buf.extend_from_slice(&buf[..n]);
        let chunk = this.write_buf.split().freeze();
        this.send.send_data(chunk, false).map_err(h2_to_io)?;
        Poll::Ready(Ok(n))
    }

    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        // h2 flushes frames from the connection task; there is nothing buffered here.
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(self.get_mut().close_write())
    }
}
