//! The table of open doors: token → (container, port), with each door's rate bucket,
//! its share of the listener's connections, the signal every connection through it
//! ends on, and the URLs a door is reached at. One lock, held for table updates only.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;

use super::Preview;
use super::audit::Audit;
use super::rate::{Bound, Bucket};
use super::token;

/// Where doors answer: the listener's address (path form) and, when configured, the
/// domain of the Host form.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Urls {
    /// `host:port` the listener is reached at (the bound address once it listens).
    pub authority: String,
    /// The Host form's domain (`{port}-{token}.{domain}`); none: the path form only.
    pub domain: Option<String>,
}

impl Urls {
    /// A door's URL: the Host form when a domain is configured, else the path form.
    pub fn url(&self, port: u16, token: &str) -> String {
        match &self.domain {
            Some(d) => {
                let listen_port = self
                    .authority
                    .rsplit_once(':')
                    .map(|(_, p)| p)
                    .filter(|p| *p != "80");
                match listen_port {
                    Some(lp) => format!("http://{port}-{token}.{d}:{lp}/"),
                    None => format!("http://{port}-{token}.{d}/"),
                }
            }
            None => format!("http://{}/p/{token}/", self.authority),
        }
    }
}

/// Most connections one door holds at once: inbound connections a request through it
/// bound, and upgrades (WebSocket, CDP) spliced through it. Each door has its own, so
/// one door (one key: at most 8 doors) cannot take another's.
pub const PER_DOOR: usize = 32;

/// An open door.
#[derive(Debug, Clone)]
pub struct Door {
    /// The container it opens onto.
    pub container: String,
    /// The port inside it.
    pub port: u16,
    /// Cancelled when the door closes (unexpose, or its container stops): every
    /// connection and splice made through it selects on it and ends.
    pub closed: CancellationToken,
    /// The door's share of the listener's connections ([`PER_DOOR`]).
    pub share: Arc<Semaphore>,
}

/// Two doors are the same door when they open onto the same port of the same container.
impl PartialEq for Door {
    fn eq(&self, other: &Self) -> bool {
        self.container == other.container && self.port == other.port
    }
}
impl Eq for Door {}

/// What the table says about a token for one inbound request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Lookup {
    /// An open door, the request within its rate bound.
    Open(Door),
    /// An open door over its rate bound.
    Limited,
    /// No such door (never opened, closed, or guessed): the 404.
    Unknown,
}

#[derive(Debug)]
struct Entry {
    door: Door,
    bucket: Bucket,
}

/// The doors of one substrate.
#[derive(Debug)]
pub struct Doors {
    by_token: Mutex<HashMap<String, Entry>>,
    urls: Mutex<Urls>,
    bound: Bound,
    audit: Audit,
}

impl Doors {
    /// An empty table.
    pub fn new(urls: Urls, bound: Bound) -> Self {
        Self {
            by_token: Mutex::default(),
            urls: Mutex::new(urls),
            bound,
            audit: Audit::default(),
        }
    }

