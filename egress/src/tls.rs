//! TLS for interception: each container's certificate authority, the leaf certificates
//! it mints for the hosts a command reaches, and the upstream side's verification.
//!
//! The CA's private key is the crown jewel: anyone holding it can impersonate any host
//! to that container's clients. It is generated in this process when the container is
//! built, lives only in this process's memory (never on disk, never in a log, never in
//! the container: the container gets the certificate only), and dies with the
//! container. A host that restarts makes new CAs for new containers.
//!
//! Upstream, the proxy verifies the real host's certificate against this machine's
//! trust roots (`rustls-native-certs`) plus the CA files `egress.extra_ca_files` names
//! (tests use one for their loopback upstream). A certificate that does not verify is a
//! 502 for the command, never a connection.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, OnceLock};

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose,
};
use rustls::crypto::CryptoProvider;
use rustls::{ClientConfig, RootCertStore, ServerConfig};
use rustls_pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};

/// Most leaf configurations one container keeps (a wildcard rule could name
/// unboundedly many hosts; past this the cache starts over).
const MAX_LEAVES: usize = 1024;

/// ALPN: HTTP/1.1 everywhere; h2 also offered to a container's clients (the proxy
/// speaks HTTP/1.1 upstream either way).
const ALPN_HTTP1: &[u8] = b"http/1.1";
/// ALPN for HTTP/2.
pub const ALPN_H2: &[u8] = b"h2";

/// The one crypto provider (ring) every TLS configuration here uses.
fn provider() -> Arc<CryptoProvider> {
    static P: OnceLock<Arc<CryptoProvider>> = OnceLock::new();
    P.get_or_init(|| Arc::new(rustls::crypto::ring::default_provider()))
        .clone()
}

/// Why a TLS configuration could not be built.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// Generating or signing a certificate failed.
    #[error("certificate: {0}")]
    Cert(#[from] rcgen::Error),
    /// rustls refused a configuration.
    #[error("tls: {0}")]
    Rustls(#[from] rustls::Error),
    /// A CA file could not be read or holds no certificate.
    #[error("{path}: {why}")]
    CaFile {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        why: String,
    },
}

/// One container's certificate authority: the key never leaves this value.
pub struct Authority {
    issuer: Issuer<'static, KeyPair>,
    cert_pem: String,
    /// One key for every leaf of this container (minting is then one signature)...
    leaf_key: KeyPair,
    /// ...parsed once for rustls.
    leaf_signer: Arc<dyn rustls::sign::SigningKey>,
    leaves: Mutex<HashMap<String, Arc<ServerConfig>>>,
}

impl std::fmt::Debug for Authority {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the keys.
        f.debug_struct("Authority").finish_non_exhaustive()
    }
}

impl Authority {
    /// A new CA for `container` (its name says whose it is; it may sign any host).
    pub fn generate(container: &str) -> Result<Authority, TlsError> {
        let key = KeyPair::generate()?;
        let mut params = CertificateParams::new(Vec::<String>::new())?;
        let mut dn = DistinguishedName::new();
        dn.push(DnType::OrganizationName, "Stockade");
        let short: String = container.chars().take(12).collect();
        dn.push(
            DnType::CommonName,
            format!("Stockade egress CA for container {short}"),
        );
        params.distinguished_name = dn;
        params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let cert = params.self_signed(&key)?;
        let leaf_key = KeyPair::generate()?;
        let leaf_signer = provider()
            .key_provider
            .load_private_key(PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(
                leaf_key.serialize_der(),
            )))?;
        Ok(Authority {
            issuer: Issuer::new(params, key),
            cert_pem: cert.pem(),
            leaf_key,
            leaf_signer,
            leaves: Mutex::new(HashMap::new()),
        })
    }

    /// The CA certificate (PEM): what the container trusts.
    pub fn cert_pem(&self) -> &str {
        &self.cert_pem
    }

    /// The server configuration presenting a leaf for `host` (minted on first use and
    /// kept). The bool says whether it was minted now.
    pub fn server_config(&self, host: &str) -> Result<(Arc<ServerConfig>, bool), TlsError> {
        let host = host.trim_start_matches('[').trim_end_matches(']');
        let host = host.strip_suffix('.').unwrap_or(host).to_ascii_lowercase();
        if let Some(c) = self.cache().get(&host) {
            return Ok((c.clone(), false));
        }
        let config = Arc::new(self.mint(&host)?);
        let mut cache = self.cache();
        if cache.len() >= MAX_LEAVES {
            cache.clear();
        }
        cache.insert(host, config.clone());
        Ok((config, true))
    }

    fn mint(&self, host: &str) -> Result<ServerConfig, TlsError> {
        let mut params = CertificateParams::new(vec![host.to_owned()])?;
        let mut dn = DistinguishedName::new();
        dn.push(DnType::CommonName, host);
        params.distinguished_name = dn;
        params.is_ca = IsCa::ExplicitNoCa;
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        params.use_authority_key_identifier_extension = true;
        let leaf = params.signed_by(&self.leaf_key, &self.issuer)?;
        // The key parsed once (`leaf_signer`): minting is the signature and this.
        let certified =
            rustls::sign::CertifiedKey::new(vec![leaf.der().clone()], self.leaf_signer.clone());
        let mut config = ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()?
            .with_no_client_auth()
            .with_cert_resolver(Arc::new(rustls::sign::SingleCertAndKey::from(certified)));
        // A client that offers h2 gets it; one that offers only HTTP/1.1 gets that.
        config.alpn_protocols = vec![ALPN_H2.to_vec(), ALPN_HTTP1.to_vec()];
        Ok(config)
    }

    fn cache(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<ServerConfig>>> {
        self.leaves.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// A server configuration presenting `cert` (HTTP/1.1 by ALPN).
fn server_config(cert: CertificateDer<'static>, key: &KeyPair) -> Result<ServerConfig, TlsError> {
    let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der()));
    let mut config = ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()?
        .with_no_client_auth()
        .with_single_cert(vec![cert], key)?;
    config.alpn_protocols = vec![ALPN_HTTP1.to_vec()];
    Ok(config)
}

