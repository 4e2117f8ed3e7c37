//! The socket factory: every socket that must live in a particular network namespace
//! (a pod's, for ztunnel's in-pod listeners) is created through a [`SocketFactory`].
//!
//! A socket stays in the namespace it was created in, whatever thread later binds,
//! connects or polls it. [`NetnsSocketFactory`] therefore enters the namespace only around
//! `socket(2)`; everything after runs on the caller's thread. All sockets are returned in
//! non-blocking mode, ready to be wrapped by tokio (`TcpListener::from_std`,
//! `UdpSocket::from_std`, `TcpSocket::from_std_stream`). The factories that enter a
//! namespace are per platform: `NetnsSocketFactory` (Unix, by descriptor) and
//! `CompartmentSocketFactory` (Windows, by network compartment).

use std::{
    io,
    net::{SocketAddr, TcpListener, UdpSocket},
    time::Duration,
};

use socket2::{Domain, Protocol, Socket, TcpKeepalive, Type};

use crate::{NetnsError, imp};

/// Errors from creating and configuring sockets; each says which step failed.
#[derive(Debug, thiserror::Error)]
pub enum SocketError {
    /// Entering the namespace failed.
    #[error(transparent)]
    Netns(#[from] NetnsError),
    /// Entering the network compartment failed (Windows).
    #[error(transparent)]
    Compartment(#[from] crate::compartment::CompartmentError),
    /// `socket(2)` failed.
    #[error("creating {kind} socket: {source}")]
    Create {
        /// "tcp" or "udp".
        kind: &'static str,
        /// The underlying error.
        source: io::Error,
    },
    /// A socket option could not be set.
    #[error("setting {option}: {source}")]
    Option {
        /// The option's C name.
        option: &'static str,
        /// The underlying error.
        source: io::Error,
    },
    /// A socket option was requested that this platform does not have.
    #[error("{option} is not supported on this platform")]
    Unsupported {
        /// The option's C name.
        option: &'static str,
    },
    /// `bind(2)` failed.
    #[error("binding {addr}: {source}")]
    Bind {
        /// The local address.
        addr: SocketAddr,
        /// The underlying error.
        source: io::Error,
    },
    /// `listen(2)` failed.
    #[error("listening on {addr}: {source}")]
    Listen {
        /// The local address.
        addr: SocketAddr,
        /// The underlying error.
        source: io::Error,
    },
    /// Connecting to the peer failed.
    #[error("connecting to {addr}: {source}")]
    Connect {
        /// The remote address.
        addr: SocketAddr,
        /// The underlying error.
        source: io::Error,
    },
}

/// How much `IP_TRANSPARENT` matters to the caller.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Transparent {
    /// Do not set it.
    #[default]
    Off,
    /// Try; carry on without it if the kernel refuses (e.g. no CAP_NET_ADMIN).
    BestEffort,
    /// Fail socket creation if it cannot be set.
    Required,
}

/// TCP keepalive parameters.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Keepalive {
    /// Idle time before the first probe.
    pub time: Duration,
    /// Time between probes.
    pub interval: Duration,
    /// Unanswered probes before the connection is dropped.
    pub retries: u32,
}

/// Options applied to a socket before bind/listen.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SocketOptions {
    /// `SO_MARK`; overrides the factory's default mark when set.
    pub mark: Option<u32>,
    /// `SO_REUSEADDR` (on by default for listeners, like tokio and std).
    pub reuse_address: bool,
    /// `SO_REUSEPORT`.
    pub reuse_port: bool,
    /// `IP_TRANSPARENT` / `IPV6_TRANSPARENT`.
    pub transparent: Transparent,
    /// `IP_FREEBIND` / `IPV6_FREEBIND`: bind to addresses not (yet) on an interface.
    pub freebind: bool,
    /// `TCP_NODELAY` (TCP only; inherited by accepted sockets on Linux).
    pub nodelay: bool,
    /// TCP keepalive (TCP only).
    pub keepalive: Option<Keepalive>,
    /// `IPV6_V6ONLY` for IPv6 sockets; `None` keeps the system default.
    pub only_v6: Option<bool>,
    /// Listen backlog.
    pub backlog: i32,
    /// For a TCP stream socket that is not bound ([`SocketFactory::new_tcp_stream_socket`]
    /// without a local address): search the whole port range in sequence at connect
    /// (`IP_LOCAL_PORT_RANGE`), as sockets bound to an address with port 0 always do.
    /// Off, the kernel searches the even ports first. For a proxy's connects on an
    /// application's behalf, which share the application's 4-tuples to one destination.
    pub sequential_port_search: bool,
}

impl Default for SocketOptions {
    fn default() -> Self {
        Self {
            mark: None,
            reuse_address: true,
            reuse_port: false,
            transparent: Transparent::Off,
            freebind: false,
            nodelay: false,
            keepalive: None,
            only_v6: None,
            backlog: 1024,
            sequential_port_search: false,
        }
    }
}