    fn table(&self) -> MutexGuard<'_, HashMap<String, Entry>> {
        self.by_token.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn urls(&self) -> Urls {
        self.urls.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// The listener is bound: URLs name this authority from now on.
    pub fn set_authority(&self, authority: String) {
        self.urls
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .authority = authority;
    }

    /// The Host form's domain, if configured.
    pub fn domain(&self) -> Option<String> {
        self.urls().domain
    }

    /// The inbound requests seen (the audit).
    pub fn audit(&self) -> &Audit {
        &self.audit
    }

    /// Open the door onto `port` of `container` (a fresh token), or answer the open one.
    pub fn open(&self, container: &str, port: u16) -> Result<Preview, String> {
        let urls = self.urls();
        let mut t = self.table();
        if let Some((tok, _)) = t
            .iter()
            .find(|(_, e)| e.door.container == container && e.door.port == port)
        {
            return Ok(preview(&urls, port, tok));
        }
        let tok = loop {
            let tok = token::fresh()?;
            if !t.contains_key(&tok) {
                break tok;
            }
        };
        t.insert(
            tok.clone(),
            Entry {
                door: Door {
                    container: container.to_string(),
                    port,
                    closed: CancellationToken::new(),
                    share: Arc::new(Semaphore::new(PER_DOOR)),
                },
                bucket: Bucket::full(self.bound, Instant::now()),
            },
        );
        Ok(preview(&urls, port, &tok))
    }

    /// Close the door onto `port` of `container`; true if one was open. Every
    /// connection and splice made through it ends (its `closed` is cancelled).
    pub fn close(&self, container: &str, port: u16) -> bool {
        self.close_where(|d| d.container == container && d.port == port) > 0
    }

    /// Close every door of `container` (it stopped); how many. Every connection and
    /// splice made through them ends.
    pub fn close_container(&self, container: &str) -> usize {
        self.close_where(|d| d.container == container)
    }

    fn close_where(&self, doomed: impl Fn(&Door) -> bool) -> usize {
        let mut t = self.table();
        let mut n = 0;
        t.retain(|_, e| {
            let keep = !doomed(&e.door);
            if !keep {
                e.door.closed.cancel();
                n += 1;
            }
            keep
        });
        n
    }

    /// The container's open doors, by port.
    pub fn list(&self, container: &str) -> Vec<Preview> {
        let urls = self.urls();
        let mut v: Vec<Preview> = self
            .table()
            .iter()
            .filter(|(_, e)| e.door.container == container)
            .map(|(tok, e)| preview(&urls, e.door.port, tok))
            .collect();
        v.sort_by_key(|p| p.port);
        v
    }

    /// Every open door (tests and diagnostics): (container, port).
    pub fn all(&self) -> Vec<(String, u16)> {
        let mut v: Vec<_> = self
            .table()
            .values()
            .map(|e| (e.door.container.clone(), e.door.port))
            .collect();
        v.sort();
        v
    }

    /// The door `token` names, when the request names it wholly (`port`, the Host
    /// form's, is the door's when given), taking one request from its rate bound at
    /// `now`. A request that names no door (an unknown token, another port) is
    /// [`Lookup::Unknown`] and charges no door's bucket: only a request the door would
    /// serve spends its bound.
    pub fn admit(&self, token: &str, port: Option<u16>, now: Instant) -> Lookup {
        let mut t = self.table();
        let Some(e) = t.get_mut(token) else {
            return Lookup::Unknown;
        };
        if port.is_some_and(|p| p != e.door.port) {
            return Lookup::Unknown;
        }
        if e.bucket.take(self.bound, now) {
            Lookup::Open(e.door.clone())
        } else {
            Lookup::Limited
        }
    }
}

fn preview(urls: &Urls, port: u16, token: &str) -> Preview {
    Preview {
        port,
        token: token.to_string(),
        url: urls.url(port, token),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn doors(domain: Option<&str>) -> Doors {
        Doors::new(
            Urls {
                authority: "127.0.0.1:8790".into(),
                domain: domain.map(Into::into),
            },
            Bound {
                burst: 2,
                per_second: 1,
            },
        )
    }

    #[test]
    fn open_is_idempotent_per_port_and_close_forgets() {
        let d = doors(None);
        let a = d.open("c1", 8000).unwrap();
        assert_eq!(d.open("c1", 8000).unwrap(), a, "the same door again");
        let b = d.open("c1", 9000).unwrap();
        let other = d.open("c2", 8000).unwrap();
        assert_ne!(a.token, b.token);
        assert_ne!(a.token, other.token);
        assert_eq!(a.url, format!("http://127.0.0.1:8790/p/{}/", a.token));
        assert_eq!(d.list("c1"), vec![a.clone(), b.clone()]);
        assert!(d.close("c1", 8000));
        assert!(!d.close("c1", 8000), "closing twice");
        assert_eq!(d.admit(&a.token, None, Instant::now()), Lookup::Unknown);
        let reopened = d.open("c1", 8000).unwrap();
        assert_ne!(reopened.token, a.token, "a reopened door has a fresh token");
        assert_eq!(d.close_container("c1"), 2);
        assert_eq!(d.admit(&b.token, None, Instant::now()), Lookup::Unknown);
        assert!(matches!(
            d.admit(&other.token, None, Instant::now()),
            Lookup::Open(Door { ref container, port: 8000, .. }) if container == "c2"
        ));
    }

    #[test]
    fn closing_a_door_cancels_every_connection_through_it() {
        let d = doors(None);
        let a = d.open("c1", 8000).unwrap();
        let b = d.open("c1", 9000).unwrap();
        let c = d.open("c2", 8000).unwrap();
        let signal = |tok: &str| match d.admit(tok, None, Instant::now()) {
            Lookup::Open(door) => door.closed,
            other => panic!("{other:?}"),
        };
        let (sa, sb, sc) = (signal(&a.token), signal(&b.token), signal(&c.token));
        assert!(d.close("c1", 8000));
        assert!(sa.is_cancelled(), "unexpose ends a's connections");
        assert!(!sb.is_cancelled() && !sc.is_cancelled(), "the others stay");
        assert_eq!(d.close_container("c1"), 1);
        assert!(sb.is_cancelled(), "the container's stop ends b's");
        assert!(!sc.is_cancelled(), "another container's door stays");
    }

    #[test]
    fn a_request_is_decided_wholly_before_it_charges_the_bucket() {
        let d = doors(None);
        let a = d.open("c", 8000).unwrap();
        let now = Instant::now();
        // (port named, what the table answers): a wrong port is no door and spends
        // nothing, however many times; the burst (2) is left whole for the right one.
        let rows: [(Option<u16>, &str); 7] = [
            (Some(8001), "unknown"),
            (Some(8001), "unknown"),
            (Some(8001), "unknown"),
            (Some(1), "unknown"),
            (Some(8000), "open"),
            (None, "open"),
            (Some(8000), "limited"),
        ];
        for (i, (port, want)) in rows.into_iter().enumerate() {
            let got = match d.admit(&a.token, port, now) {
                Lookup::Open(_) => "open",
                Lookup::Limited => "limited",
                Lookup::Unknown => "unknown",
            };
            assert_eq!(got, want, "row {i}: port {port:?}");
        }
    }

    #[test]
    fn the_rate_bound_is_per_door() {
        let d = doors(None);
        let a = d.open("c", 1).unwrap();
        let b = d.open("c", 2).unwrap();
        let now = Instant::now();
        assert!(matches!(d.admit(&a.token, None, now), Lookup::Open(_)));
        assert!(matches!(d.admit(&a.token, None, now), Lookup::Open(_)));
        assert_eq!(d.admit(&a.token, None, now), Lookup::Limited);
        assert!(
            matches!(d.admit(&b.token, None, now), Lookup::Open(_)),
            "b has its own"
        );
    }

    #[test]
    fn urls() {
        let rows = [
            ("127.0.0.1:8790", None, "http://127.0.0.1:8790/p/TOK/"),
            (
                "127.0.0.1:8790",
                Some("p.test"),
                "http://8000-TOK.p.test:8790/",
            ),
            ("0.0.0.0:80", Some("p.test"), "http://8000-TOK.p.test/"),
        ];
        for (authority, domain, want) in rows {
            let u = Urls {
                authority: authority.into(),
                domain: domain.map(Into::into),
            };
            assert_eq!(u.url(8000, "TOK"), want);
        }
    }
}
