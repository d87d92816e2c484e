//! Tenants: scoped consumer tokens (docs/TENANTS.md). The operator's token (the data
//! directory's `api-token`) makes them; each reaches only the keys of its pattern
//! (another tenant's key is the same 404 as an unknown one, on every route, stream,
//! door, pending decision and `/mcp`) and holds at most its share of the ceiling.
//!
//! A token is `stk_<id>_<secret>`: the id is public (listed, revoked by), the secret 256
//! bits from the OS CSPRNG, and the server keeps only the secret's SHA-256 (the
//! database alone opens nothing). Live tokens are held in memory (loaded at start,
//! changed with the table), so checking one is a map lookup and a hash. The decisions
//! (pattern, overlap, token shape, share) are [`scope`]'s, pure.

pub mod scope;

use std::collections::HashMap;
use std::sync::{Arc, Mutex, RwLock};

use stockade_runtime::substrate::Substrate;
use stockade_store::{Store, TenantRow};
use stockade_wire as wire;

pub use scope::Pattern;

/// One live scoped token.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tenant {
    /// Its public id.
    pub id: String,
    /// The operator's label.
    pub name: String,
    /// The keys it reaches.
    pub keys: Pattern,
    /// Its share of the ceiling.
    pub ceiling: u32,
    digest: Vec<u8>,
}

/// Who a consumer request is from.
#[derive(Debug, Clone)]
pub enum Caller {
    /// The operator's (unscoped) token: every key, and the tokens' routes.
    Operator,
    /// A scoped token.
    Tenant(Arc<Tenant>),
}

impl Caller {
    /// Does this caller reach `key`?
    pub fn reaches(&self, key: &str) -> bool {
        match self {
            Caller::Operator => true,
            Caller::Tenant(t) => t.keys.matches(key),
        }
    }

    /// The tenant's id, if scoped (for log lines).
    pub fn tenant_id(&self) -> Option<&str> {
        match self {
            Caller::Operator => None,
            Caller::Tenant(t) => Some(&t.id),
        }
    }
}

/// Why a token could not be made, revoked or admitted.
#[derive(Debug, thiserror::Error)]
pub enum TenantError {
    /// A pattern, ceiling or name the server refuses (400).
    #[error("{0}")]
    Invalid(String),
    /// Its keys overlap a live token's (409).
    #[error(
        "keys {keys} overlap the live token {other} ({other_keys}): two tokens never reach one key"
    )]
    Overlap {
        /// The pattern asked for.
        keys: String,
        /// The live token's id.
        other: String,
        /// Its pattern.
        other_keys: String,
    },
    /// The tenant holds its whole share (429).
    #[error("token {id} holds its share of the ceiling ({ceiling} live containers)")]
    OverShare {
        /// The tenant.
        id: String,
        /// Its share.
        ceiling: u32,
    },
    /// The store failed (500).
    #[error("{0}")]
    Store(String),
}

fn store_error(e: stockade_store::StoreError) -> TenantError {
    TenantError::Store(e.to_string())
}

/// The longest label.
pub const MAX_NAME: usize = 64;

/// The scoped tokens of one server.
pub struct Tenants {
    store: Arc<Store>,
    /// The server's ceiling: no share is larger.
    server_ceiling: u32,
    live: RwLock<HashMap<String, Arc<Tenant>>>,
    /// Keys being admitted or running a call that may create a container, per tenant
    /// (key → how many calls hold it): counted until the container is live.
    held: Mutex<HashMap<String, HashMap<String, usize>>>,
    /// One admission at a time per tenant: a count and the hold it makes are one step
    /// (two calls cannot both take the last place).
    admitting: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
}

fn digest(secret: &str) -> Vec<u8> {
    ring::digest::digest(&ring::digest::SHA256, secret.as_bytes())
        .as_ref()
        .to_vec()
}

fn random_hex(bytes: usize) -> Result<String, TenantError> {
    use ring::rand::SecureRandom;
    let mut b = vec![0u8; bytes];
    ring::rand::SystemRandom::new()
        .fill(&mut b)
        .map_err(|_| TenantError::Store("the OS random source failed".into()))?;
    Ok(b.iter().map(|x| format!("{x:02x}")).collect())
}

