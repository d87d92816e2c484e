//! Server-held secrets: the values behind a rule's `headers`. A grant names a secret;
//! the proxy adds its value to the requests that rule admits over intercepted HTTPS,
//! only while that fence is open. The command never holds it.
//!
//! Two sources: files named in `wasmtime.toml` (`[egress.secret_files]`, read when a
//! fence opens, so a rotated file takes effect on the next exec), and values set through
//! the API/CLI with the approver's credential (kept in the store, in the private data
//! directory). A name defined by a file cannot be set through the API. A value is
//! never logged, never in an error, never in an API answer: [`Secret`]'s `Debug` says so.
//!
//! Every secret is bound: the approver who sets it says where it may go
//! (host:port, methods, path prefix; `egress.secret_bindings` for a file), and a rule
//! naming it must sit inside that binding ([`stockade_grammar::binding`]). A secret set
//! before bindings existed, or a file without a binding, is unbound: no rule may name it.

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::Arc;

use hyper::header::HeaderValue;

use stockade_grammar::binding::Binding;

use crate::config::EgressConfig;

/// Why the secret store failed (its own error, kept as the source).
pub type StoreError = Box<dyn std::error::Error + Send + Sync>;

/// Where secrets set through the API are kept (the host's records store, in the
/// private data directory). The proxy only reads values when a fence opens; the API
/// sets and removes them through [`Secrets`].
pub trait SecretStore: Send + Sync + 'static {
    /// Store `value` for `name` with where it may go (replacing an earlier one).
    fn put_secret(
        &self,
        name: &str,
        value: &str,
        binding: &Binding,
        now_ms: u64,
    ) -> Result<(), StoreError>;
    /// Where `name` may go: `None` when it is not set or was set before bindings.
    fn secret_binding(&self, name: &str) -> Result<Option<Binding>, StoreError>;
    /// The value of `name`, if set.
    fn secret(&self, name: &str) -> Result<Option<String>, StoreError>;
    /// Remove `name`; whether it existed.
    fn remove_secret(&self, name: &str) -> Result<bool, StoreError>;
    /// Every name with when it was last set (ms since the epoch).
    fn secret_names(&self) -> Result<Vec<(String, u64)>, StoreError>;
}

/// Longest secret value.
pub const MAX_SECRET_VALUE: usize = 8 * 1024;

/// A secret's value, ready to be a header: `Debug` never shows it.
#[derive(Clone)]
pub struct Secret(HeaderValue);

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(..)")
    }
}

impl Secret {
    /// The header value (marked sensitive).
    pub fn header(&self) -> &HeaderValue {
        &self.0
    }
}

/// The values of one grant's secrets, resolved when its fence opens.
pub type Resolved = HashMap<String, Secret>;

/// A secret value that cannot be a header value (pure): empty, too long, or holding a
/// control character (a CR/LF would split the request the proxy writes upstream).
pub fn check_value(value: &str) -> Result<HeaderValue, String> {
    if value.is_empty() || value.len() > MAX_SECRET_VALUE {
        return Err(format!(
            "a secret value must be 1..={MAX_SECRET_VALUE} bytes"
        ));
    }
    if value.bytes().any(|b| (b < b' ' && b != b'\t') || b == 0x7f) {
        return Err("a secret value must not hold control characters (CR, LF, NUL, ...)".into());
    }
    let mut v = HeaderValue::from_str(value).map_err(|_| "not a header value".to_string())?;
    v.set_sensitive(true);
    Ok(v)
}

/// How a secret listing names where a value comes from.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct SecretInfo {
    /// The name.
    pub name: String,
    /// `api` or `file`.
    pub source: &'static str,
    /// When it was set through the API (ms since the epoch); 0 for a file.
    pub updated_ms: u64,
    /// Where it may go (`GET,POST api.example.com:443/v1/`); `None`: unbound, no rule
    /// may name it.
    pub binding: Option<String>,
}

