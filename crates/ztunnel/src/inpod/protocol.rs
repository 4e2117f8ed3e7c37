//! ZDS wire messages (§2.2): a received datagram plus its optional descriptor becomes a typed
//! [`Request`]; hello and acks are encoded here. Pure functions, no sockets.

use std::os::fd::OwnedFd;

use ambit_netns::NetnsFd;
use ambit_proto::zds::{self, workload_request::Payload};
use prost::Message;

use super::ZdsError;
use crate::proxy::LocalWorkload;

/// One decoded agent request.
#[derive(Debug)]
pub enum Request {
    /// Start (or keep) the proxies of a pod.
    Add {
        uid: String,
        info: LocalWorkload,
        netns: NetnsFd,
    },
    /// Snapshot only: keep a pod whose netns the agent can no longer open.
    Keep { uid: String },
    /// Stop a pod's proxies.
    Del { uid: String },
    /// End of the initial snapshot.
    SnapshotSent,
}

impl Request {
    /// Message name for logs.
    pub fn kind(&self) -> &'static str {
        match self {
            Request::Add { .. } => "AddWorkload",
            Request::Keep { .. } => "KeepWorkload",
            Request::Del { .. } => "DelWorkload",
            Request::SnapshotSent => "SnapshotSent",
        }
    }

    /// The uid the request is about, if any.
    pub fn uid(&self) -> Option<&str> {
        match self {
            Request::Add { uid, .. } | Request::Keep { uid } | Request::Del { uid } => Some(uid),
            Request::SnapshotSent => None,
        }
    }
}

/// `ZdsHello{version: V1}` (bytes `08 01`), sent raw as the first datagram.
pub fn encode_hello() -> Vec<u8> {
    zds::ZdsHello {
        version: zds::Version::V1 as i32,
    }
    .encode_to_vec()
}

/// `WorkloadResponse{ack: Ack{error}}`; `None` is an ACK (bytes `0a 00`).
pub fn encode_ack(error: Option<&str>) -> Vec<u8> {
    zds::WorkloadResponse {
        payload: Some(zds::workload_response::Payload::Ack(zds::Ack {
            error: error.unwrap_or_default().to_owned(),
        })),
    }
    .encode_to_vec()
}

