//! A key's lifetime, metadata and listing (docs/DESIGN.md §2, "Lifetime, metadata and
//! listing"): `GET /v1/sandboxes` (the known keys the caller reaches, `?prefix=`),
//! `GET /v1/sandboxes/{key}` (one, or 404 when it is not known: the bytes of a key
//! outside a token), `DELETE /v1/sandboxes/{key}` (aborted and forgotten), `PUT
//! …/lifetime` (`{"ends_in_ms"|"ends_at_ms", "on_end"}`), `DELETE …/lifetime`, `PUT
//! …/metadata` (`{"metadata": {…}}`, replaced whole). Each is one facade call (two for
//! the delete), and `PUT …/network` (a grant, as `exec`'s) / `DELETE …/network`: the
//! grant of the key's fenced commands that bring none. The guest validates, records
//! and, at a lifetime's end or a command's fence, decides.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{RawQuery, State};
use axum::http::StatusCode;
use axum::{Extension, Json};
use stockade_runtime::bindings::{EndAction, Lifetime, SandboxInfo};
use stockade_wire::{self as wire, ErrorCode};

use super::auth::no_such_sandbox;
use super::error::{ApiError, ApiResult, Params};
use super::{ApiState, parse_json};
use crate::tenants::Caller;
use crate::tenants::scope::Listing;

fn answer(i: SandboxInfo) -> wire::SandboxInfo {
    wire::SandboxInfo {
        key: i.key,
        running: i.running,
        lifetime: i.lifetime.map(|l| wire::Lifetime {
            ends_at_ms: l.ends_at_ms,
            on_end: match l.on_end {
                EndAction::Abort => wire::OnEnd::Abort,
                EndAction::Checkpoint => wire::OnEnd::Checkpoint,
            },
        }),
        metadata: i.metadata.into_iter().collect(),
        network: i.network.as_ref().map(crate::answers::grant_body),
    }
}

fn invalid(m: impl Into<String>) -> ApiError {
    ApiError::new(StatusCode::BAD_REQUEST, ErrorCode::InvalidInput, m)
}

