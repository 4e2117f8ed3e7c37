//! [`NetnsSocketFactory`]: the Unix socket factory, entering a namespace held by descriptor
//! around `socket(2)` only.

use socket2::{Domain, Protocol, Socket, Type};

use crate::socket::create_socket;
use crate::{NetnsFd, SocketError, SocketFactory, in_netns};

/// Creates sockets inside a fixed network namespace, optionally marking all of them.
#[derive(Debug)]
pub struct NetnsSocketFactory {
    /// The namespace sockets are created in.
    pub netns: NetnsFd,
    /// Default `SO_MARK` for every socket (e.g. so redirection rules skip our own traffic).
    pub mark: Option<u32>,
}

impl NetnsSocketFactory {
    /// A factory for `netns` that marks every socket with `mark`.
    pub fn new(netns: NetnsFd, mark: Option<u32>) -> Self {
        Self { netns, mark }
    }
}

impl SocketFactory for NetnsSocketFactory {
    fn new_socket(
        &self,
        domain: Domain,
        ty: Type,
        protocol: Protocol,
    ) -> Result<Socket, SocketError> {
        in_netns(&self.netns, || create_socket(domain, ty, protocol))?
    }

    fn default_mark(&self) -> Option<u32> {
        self.mark
    }
}
