//! [`ReadAhead`]: batches the small reads TLS makes from a socket into fewer, larger ones.
//!
//! rustls reads ciphertext into its own buffer, at most one TLS record (~16 KiB) per call,
//! and shrinks that buffer to 4 KiB whenever it has consumed everything, so a bulk HBONE
//! connection cost one `recvfrom` per record or more (50–60 per MB on the receiving
//! ztunnel, BENCHMARKS.md). Placed under TLS, this adapter reads as much as the socket has,
//! up to its capacity, in one call and serves rustls's reads from memory: ~12 `recvfrom` per
//! MB with 64 KiB, at the price of one user-space copy that costs less than the syscalls it
//! saves (measured, BENCHMARKS.md).
//!
//! The buffer is released as soon as a read drains a fill that did not fill it (the socket
//! had nothing more, i.e. the peer paused), so an idle connection holds no buffer; reads are
//! into uninitialised capacity (no zeroing). Reads at least as large as the capacity bypass
//! the buffer.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use bytes::{Buf, BufMut, BytesMut};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio_util::io::poll_read_buf;

/// A read-buffering wrapper around a TCP stream; writes pass through untouched (vectored
/// included).
#[derive(Debug)]
pub struct ReadAhead {
    inner: TcpStream,
    /// Read from `inner`, not yet handed to the reader. Empty (no allocation) while idle.
    buf: BytesMut,
    capacity: usize,
    /// The last fill drained the socket: free the buffer once it is consumed.
    shrink_when_empty: bool,
    fills: u64,
    empty_reads: u64,
}

impl ReadAhead {
    /// Wraps `inner`; `capacity` 0 passes every read through.
    pub fn new(inner: TcpStream, capacity: usize) -> Self {
        Self {
            inner,
            buf: BytesMut::new(),
            capacity,
            shrink_when_empty: false,
            fills: 0,
            empty_reads: 0,
        }
    }

    pub fn get_ref(&self) -> &TcpStream {
        &self.inner
    }

    /// Bytes read from the socket and not yet handed to the reader.
    pub fn buffered(&self) -> usize {
        self.buf.len()
    }

    /// Bytes of buffer allocated (0 while idle).
    pub fn allocated(&self) -> usize {
        self.buf.capacity()
    }

    /// Buffered reads from the socket so far.
    pub fn fills(&self) -> u64 {
        self.fills
    }

    /// Reads from the socket that found it empty (`EAGAIN`) so far: each is a wasted
    /// syscall.
    pub fn empty_reads(&self) -> u64 {
        self.empty_reads
    }

    /// Reads once from the socket into the buffer; `Ok(0)` at EOF. Allocates only once the
    /// socket is readable, and frees the buffer again when the socket had nothing after all.
    ///
    /// The read goes through the stream's `poll_read`, which also clears the socket's
    /// readiness after a short read (under edge-triggered epoll a short read drained the
    /// socket): the next fill then waits for the next edge instead of asking the socket
    /// once more for an `EAGAIN`. `try_read_buf` clears it only on `EAGAIN`, one wasted
    /// `recvfrom` per request on request/response traffic (BENCHMARKS.md).
    fn poll_fill(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<usize>> {
        ready!(self.inner.poll_read_ready(cx))?;
        // Reclaims the drained allocation in place (nothing else references it).
        self.buf.reserve(self.capacity);
        // Never more than the capacity, whatever the reclaimed allocation's size.
        let mut limited = (&mut self.buf).limit(self.capacity);
        match poll_read_buf(Pin::new(&mut self.inner), cx, &mut limited) {
            Poll::Ready(Ok(n)) => {
                self.fills += 1;
                // A short fill drained the socket: the peer may pause now, so the block
                // is not kept once consumed.
                self.shrink_when_empty = n < self.capacity;
                Poll::Ready(Ok(n))
            }
            Poll::Ready(Err(e)) => Poll::Ready(Err(e)),
            // Readiness was stale: the read found nothing (and registered the waker).
            // Wait again, holding nothing.
            Poll::Pending => {
                self.empty_reads += 1;
                self.buf = BytesMut::new();
                Poll::Pending
            }
        }
    }
}

impl AsyncRead for ReadAhead {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        out: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if this.buf.is_empty() {
            if this.capacity == 0 || out.remaining() >= this.capacity {
                return Pin::new(&mut this.inner).poll_read(cx, out);
            }
            if ready!(this.poll_fill(cx))? == 0 {
                this.buf = BytesMut::new();
                return Poll::Ready(Ok(()));
            }
        }
        let n = out.remaining().min(this.buf.len());
        out.put_slice(&this.buf[..n]);
        this.buf.advance(n);
        if this.buf.is_empty() && this.shrink_when_empty {
            this.buf = BytesMut::new();
            this.shrink_when_empty = false;
        }
        Poll::Ready(Ok(()))
    }
}