fn info(r: &TenantRow) -> wire::TokenInfo {
    wire::TokenInfo {
        id: r.id.clone(),
        name: r.name.clone(),
        keys: r.keys.clone(),
        ceiling: r.ceiling,
        created_ms: r.created_ms,
        revoked_ms: r.revoked_ms,
    }
}

impl Tenants {
    /// The live tokens in `store`, for a server of `server_ceiling`.
    pub fn load(store: Arc<Store>, server_ceiling: u32) -> Result<Arc<Self>, TenantError> {
        let mut live = HashMap::new();
        for r in store.tenants().map_err(store_error)? {
            if r.revoked_ms.is_some() {
                continue;
            }
            // A row this version cannot parse is left out (its token opens nothing),
            // and said.
            match Pattern::parse(&r.keys) {
                Ok(keys) => {
                    live.insert(
                        r.id.clone(),
                        Arc::new(Tenant {
                            id: r.id,
                            name: r.name,
                            keys,
                            ceiling: r.ceiling,
                            digest: r.digest,
                        }),
                    );
                }
                Err(e) => {
                    tracing::warn!(target: "stockade::tenants", id = %r.id, error = %e, "token left out")
                }
            }
        }
        Ok(Arc::new(Self {
            store,
            server_ceiling,
            live: RwLock::new(live),
            held: Mutex::new(HashMap::new()),
            admitting: Mutex::new(HashMap::new()),
        }))
    }

    /// The live tenant whose token this is, if any (constant-time on the secret).
    pub fn verify(&self, presented: &str) -> Option<Arc<Tenant>> {
        let (id, secret) = scope::split_token(presented)?;
        let t = self.live.read().ok()?.get(id).cloned()?;
        crate::compare::same(&digest(secret), &t.digest).then_some(t)
    }

    /// Make a token. The answer carries the token, shown this once.
    pub fn create(
        &self,
        body: &wire::TokenBody,
        now_ms: u64,
    ) -> Result<wire::TokenCreated, TenantError> {
        let keys = Pattern::parse(&body.keys).map_err(TenantError::Invalid)?;
        // A share above the server's ceiling is the whole ceiling (the gate admits
        // every container anyway); zero would be a token that can run nothing.
        let ceiling = match body.ceiling {
            None => self.server_ceiling,
            Some(0) => {
                return Err(TenantError::Invalid(
                    "ceiling 0: a share is at least 1 live container".into(),
                ));
            }
            Some(c) => u32::try_from(c)
                .map_err(|_| TenantError::Invalid(format!("ceiling {c}: past 4294967295")))?
                .min(self.server_ceiling),
        };
        let name = body.name.clone().unwrap_or_else(|| keys.to_string());
        if name.is_empty()
            || name.chars().count() > MAX_NAME
            || name.chars().any(|c| c.is_control())
        {
            return Err(TenantError::Invalid(format!(
                "name: 1 to {MAX_NAME} characters, none a control character"
            )));
        }
        let mut live = self
            .live
            .write()
            .map_err(|_| TenantError::Store("the token table's lock is poisoned".into()))?;
        if let Some(o) = live.values().find(|o| o.keys.overlaps(&keys)) {
            return Err(TenantError::Overlap {
                keys: keys.to_string(),
                other: o.id.clone(),
                other_keys: o.keys.to_string(),
            });
        }
        let id = random_hex(scope::ID_HEX / 2)?;
        let secret = random_hex(scope::SECRET_HEX / 2)?;
        let row = TenantRow {
            id: id.clone(),
            name: name.clone(),
            keys: keys.to_string(),
            ceiling,
            digest: digest(&secret),
            created_ms: now_ms,
            revoked_ms: None,
        };
        self.store.put_tenant(&row).map_err(store_error)?;
        live.insert(
            id.clone(),
            Arc::new(Tenant {
                id: id.clone(),
                name,
                keys,
                ceiling,
                digest: row.digest.clone(),
            }),
        );
        tracing::info!(target: "stockade::tenants", id = %id, keys = %row.keys, ceiling, "token created");
        Ok(wire::TokenCreated {
            token: format!("{}{id}_{secret}", scope::TOKEN_PREFIX),
            info: info(&row),
        })
    }

