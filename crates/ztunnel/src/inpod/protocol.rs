//! ZDS wire messages (§2.2) as ztunnel reads them: the framing is `ambit_contract::zds`
//! (shared with the agent); the platform's `decode_request` turns a received message plus
//! what rode along into a [`Request`] carrying a checked pod namespace (a netns descriptor on
//! Linux, an HNS namespace on Windows), with ztunnel's NACK texts. Pure functions, no
//! sockets.

use ambit_contract::zds as wire;

pub use super::platform::decode_request;
pub use ambit_contract::zds::{encode_ack, encode_hello};

/// One decoded agent request, carrying the pod's namespace as this platform names it.
pub type Request = wire::Request<super::platform::PodNetns>;

#[cfg(all(test, unix))]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::os::fd::OwnedFd;

    use ambit_netns::NetnsFd;

    use super::super::ZdsError;

    use ambit_proto::zds::{self, workload_request::Payload};
    use prost::Message;

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
                windows_namespace: None,
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
            windows_namespace: None,
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
