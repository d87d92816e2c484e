//! The API without a connection: a [`Transport`] that hands a client's request to this
//! server's own router (`stockade serve`'s E2B layer, docs/E2B.md). The request meets
//! every route, layer and check a connection's would (the bearer token, a tenant's
//! pattern and share, body limits): only the socket is gone. An answer's body is the
//! router's own stream, so a caller that drops it mid-stream is a client that left (an
//! exec's stream dropped ends the command, as a closed connection does).

use axum::Router;
use bytes::Bytes;
use http_body_util::{BodyExt as _, Full};
use stockade_client::{Answer, BoxError, Transport};
use tower::ServiceExt as _;

/// This server's router, as a client's transport.
#[derive(Clone)]
pub struct InProcess(Router);

impl InProcess {
    /// The transport of `router` (the API's routes and layers, as served).
    pub fn new(router: Router) -> Self {
        Self(router)
    }
}

impl std::fmt::Debug for InProcess {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("InProcess")
    }
}

impl Transport for InProcess {
    fn send(&self, req: hyper::Request<Full<Bytes>>) -> Answer {
        let router = self.0.clone();
        Box::pin(async move {
            let resp = router
                .oneshot(req.map(axum::body::Body::new))
                .await
                .map_err(|e| Box::new(e) as BoxError)?;
            Ok(resp.map(|b| b.map_err(|e| Box::new(e) as BoxError).boxed_unsync()))
        })
    }
}