/// Creates sockets in some network namespace with the requested options.
///
/// Implementors only provide [`SocketFactory::new_socket`] (the raw `socket(2)` in the
/// right namespace) and optionally a default mark; option handling, bind and listen are
/// shared.
pub trait SocketFactory: std::fmt::Debug + Send + Sync {
    /// Creates a raw socket in the factory's namespace. It must not be bound yet. `ty` is
    /// passed on to `socket(2)` as given: on Linux it carries `SOCK_NONBLOCK`, and the
    /// shared option handling relies on that instead of setting it again.
    fn new_socket(
        &self,
        domain: Domain,
        ty: Type,
        protocol: Protocol,
    ) -> Result<Socket, SocketError>;

    /// `SO_MARK` applied when the options do not set one.
    fn default_mark(&self) -> Option<u32> {
        None
    }

    /// A non-blocking TCP listener bound to `addr`.
    fn new_tcp_listener(
        &self,
        addr: SocketAddr,
        opts: &SocketOptions,
    ) -> Result<TcpListener, SocketError> {
        let sock = configured(self, addr, Type::STREAM, Protocol::TCP, opts)?;
        bind(&sock, addr)?;
        sock.listen(opts.backlog)
            .map_err(|source| SocketError::Listen { addr, source })?;
        Ok(sock.into())
    }

    /// A non-blocking, unconnected TCP socket of `remote`'s family, bound to `local` if
    /// given. Connect it with tokio (`TcpSocket::from_std_stream(sock.into())`) or use
    /// [`connect_tcp`]. Bound to an address with port 0 (or not bound, with
    /// [`SocketOptions::sequential_port_search`]), it gets its port at connect time,
    /// searched over the whole range from where the last search to the same destination
    /// ended (`IP_BIND_ADDRESS_NO_PORT`, `IP_LOCAL_PORT_RANGE`).
    fn new_tcp_stream_socket(
        &self,
        remote: SocketAddr,
        local: Option<SocketAddr>,
        opts: &SocketOptions,
    ) -> Result<Socket, SocketError> {
        let sock = configured(self, remote, Type::STREAM, Protocol::TCP, opts)?;
        let port_at_connect = local.is_some_and(|l| l.port() == 0);
        if port_at_connect {
            // Choose the port at connect time (per 4-tuple), not at bind time.
            imp::set_bind_address_no_port(&sock).map_err(|source| SocketError::Option {
                option: "IP_BIND_ADDRESS_NO_PORT",
                source,
            })?;
        }
        if port_at_connect || (local.is_none() && opts.sequential_port_search) {
            // A proxy makes many connections from one client's address to one app port:
            // keep the kernel's port search short once TIME-WAIT holds most of the range.
            imp::set_sequential_port_search(&sock).map_err(|source| SocketError::Option {
                option: "IP_LOCAL_PORT_RANGE",
                source,
            })?;
        }
        if let Some(local) = local {
            bind(&sock, local)?;
        }
        Ok(sock)
    }

    /// A non-blocking UDP socket bound to `addr`.
    fn new_udp_socket(
        &self,
        addr: SocketAddr,
        opts: &SocketOptions,
    ) -> Result<UdpSocket, SocketError> {
        let sock = configured(self, addr, Type::DGRAM, Protocol::UDP, opts)?;
        bind(&sock, addr)?;
        Ok(sock.into())
    }
}

/// Creates a socket of `addr`'s family through `factory` and applies `opts`.
fn configured<F: SocketFactory + ?Sized>(
    factory: &F,
    addr: SocketAddr,
    ty: Type,
    protocol: Protocol,
    opts: &SocketOptions,
) -> Result<Socket, SocketError> {
    // Created non-blocking (SOCK_NONBLOCK) where the type can say so: two `fcntl` fewer
    // per socket, one socket per proxied connection on a pod's side.
    #[cfg(target_os = "linux")]
    let ty = ty.nonblocking();
    let sock = factory.new_socket(Domain::for_address(addr), ty, protocol)?;
    apply_options(
        &sock,
        addr.is_ipv6(),
        protocol == Protocol::TCP,
        opts,
        opts.mark.or(factory.default_mark()),
    )?;
    Ok(sock)
}

fn bind(sock: &Socket, addr: SocketAddr) -> Result<(), SocketError> {
    sock.bind(&addr.into())
        .map_err(|source| SocketError::Bind { addr, source })
}

