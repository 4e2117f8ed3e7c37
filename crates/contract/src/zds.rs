//! ZDS framing (`spec/cni.md` §4, `spec/ztunnel.md` §2, `spec/windows.md` §2): what the CNI
//! agent and ztunnel put in each message. One protobuf message per `SOCK_SEQPACKET` datagram
//! (Linux) or per named-pipe message (Windows), at most [`MAX_MESSAGE`] bytes. On Linux
//! `AddWorkload` carries the pod's netns as the one `SCM_RIGHTS` descriptor and every other
//! message none ([`decode_request`]); on Windows nothing rides along and the pod's HNS
//! namespace is `WorkloadInfo.windows_namespace` ([`decode_request_windows`]). The transport
//! itself is `ambit_netns::zds`; this module is pure functions on bytes, so both ends, both
//! platforms and the fuzz targets share one reading of the wire.
//!
//! The conversation: ztunnel connects and sends `ZdsHello{V1}` ([`encode_hello`], bytes
//! `08 01`); the agent sends [`Request`]s one at a time and ztunnel answers each with an
//! [`Answer`] ([`encode_ack`], an empty error is an ACK, bytes `0a 00`).

use std::fmt;

use ambit_proto::zds::{
    self, AddWorkload, DelWorkload, KeepWorkload, SnapshotSent, WorkloadRequest, WorkloadResponse,
    workload_request::Payload, workload_response,
};
use prost::Message;

pub use ambit_proto::zds::{WindowsNamespace, WorkloadInfo};

/// Both peers read each datagram into a buffer of this size and treat truncation as an
/// error, so every message sent must be strictly smaller.
pub const MAX_MESSAGE: usize = 1024;

/// The uid ZDS names a pod by (the Kubernetes pod UID); never empty.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PodUid(String);

/// An empty pod uid.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("empty pod uid")]
pub struct EmptyUid;

impl PodUid {
    /// A uid; empty is refused.
    pub fn new(uid: impl Into<String>) -> Result<Self, EmptyUid> {
        let uid = uid.into();
        if uid.is_empty() {
            Err(EmptyUid)
        } else {
            Ok(Self(uid))
        }
    }

    /// The uid as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The uid as an owned string.
    pub fn into_string(self) -> String {
        self.0
    }
}

impl fmt::Display for PodUid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl PartialEq<str> for PodUid {
    fn eq(&self, other: &str) -> bool {
        self.0 == other
    }
}

impl PartialEq<&str> for PodUid {
    fn eq(&self, other: &&str) -> bool {
        self.0 == *other
    }
}

impl PartialEq<String> for PodUid {
    fn eq(&self, other: &String) -> bool {
        self.0 == *other
    }
}

impl std::borrow::Borrow<str> for PodUid {
    fn borrow(&self) -> &str {
        &self.0
    }
}

impl std::str::FromStr for PodUid {
    type Err = EmptyUid;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::new(s)
    }
}

/// One agent → ztunnel request. `Fd` is the netns descriptor `Add` carries: a borrowed one
/// when sending, whatever the receiver turns the received descriptor into when receiving.
#[derive(Debug)]
pub enum Request<Fd> {
    /// Start (or keep) a pod's proxies in the netns sent along.
    Add {
        /// The pod.
        uid: PodUid,
        /// Name, namespace and service account.
        info: WorkloadInfo,
        /// The pod's netns.
        netns: Fd,
    },
    /// Snapshot only: keep a pod whose netns the agent can no longer open.
    Keep {
        /// The pod.
        uid: PodUid,
    },
    /// Stop a pod's proxies.
    Del {
        /// The pod.
        uid: PodUid,
    },
    /// End of the snapshot that starts every connection.
    SnapshotSent,
}

/// An encoded request does not fit the peer's receive buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("encoded ZDS message is {0} bytes, must be < {MAX_MESSAGE}")]
pub struct TooLarge(pub usize);

