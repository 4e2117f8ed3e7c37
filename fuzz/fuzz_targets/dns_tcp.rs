//! DNS over TCP: the bytes of one connection, split into messages by the proxy's own framing
//! (`dns::message::read_tcp_message`, two-byte length then the message), each answered as
//! the server does until the first frame it can not read or answer (see `common/dns.rs`).
//!
//! Extra property: every answer frames (`tcp_frame`) and reads back unchanged.
#![no_main]

use std::future::Future;
use std::pin::pin;
use std::task::{Context, Poll, Waker};

use ambit_ztunnel::dns::message::{MAX_MESSAGE, read_tcp_message, tcp_frame};
use libfuzzer_sys::fuzz_target;

#[path = "common/dns.rs"]
mod dns;

/// Reading from a byte slice never waits, so one poll finishes the future.
fn now<F: Future>(f: F) -> F::Output {
    match pin!(f).poll(&mut Context::from_waker(Waker::noop())) {
        Poll::Ready(v) => v,
        Poll::Pending => panic!("a read from a byte slice waited"),
    }
}

fuzz_target!(|data: &[u8]| {
    let mut stream = data;
    while let Ok(raw) = now(read_tcp_message(&mut stream)) {
        // The server closes the connection on a dropped message or an unframeable answer.
        let Some(answer) = dns::answer(&raw, Some(MAX_MESSAGE)) else {
            break;
        };
        let Some(framed) = tcp_frame(&answer) else {
            break;
        };
        let back = now(read_tcp_message(&mut framed.as_slice())).expect("our frame reads back");
        assert_eq!(back, answer);
    }
});
