//! DNS wire format at the edge of the proxy: classifying a raw packet (answer locally,
//! forward, FORMERR or drop) and building our own responses. The only module that names
//! `hickory-proto`; forwarded packets are never re-encoded, so what we do not understand
//! still reaches the upstream server byte for byte.

use std::io;
use std::net::IpAddr;

use hickory_proto::op::{Edns, Header, Message, MessageType, OpCode, Query, ResponseCode};
use hickory_proto::rr::rdata::{A, AAAA, CNAME};
use hickory_proto::rr::{DNSClass, Name, RData, Record, RecordType};
use hickory_proto::serialize::binary::{BinDecodable, BinDecoder};
use tokio::io::{AsyncRead, AsyncReadExt};

use super::LOCAL_TTL;
use super::resolve::{Family, LocalAnswer};

/// Length of the fixed DNS header.
pub const HEADER_LEN: usize = 12;

/// The largest DNS message (UDP datagram payload or TCP frame).
pub const MAX_MESSAGE: usize = 65535;

/// The classic UDP payload limit for clients that do not send EDNS.
pub const MIN_UDP_PAYLOAD: usize = 512;

/// The UDP payload size we advertise in our own EDNS answers.
pub const OUR_UDP_PAYLOAD: u16 = 4096;

/// What to do with a packet.
#[derive(Debug)]
pub enum Classified {
    /// Too short to carry an id, or a response (answering would let two proxies loop).
    Drop,
    Request(Request),
}

/// A readable request.
#[derive(Debug)]
pub struct Request {
    pub header: Header,
    /// Empty when the question section could not be read.
    pub queries: Vec<Query>,
    pub edns: Option<Edns>,
    /// For metrics: the first question's type, or `unknown`.
    pub query_type: String,
    pub action: Action,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// An A/AAAA question we may be able to answer.
    Local { name: Name, family: Family },
    /// Anything else: relay to upstream unchanged.
    Forward,
    /// The question section is unreadable: FORMERR.
    FormErr,
}

/// Classifies a raw packet. Never panics on any input.
pub fn classify(raw: &[u8]) -> Classified {
    let mut decoder = BinDecoder::new(raw);
    let Ok(header) = Header::read(&mut decoder) else {
        return Classified::Drop;
    };
    if header.message_type() == MessageType::Response {
        return Classified::Drop;
    }
    let queries = Message::read_queries(&mut decoder, usize::from(header.query_count()));
    let query_type = queries
        .as_ref()
        .ok()
        .and_then(|q| q.first())
        .map_or_else(|| "unknown".to_string(), |q| q.query_type().to_string());
    // The additional section is only needed for EDNS; a request whose records we can not
    // decode is still forwarded (the upstream server may understand it).
    let full = Message::from_vec(raw).ok();
    let edns = full.and_then(|m| m.extensions().clone());
    let (queries, action) = match (header.op_code(), queries) {
        (OpCode::Query, Err(_)) => (Vec::new(), Action::FormErr),
        (_, Err(_)) => (Vec::new(), Action::Forward),
        (op, Ok(queries)) => {
            let action = local_question(op, &queries, edns.as_ref()).unwrap_or(Action::Forward);
            (queries, action)
        }
    };
    Classified::Request(Request {
        header,
        queries,
        edns,
        query_type,
        action,
    })
}

/// `Some` when the request is a plain single A/AAAA IN question.
fn local_question(op: OpCode, queries: &[Query], edns: Option<&Edns>) -> Option<Action> {
    // A future EDNS version must get BADVERS from a server that implements EDNS fully.
    if op != OpCode::Query || edns.is_some_and(|e| e.version() != 0) {
        return None;
    }
    let [q] = queries else { return None };
    if q.query_class() != DNSClass::IN {
        return None;
    }
    let family = match q.query_type() {
        RecordType::A => Family::V4,
        RecordType::AAAA => Family::V6,
        _ => return None,
    };
    Some(Action::Local {
        name: q.name().clone(),
        family,
    })
}

impl Request {
    /// The largest UDP response the client accepts.
    pub fn udp_limit(&self) -> usize {
        self.edns
            .as_ref()
            .map_or(MIN_UDP_PAYLOAD, |e| usize::from(e.max_payload()))
            .max(MIN_UDP_PAYLOAD)
    }

