//! The stop request a container runtime sends: `SIGTERM` on Unix, the console shutdown and
//! close events on Windows (what a Windows container receives when its pod stops).

use std::io;

/// Waits for the runtime's stop request.
#[derive(Debug)]
pub struct Terminate {
    #[cfg(unix)]
    term: tokio::signal::unix::Signal,
    #[cfg(windows)]
    shutdown: tokio::signal::windows::CtrlShutdown,
    #[cfg(windows)]
    close: tokio::signal::windows::CtrlClose,
}

impl Terminate {
    /// Registers the handler (do it early: a request before registration is lost).
    pub fn new() -> io::Result<Self> {
        #[cfg(unix)]
        {
            use tokio::signal::unix::{SignalKind, signal};
            Ok(Self {
                term: signal(SignalKind::terminate())?,
            })
        }
        #[cfg(windows)]
        {
            use tokio::signal::windows::{ctrl_close, ctrl_shutdown};
            Ok(Self {
                shutdown: ctrl_shutdown()?,
                close: ctrl_close()?,
            })
        }
    }

    /// Resolves at the next stop request.
    pub async fn recv(&mut self) {
        #[cfg(unix)]
        {
            self.term.recv().await;
        }
        #[cfg(windows)]
        {
            tokio::select! {
                _ = self.shutdown.recv() => {}
                _ = self.close.recv() => {}
            }
        }
    }
}