/// Why a secret operation failed.
#[derive(Debug, thiserror::Error)]
pub enum SecretError {
    /// A name or value the grammar refuses.
    #[error("{0}")]
    Invalid(String),
    /// The name is defined by the configuration's files.
    #[error("secret {0:?} is defined by egress.secret_files and cannot be changed here")]
    FromFile(String),
    /// The store failed.
    #[error("{0}")]
    Store(String),
}

/// The secrets of one server.
#[derive(Clone)]
pub struct Secrets {
    store: Arc<dyn SecretStore>,
    files: Arc<BTreeMap<String, PathBuf>>,
    file_bindings: Arc<BTreeMap<String, Binding>>,
}

impl std::fmt::Debug for Secrets {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Secrets")
            .field("files", &self.files.keys().collect::<Vec<_>>())
            .finish_non_exhaustive()
    }
}

impl Secrets {
    /// Secrets from the store and from `files` (name → path).
    /// (Unbound file secrets: see [`Secrets::from_config`].)
    pub fn new(store: Arc<dyn SecretStore>, files: BTreeMap<String, PathBuf>) -> Secrets {
        Secrets {
            store,
            files: Arc::new(files),
            file_bindings: Arc::default(),
        }
    }

    /// Secrets from the store and from the configuration's files, each file bound as
    /// `egress.secret_bindings` says (a binding that does not parse is left out, so
    /// its secret is unbound; `Config::validate` refuses such a file first).
    pub fn from_config(store: Arc<dyn SecretStore>, egress: &EgressConfig) -> Secrets {
        let file_bindings = egress
            .secret_bindings
            .iter()
            .filter_map(|(name, b)| Some((name.clone(), b.parse().ok()?)))
            .collect();
        Secrets {
            store,
            files: Arc::new(egress.secret_files.clone()),
            file_bindings: Arc::new(file_bindings),
        }
    }

    /// Set a secret through the API, with where it may go.
    pub fn set(
        &self,
        name: &str,
        value: &str,
        binding: &Binding,
        now_ms: u64,
    ) -> Result<(), SecretError> {
        stockade_grammar::rules::secret_name(name)
            .map_err(|e| SecretError::Invalid(e.to_string()))?;
        if self.files.contains_key(name) {
            return Err(SecretError::FromFile(name.to_owned()));
        }
        check_value(value).map_err(SecretError::Invalid)?;
        self.store
            .put_secret(name, value, binding, now_ms)
            .map_err(|e| SecretError::Store(e.to_string()))
    }

    /// Where `name` may go: `None` when it is not set or is unbound (set before
    /// bindings existed, or a file without `egress.secret_bindings`).
    pub fn binding(&self, name: &str) -> Option<Binding> {
        if self.files.contains_key(name) {
            return self.file_bindings.get(name).cloned();
        }
        self.store.secret_binding(name).ok().flatten()
    }

    /// Remove a secret set through the API; whether it existed.
    pub fn remove(&self, name: &str) -> Result<bool, SecretError> {
        stockade_grammar::rules::secret_name(name)
            .map_err(|e| SecretError::Invalid(e.to_string()))?;
        if self.files.contains_key(name) {
            return Err(SecretError::FromFile(name.to_owned()));
        }
        self.store
            .remove_secret(name)
            .map_err(|e| SecretError::Store(e.to_string()))
    }

    /// Is `name` set (a file, or a value in the store)?
    pub fn exists(&self, name: &str) -> bool {
        self.files.contains_key(name) || self.store.secret(name).is_ok_and(|v| v.is_some())
    }

    /// Every name, with its source: never a value.
    pub fn list(&self) -> Result<Vec<SecretInfo>, SecretError> {
        let mut out: Vec<SecretInfo> = self
            .files
            .keys()
            .map(|name| SecretInfo {
                name: name.clone(),
                source: "file",
                updated_ms: 0,
                binding: self.file_bindings.get(name).map(|b| b.to_string()),
            })
            .collect();
        for (name, updated_ms) in self
            .store
            .secret_names()
            .map_err(|e| SecretError::Store(e.to_string()))?
        {
            if !self.files.contains_key(&name) {
                let binding = self.binding(&name).map(|b| b.to_string());
                out.push(SecretInfo {
                    name,
                    source: "api",
                    updated_ms,
                    binding,
                });
            }
        }
        out.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(out)
    }