/// The key as it is known, or the 404 of a key nobody holds.
async fn described(s: &ApiState, key: &str) -> ApiResult<Json<wire::SandboxInfo>> {
    match s.runtime.describe(key).await? {
        Some(i) => Ok(Json(answer(i))),
        None => Err(no_such_sandbox()),
    }
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// A lifetime body read (pure but for `now_ms`): exactly one of `ends_at_ms` and
/// `ends_in_ms` (added to now, saturating: a lifetime past the last millisecond a u64
/// holds never ends, as one that far away would not).
pub fn lifetime(b: &wire::LifetimeBody, now_ms: u64) -> Result<Lifetime, String> {
    let ends_at_ms = match (b.ends_at_ms, b.ends_in_ms) {
        (Some(at), None) => at,
        (None, Some(d)) => now_ms.saturating_add(d),
        _ => return Err("give exactly one of ends_at_ms and ends_in_ms".into()),
    };
    Ok(Lifetime {
        ends_at_ms,
        on_end: match b.on_end.unwrap_or(wire::OnEnd::Abort) {
            wire::OnEnd::Abort => EndAction::Abort,
            wire::OnEnd::Checkpoint => EndAction::Checkpoint,
        },
    })
}

pub(super) async fn list(
    State(s): State<Arc<ApiState>>,
    caller: Option<Extension<Caller>>,
    RawQuery(raw): RawQuery,
) -> ApiResult<Json<wire::SandboxList>> {
    let mut wanted = String::new();
    for (k, v) in crate::e2b::listing::form_pairs(raw.as_deref().unwrap_or("")).map_err(invalid)? {
        match k.as_str() {
            "prefix" => wanted = v,
            other => {
                return Err(invalid(format!(
                    "{other:?} is not a parameter of this list"
                )));
            }
        }
    }
    let listing = match caller.as_ref().map(|Extension(c)| c) {
        Some(Caller::Tenant(t)) => t.keys.listing(&wanted),
        _ => Listing::Prefix(wanted),
    };
    let found = match listing {
        Listing::Prefix(p) => s.runtime.sandboxes(&p).await?,
        Listing::One(k) => s.runtime.describe(&k).await?.into_iter().collect(),
        Listing::Nothing => Vec::new(),
    };
    let reaches = |k: &str| caller.as_ref().is_none_or(|Extension(c)| c.reaches(k));
    Ok(Json(wire::SandboxList {
        sandboxes: found
            .into_iter()
            .filter(|i| reaches(&i.key))
            .map(answer)
            .collect(),
    }))
}

pub(super) async fn describe(
    State(s): State<Arc<ApiState>>,
    Params(key): Params<String>,
) -> ApiResult<Json<wire::SandboxInfo>> {
    described(&s, &key).await
}

/// A known key's container aborted, then the key forgotten (its named snapshots
/// stay); a key that is not known is the 404 of a key nobody holds (`abort` is for
/// those).
pub(super) async fn delete(
    State(s): State<Arc<ApiState>>,
    Params(key): Params<String>,
) -> ApiResult<Json<wire::Forgotten>> {
    let _known = described(&s, &key).await?;
    s.runtime.abort(&key).await?;
    s.runtime.forget(&key).await?;
    Ok(Json(wire::Forgotten { forgotten: key }))
}

pub(super) async fn set_lifetime(
    State(s): State<Arc<ApiState>>,
    Params(key): Params<String>,
    body: Result<Bytes, BytesRejection>,
) -> ApiResult<Json<wire::SandboxInfo>> {
    let b: wire::LifetimeBody = parse_json(body)?;
    let l = lifetime(&b, now_ms()).map_err(invalid)?;
    s.runtime.set_lifetime(&key, Some(l)).await?;
    described(&s, &key).await
}

pub(super) async fn clear_lifetime(
    State(s): State<Arc<ApiState>>,
    Params(key): Params<String>,
) -> ApiResult<Json<wire::SandboxInfo>> {
    s.runtime.set_lifetime(&key, None).await?;
    described(&s, &key).await
}

pub(super) async fn set_metadata(
    State(s): State<Arc<ApiState>>,
    Params(key): Params<String>,
    body: Result<Bytes, BytesRejection>,
) -> ApiResult<Json<wire::SandboxInfo>> {
    let b: wire::MetadataBody = parse_json(body)?;
    s.runtime
        .set_metadata(&key, b.metadata.into_iter().collect())
        .await?;
    described(&s, &key).await
}

/// The key's network: a grant body as `exec` takes one, its secrets checked as an
/// exec's are ([`super::check_secrets`]: 409 for one the server does not hold, 400 for
/// a rule outside its binding), then validated and recorded by the guest.
pub(super) async fn set_network(
    State(s): State<Arc<ApiState>>,
    Params(key): Params<String>,
    body: Result<Bytes, BytesRejection>,
) -> ApiResult<Json<wire::SandboxInfo>> {
    let b: wire::GrantBody = parse_json(body)?;
    super::check_secrets(&s, &b.rules)?;
    s.runtime
        .set_network(&key, Some(crate::answers::grant(b)))
        .await?;
    described(&s, &key).await
}

pub(super) async fn clear_network(
    State(s): State<Arc<ApiState>>,
    Params(key): Params<String>,
) -> ApiResult<Json<wire::SandboxInfo>> {
    s.runtime.set_network(&key, None).await?;
    described(&s, &key).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lifetime_is_one_instant() {
        let b = |at: Option<u64>, inn: Option<u64>, on: Option<wire::OnEnd>| wire::LifetimeBody {
            ends_at_ms: at,
            ends_in_ms: inn,
            on_end: on,
        };
        let now = 1_000;
        let l = lifetime(&b(None, Some(500), None), now).unwrap();
        assert_eq!((l.ends_at_ms, l.on_end), (1_500, EndAction::Abort));
        let l = lifetime(&b(Some(7), None, Some(wire::OnEnd::Checkpoint)), now).unwrap();
        assert_eq!((l.ends_at_ms, l.on_end), (7, EndAction::Checkpoint));
        assert!(lifetime(&b(None, None, None), now).is_err());
        assert!(lifetime(&b(Some(1), Some(1), None), now).is_err());
        assert_eq!(
            lifetime(&b(None, Some(u64::MAX), None), now)
                .unwrap()
                .ends_at_ms,
            u64::MAX
        );
    }
}