    fn response(&self, code: ResponseCode) -> Message {
        let mut header = Header::response_from_request(&self.header);
        header.set_response_code(code);
        // We recurse on the client's behalf (by forwarding), so recursion is available.
        header.set_recursion_available(true);
        let mut msg = Message::new();
        msg.set_header(header);
        msg.add_queries(self.queries.iter().cloned());
        if self.edns.is_some() {
            let mut edns = Edns::new();
            edns.set_max_payload(OUR_UDP_PAYLOAD);
            msg.set_edns(edns);
        }
        msg
    }

    /// An error response (SERVFAIL, FORMERR) echoing the question when we read it.
    pub fn error(&self, code: ResponseCode) -> Vec<u8> {
        self.response(code)
            .to_vec()
            .unwrap_or_else(|_| bare_error(self.header.id(), self.header.op_code(), code))
    }

    /// The authoritative answer for a local name, at most `limit` bytes (truncated with TC
    /// otherwise, so the client retries over TCP).
    pub fn local_answer(&self, asked: &Name, answer: &LocalAnswer, limit: usize) -> Vec<u8> {
        let mut msg = self.response(ResponseCode::NoError);
        msg.set_authoritative(true);
        let mut owner = asked.clone();
        if let Some(target) = answer
            .cname
            .as_deref()
            .and_then(|t| Name::from_ascii(t).ok())
        {
            let mut target = target;
            target.set_fqdn(true);
            msg.add_answer(Record::from_rdata(
                asked.clone(),
                LOCAL_TTL,
                RData::CNAME(CNAME(target.clone())),
            ));
            owner = target;
        }
        for ip in &answer.addrs {
            let rdata = match ip {
                IpAddr::V4(v4) => RData::A(A(*v4)),
                IpAddr::V6(v6) => RData::AAAA(AAAA(*v6)),
            };
            msg.add_answer(Record::from_rdata(owner.clone(), LOCAL_TTL, rdata));
        }
        match msg.to_vec() {
            Ok(bytes) if bytes.len() <= limit => bytes,
            Ok(_) => msg
                .truncate()
                .to_vec()
                .unwrap_or_else(|_| self.error(ResponseCode::ServFail)),
            Err(_) => self.error(ResponseCode::ServFail),
        }
    }
}

/// A 12-byte error response for when even echoing the question can not be encoded.
fn bare_error(id: u16, op: OpCode, code: ResponseCode) -> Vec<u8> {
    let mut out = vec![0u8; HEADER_LEN];
    out[..2].copy_from_slice(&id.to_be_bytes());
    out[2] = 0x80 | ((u8::from(op) & 0x0f) << 3);
    out[3] = 0x80 | (u16::from(code) & 0x0f) as u8;
    out
}

/// Reads one DNS-over-TCP message (RFC 1035 §4.2.2): a two-byte big-endian length, then
/// that many bytes. Any error (the peer closing before or inside a message included) ends
/// the connection; the caller puts the deadline on it.
pub async fn read_tcp_message<R: AsyncRead + Unpin>(r: &mut R) -> io::Result<Vec<u8>> {
    let len = usize::from(r.read_u16().await?);
    let mut raw = vec![0u8; len];
    r.read_exact(&mut raw).await?;
    Ok(raw)
}

/// `message` with its two-byte length prefix for TCP; `None` when it is longer than a
/// length can say ([`MAX_MESSAGE`]).
pub fn tcp_frame(message: &[u8]) -> Option<Vec<u8>> {
    let len = u16::try_from(message.len()).ok()?;
    let mut framed = Vec::with_capacity(message.len() + 2);
    framed.extend_from_slice(&len.to_be_bytes());
    framed.extend_from_slice(message);
    Some(framed)
}

/// The id of a raw message, if it has a header.
pub fn read_id(raw: &[u8]) -> Option<u16> {
    (raw.len() >= HEADER_LEN).then(|| u16::from_be_bytes([raw[0], raw[1]]))
}

/// Overwrites the id of a raw message in place (no-op on a too-short buffer).
pub fn set_id(raw: &mut [u8], id: u16) {
    if raw.len() >= HEADER_LEN {
        raw[..2].copy_from_slice(&id.to_be_bytes());
    }
}

