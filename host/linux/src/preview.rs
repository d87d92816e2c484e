//! The linux substrate's preview doors (DESIGN §8; docs/PREVIEW.md): the table lives in
//! [`stockade_runtime::preview::Doors`]; this module answers the three contract calls for live
//! containers, connects a door into its container's network namespace (through the
//! supervisor's pidfd, [`netns::connect_in`]), and starts the listener
//! ([`Linux::serve_previews`]). A container's doors close when it stops, whatever
//! stopped it (`kill_container` and `teardown` close them first).

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, Weak};
use std::time::Duration;

use super::{Inner, Linux, netns};
use stockade_runtime::preview::{Connect, Preview};
use stockade_runtime::substrate::{Result, SubstrateError};

/// Longest a connection into the container may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

impl Inner {
    /// Open (or answer) the door onto `port` of a live container.
    pub(super) fn open_preview(&self, container: &str, port: u16) -> Result<Preview> {
        let c = self.get(container)?;
        if *c.exited.borrow() {
            return Err(SubstrateError::Unreachable(format!(
                "container {container} stopped"
            )));
        }
        if !self
            .preview_listening
            .load(std::sync::atomic::Ordering::SeqCst)
        {
            return Err(SubstrateError::Unreachable(
                "the preview listener is not listening ([preview] in wasmtime.toml; see the server's log)"
                    .into(),
            ));
        }
        let p = self
            .doors
            .open(container, port)
            .map_err(SubstrateError::Failed)?;
        tracing::info!(target: "stockade::preview", key = c.key, container, port, "door open");
        Ok(p)
    }

    pub(super) fn close_preview(&self, container: &str, port: u16) -> Result<bool> {
        let closed = self.doors.close(container, port);
        tracing::info!(target: "stockade::preview", container, port, closed, "door closed");
        Ok(closed)
    }

    pub(super) fn list_previews(&self, container: &str) -> Result<Vec<Preview>> {
        Ok(self.doors.list(container))
    }

    /// The container stopped (or is stopping): its doors close now.
    pub(super) fn close_doors(&self, container: &str) {
        let n = self.doors.close_container(container);
        if n > 0 {
            tracing::info!(target: "stockade::preview", container, closed = n, "doors closed with their container");
        }
    }
}

/// Connections into containers, for the listener. Holds the substrate weakly: the
/// listener never keeps a stopped substrate alive.
struct Connector(Weak<Inner>);

impl Connect for Connector {
    fn connect(
        &self,
        container: &str,
        port: u16,
    ) -> Pin<Box<dyn Future<Output = io::Result<tokio::net::TcpStream>> + Send + '_>> {
        let c = self
            .0
            .upgrade()
            .and_then(|inner| inner.get(container).ok())
            .filter(|c| !*c.exited.borrow());
        Box::pin(async move {
            let c = c.ok_or_else(|| io::Error::other("the container is gone"))?;
            let pidfd = c.pidfd.clone();
            let s = tokio::task::spawn_blocking(move || {
                netns::connect_in(pidfd, port, CONNECT_TIMEOUT)
            })
            .await
            .map_err(io::Error::other)??;
            tokio::net::TcpStream::from_std(s)
        })
    }
}

impl Linux {
    /// Bind `[preview] listen` and serve doors until the process ends (`stockade serve`,
    /// `stockade node`). Returns the bound address; URLs name it from now on.
    pub async fn serve_previews(&self) -> io::Result<SocketAddr> {
        let addr: SocketAddr = self
            .inner
            .preview
            .listen
            .parse()
            .map_err(|_| io::Error::other("preview.listen is not an address"))?;
        let listener = tokio::net::TcpListener::bind(addr).await?;
        let bound = listener.local_addr()?;
        self.inner.doors.set_authority(bound.to_string());
        self.inner
            .preview_listening
            .store(true, std::sync::atomic::Ordering::SeqCst);
        let doors = self.inner.doors.clone();
        let connect: Arc<dyn Connect> = Arc::new(Connector(Arc::downgrade(&self.inner)));
        tokio::spawn(stockade_runtime::preview::serve(listener, doors, connect));
        tracing::info!(target: "stockade::preview", listen = %bound, domain = self.inner.preview.domain, "preview listener serving");
        Ok(bound)
    }

    /// The doors' table (tests: the audit, what is open).
    pub fn doors(&self) -> &Arc<stockade_runtime::preview::Doors> {
        &self.inner.doors
    }
}
