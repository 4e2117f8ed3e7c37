//! Bidirectional copy between a plain byte stream (the application's TCP socket) and an
//! HBONE tunnel, tuned for the data path.
//!
//! - Half-close propagates both ways: EOF from the socket becomes END_STREAM; the peer's
//!   END_STREAM becomes `shutdown()` (FIN) on the socket; the other direction keeps going.
//! - Socket → tunnel reads into a *per-thread* read arena and hands h2 zero-copy slices of
//!   it; tunnel → socket writes h2's received chunks directly, without an intermediate copy.
//!   A connection owns no read buffer of its own: an idle connection (the common case: most
//!   proxied connections sit idle most of the time) holds no data buffer at all, only the
//!   chunks h2 has not sent yet.
//! - Reads are sized by how much the flow has moved: up to 4 KiB at first (small reads for
//!   chatty exchanges), 16 KiB after 64 KiB and 256 KiB when a flow proves to be bulk
//!   (1 MiB), so large transfers move in big frames without per-chunk allocation. Each size
//!   has its own arena, so small flows never pin a 256 KiB block.

use std::cell::{Cell, RefCell};
use std::fmt;
use std::future::{Future, poll_fn};
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use bytes::{Buf, Bytes, BytesMut};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite};

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

/// Socket → tunnel. Holds no read buffer between polls (see [`Arenas`]).
#[derive(Default)]
struct Upstream {
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
            let tier = Tier::for_total(self.total);
            match ready!(read_into_arena(tier, cx, socket, usize::MAX))
                .map_err(|e| (CopySide::Socket, e))?
            {
                None => self.eof = true,
                Some(chunk) => {
                    self.total += chunk.len() as u64;
                    self.pending = chunk;
                }
            }
        }
    }
}

/// Read size class of a flow.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Tier {
    Tiny = 0,
    Small = 1,
    Large = 2,
}

impl Tier {
    fn for_total(total: u64) -> Self {
        // Most connections are small and then sit idle for a long time: small reads keep
        // the blocks their in-flight chunks pin small; flows that keep going earn bigger
        // reads.
        if total >= BULK_THRESHOLD {
            Tier::Large
        } else if total >= CHATTY_THRESHOLD {
            Tier::Small
        } else {
            Tier::Tiny
        }
    }

    fn block_size(self) -> usize {
        match self {
            Tier::Tiny => TINY_BUF,
            Tier::Small => SMALL_BUF,
            Tier::Large => LARGE_BUF,
        }
    }
}

/// The read arenas of one thread, one per [`Tier`].
///
/// Every copy running on the thread reads into the free tail of the arena of its tier and
/// splits what it read off as a frozen [`Bytes`] (zero-copy, handed to h2); the rest of the
/// block stays here for the next read, by any connection. The buffer is only borrowed for
/// the duration of one `poll_read` call, so a connection waiting for data holds none, and a
/// thread needs one block per tier however many connections it serves.
///
/// The free space is the block's spare *capacity* (its length is always 0 between reads),
/// read into uninitialised through tokio's `read_buf`, so no byte is zeroed first (zeroing
/// each new 256 KiB block was 4.4 % of the data path's samples). When the spare capacity
/// gets short, a new block is reserved: `BytesMut::reserve` reclaims the old block in place
/// once h2 has dropped every chunk split from it (the common case for a steady flow),
/// otherwise the old block is freed when its last chunk is.
struct Arenas {
    blocks: [BytesMut; 3],
}

thread_local! {
    static ARENAS: RefCell<Arenas> = RefCell::new(Arenas {
        blocks: [BytesMut::new(), BytesMut::new(), BytesMut::new()],
    });
    /// Blocks (re)filled by this thread's arenas; see [`arena_refills`].
    static REFILLS: Cell<u64> = const { Cell::new(0) };
}

/// Takes the current thread's block for `tier` out of the arena, empty and with a worthwhile
/// amount of spare capacity. Taking (rather than borrowing) keeps the thread-local unborrowed
/// while foreign code (`poll_read`) runs.
fn take_block(tier: Tier) -> BytesMut {
    let mut block = ARENAS
        .try_with(|a| std::mem::take(&mut a.borrow_mut().blocks[tier as usize]))
        .unwrap_or_default();
    block.clear();
    let target = tier.block_size();
    if block.capacity() < target / 4 {
        block.reserve(target);
        let _ = REFILLS.try_with(|r| r.set(r.get() + 1));
    }
    block
}