/// Whether a raw message is a response with the TC bit.
pub fn is_truncated(raw: &[u8]) -> bool {
    raw.len() >= HEADER_LEN && raw[2] & 0x02 != 0
}

/// Whether a raw message is a response (QR bit).
pub fn is_response(raw: &[u8]) -> bool {
    raw.len() >= HEADER_LEN && raw[2] & 0x80 != 0
}

#[cfg(test)]
mod tests {
    use super::*;
    use ambit_model::names::NamespacedHostname;

    fn query(name: &str, ty: RecordType) -> Message {
        let mut m = Message::new();
        m.set_id(0x1234).set_recursion_desired(true);
        m.add_query(Query::query(Name::from_ascii(name).unwrap(), ty));
        m
    }

    fn classify_ok(raw: &[u8]) -> Request {
        match classify(raw) {
            Classified::Request(r) => r,
            Classified::Drop => panic!("dropped"),
        }
    }

    #[test]
    fn classification_table() {
        let a = query("svc1.", RecordType::A).to_vec().unwrap();
        let aaaa = query("svc1.", RecordType::AAAA).to_vec().unwrap();
        let srv = query("_http._tcp.svc1.", RecordType::SRV).to_vec().unwrap();
        let mut chaos = query("version.bind.", RecordType::A);
        chaos.queries_mut()[0].set_query_class(DNSClass::CH);
        let chaos = chaos.to_vec().unwrap();
        let mut two = query("a.", RecordType::A);
        two.add_query(Query::query(Name::from_ascii("b.").unwrap(), RecordType::A));
        let two = two.to_vec().unwrap();
        let mut update = query("example.com.", RecordType::SOA);
        update.set_op_code(OpCode::Update);
        let update = update.to_vec().unwrap();
        let mut edns1 = query("svc1.", RecordType::A);
        let mut e = Edns::new();
        e.set_version(1);
        edns1.set_edns(e);
        let edns1 = edns1.to_vec().unwrap();
        let mut response = query("svc1.", RecordType::A);
        response.set_message_type(MessageType::Response);
        let response = response.to_vec().unwrap();
        // Header claims one question, body is missing.
        let mut no_question = a[..HEADER_LEN].to_vec();
        no_question[5] = 1;
        let mut bad_update = update[..HEADER_LEN].to_vec();
        bad_update[5] = 1;

        let svc1 = Name::from_ascii("svc1.").unwrap();
        let cases: Vec<(&str, &[u8], Option<Action>)> = vec![
            (
                "A",
                &a,
                Some(Action::Local {
                    name: svc1.clone(),
                    family: Family::V4,
                }),
            ),
            (
                "AAAA",
                &aaaa,
                Some(Action::Local {
                    name: svc1,
                    family: Family::V6,
                }),
            ),
            ("SRV", &srv, Some(Action::Forward)),
            ("class CH", &chaos, Some(Action::Forward)),
            ("two questions", &two, Some(Action::Forward)),
            ("UPDATE", &update, Some(Action::Forward)),
            ("EDNS version 1", &edns1, Some(Action::Forward)),
            ("truncated question", &no_question, Some(Action::FormErr)),
            ("truncated UPDATE", &bad_update, Some(Action::Forward)),
            ("response", &response, None),
            ("short", &a[..5], None),
            ("empty", &[], None),
        ];
        for (name, raw, want) in cases {
            let got = match classify(raw) {
                Classified::Drop => None,
                Classified::Request(r) => Some(r.action),
            };
            assert_eq!(got, want, "case {name}");
        }
    }

    #[test]
    fn classify_never_panics_on_garbage() {
        let mut seed = 0x2545_f491_u32;
        for len in 0..600 {
            let raw: Vec<u8> = (0..len)
                .map(|_| {
                    seed ^= seed << 13;
                    seed ^= seed >> 17;
                    seed ^= seed << 5;
                    seed as u8
                })
                .collect();
            if let Classified::Request(r) = classify(&raw) {
                let _ = r.error(ResponseCode::FormErr);
            }
        }
    }