/// A CA of its own and a server certificate it signed: for upstreams that stand for
/// the network in tests and benchmarks (the proxy trusts `ca` through
/// `egress.extra_ca_files`).
pub struct LocalPki {
    /// The CA certificate.
    pub ca: CertificateDer<'static>,
    /// The CA certificate, PEM.
    pub ca_pem: String,
    /// A server configuration presenting a certificate for the names given.
    pub server: Arc<ServerConfig>,
}

impl LocalPki {
    /// A CA and a server certificate for `names` (host names or IP addresses).
    pub fn new(names: Vec<String>) -> Result<LocalPki, TlsError> {
        let ca_key = KeyPair::generate()?;
        let mut ca = CertificateParams::new(Vec::<String>::new())?;
        ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca.distinguished_name
            .push(DnType::CommonName, "local upstream CA");
        let ca_cert = ca.self_signed(&ca_key)?;
        let issuer = Issuer::new(ca, ca_key);
        let key = KeyPair::generate()?;
        let leaf = CertificateParams::new(names)?.signed_by(&key, &issuer)?;
        Ok(LocalPki {
            ca: ca_cert.der().clone(),
            ca_pem: ca_cert.pem(),
            server: Arc::new(server_config(leaf.der().clone(), &key)?),
        })
    }
}

/// This machine's trust roots, loaded once.
fn native_roots() -> &'static [CertificateDer<'static>] {
    static ROOTS: OnceLock<Vec<CertificateDer<'static>>> = OnceLock::new();
    ROOTS.get_or_init(|| {
        let found = rustls_native_certs::load_native_certs();
        for e in &found.errors {
            tracing::warn!(target: "stockade::egress", error = %e, "a system trust root could not be loaded");
        }
        found.certs
    })
}

/// The upstream side: this machine's roots plus the CA files named (PEM).
pub fn upstream_config(extra_ca_files: &[PathBuf]) -> Result<Arc<ClientConfig>, TlsError> {
    let mut extra = Vec::new();
    for path in extra_ca_files {
        for c in read_pem_certs(path)? {
            let mut one = RootCertStore::empty();
            one.add(c.clone()).map_err(|e| TlsError::CaFile {
                path: path.clone(),
                why: e.to_string(),
            })?;
            extra.push(c);
        }
    }
    upstream_config_with(true, extra)
}

/// The upstream side from certificates: this machine's roots (when `native`) plus
/// `extra`.
pub fn upstream_config_with(
    native: bool,
    extra: Vec<CertificateDer<'static>>,
) -> Result<Arc<ClientConfig>, TlsError> {
    let mut roots = RootCertStore::empty();
    if native {
        roots.add_parsable_certificates(native_roots().iter().cloned());
    }
    roots.add_parsable_certificates(extra);
    let mut config = ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()?
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![ALPN_HTTP1.to_vec()];
    Ok(Arc::new(config))
}

/// The certificates of a PEM file (at least one).
pub fn read_pem_certs(path: &std::path::Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    use rustls_pki_types::pem::PemObject;
    let bad = |why: String| TlsError::CaFile {
        path: path.to_owned(),
        why,
    };
    let certs = CertificateDer::pem_file_iter(path)
        .map_err(|e| bad(e.to_string()))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| bad(e.to_string()))?;
    if certs.is_empty() {
        return Err(bad("no certificate in the file".into()));
    }
    Ok(certs)
}

/// Why an upstream TLS handshake failed, as the 502's reason (pure).
pub fn handshake_reason(error: &std::io::Error) -> &'static str {
    let tls = error
        .get_ref()
        .and_then(|e| e.downcast_ref::<rustls::Error>());
    match tls {
        Some(rustls::Error::InvalidCertificate(_)) => "upstream-certificate",
        Some(rustls::Error::NoApplicationProtocol) => "upstream-alpn",
        Some(_) => "upstream-tls",
        None => "upstream-tls",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_leaf_is_minted_once_per_host_and_names_it() {
        let ca = Authority::generate("container-1").unwrap();
        assert!(ca.cert_pem().starts_with("-----BEGIN CERTIFICATE-----"));
        let (a, minted) = ca.server_config("API.example.com.").unwrap();
        assert!(minted);
        let (b, again) = ca.server_config("api.example.com").unwrap();
        assert!(!again, "the second use of a host is cached");
        assert!(Arc::ptr_eq(&a, &b));
        let (_, ip) = ca.server_config("[::1]").unwrap();
        assert!(ip, "an IP literal gets its own leaf");
        assert_eq!(format!("{ca:?}"), "Authority { .. }");
    }

    #[test]
    fn an_unreadable_or_empty_ca_file_is_an_error_naming_it() {
        let dir = std::env::temp_dir().join(format!("stockade-tls-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let empty = dir.join("empty.pem");
        std::fs::write(&empty, "nothing here\n").unwrap();
        let e = upstream_config(std::slice::from_ref(&empty))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("empty.pem") && e.contains("no certificate"),
            "{e}"
        );
        let e = upstream_config(&[dir.join("missing.pem")])
            .unwrap_err()
            .to_string();
        assert!(e.contains("missing.pem"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