    /// The values of `names`, or an error naming the first that is not set (the error
    /// never holds a value).
    pub fn resolve(&self, names: &[&str]) -> Result<Resolved, String> {
        let mut out = Resolved::new();
        for name in names {
            let value = match self.files.get(*name) {
                Some(path) => std::fs::read_to_string(path)
                    .map(|v| v.trim_end_matches(['\n', '\r']).to_owned())
                    .map_err(|e| {
                        format!("secret {name:?}: its file cannot be read: {}", e.kind())
                    })?,
                None => self
                    .store
                    .secret(name)
                    .map_err(|e| format!("secret {name:?}: {e}"))?
                    .ok_or_else(|| format!("secret {name:?} is not set"))?,
            };
            let header = check_value(&value).map_err(|e| format!("secret {name:?}: {e}"))?;
            out.insert((*name).to_owned(), Secret(header));
        }
        Ok(out)
    }
}

/// An in-memory [`SecretStore`] for the crate's tests.
#[cfg(test)]
#[derive(Default)]
pub(crate) struct MemoryStore(std::sync::Mutex<BTreeMap<String, MemoryRow>>);

/// A value, when it was set, where it may go.
#[cfg(test)]
type MemoryRow = (String, u64, Option<Binding>);

#[cfg(test)]
impl MemoryStore {
    /// A value with no binding, as a store row from before bindings existed.
    pub(crate) fn put_unbound(&self, name: &str, value: &str, now_ms: u64) {
        self.0
            .lock()
            .unwrap()
            .insert(name.to_owned(), (value.to_owned(), now_ms, None));
    }
}