impl<Fd> Request<Fd> {
    /// The message name, for logs and errors.
    pub fn kind(&self) -> &'static str {
        match self {
            Request::Add { .. } => "AddWorkload",
            Request::Keep { .. } => "KeepWorkload",
            Request::Del { .. } => "DelWorkload",
            Request::SnapshotSent => "SnapshotSent",
        }
    }

    /// The pod the request is about, if any.
    pub fn uid(&self) -> Option<&PodUid> {
        match self {
            Request::Add { uid, .. } | Request::Keep { uid } | Request::Del { uid } => Some(uid),
            Request::SnapshotSent => None,
        }
    }

    /// The descriptor to send with the datagram (`Add` only).
    pub fn netns(&self) -> Option<&Fd> {
        match self {
            Request::Add { netns, .. } => Some(netns),
            _ => None,
        }
    }

    /// The datagram; refused when it would not fit [`MAX_MESSAGE`].
    pub fn encode(&self) -> Result<Vec<u8>, TooLarge> {
        let payload = match self {
            Request::Add { uid, info, .. } => Payload::Add(AddWorkload {
                uid: uid.as_str().to_owned(),
                workload_info: Some(info.clone()),
            }),
            Request::Keep { uid } => Payload::Keep(KeepWorkload {
                uid: uid.as_str().to_owned(),
            }),
            Request::Del { uid } => Payload::Del(DelWorkload {
                uid: uid.as_str().to_owned(),
            }),
            Request::SnapshotSent => Payload::SnapshotSent(SnapshotSent {}),
        };
        let bytes = WorkloadRequest {
            payload: Some(payload),
        }
        .encode_to_vec();
        if bytes.len() >= MAX_MESSAGE {
            return Err(TooLarge(bytes.len()));
        }
        Ok(bytes)
    }
}

/// Why a received request datagram is not a valid [`Request`]. `E` is the error of turning
/// the received descriptor into the receiver's netns type.
#[derive(Debug, thiserror::Error)]
pub enum RequestError<E> {
    /// Not a `WorkloadRequest`.
    #[error("undecodable WorkloadRequest: {0}")]
    Decode(#[from] prost::DecodeError),
    /// A `WorkloadRequest` without a payload this version knows.
    #[error("WorkloadRequest without a known payload")]
    NoPayload,
    /// `AddWorkload` came without its descriptor.
    #[error("AddWorkload {uid} without the pod's netns fd")]
    MissingFd {
        /// The uid as sent (possibly empty).
        uid: String,
    },
    /// A descriptor came with a message that carries none.
    #[error("unexpected file descriptor with {message}")]
    UnexpectedFd {
        /// The message name.
        message: &'static str,
    },
    /// The descriptor of `AddWorkload` was refused by the receiver's check.
    #[error("the fd sent with AddWorkload {uid}: {source}")]
    BadFd {
        /// The uid as sent (possibly empty).
        uid: String,
        /// Why the descriptor was refused.
        source: E,
    },
    /// A message without a uid.
    #[error("{message} without a uid")]
    MissingUid {
        /// The message name.
        message: &'static str,
    },
    /// `AddWorkload` without `workload_info`.
    #[error("AddWorkload {uid} without workload_info")]
    MissingWorkloadInfo {
        /// The pod.
        uid: PodUid,
    },
}

/// Decodes one request datagram and its descriptor, checking the descriptor rules: exactly
/// one with `AddWorkload` (turned into `Fd` by `netns`, which may refuse it), none with
/// anything else. `A` is what the transport received beside the datagram (an `OwnedFd` on
/// Linux). An unused descriptor is closed when the error is dropped.
///
/// Checks run in this order: decoding, payload, descriptor presence, `netns`, uid,
/// `workload_info`.
pub fn decode_request<A, Fd, E>(
    data: &[u8],
    fd: Option<A>,
    netns: impl FnOnce(A) -> Result<Fd, E>,
) -> Result<Request<Fd>, RequestError<E>> {
    let req = WorkloadRequest::decode(data)?;
    let no_fd = |message: &'static str| match &fd {
        Some(_) => Err(RequestError::UnexpectedFd { message }),
        None => Ok(()),
    };
    match req.payload.ok_or(RequestError::NoPayload)? {
        Payload::Add(add) => {
            let Some(fd) = fd else {
                return Err(RequestError::MissingFd { uid: add.uid });
            };
            let netns = netns(fd).map_err(|source| RequestError::BadFd {
                uid: add.uid.clone(),
                source,
            })?;
            let uid = uid(add.uid, "AddWorkload")?;
            let Some(info) = add.workload_info else {
                return Err(RequestError::MissingWorkloadInfo { uid });
            };
            Ok(Request::Add { uid, info, netns })
        }
        Payload::Keep(keep) => {
            no_fd("KeepWorkload")?;
            Ok(Request::Keep {
                uid: uid(keep.uid, "KeepWorkload")?,
            })
        }
        Payload::Del(del) => {
            no_fd("DelWorkload")?;
            Ok(Request::Del {
                uid: uid(del.uid, "DelWorkload")?,
            })
        }
        Payload::SnapshotSent(_) => {
            no_fd("SnapshotSent")?;
            Ok(Request::SnapshotSent)
        }
    }
}