    #[test]
    fn local_answer_with_cname_and_truncation() {
        let raw = query("remote.default.default.svc.cluster.local.", RecordType::A)
            .to_vec()
            .unwrap();
        let req = classify_ok(&raw);
        let Action::Local { name, .. } = &req.action else {
            panic!("not local")
        };
        let answer = LocalAnswer {
            cname: Some("remote.default".into()),
            addrs: vec!["10.0.0.2".parse().unwrap()],
            service: NamespacedHostname::new("default", "remote.default.svc.cluster.local")
                .unwrap(),
        };
        let resp = Message::from_vec(&req.local_answer(name, &answer, 512)).unwrap();
        assert_eq!(resp.id(), 0x1234);
        assert!(resp.authoritative());
        assert!(resp.recursion_desired());
        assert_eq!(resp.response_code(), ResponseCode::NoError);
        let answers: Vec<String> = resp
            .answers()
            .iter()
            .map(|r| format!("{} {} {}", r.name(), r.ttl(), r.data()))
            .collect();
        assert_eq!(
            answers,
            [
                "remote.default.default.svc.cluster.local. 30 remote.default.",
                "remote.default. 30 10.0.0.2",
            ]
        );

        let many = LocalAnswer {
            cname: None,
            addrs: (0..100).map(|i| IpAddr::from([10, 0, 0, i])).collect(),
            service: answer.service.clone(),
        };
        let small = Message::from_vec(&req.local_answer(name, &many, 512)).unwrap();
        assert!(small.truncated());
        assert!(small.answers().is_empty());
        let big = Message::from_vec(&req.local_answer(name, &many, 65535)).unwrap();
        assert_eq!(big.answers().len(), 100);
    }

    #[test]
    fn errors_echo_id_and_question() {
        let raw = query("x.", RecordType::A).to_vec().unwrap();
        let resp = Message::from_vec(&classify_ok(&raw).error(ResponseCode::ServFail)).unwrap();
        assert_eq!(resp.id(), 0x1234);
        assert_eq!(resp.response_code(), ResponseCode::ServFail);
        assert_eq!(resp.queries().len(), 1);
        let bare =
            Message::from_vec(&bare_error(7, OpCode::Update, ResponseCode::FormErr)).unwrap();
        assert_eq!((bare.id(), bare.op_code()), (7, OpCode::Update));
        assert_eq!(bare.response_code(), ResponseCode::FormErr);
        assert_eq!(bare.message_type(), MessageType::Response);
    }

    #[test]
    fn raw_header_helpers() {
        let mut raw = query("x.", RecordType::A).to_vec().unwrap();
        assert_eq!(read_id(&raw), Some(0x1234));
        set_id(&mut raw, 0xbeef);
        assert_eq!(read_id(&raw), Some(0xbeef));
        assert!(!is_response(&raw) && !is_truncated(&raw));
        raw[2] |= 0x82;
        assert!(is_response(&raw) && is_truncated(&raw));
        assert_eq!(read_id(&raw[..3]), None);
    }

    /// TCP framing: what a stream of bytes yields, message by message, until the first error.
    #[tokio::test]
    async fn tcp_messages_table() {
        // (case, bytes of the stream, the messages read before the first error)
        type Case = (&'static str, &'static [u8], &'static [&'static [u8]]);
        let cases: &[Case] = &[
            ("empty stream", b"", &[]),
            ("half a length", b"\x00", &[]),
            ("empty message", b"\x00\x00", &[b""]),
            ("two messages", b"\x00\x01a\x00\x02bc", &[b"a", b"bc"]),
            ("body shorter than its length", b"\x00\x03ab", &[]),
            (
                "a message, then a cut one",
                b"\x00\x01a\x00\x05abc",
                &[b"a"],
            ),
        ];
        for (name, stream, want) in cases {
            let mut r: &[u8] = stream;
            let mut got = Vec::new();
            while let Ok(m) = read_tcp_message(&mut r).await {
                got.push(m);
            }
            assert_eq!(
                got,
                want.iter().map(|m| m.to_vec()).collect::<Vec<_>>(),
                "{name}"
            );
        }
        let framed = tcp_frame(b"abc").unwrap();
        assert_eq!(framed, b"\x00\x03abc");
        assert_eq!(
            read_tcp_message(&mut framed.as_slice()).await.unwrap(),
            b"abc"
        );
        assert_eq!(
            tcp_frame(&vec![0; MAX_MESSAGE]).map(|f| f.len()),
            Some(MAX_MESSAGE + 2)
        );
        assert_eq!(tcp_frame(&vec![0; MAX_MESSAGE + 1]), None);
    }
}