#[cfg(test)]
impl SecretStore for MemoryStore {
    fn put_secret(
        &self,
        name: &str,
        value: &str,
        binding: &Binding,
        now_ms: u64,
    ) -> Result<(), StoreError> {
        self.0.lock().unwrap().insert(
            name.to_owned(),
            (value.to_owned(), now_ms, Some(binding.clone())),
        );
        Ok(())
    }
    fn secret_binding(&self, name: &str) -> Result<Option<Binding>, StoreError> {
        Ok(self.0.lock().unwrap().get(name).and_then(|v| v.2.clone()))
    }
    fn secret(&self, name: &str) -> Result<Option<String>, StoreError> {
        Ok(self.0.lock().unwrap().get(name).map(|v| v.0.clone()))
    }
    fn remove_secret(&self, name: &str) -> Result<bool, StoreError> {
        Ok(self.0.lock().unwrap().remove(name).is_some())
    }
    fn secret_names(&self) -> Result<Vec<(String, u64)>, StoreError> {
        Ok(self
            .0
            .lock()
            .unwrap()
            .iter()
            .map(|(n, v)| (n.clone(), v.1))
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secrets(files: &[(&str, &str)]) -> (PathBuf, Secrets) {
        secrets_in(files, |_| ())
    }

    /// Secrets over a store that `prepare` filled first.
    fn secrets_in(
        files: &[(&str, &str)],
        prepare: impl FnOnce(&MemoryStore),
    ) -> (PathBuf, Secrets) {
        let dir = std::env::temp_dir().join(format!("stockade-secrets-{}", uuid::Uuid::new_v4()));
        std::fs::create_dir_all(&dir).unwrap();
        let store = Arc::new(MemoryStore::default());
        prepare(&store);
        let mut map = BTreeMap::new();
        for (name, value) in files {
            let p = dir.join(name);
            std::fs::write(&p, format!("{value}\n")).unwrap();
            map.insert((*name).to_owned(), p);
        }
        (dir, Secrets::new(store, map))
    }

    fn bound() -> Binding {
        stockade_grammar::binding::parse("api.example.com", &["GET".to_owned()], Some("/v1/"))
            .unwrap()
    }

    #[test]
    fn values_resolve_from_files_and_the_store_and_never_print() {
        let (dir, s) = secrets(&[("from-file", "Bearer file-value")]);
        s.set("from-api", "Bearer api-value", &bound(), 7).unwrap();
        let r = s.resolve(&["from-api", "from-file"]).unwrap();
        assert_eq!(r["from-file"].header(), "Bearer file-value");
        assert_eq!(r["from-api"].header(), "Bearer api-value");
        assert!(r["from-api"].header().is_sensitive());
        let shown = format!("{r:?} {s:?}");
        assert!(!shown.contains("value"), "{shown}");
        let e = s.resolve(&["missing"]).unwrap_err();
        assert_eq!(e, "secret \"missing\" is not set");
        assert_eq!(
            s.list().unwrap(),
            vec![
                SecretInfo {
                    name: "from-api".into(),
                    source: "api",
                    updated_ms: 7,
                    binding: Some("GET api.example.com:443/v1/".into()),
                },
                SecretInfo {
                    name: "from-file".into(),
                    source: "file",
                    updated_ms: 0,
                    binding: None,
                },
            ]
        );
        assert!(matches!(
            s.set("from-file", "x", &bound(), 1),
            Err(SecretError::FromFile(_))
        ));
        assert!(s.remove("from-api").unwrap());
        assert!(!s.remove("from-api").unwrap());
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn a_value_that_would_split_a_request_is_refused() {
        let (dir, s) = secrets(&[]);
        for (what, value) in [
            ("empty", ""),
            ("a CRLF", "a\r\nX-Injected: 1"),
            ("a LF", "a\nb"),
            ("a NUL", "a\0b"),
        ] {
            assert!(
                matches!(s.set("x", value, &bound(), 1), Err(SecretError::Invalid(_))),
                "{what}"
            );
        }
        assert!(
            s.set("x", &"a".repeat(MAX_SECRET_VALUE + 1), &bound(), 1)
                .is_err()
        );
        assert!(matches!(
            s.set("Bad", "v", &bound(), 1),
            Err(SecretError::Invalid(_))
        ));
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn a_secret_carries_its_binding_and_one_set_before_bindings_has_none() {
        // A value from before bindings existed: no binding (the store's side of this
        // is `stockade_host::store`'s `a_secret_row_from_before_bindings_is_unbound`).
        let (dir, s) = secrets_in(&[], |store| store.put_unbound("old", "v", 1));
        assert_eq!(s.binding("tok"), None, "not set");
        s.set("tok", "v", &bound(), 1).unwrap();
        assert_eq!(s.binding("tok"), Some(bound()));
        let wider =
            stockade_grammar::binding::parse("[::1]:8443", &["GET".into(), "POST".into()], None)
                .unwrap();
        s.set("tok", "w", &wider, 2).unwrap();
        assert_eq!(s.binding("tok"), Some(wider), "set again: the new binding");
        assert_eq!(s.binding("old"), None, "an old secret is unbound");
        assert!(s.exists("old"));
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn file_secrets_are_bound_by_the_configuration() {
        let dir = std::env::temp_dir().join(format!("stockade-secrets-{}", uuid::Uuid::new_v4()));
        std::fs::create_dir_all(&dir).unwrap();
        let store = Arc::new(MemoryStore::default());
        let mut egress = EgressConfig::default();
        egress.secret_files.insert("bound".into(), dir.join("b"));
        egress.secret_files.insert("loose".into(), dir.join("l"));
        egress.secret_bindings.insert(
            "bound".into(),
            crate::config::SecretBindingConfig {
                host: "api.example.com".into(),
                methods: vec!["GET".into()],
                path_prefix: Some("/v1/".into()),
            },
        );
        let s = Secrets::from_config(store, &egress);
        assert_eq!(s.binding("bound"), Some(bound()));
        assert_eq!(
            s.binding("loose"),
            None,
            "a file without a binding is unbound"
        );
        std::fs::remove_dir_all(dir).unwrap();
    }
}
