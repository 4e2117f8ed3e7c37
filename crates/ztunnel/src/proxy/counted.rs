//! A socket wrapper that feeds the connection's byte counters while data flows, so
//! `istio_tcp_{received,sent}_bytes_total` move during long-lived connections, not only at
//! the end.

use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use crate::telemetry::ConnectionGuard;

/// Wraps the *client-facing or app-facing* socket. `reads_are_requests` says whether bytes
/// read from it travel in the request direction (client → server).
pub struct Counted<'a, S> {
    inner: &'a mut S,
    guard: &'a ConnectionGuard,
    reads_are_requests: bool,
}

impl<'a, S> Counted<'a, S> {
    pub fn new(inner: &'a mut S, guard: &'a ConnectionGuard, reads_are_requests: bool) -> Self {
        Self {
            inner,
            guard,
            reads_are_requests,
        }
    }

    fn count(&self, n: usize, read: bool) {
        let n = n as u64;
        if n == 0 {
            return;
        }
        if read == self.reads_are_requests {
            self.guard.add_received(n);
        } else {
            self.guard.add_sent(n);
        }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Counted<'_, S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let r = Pin::new(&mut *self.inner).poll_read(cx, buf);
        let n = buf.filled().len().saturating_sub(before);
        self.count(n, true);
        r
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Counted<'_, S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let r = Pin::new(&mut *self.inner).poll_write(cx, buf);
        if let Poll::Ready(Ok(n)) = &r {
            self.count(*n, false);
        }
        r
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        let r = Pin::new(&mut *self.inner).poll_write_vectored(cx, bufs);
        if let Poll::Ready(Ok(n)) = &r {
            self.count(*n, false);
        }
        r
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut *self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut *self.inner).poll_shutdown(cx)
    }
}