fn apply_options(
    sock: &Socket,
    ipv6: bool,
    tcp: bool,
    opts: &SocketOptions,
    mark: Option<u32>,
) -> Result<(), SocketError> {
    let opt_err = |option: &'static str| move |source| SocketError::Option { option, source };
    #[cfg(not(target_os = "linux"))]
    sock.set_nonblocking(true).map_err(opt_err("O_NONBLOCK"))?;
    if opts.reuse_address {
        sock.set_reuse_address(true)
            .map_err(opt_err("SO_REUSEADDR"))?;
    }
    if let (true, Some(only)) = (ipv6, opts.only_v6) {
        sock.set_only_v6(only).map_err(opt_err("IPV6_V6ONLY"))?;
    }
    if tcp {
        if opts.nodelay {
            sock.set_tcp_nodelay(true).map_err(opt_err("TCP_NODELAY"))?;
        }
        if let Some(k) = opts.keepalive {
            let params = TcpKeepalive::new()
                .with_time(k.time)
                .with_interval(k.interval)
                .with_retries(k.retries);
            sock.set_tcp_keepalive(&params)
                .map_err(opt_err("SO_KEEPALIVE"))?;
        }
    }
    imp::apply_options(sock, ipv6, opts, mark)
}

/// Where marks and transparent sockets do not exist (Windows, platforms without network
/// namespaces): each Linux-only option asked for is refused by name, never ignored.
#[cfg(not(target_os = "linux"))]
pub(crate) fn refuse_linux_options(
    opts: &SocketOptions,
    mark: Option<u32>,
) -> Result<(), SocketError> {
    let unsupported = |option| Err(SocketError::Unsupported { option });
    if mark.is_some() {
        return unsupported("SO_MARK");
    }
    if opts.reuse_port {
        return unsupported("SO_REUSEPORT");
    }
    if opts.transparent == Transparent::Required {
        return unsupported("IP_TRANSPARENT");
    }
    if opts.freebind {
        return unsupported("IP_FREEBIND");
    }
    Ok(())
}

pub(crate) fn create_socket(
    domain: Domain,
    ty: Type,
    protocol: Protocol,
) -> Result<Socket, SocketError> {
    let kind = if ty == Type::DGRAM { "udp" } else { "tcp" };
    Socket::new(domain, ty, Some(protocol)).map_err(|source| SocketError::Create { kind, source })
}

/// Creates sockets in the calling thread's current namespace.
#[derive(Clone, Copy, Debug, Default)]
pub struct DefaultSocketFactory;

impl SocketFactory for DefaultSocketFactory {
    fn new_socket(
        &self,
        domain: Domain,
        ty: Type,
        protocol: Protocol,
    ) -> Result<Socket, SocketError> {
        create_socket(domain, ty, protocol)
    }
}

/// Connects a TCP stream created by `factory` (so it lives in the factory's namespace)
/// to `remote`, optionally from `local`.
pub async fn connect_tcp(
    factory: &dyn SocketFactory,
    remote: SocketAddr,
    local: Option<SocketAddr>,
    opts: &SocketOptions,
) -> Result<tokio::net::TcpStream, SocketError> {
    let sock = factory.new_tcp_stream_socket(remote, local, opts)?;
    let sock = tokio::net::TcpSocket::from_std_stream(sock.into());
    sock.connect(remote)
        .await
        .map_err(|source| SocketError::Connect {
            addr: remote,
            source,
        })
}

/// The destination a connection had before the in-pod rules REDIRECTed it to us
/// (`SO_ORIGINAL_DST`; on Windows the same option reads where HNS's WFP proxy policy sent
/// it). Fails for connections that were not redirected.
pub fn original_dst<S: imp::AsSocket>(stream: &S) -> io::Result<SocketAddr> {
    crate::imp::original_dst(&socket2::SockRef::from(stream))
}

/// Whether `IP_TRANSPARENT` took effect on `sock` (a best-effort listener may lack it;
/// always `false` where the option does not exist).
pub fn is_transparent<S: imp::AsSocket>(sock: &S) -> io::Result<bool> {
    let r = socket2::SockRef::from(sock);
    let ipv6 = r.local_addr()?.is_ipv6();
    crate::imp::is_transparent(&r, ipv6)
}

/// Run under Wine by `scripts/test` (the Windows step): nothing Linux-only is silently dropped.
#[cfg(all(test, not(target_os = "linux")))]
mod refuse_tests {
    use super::*;

    #[test]
    fn each_linux_only_option_is_refused_by_name() {
        let cases: [(&str, SocketOptions, Option<u32>); 4] = [
            ("SO_MARK", SocketOptions::default(), Some(0x539)),
            (
                "SO_REUSEPORT",
                SocketOptions {
                    reuse_port: true,
                    ..SocketOptions::default()
                },
                None,
            ),
            (
                "IP_TRANSPARENT",
                SocketOptions {
                    transparent: Transparent::Required,
                    ..SocketOptions::default()
                },
                None,
            ),
            (
                "IP_FREEBIND",
                SocketOptions {
                    freebind: true,
                    ..SocketOptions::default()
                },
                None,
            ),
        ];
        for (want, opts, mark) in cases {
            match refuse_linux_options(&opts, mark) {
                Err(SocketError::Unsupported { option }) => assert_eq!(option, want),
                other => panic!("{want}: expected a refusal, got {other:?}"),
            }
        }
        assert!(refuse_linux_options(&SocketOptions::default(), None).is_ok());
    }
}
