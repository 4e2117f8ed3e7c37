//! ZDS `istio.workload.zds.WorkloadRequest` (CNI agent → ztunnel) with the descriptor that
//! came along, as ztunnel's side of the ZDS socket reads it
//! (`ambit_ztunnel::inpod::decode_request`). The input's first byte picks the descriptor
//! (none, a network namespace, a file that is not one), the rest is the datagram, so every
//! combination of payload kind, uid, workload info and descriptor is reachable.
//!
//! Properties: never panics; whatever prost decodes re-encodes to bytes that decode to the
//! same message (unknown fields are dropped on the first decode, so the check is on the
//! second); and ztunnel's verdict is exactly the one the protocol rules give (checked in
//! order: payload, descriptor presence, descriptor kind, uid, workload info), with the uid
//! and workload info passed through unchanged.
#![no_main]

use std::fs::File;
use std::os::fd::OwnedFd;

use ambit_proto::prost::Message;
use ambit_proto::zds::{self, workload_request::Payload};
use ambit_ztunnel::inpod::{Request, ZdsError, decode_request};
use libfuzzer_sys::fuzz_target;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fd {
    None,
    Netns,
    NotNetns,
}

fn open(fd: Fd) -> Option<OwnedFd> {
    let path = match fd {
        Fd::None => return None,
        Fd::Netns => "/proc/self/ns/net",
        Fd::NotNetns => "/dev/null",
    };
    Some(OwnedFd::from(
        File::open(path).unwrap_or_else(|e| panic!("opening {path}: {e}")),
    ))
}

/// The verdict the rules give: `Ok(())` or the error variant's name.
fn expected(req: &zds::WorkloadRequest, fd: Fd) -> Result<(), &'static str> {
    let (uid, needs_fd, info_missing) = match req.payload.as_ref().ok_or("NoPayload")? {
        Payload::Add(a) => (Some(a.uid.as_str()), true, a.workload_info.is_none()),
        Payload::Keep(k) => (Some(k.uid.as_str()), false, false),
        Payload::Del(d) => (Some(d.uid.as_str()), false, false),
        Payload::SnapshotSent(_) => (None, false, false),
    };
    match (needs_fd, fd) {
        (true, Fd::None) => return Err("MissingFd"),
        (true, Fd::NotNetns) => return Err("BadNetns"),
        (false, Fd::Netns | Fd::NotNetns) => return Err("UnexpectedFd"),
        _ => {}
    }
    if uid.is_some_and(str::is_empty) {
        return Err("MissingUid");
    }
    if info_missing {
        return Err("MissingWorkloadInfo");
    }
    Ok(())
}

fn variant(e: &ZdsError) -> &'static str {
    match e {
        ZdsError::NoPayload => "NoPayload",
        ZdsError::MissingFd { .. } => "MissingFd",
        ZdsError::BadNetns { .. } => "BadNetns",
        ZdsError::UnexpectedFd { .. } => "UnexpectedFd",
        ZdsError::MissingUid { .. } => "MissingUid",
        ZdsError::MissingWorkloadInfo { .. } => "MissingWorkloadInfo",
        ZdsError::Decode(_) => "Decode",
        _ => "unexpected",
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&choice, data)) = data.split_first() else {
        return;
    };
    let fd = [Fd::None, Fd::Netns, Fd::NotNetns][usize::from(choice % 3)];
    let decoded = zds::WorkloadRequest::decode(data);
    let verdict = decode_request(data, open(fd));
    let req = match decoded {
        Ok(req) => req,
        Err(_) => {
            assert!(matches!(verdict, Err(ZdsError::Decode(_))), "{verdict:?}");
            return;
        }
    };
    let bytes = req.encode_to_vec();
    assert_eq!(bytes.len(), req.encoded_len());
    assert_eq!(
        zds::WorkloadRequest::decode(bytes.as_slice()).as_ref(),
        Ok(&req),
        "re-encoded as {bytes:02x?}"
    );

    match (expected(&req, fd), &verdict) {
        (Err(want), Err(got)) => {
            assert_eq!(variant(got), want, "{got}");
            assert!(!got.to_string().is_empty());
        }
        (Ok(()), Ok(got)) => match (req.payload.as_ref(), got) {
            (Some(Payload::Add(a)), Request::Add { uid, info, .. }) => {
                assert_eq!(uid.as_str(), a.uid);
                assert_eq!(Some(info), a.workload_info.as_ref());
            }
            (Some(Payload::Keep(k)), Request::Keep { uid }) => assert_eq!(uid.as_str(), k.uid),
            (Some(Payload::Del(d)), Request::Del { uid }) => assert_eq!(uid.as_str(), d.uid),
            (Some(Payload::SnapshotSent(_)), Request::SnapshotSent) => {}
            (p, got) => panic!("{p:?} decoded as {got:?}"),
        },
        (want, got) => panic!("{:?} with {fd:?}: want {want:?}, got {got:?}", req.payload),
    }
});