/// Why an `AddWorkload` received over the Windows named pipe names no usable namespace.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WindowsNamespaceError {
    /// `workload_info.windows_namespace` is absent (upstream's ztunnel panics here).
    #[error("no windows_namespace")]
    Missing,
    /// `windows_namespace.guid` is empty.
    #[error("windows_namespace without a guid")]
    EmptyGuid,
}

/// Decodes one request message received over the Windows named pipe (`spec/windows.md` §2):
/// no descriptor ever rides along, and `AddWorkload` names the pod's HNS namespace in
/// `workload_info.windows_namespace`, which becomes the request's `netns`. A missing
/// namespace or guid is [`RequestError::BadFd`] with a [`WindowsNamespaceError`]: a NACK,
/// never a panic. `windows_namespace.id` 0 (no compartment yet) is valid here; what to do
/// with it is the receiver's decision.
///
/// Checks run in this order: decoding, payload, uid, `workload_info`, `windows_namespace`.
pub fn decode_request_windows(
    data: &[u8],
) -> Result<Request<WindowsNamespace>, RequestError<WindowsNamespaceError>> {
    let req = WorkloadRequest::decode(data)?;
    match req.payload.ok_or(RequestError::NoPayload)? {
        Payload::Add(add) => {
            let uid = uid(add.uid, "AddWorkload")?;
            let Some(info) = add.workload_info else {
                return Err(RequestError::MissingWorkloadInfo { uid });
            };
            let bad = |source| RequestError::BadFd {
                uid: uid.as_str().to_owned(),
                source,
            };
            let netns = match &info.windows_namespace {
                None => return Err(bad(WindowsNamespaceError::Missing)),
                Some(ns) if ns.guid.is_empty() => {
                    return Err(bad(WindowsNamespaceError::EmptyGuid));
                }
                Some(ns) => ns.clone(),
            };
            Ok(Request::Add { uid, info, netns })
        }
        Payload::Keep(keep) => Ok(Request::Keep {
            uid: uid(keep.uid, "KeepWorkload")?,
        }),
        Payload::Del(del) => Ok(Request::Del {
            uid: uid(del.uid, "DelWorkload")?,
        }),
        Payload::SnapshotSent(_) => Ok(Request::SnapshotSent),
    }
}

fn uid<E>(uid: String, message: &'static str) -> Result<PodUid, RequestError<E>> {
    PodUid::new(uid).map_err(|EmptyUid| RequestError::MissingUid { message })
}

/// `ZdsHello{version: V1}` (bytes `08 01`), ztunnel's first datagram.
pub fn encode_hello() -> Vec<u8> {
    zds::ZdsHello {
        version: zds::Version::V1 as i32,
    }
    .encode_to_vec()
}