    /// Every token, live and revoked.
    pub fn list(&self) -> Result<Vec<wire::TokenInfo>, TenantError> {
        Ok(self
            .store
            .tenants()
            .map_err(store_error)?
            .iter()
            .map(info)
            .collect())
    }

    /// Revoke a live token: from now on it is a wrong token (401) everywhere. `false`:
    /// no live token has that id.
    pub fn revoke(&self, id: &str, now_ms: u64) -> Result<bool, TenantError> {
        let mut live = self
            .live
            .write()
            .map_err(|_| TenantError::Store("the token table's lock is poisoned".into()))?;
        if !live.contains_key(id) {
            return Ok(false);
        }
        self.store.revoke_tenant(id, now_ms).map_err(store_error)?;
        live.remove(id);
        tracing::info!(target: "stockade::tenants", id = %id, "token revoked");
        Ok(true)
    }

    /// Admit `tenant`'s call on `key`, which may create a container: within its share
    /// ([`scope::within_share`]) the call holds the key until the returned [`Hold`]
    /// drops (by then the container is live, and counted as such).
    pub async fn admit(
        self: &Arc<Self>,
        tenant: &Tenant,
        key: &str,
        substrate: &dyn Substrate,
    ) -> Result<Hold, TenantError> {
        let one = self
            .admitting
            .lock()
            .map_err(|_| TenantError::Store("the admission lock is poisoned".into()))?
            .entry(tenant.id.clone())
            .or_default()
            .clone();
        let _one = one.lock().await;
        let held: Vec<String> = self.held_keys(&tenant.id);
        let mut live = 0usize;
        let mut key_is_live = false;
        for k in self.store.tenant_keys(&tenant.id).map_err(store_error)? {
            let holding = held.contains(&k);
            // A key the substrate cannot be asked about counts as live: the share is
            // never overcommitted on an error.
            let up = holding || !matches!(substrate.current(&k).await, Ok(None));
            if up {
                live += 1;
                key_is_live |= k == key;
            } else {
                // No container and no call holding it: nothing to count, so the list
                // stays as long as the share, not as every key ever called.
                self.store
                    .forget_tenant_key(&tenant.id, &k)
                    .map_err(store_error)?;
            }
        }
        if !scope::within_share(live, key_is_live, tenant.ceiling) {
            tracing::info!(target: "stockade::tenants", id = %tenant.id, key = %key, live, ceiling = tenant.ceiling, "over its share");
            return Err(TenantError::OverShare {
                id: tenant.id.clone(),
                ceiling: tenant.ceiling,
            });
        }
        self.store
            .note_tenant_key(&tenant.id, key)
            .map_err(store_error)?;
        if let Ok(mut h) = self.held.lock() {
            *h.entry(tenant.id.clone())
                .or_default()
                .entry(key.to_string())
                .or_default() += 1;
        }
        Ok(Hold {
            tenants: self.clone(),
            tenant: tenant.id.clone(),
            key: key.to_string(),
        })
    }

    fn held_keys(&self, tenant: &str) -> Vec<String> {
        self.held
            .lock()
            .map(|h| {
                h.get(tenant)
                    .map(|m| m.keys().cloned().collect())
                    .unwrap_or_default()
            })
            .unwrap_or_default()
    }
}

/// A call that may create a container, counted against its tenant's share until it
/// drops.
pub struct Hold {
    tenants: Arc<Tenants>,
    tenant: String,
    key: String,
}

impl Drop for Hold {
    fn drop(&mut self) {
        if let Ok(mut h) = self.tenants.held.lock()
            && let Some(keys) = h.get_mut(&self.tenant)
        {
            if let Some(n) = keys.get_mut(&self.key) {
                *n -= 1;
                if *n == 0 {
                    keys.remove(&self.key);
                }
            }
            if keys.is_empty() {
                h.remove(&self.tenant);
            }
        }
    }
}

#[cfg(test)]
impl Tenant {
    /// A tenant of `keys`, share 2, for the API's tables.
    pub(crate) fn for_tests(keys: &str) -> Tenant {
        Tenant {
            id: "0123456789abcdef".into(),
            name: keys.into(),
            keys: Pattern::parse(keys).unwrap(),
            ceiling: 2,
            digest: vec![],
        }
    }
}