impl AsyncWrite for ReadAhead {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;

    async fn pair(capacity: usize) -> (ReadAhead, TcpStream) {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let peer = TcpStream::connect(l.local_addr().unwrap()).await.unwrap();
        let (ours, _) = l.accept().await.unwrap();
        (ReadAhead::new(ours, capacity), peer)
    }

    fn pattern(len: usize) -> Vec<u8> {
        (0..len).map(|i| (i % 251) as u8).collect()
    }

    #[tokio::test]
    async fn delivers_every_byte_in_order_in_fewer_socket_reads() {
        // (capacity, reader's read size): record-sized reads as rustls makes them, sizes
        // that do not divide the capacity, reads at least as large as the capacity (bypass).
        let cases = [
            (64 * 1024, 16 * 1024),
            (64 * 1024, 18 * 1024 + 5),
            (16 * 1024, 64 * 1024),
            (0, 16 * 1024),
        ];
        for (capacity, read_size) in cases {
            let (mut ra, mut peer) = pair(capacity).await;
            let data = pattern(4 << 20);
            let sent = data.clone();
            let writer = tokio::spawn(async move {
                peer.write_all(&sent).await.unwrap();
                peer.shutdown().await.unwrap();
            });
            let (mut got, mut reads) = (Vec::new(), 0u64);
            let mut chunk = vec![0; read_size];
            loop {
                let n = ra.read(&mut chunk).await.unwrap();
                if n == 0 {
                    break;
                }
                reads += 1;
                got.extend_from_slice(&chunk[..n]);
            }
            writer.await.unwrap();
            assert!(
                got == data,
                "capacity {capacity}, reads of {read_size}: data differs"
            );
            let case = format!("capacity {capacity}, reads of {read_size}");
            if capacity > read_size {
                // Each fill serves at least one read; while the peer keeps writing most
                // fills serve several.
                assert!(
                    ra.fills() < reads,
                    "{case}: {} fills for {reads} reads",
                    ra.fills()
                );
            } else {
                assert_eq!(ra.fills(), 0, "{case}: the buffer should be bypassed");
            }
            assert_eq!(
                (ra.buffered(), ra.allocated()),
                (0, 0),
                "{case}: holds memory at EOF"
            );
        }
    }

    #[tokio::test]
    async fn a_paused_peer_leaves_no_buffer_allocated() {
        let (mut ra, mut peer) = pair(64 * 1024).await;
        peer.write_all(b"hello").await.unwrap();
        let mut chunk = [0; 1024];
        assert_eq!(ra.read(&mut chunk).await.unwrap(), 5);
        assert_eq!(&chunk[..5], b"hello");
        // Nothing more comes: the read waits, holding no buffer.
        let waiting = tokio::time::timeout(Duration::from_millis(50), ra.read(&mut chunk)).await;
        assert!(waiting.is_err(), "read returned without data");
        assert_eq!(ra.allocated(), 0);
        peer.write_all(b"again").await.unwrap();
        assert_eq!(ra.read(&mut chunk).await.unwrap(), 5);
        assert_eq!(&chunk[..5], b"again");
    }

    #[tokio::test]
    async fn a_short_fill_is_not_followed_by_a_read_that_finds_nothing() {
        // A fill shorter than the capacity drained the socket (edge-triggered epoll): the
        // next read must wait for readiness instead of asking the socket again (`EAGAIN`),
        // one wasted syscall per request on request/response traffic (BENCHMARKS.md).
        let (mut ra, mut peer) = pair(64 * 1024).await;
        let mut chunk = [0; 1024];
        for round in 1..=3u64 {
            peer.write_all(b"request").await.unwrap();
            assert_eq!(ra.read(&mut chunk).await.unwrap(), 7);
            let waiting =
                tokio::time::timeout(Duration::from_millis(20), ra.read(&mut chunk)).await;
            assert!(
                waiting.is_err(),
                "round {round}: read returned without data"
            );
            assert_eq!(ra.fills(), round);
            assert_eq!(ra.empty_reads(), 0, "round {round}: a read found nothing");
        }
    }

    #[tokio::test]
    async fn writes_pass_through() {
        let (mut ra, mut peer) = pair(64 * 1024).await;
        ra.write_all(b"hello").await.unwrap();
        ra.flush().await.unwrap();
        let mut got = [0; 5];
        peer.read_exact(&mut got).await.unwrap();
        assert_eq!(&got, b"hello");
    }
}