/// Why a hello or an answer datagram is not valid.
#[derive(Debug, thiserror::Error)]
pub enum AnswerError {
    /// Not a `ZdsHello`.
    #[error("undecodable ZdsHello: {0}")]
    Hello(#[source] prost::DecodeError),
    /// Not a `WorkloadResponse`.
    #[error("undecodable response: {0}")]
    Response(#[source] prost::DecodeError),
    /// A `WorkloadResponse` without an ack.
    #[error("response without ack")]
    NoAck,
}

/// The version ztunnel announced (raw: unknown values are kept).
pub fn decode_hello(data: &[u8]) -> Result<i32, AnswerError> {
    zds::ZdsHello::decode(data)
        .map(|h| h.version)
        .map_err(AnswerError::Hello)
}

/// ztunnel's answer to one request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Answer {
    /// Done.
    Ack,
    /// Refused, with ztunnel's reason.
    Nack(String),
}

/// `WorkloadResponse{ack: Ack{error}}`; `None` is an ACK (bytes `0a 00`).
pub fn encode_ack(error: Option<&str>) -> Vec<u8> {
    WorkloadResponse {
        payload: Some(workload_response::Payload::Ack(zds::Ack {
            error: error.unwrap_or_default().to_owned(),
        })),
    }
    .encode_to_vec()
}

/// Decodes ztunnel's answer datagram.
pub fn decode_answer(data: &[u8]) -> Result<Answer, AnswerError> {
    match WorkloadResponse::decode(data).map_err(AnswerError::Response)? {
        WorkloadResponse {
            payload: Some(workload_response::Payload::Ack(ack)),
        } => Ok(if ack.error.is_empty() {
            Answer::Ack
        } else {
            Answer::Nack(ack.error)
        }),
        WorkloadResponse { payload: None } => Err(AnswerError::NoAck),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn uid(s: &str) -> PodUid {
        PodUid::new(s).unwrap()
    }

    fn info() -> WorkloadInfo {
        WorkloadInfo {
            name: "n".into(),
            namespace: "ns".into(),
            service_account: "sa".into(),
            windows_namespace: None,
        }
    }

    /// What a transport received beside a datagram (a descriptor on Linux); the framing
    /// only cares whether there is one.
    #[derive(Debug, PartialEq)]
    struct Attached;

    fn some_fd() -> Attached {
        Attached
    }

    /// Accepts any descriptor.
    fn keep(fd: Attached) -> Result<Attached, std::convert::Infallible> {
        Ok(fd)
    }

    #[test]
    fn wire_bytes_match_the_spec() {
        assert_eq!(encode_hello(), [0x08, 0x01]);
        assert_eq!(decode_hello(&[0x08, 0x01]).unwrap(), 1);
        assert_eq!(encode_ack(None), [0x0a, 0x00]);
        assert_eq!(decode_answer(&[0x0a, 0x00]).unwrap(), Answer::Ack);
        assert_eq!(
            decode_answer(&encode_ack(Some("boom"))).unwrap(),
            Answer::Nack("boom".into())
        );
        let snapshot: Request<()> = Request::SnapshotSent;
        assert_eq!(snapshot.encode().unwrap(), [0x1a, 0x00]);
        // DelWorkload's uid is field 2: 12 05 12 03 'a' 'b' 'c'.
        let del: Request<()> = Request::Del { uid: uid("abc") };
        assert_eq!(
            del.encode().unwrap(),
            [0x12, 0x05, 0x12, 0x03, b'a', b'b', b'c']
        );
    }

    #[test]
    fn requests_round_trip() {
        let cases: Vec<Request<()>> = vec![
            Request::Add {
                uid: uid("u1"),
                info: info(),
                netns: (),
            },
            Request::Keep { uid: uid("u2") },
            Request::Del { uid: uid("u3") },
            Request::SnapshotSent,
        ];
        for sent in cases {
            let bytes = sent.encode().unwrap();
            let fd = sent.netns().map(|()| some_fd());
            let got = decode_request(&bytes, fd, keep).unwrap();
            assert_eq!(got.kind(), sent.kind());
            assert_eq!(got.uid(), sent.uid());
            if let Request::Add { info: got_info, .. } = got {
                assert_eq!(got_info, info());
            }
        }
    }

    #[test]
    fn oversized_requests_are_refused() {
        let big: Request<()> = Request::Keep {
            uid: uid(&"x".repeat(MAX_MESSAGE)),
        };
        assert!(matches!(big.encode(), Err(TooLarge(n)) if n > MAX_MESSAGE));
    }

    #[test]
    fn request_rejections() {
        let add = |uid: &str, info: Option<WorkloadInfo>| {
            WorkloadRequest {
                payload: Some(Payload::Add(AddWorkload {
                    uid: uid.into(),
                    workload_info: info,
                })),
            }
            .encode_to_vec()
        };
        let keep = WorkloadRequest {
            payload: Some(Payload::Keep(KeepWorkload { uid: "u1".into() })),
        }
        .encode_to_vec();
        let del_empty = WorkloadRequest {
            payload: Some(Payload::Del(DelWorkload { uid: String::new() })),
        }
        .encode_to_vec();
        type Check = fn(&RequestError<&'static str>) -> bool;
        let refuse = |_: Attached| Err::<Attached, _>("not a netns");
        /// (name, datagram, descriptor, the receiver refuses the descriptor, expected error)
        type Case = (&'static str, Vec<u8>, Option<Attached>, bool, Check);
        let cases: Vec<Case> = vec![
            ("garbage", vec![0xff, 0xff, 0xff], None, false, |e| {
                matches!(e, RequestError::Decode(_))
            }),
            ("no payload", vec![], None, false, |e| {
                matches!(e, RequestError::NoPayload)
            }),
            (
                "add without fd",
                add("u1", Some(info())),
                None,
                false,
                |e| matches!(e, RequestError::MissingFd { .. }),
            ),
            (
                "add with a refused fd",
                add("u1", Some(info())),
                Some(some_fd()),
                true,
                |e| matches!(e, RequestError::BadFd { .. }),
            ),
            (
                "add without uid",
                add("", Some(info())),
                Some(some_fd()),
                false,
                |e| matches!(e, RequestError::MissingUid { .. }),
            ),
            (
                "add without workload_info",
                add("u1", None),
                Some(some_fd()),
                false,
                |e| matches!(e, RequestError::MissingWorkloadInfo { .. }),
            ),
            ("keep with fd", keep, Some(some_fd()), false, |e| {
                matches!(e, RequestError::UnexpectedFd { .. })
            }),
            (
                "snapshot with fd",
                vec![0x1a, 0x00],
                Some(some_fd()),
                false,
                |e| matches!(e, RequestError::UnexpectedFd { .. }),
            ),
            ("del without uid", del_empty, None, false, |e| {
                matches!(e, RequestError::MissingUid { .. })
            }),
        ];
        for (name, data, fd, refused, check) in cases {
            let err = if refused {
                decode_request(&data, fd, refuse).expect_err(name)
            } else {
                decode_request(&data, fd, Ok::<_, &'static str>).expect_err(name)
            };
            assert!(check(&err), "{name}: {err}");
        }
    }

    #[test]
    fn answer_rejections() {
        assert!(matches!(
            decode_answer(&[0xff, 0xff]),
            Err(AnswerError::Response(_))
        ));
        assert!(matches!(decode_answer(&[]), Err(AnswerError::NoAck)));
        assert!(matches!(decode_hello(&[0xff]), Err(AnswerError::Hello(_))));
    }

    #[test]
    fn uids_are_never_empty() {
        assert_eq!(PodUid::new(""), Err(EmptyUid));
        assert_eq!("p".parse::<PodUid>().unwrap().as_str(), "p");
    }

    fn windows_add(uid: &str, info: Option<WorkloadInfo>) -> Vec<u8> {
        WorkloadRequest {
            payload: Some(Payload::Add(AddWorkload {
                uid: uid.into(),
                workload_info: info,
            })),
        }
        .encode_to_vec()
    }

    fn windows_info(ns: Option<(u32, &str)>) -> WorkloadInfo {
        WorkloadInfo {
            name: "a".into(),
            namespace: "b".into(),
            service_account: "c".into(),
            windows_namespace: ns.map(|(id, guid)| WindowsNamespace {
                id,
                guid: guid.into(),
            }),
        }
    }

    /// `spec/windows.md` §2.2: the hand-encoded bytes of every Windows message, both ways.
    #[test]
    fn windows_wire_bytes_match_the_spec() {
        let add: Request<()> = Request::Add {
            uid: uid("u1"),
            info: windows_info(Some((7, "G"))),
            netns: (),
        };
        let add_bytes = [
            0x0a, 0x16, 0x0a, 0x02, 0x75, 0x31, 0x12, 0x10, 0x0a, 0x01, 0x61, 0x12, 0x01, 0x62,
            0x1a, 0x01, 0x63, 0x2a, 0x05, 0x08, 0x07, 0x12, 0x01, 0x47,
        ];
        assert_eq!(add.encode().unwrap(), add_bytes);
        match decode_request_windows(&add_bytes).unwrap() {
            Request::Add { uid, info, netns } => {
                assert_eq!(uid, "u1");
                assert_eq!(info, windows_info(Some((7, "G"))));
                assert_eq!((netns.id, netns.guid.as_str()), (7, "G"));
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(encode_ack(Some("e")), [0x0a, 0x03, 0x0a, 0x01, 0x65]);
        let cases: [(Request<()>, &[u8]); 3] = [
            (Request::SnapshotSent, &[0x1a, 0x00]),
            (
                Request::Keep { uid: uid("u1") },
                &[0x2a, 0x04, 0x0a, 0x02, 0x75, 0x31],
            ),
            (
                Request::Del { uid: uid("u1") },
                &[0x12, 0x04, 0x12, 0x02, 0x75, 0x31],
            ),
        ];
        for (req, bytes) in cases {
            assert_eq!(req.encode().unwrap(), bytes, "{}", req.kind());
            let got = decode_request_windows(bytes).unwrap();
            assert_eq!((got.kind(), got.uid()), (req.kind(), req.uid()));
        }
    }

    #[test]
    fn windows_rejections_are_errors_not_panics() {
        type Check = fn(&RequestError<WindowsNamespaceError>) -> bool;
        let cases: Vec<(&str, Vec<u8>, Check)> = vec![
            ("garbage", vec![0xff, 0xff], |e| {
                matches!(e, RequestError::Decode(_))
            }),
            ("no payload", vec![], |e| {
                matches!(e, RequestError::NoPayload)
            }),
            ("add without workload_info", windows_add("u1", None), |e| {
                matches!(e, RequestError::MissingWorkloadInfo { .. })
            }),
            (
                "add without windows_namespace",
                windows_add("u1", Some(windows_info(None))),
                |e| {
                    matches!(
                        e,
                        RequestError::BadFd {
                            source: WindowsNamespaceError::Missing,
                            ..
                        }
                    )
                },
            ),
            (
                "add with an empty guid",
                windows_add("u1", Some(windows_info(Some((3, ""))))),
                |e| {
                    matches!(
                        e,
                        RequestError::BadFd {
                            source: WindowsNamespaceError::EmptyGuid,
                            ..
                        }
                    )
                },
            ),
            (
                "add without uid",
                windows_add("", Some(windows_info(Some((3, "G"))))),
                |e| matches!(e, RequestError::MissingUid { .. }),
            ),
        ];
        for (name, data, check) in cases {
            let err = decode_request_windows(&data).expect_err(name);
            assert!(check(&err), "{name}: {err}");
        }
        // No compartment yet is a valid Add: the receiver decides to wait.
        let pending = windows_add("u1", Some(windows_info(Some((0, "G")))));
        assert!(matches!(
            decode_request_windows(&pending),
            Ok(Request::Add { netns, .. }) if netns.id == 0
        ));
    }
}