/// Puts a block back for the next read on this thread. If a nested read put one back in the
/// meantime (no such caller today), the one with more space is kept.
fn return_block(tier: Tier, block: BytesMut) {
    let _ = ARENAS.try_with(|a| {
        let slot = &mut a.borrow_mut().blocks[tier as usize];
        if block.capacity() > slot.capacity() {
            *slot = block;
        }
    });
}

/// A first flight sent ahead of the CONNECT's response ([`crate::client::EarlyData`]),
/// at most `max` bytes: read like the copy's first reads, so it costs what they cost.
pub(crate) fn read_first_flight<S>(
    cx: &mut Context<'_>,
    socket: &mut S,
    max: usize,
) -> Poll<io::Result<Option<Bytes>>>
where
    S: AsyncRead + Unpin + ?Sized,
{
    read_into_arena(Tier::Tiny, cx, socket, max)
}

/// Reads once, at most `max` bytes, from `socket` into the thread's arena for `tier`.
/// `Some(chunk)` with at least one byte, `None` at EOF.
fn read_into_arena<S>(
    tier: Tier,
    cx: &mut Context<'_>,
    socket: &mut S,
    max: usize,
) -> Poll<io::Result<Option<Bytes>>>
where
    S: AsyncRead + Unpin + ?Sized,
{
    let mut block = take_block(tier);
    // One poll of tokio's `read_buf` future: it reads into the block's uninitialised spare
    // capacity and advances its length by what was read (the safe counterpart of
    // `ReadBuf::uninit` + `set_len`). Dropping it after a `Pending` poll is harmless: it
    // holds nothing but the two borrows.
    let polled = {
        let mut room = bytes::BufMut::limit(&mut block, max);
        let read = socket.read_buf(&mut room);
        std::pin::pin!(read).poll(cx)
    };
    let out = match polled {
        Poll::Ready(Ok(0)) => Poll::Ready(Ok(None)),
        Poll::Ready(Ok(n)) => Poll::Ready(Ok(Some(block.split_to(n).freeze()))),
        Poll::Ready(Err(e)) => Poll::Ready(Err(e)),
        Poll::Pending => Poll::Pending,
    };
    return_block(tier, block);
    out
}

/// How many read blocks the current thread's arenas have filled so far: a new connection
/// does not cost one; only the volume read on the thread does (one block per ~¾ block size
/// read while earlier chunks are still in flight).
pub fn arena_refills() -> u64 {
    REFILLS.try_with(Cell::get).unwrap_or(0)
}

/// Bytes of free read space the current thread's arenas hold (at most one block per size
/// class, whatever the number of connections).
pub fn arena_free_bytes() -> usize {
    ARENAS
        .try_with(|a| a.borrow().blocks.iter().map(BytesMut::capacity).sum())
        .unwrap_or(0)
}

/// Which of the two streams of [`copy_streams`] failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StreamEnd {
    /// The first argument (`a`).
    First,
    /// The second argument (`b`).
    Second,
}

impl fmt::Display for StreamEnd {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            StreamEnd::First => "first",
            StreamEnd::Second => "second",
        })
    }
}

/// A [`copy_streams`] that ended with an I/O error on one of its streams.
#[derive(Debug, thiserror::Error)]
#[error("{end} stream failed while copying ({} bytes to the second, {} to the first)", written.0, written.1)]
pub struct StreamsCopyError {
    pub end: StreamEnd,
    /// Bytes written to `b` and to `a` before the failure (for metrics).
    pub written: (u64, u64),
    #[source]
    pub source: io::Error,
}

/// Copies both ways between two plain byte streams (a client socket and an upstream
/// connection, for non-HBONE traffic) until both directions have seen EOF, propagating
/// half-close (EOF on one side becomes `shutdown()` of the other). Reads go through the same
/// per-thread arenas as [`copy_bidirectional`], so an idle connection holds no buffer.
/// Returns the bytes written to `b` and to `a`; an error says which stream failed.
pub async fn copy_streams<A, B>(a: &mut A, b: &mut B) -> Result<(u64, u64), StreamsCopyError>
where
    A: AsyncRead + AsyncWrite + Unpin + ?Sized,
    B: AsyncRead + AsyncWrite + Unpin + ?Sized,
{
    use StreamEnd::{First, Second};
    let mut a_to_b = Pipe::default();
    let mut b_to_a = Pipe::default();
    poll_fn(|cx| {
        let fail = |end, source, a_to_b: &Pipe, b_to_a: &Pipe| {
            Poll::Ready(Err(StreamsCopyError {
                end,
                written: (a_to_b.written, b_to_a.written),
                source,
            }))
        };
        let a_done = match a_to_b.poll(cx, &mut *a, &mut *b) {
            Poll::Ready(Err((op, e))) => {
                let end = if op == PipeOp::Read { First } else { Second };
                return fail(end, e, &a_to_b, &b_to_a);
            }
            p => p.is_ready(),
        };
        let b_done = match b_to_a.poll(cx, &mut *b, &mut *a) {
            Poll::Ready(Err((op, e))) => {
                let end = if op == PipeOp::Read { Second } else { First };
                return fail(end, e, &a_to_b, &b_to_a);
            }
            p => p.is_ready(),
        };
        if a_done && b_done {
            Poll::Ready(Ok((a_to_b.written, b_to_a.written)))
        } else {
            Poll::Pending
        }
    })
    .await
}

