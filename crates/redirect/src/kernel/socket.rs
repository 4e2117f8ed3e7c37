//! One netlink request and its replies, bounded in time and size.

use std::fmt::Debug;
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
            self.buf.clear();
            let n = self
                .sock
                .recv(&mut self.buf, 0)
                .map_err(|source| KernelError::Io { what, source })?;
            if n >= RECV_BUF {
                return Err(decode(what, "reply filled the receive buffer"));
            }
            let mut at = 0;
            while at < self.buf.len() {
                let msg = NetlinkMessage::<T>::deserialize(&self.buf[at..])
                    .map_err(|e| decode(what, e))?;
                let len = msg.header.length as usize;
                if len == 0 {
                    return Err(decode(what, "zero-length message"));
                }
                at += len.next_multiple_of(4);
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
            self.buf.clear();
            let n = self
                .sock
                .recv(&mut self.buf, 0)
                .map_err(|source| KernelError::Io { what, source })?;
            if n >= RECV_BUF {
                return Err(decode(what, "reply filled the receive buffer"));
            }
            let mut at = 0;
            while at < self.buf.len() {
                let msg = NetlinkMessage::<T>::deserialize(&self.buf[at..])
                    .map_err(|e| decode(what, e))?;
                let len = msg.header.length as usize;
                if len == 0 {
                    return Err(decode(what, "zero-length message"));
                }
                at += len.next_multiple_of(4);
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
}

fn decode(what: &'static str, detail: impl ToString) -> KernelError {
    KernelError::Decode {
        what,
        detail: detail.to_string(),
    }
}
