//! The Unix half of the platform switch: namespaces held by file descriptor. Linux has
//! them (the system calls are in `linux.rs`); other Unixes compile against the
//! `unsupported.rs` stub and get [`crate::NetnsError::Unsupported`].

#[path = "command.rs"]
mod command;
#[path = "enter.rs"]
mod enter;
#[path = "fd.rs"]
mod fd;
#[path = "netns_socket.rs"]
mod netns_socket;
#[path = "seqpacket.rs"]
mod seqpacket;

pub use command::{kill_with_parent, set_command_netns};
pub use enter::{in_netns, run_in_netns_thread, spawn_in_netns_thread};
pub use fd::NetnsFd;
pub use netns_socket::NetnsSocketFactory;
pub use seqpacket::{SeqPacket, SeqPacketListener, register_async};
