//! One netlink request and its replies, bounded in time and size.

use std::fmt::Debug;
use std::marker::PhantomData;
use std::time::Duration;

use netlink_packet_core::{
    NLM_F_ACK, NLM_F_DUMP, NLM_F_DUMP_INTR, NLM_F_REQUEST, NetlinkDeserializable, NetlinkHeader,
    NetlinkMessage, NetlinkPayload, NetlinkSerializable,
};
use netlink_sys::Socket;

use super::KernelError;

/// How long the kernel may take to answer one receive. Dumps of a pod's few rules take
/// microseconds; the deadline only bounds a wedged kernel path.
const RECV_TIMEOUT: Duration = Duration::from_secs(2);

/// Messages one dump may return. A pod holds a few dozen rules and routes; a namespace
/// with more than this is not one we wrote, and the rule tools decide about it.
pub(crate) const MAX_MESSAGES: usize = 4096;

/// A receive buffer. Netlink never splits a message across datagrams, and the kernel
/// sizes dump datagrams to at most this much (it grows them only for a message larger
/// than a page, which our objects never are); a full buffer is treated as truncation.
const RECV_BUF: usize = 64 * 1024;

/// A netlink socket of one protocol in the calling thread's namespace.
#[derive(Debug)]
pub(crate) struct Netlink {
    sock: Socket,
    seq: u32,
    buf: Vec<u8>,
}

impl Netlink {
    /// Opens and binds a socket of `protocol` (`netlink_sys::protocols::*`).
    pub(crate) fn open(protocol: isize) -> Result<Self, KernelError> {
        let io = |what| move |source| KernelError::Io { what, source };
        let mut sock = Socket::new(protocol).map_err(io("socket"))?;
        sock.bind_auto().map_err(io("bind"))?;
        socket2::SockRef::from(&sock)
            .set_read_timeout(Some(RECV_TIMEOUT))
            .map_err(io("SO_RCVTIMEO"))?;
        Ok(Self {
            sock,
            seq: 0,
            buf: Vec::with_capacity(RECV_BUF),
        })
    }