/// Which half of a [`Pipe`] failed: reading its source or writing its sink.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum PipeOp {
    Read,
    Write,
}

/// One direction of [`copy_streams`].
#[derive(Default)]
struct Pipe {
    /// Read, not yet written.
    pending: Bytes,
    read: u64,
    written: u64,
    need_flush: bool,
    eof: bool,
    done: bool,
}

impl Pipe {
    fn poll<R, W>(
        &mut self,
        cx: &mut Context<'_>,
        from: &mut R,
        to: &mut W,
    ) -> Poll<Result<(), (PipeOp, io::Error)>>
    where
        R: AsyncRead + Unpin + ?Sized,
        W: AsyncWrite + Unpin + ?Sized,
    {
        let write = |e| (PipeOp::Write, e);
        loop {
            if self.done {
                return Poll::Ready(Ok(()));
            }
            if !self.pending.is_empty() {
                let n = ready!(Pin::new(&mut *to).poll_write(cx, &self.pending)).map_err(write)?;
                if n == 0 {
                    return Poll::Ready(Err(write(io::ErrorKind::WriteZero.into())));
                }
                self.pending.advance(n);
                self.written += n as u64;
                self.need_flush = true;
                continue;
            }
            if self.eof {
                ready!(Pin::new(&mut *to).poll_shutdown(cx)).map_err(write)?;
                self.done = true;
                continue;
            }
            match read_into_arena(Tier::for_total(self.read), cx, from, usize::MAX) {
                Poll::Ready(Ok(Some(chunk))) => {
                    self.read += chunk.len() as u64;
                    self.pending = chunk;
                }
                Poll::Ready(Ok(None)) => self.eof = true,
                Poll::Ready(Err(e)) => return Poll::Ready(Err((PipeOp::Read, e))),
                Poll::Pending => {
                    if self.need_flush {
                        ready!(Pin::new(&mut *to).poll_flush(cx)).map_err(write)?;
                        self.need_flush = false;
                    }
                    return Poll::Pending;
                }
            }
        }
    }
}

/// Advances `chunk` past `n` written bytes, letting go of its buffer once all of it is
/// written: an empty [`Bytes`] left by `advance` still holds its allocation (h2's read
/// buffer, shared with the frames around it), and an idle connection would keep it for
/// as long as it stays open.
pub(crate) fn consume(chunk: &mut Bytes, n: usize) {
    chunk.advance(n);
    if chunk.is_empty() {
        *chunk = Bytes::new();
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
                consume(&mut self.chunk, n);
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

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};

    use bytes::Bytes;

    use super::consume;

    /// A buffer that says when it is freed.
    struct Owner(Vec<u8>, Arc<AtomicBool>);

    impl AsRef<[u8]> for Owner {
        fn as_ref(&self) -> &[u8] {
            &self.0
        }
    }

    impl Drop for Owner {
        fn drop(&mut self) {
            self.1.store(true, Ordering::SeqCst);
        }
    }

    #[test]
    fn a_written_chunk_lets_go_of_its_buffer_only_once_all_of_it_is_written() {
        // (write sizes, freed after the last)
        let cases: &[(&[usize], bool)] =
            &[(&[10], true), (&[4, 6], true), (&[4], false), (&[0], false)];
        for (writes, freed) in cases {
            let flag = Arc::new(AtomicBool::new(false));
            let mut chunk = Bytes::from_owner(Owner(vec![1; 10], flag.clone()));
            for n in *writes {
                consume(&mut chunk, *n);
            }
            assert_eq!(flag.load(Ordering::SeqCst), *freed, "{writes:?}");
            assert_eq!(chunk.len(), 10 - writes.iter().sum::<usize>(), "{writes:?}");
        }
    }
}