/// Decodes one `WorkloadRequest` and checks the descriptor rules: exactly one fd (a network
/// namespace) with `AddWorkload`, none with anything else. A descriptor that is not used is
/// closed when the error is dropped.
pub fn decode_request(data: &[u8], fd: Option<OwnedFd>) -> Result<Request, ZdsError> {
    let req = zds::WorkloadRequest::decode(data)?;
    let no_fd = |message: &'static str| match &fd {
        Some(_) => Err(ZdsError::UnexpectedFd { message }),
        None => Ok(()),
    };
    let need_uid = |uid: String, message: &'static str| {
        if uid.is_empty() {
            Err(ZdsError::MissingUid { message })
        } else {
            Ok(uid)
        }
    };
    match req.payload.ok_or(ZdsError::NoPayload)? {
        Payload::Add(add) => {
            let fd = fd.ok_or_else(|| ZdsError::MissingFd {
                uid: add.uid.clone(),
            })?;
            let netns = NetnsFd::from_owned_fd(fd).map_err(|source| ZdsError::BadNetns {
                uid: add.uid.clone(),
                source,
            })?;
            let uid = need_uid(add.uid, "AddWorkload")?;
            let info = add
                .workload_info
                .ok_or_else(|| ZdsError::MissingWorkloadInfo { uid: uid.clone() })?;
            Ok(Request::Add {
                uid,
                info: LocalWorkload {
                    name: info.name,
                    namespace: info.namespace,
                    service_account: info.service_account,
                },
                netns,
            })
        }
        Payload::Keep(keep) => {
            no_fd("KeepWorkload")?;
            Ok(Request::Keep {
                uid: need_uid(keep.uid, "KeepWorkload")?,
            })
        }
        Payload::Del(del) => {
            no_fd("DelWorkload")?;
            Ok(Request::Del {
                uid: need_uid(del.uid, "DelWorkload")?,
            })
        }
        Payload::SnapshotSent(_) => {
            no_fd("SnapshotSent")?;
            Ok(Request::SnapshotSent)
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn request(payload: Payload) -> Vec<u8> {
        zds::WorkloadRequest {
            payload: Some(payload),
        }
        .encode_to_vec()
    }

    fn some_fd() -> OwnedFd {
        std::fs::File::open("/dev/null").unwrap().into()
    }

    /// A real netns descriptor that needs no privileges: our own.
    fn own_netns() -> OwnedFd {
        NetnsFd::current_thread().unwrap().into_owned_fd()
    }

    #[test]
    fn add_decodes_with_its_netns() {
        let data = request(Payload::Add(zds::AddWorkload {
            uid: "u1".into(),
            workload_info: Some(zds::WorkloadInfo {
                name: "n".into(),
                namespace: "ns".into(),
                service_account: "sa".into(),
            }),
        }));
        let me = NetnsFd::current_thread().unwrap();
        match decode_request(&data, Some(own_netns())).unwrap() {
            Request::Add { uid, info, netns } => {
                assert_eq!(uid, "u1");
                assert_eq!((info.name.as_str(), info.namespace.as_str()), ("n", "ns"));
                assert_eq!(info.service_account, "sa");
                assert!(netns.same_namespace(&me));
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn wire_bytes_match_the_spec() {
        assert_eq!(encode_hello(), [0x08, 0x01]);
        assert_eq!(encode_ack(None), [0x0a, 0x00]);
        let nack = zds::WorkloadResponse::decode(&encode_ack(Some("boom"))[..]).unwrap();
        assert_eq!(
            nack.payload,
            Some(zds::workload_response::Payload::Ack(zds::Ack {
                error: "boom".into()
            }))
        );
        assert!(matches!(
            decode_request(&[0x1a, 0x00], None),
            Ok(Request::SnapshotSent)
        ));
        // DelWorkload's uid is field 2: 12 05 12 03 'a' 'b' 'c'.
        match decode_request(&[0x12, 0x05, 0x12, 0x03, b'a', b'b', b'c'], None) {
            Ok(Request::Del { uid }) => assert_eq!(uid, "abc"),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn rejections() {
        let add = |info: Option<zds::WorkloadInfo>| {
            request(Payload::Add(zds::AddWorkload {
                uid: "u1".into(),
                workload_info: info,
            }))
        };
        let info = Some(zds::WorkloadInfo {
            name: "n".into(),
            namespace: "ns".into(),
            service_account: "sa".into(),
        });
        let keep = request(Payload::Keep(zds::KeepWorkload { uid: "u1".into() }));
        let del_empty = request(Payload::Del(zds::DelWorkload { uid: String::new() }));
        type Check = fn(&ZdsError) -> bool;
        /// (name, datagram, descriptor, expected error, the connection is dropped)
        type Case = (&'static str, Vec<u8>, Option<OwnedFd>, Check, bool);
        let cases: Vec<Case> = vec![
            (
                "garbage",
                vec![0xff, 0xff, 0xff],
                None,
                |e| matches!(e, ZdsError::Decode(_)),
                true,
            ),
            (
                "no payload",
                vec![],
                None,
                |e| matches!(e, ZdsError::NoPayload),
                true,
            ),
            (
                "add without fd",
                add(info.clone()),
                None,
                |e| matches!(e, ZdsError::MissingFd { .. }),
                true,
            ),
            (
                "add with a non-netns fd",
                add(info.clone()),
                Some(some_fd()),
                |e| matches!(e, ZdsError::BadNetns { .. }),
                true,
            ),
            (
                "add without workload_info",
                add(None),
                Some(own_netns()),
                |e| matches!(e, ZdsError::MissingWorkloadInfo { .. }),
                false,
            ),
            (
                "keep with fd",
                keep,
                Some(some_fd()),
                |e| matches!(e, ZdsError::UnexpectedFd { .. }),
                true,
            ),
            (
                "snapshot with fd",
                vec![0x1a, 0x00],
                Some(some_fd()),
                |e| matches!(e, ZdsError::UnexpectedFd { .. }),
                true,
            ),
            (
                "del without uid",
                del_empty,
                None,
                |e| matches!(e, ZdsError::MissingUid { .. }),
                false,
            ),
        ];
        for (name, data, fd, check, drops) in cases {
            let err = decode_request(&data, fd).expect_err(name);
            assert!(check(&err), "{name}: {err}");
            assert_eq!(err.drops_connection(), drops, "{name}");
            assert!(
                err.to_string().contains("failure to read message") == drops,
                "{name}: {err}"
            );
        }
    }
}