    /// Sends `msg` as a dump request and collects every reply until `NLMSG_DONE`.
    pub(crate) fn dump<T>(&mut self, what: &'static str, msg: T) -> Result<Vec<T>, KernelError>
    where
        T: NetlinkSerializable + NetlinkDeserializable + Debug,
    {
        self.request(what, msg, NLM_F_DUMP, MAX_MESSAGES)
    }

    /// [`Self::dump`] with its own bound on the number of replies.
    pub(crate) fn dump_max<T>(
        &mut self,
        what: &'static str,
        msg: T,
        limit: usize,
    ) -> Result<Vec<T>, KernelError>
    where
        T: NetlinkSerializable + NetlinkDeserializable + Debug,
    {
        self.request(what, msg, NLM_F_DUMP, limit)
    }

    /// Sends `msg` with an ack request and returns the replies before the ack.
    pub(crate) fn get<T>(&mut self, what: &'static str, msg: T) -> Result<Vec<T>, KernelError>
    where
        T: NetlinkSerializable + NetlinkDeserializable + Debug,
    {
        self.request(what, msg, NLM_F_ACK, MAX_MESSAGES)
    }

    /// Sends `msgs` between `begin` and `end` as one nfnetlink batch in one datagram (the
    /// kernel commits all or none), each with an ack request and its own extra `flags`;
    /// returns when every message was acknowledged, or with the first refusal.
    pub(crate) fn batch<T>(
        &mut self,
        what: &'static str,
        begin: T,
        msgs: Vec<(T, u16)>,
        end: T,
    ) -> Result<(), KernelError>
    where
        T: NetlinkSerializable + NetlinkDeserializable + Debug,
    {
        let mut out = Vec::new();
        let framed = std::iter::once((begin, 0))
            .chain(msgs.into_iter().map(|(m, f)| (m, f | NLM_F_ACK)))
            .chain(std::iter::once((end, 0)));
        let mut acks = Vec::new();
        for (m, flags) in framed {
            self.seq = self.seq.wrapping_add(1);
            let mut req =
                NetlinkMessage::new(NetlinkHeader::default(), NetlinkPayload::InnerMessage(m));
            req.header.flags = NLM_F_REQUEST | flags;
            req.header.sequence_number = self.seq;
            req.finalize();
            let at = out.len();
            out.resize(at + req.buffer_len().next_multiple_of(4), 0);
            req.serialize(&mut out[at..at + req.buffer_len()]);
            if flags & NLM_F_ACK != 0 {
                acks.push(self.seq);
            }
        }
        self.sock
            .send(&out, 0)
            .map_err(|source| KernelError::Io { what, source })?;
        let mut pending: std::collections::BTreeSet<u32> = acks.into_iter().collect();
        while !pending.is_empty() {
            for msg in self.receive::<T>(what)? {
                let msg = msg?;
                if !pending.remove(&msg.header.sequence_number) {
                    continue;
                }
                if let NetlinkPayload::Error(e) = msg.payload
                    && let Some(code) = e.code
                {
                    return Err(KernelError::Refused {
                        what,
                        code: code.get(),
                    });
                }
            }
        }
        Ok(())
    }

    fn request<T>(
        &mut self,
        what: &'static str,
        msg: T,
        flags: u16,
        limit: usize,
    ) -> Result<Vec<T>, KernelError>
    where
        T: NetlinkSerializable + NetlinkDeserializable + Debug,
    {
        self.seq = self.seq.wrapping_add(1);
        let seq = self.seq;
        let mut req =
            NetlinkMessage::new(NetlinkHeader::default(), NetlinkPayload::InnerMessage(msg));
        req.header.flags = NLM_F_REQUEST | flags;
        req.header.sequence_number = seq;
        req.finalize();
        let mut out = vec![0u8; req.buffer_len()];
        req.serialize(&mut out);
        self.sock
            .send(&out, 0)
            .map_err(|source| KernelError::Io { what, source })?;
        let mut replies = Vec::new();
        loop {
            for msg in self.receive::<T>(what)? {
                let msg = msg?;
                if msg.header.sequence_number != seq {
                    // A late answer to an earlier request on this socket.
                    continue;
                }
                if msg.header.flags & NLM_F_DUMP_INTR != 0 {
                    return Err(KernelError::Interrupted { what });
                }
                match msg.payload {
                    NetlinkPayload::Done(_) => return Ok(replies),
                    NetlinkPayload::Error(e) => {
                        return match e.code {
                            None => Ok(replies),
                            Some(code) => Err(KernelError::Refused {
                                what,
                                code: code.get(),
                            }),
                        };
                    }
                    NetlinkPayload::InnerMessage(m) => {
                        if replies.len() == limit {
                            return Err(KernelError::TooLarge { what, limit });
                        }
                        replies.push(m);
                    }
                    _ => {}
                }
            }
        }
    }

    /// Receives one datagram into the bounded buffer and returns its messages, in order
    /// (every sequence number: callers pick theirs). A full buffer is refused as
    /// truncation; a message that does not parse, or claims zero length, ends the
    /// datagram with an error.
    fn receive<T: NetlinkDeserializable>(
        &mut self,
        what: &'static str,
    ) -> Result<Messages<'_, T>, KernelError> {
        self.buf.clear();
        let n = self
            .sock
            .recv(&mut self.buf, 0)
            .map_err(|source| KernelError::Io { what, source })?;
        if n >= RECV_BUF {
            return Err(decode(what, "reply filled the receive buffer"));
        }
        Ok(Messages {
            rest: &self.buf,
            what,
            _kind: PhantomData,
        })
    }
}

/// The messages of one received datagram (see [`Netlink::receive`]).
struct Messages<'a, T> {
    /// What is left to split, starting at a message boundary.
    rest: &'a [u8],
    what: &'static str,
    _kind: PhantomData<fn() -> T>,
}

impl<T: NetlinkDeserializable> Iterator for Messages<'_, T> {
    type Item = Result<NetlinkMessage<T>, KernelError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.rest.is_empty() {
            return None;
        }
        let parsed = NetlinkMessage::<T>::deserialize(self.rest)
            .map_err(|e| decode(self.what, e))
            .and_then(|msg| match msg.header.length as usize {
                0 => Err(decode(self.what, "zero-length message")),
                len => Ok((msg, len.next_multiple_of(4))),
            });
        match parsed {
            Ok((msg, step)) => {
                self.rest = self.rest.get(step..).unwrap_or_default();
                Some(Ok(msg))
            }
            Err(e) => {
                self.rest = &[];
                Some(Err(e))
            }
        }
    }
}

fn decode(what: &'static str, detail: impl ToString) -> KernelError {
    KernelError::Decode {
        what,
        detail: detail.to_string(),
    }
}
