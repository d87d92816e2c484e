//! A local HTTPS upstream for the suites (HTTPS under the fence, DESIGN §5): a rustls
//! server with a CA of its own, on the address the test picks (127.0.0.2 for containers:
//! `NO_PROXY` covers 127.0.0.1), on a runtime of its own so any test can use it.
//!
//! It records every request (method, path, the `Authorization` it received) and never
//! echoes a header back, so what a command sees of a credential is only what the proxy
//! let leak. `/repo.git/info/refs` answers as a git smart-HTTP server with one ref, so
//! `git ls-remote` works against it.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;

/// One request the upstream saw.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Seen {
    /// Method.
    pub method: String,
    /// Path (without the query).
    pub path: String,
    /// The `Authorization` header, if any.
    pub authorization: Option<String>,
    /// The TLS server name the client asked for (SNI), if any.
    pub sni: Option<String>,
}

/// A running HTTPS upstream; stops when dropped.
pub struct HttpsUpstream {
    /// Where it listens.
    pub addr: SocketAddr,
    /// Its CA (PEM): give it to the proxy (`egress.extra_ca_files`) or a client.
    pub ca_pem: String,
    seen: Arc<Mutex<Vec<Seen>>>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

/// The fake commit every ref of the git repository points at.
pub const GIT_HEAD: &str = "4b825dc642cb6eb9a060e54bf8d69288fbee4904";

impl HttpsUpstream {
    /// Start one on `ip` (port chosen by the kernel), its certificate naming `ip`.
    pub fn start(ip: &str) -> HttpsUpstream {
        Self::start_at(ip, 0)
    }

    /// [`HttpsUpstream::start`], its thread at niceness `nice` (raised, never lowered):
    /// an upstream that stands for another machine takes only spare CPU on this one.
    pub fn start_at(ip: &str, nice: i32) -> HttpsUpstream {
        let pki = stockade_egress::tls::LocalPki::new(vec![ip.to_string(), "localhost".into()])
            .expect("a local PKI");
        let acceptor = tokio_rustls::TlsAcceptor::from(pki.server.clone());
        let listener = std::net::TcpListener::bind((ip, 0)).unwrap();
        listener.set_nonblocking(true).unwrap();
        let addr = listener.local_addr().unwrap();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let log = seen.clone();
        let thread = std::thread::spawn(move || {
            crate::nice_this_thread(nice);
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async move {
                let listener = tokio::net::TcpListener::from_std(listener).unwrap();
                let serve = async {
                    loop {
                        let Ok((s, _)) = listener.accept().await else {
                            continue;
                        };
                        let (acceptor, log) = (acceptor.clone(), log.clone());
                        tokio::spawn(async move {
                            let Ok(t) = acceptor.accept(s).await else {
                                return;
                            };
                            let sni = t.get_ref().1.server_name().map(str::to_owned);
                            let svc = hyper::service::service_fn(move |req| {
                                answer(req, log.clone(), sni.clone())
                            });
                            let _ = hyper::server::conn::http1::Builder::new()
                                .serve_connection(TokioIo::new(t), svc)
                                .await;
                        });
                    }
                };
                tokio::select! {
                    _ = serve => {}
                    _ = stopped => {}
                }
            });
        });
        HttpsUpstream {
            addr,
            ca_pem: pki.ca_pem.clone(),
            seen,
            stop: Some(stop),
            thread: Some(thread),
        }
    }

    /// What it has seen so far.
    pub fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }

    /// `https://IP:PORT`.
    pub fn base(&self) -> String {
        format!("https://{}", self.addr)
    }
}

impl Drop for HttpsUpstream {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

async fn answer(
    req: Request<Incoming>,
    log: Arc<Mutex<Vec<Seen>>>,
    sni: Option<String>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    let path = req.uri().path().to_owned();
    let service = req
        .uri()
        .query()
        .is_some_and(|q| q.contains("service=git-upload-pack"));
    log.lock().unwrap().push(Seen {
        method: req.method().to_string(),
        path: path.clone(),
        authorization: req
            .headers()
            .get(hyper::header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned),
        sni,
    });
    let _ = req.into_body().collect().await;
    if path.ends_with("/info/refs") && service {
        let mut body = String::new();
        let pkt = |s: &str| format!("{:04x}{s}", s.len() + 4);
        body.push_str(&pkt("# service=git-upload-pack\n"));
        body.push_str("0000");
        body.push_str(&pkt(&format!(
            "{GIT_HEAD} HEAD\0multi_ack symref=HEAD:refs/heads/main agent=stockade-test\n"
        )));
        body.push_str(&pkt(&format!("{GIT_HEAD} refs/heads/main\n")));
        body.push_str("0000");
        let mut resp = Response::new(Full::new(Bytes::from(body)));
        resp.headers_mut().insert(
            hyper::header::CONTENT_TYPE,
            hyper::header::HeaderValue::from_static("application/x-git-upload-pack-advertisement"),
        );
        return Ok(resp);
    }
    Ok(Response::new(Full::new(Bytes::from_static(b"ok\n"))))
}
