//! Who may call which route (docs/TENANTS.md, docs/API.md "Auth"): the bearer token a
//! request presents, decided by the route it matched (never by how its path ends), then,
//! for a scoped token, the key it names and its share of the ceiling.
//!
//! * The approver's token: approvals, secrets, answering a pending egress decision
//!   ([`APPROVER_ROUTES`]); and listing pending decisions ([`EITHER_ROUTES`]).
//! * The operator's token (the unscoped consumer token): every consumer route and key,
//!   and the tokens' routes ([`OPERATOR_ROUTES`]).
//! * A scoped token ([`crate::tenants`]): the consumer routes, for the keys of its
//!   pattern only. Another tenant's key is the same 404 as an unknown one; a route that
//!   may create a container ([`ENSURING_ROUTES`]) is admitted within its share.

use std::sync::Arc;

use axum::extract::{FromRequestParts, RawPathParams, Request, State};
use axum::http::{HeaderMap, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use stockade_wire::ErrorCode;

use super::ApiState;
use super::error::ApiError;
use crate::tenants::{Caller, Tenant, TenantError};

/// The routes that take the approver's token (templates, as in `ROUTES`).
pub const APPROVER_ROUTES: &[&str] = &[
    "/v1/sandboxes/{key}/approvals",
    "/v1/secrets",
    "/v1/secrets/{name}",
    "/v1/egress/pending/{id}",
];

/// The routes the approver's token and a consumer's may both call: the approver lists
/// what waits for them, and a consumer (the MCP server runs with its token) may list —
/// its own keys' only — but never answer (docs/EGRESS.md, "Egress that can ask").
pub const EITHER_ROUTES: &[&str] = &["/v1/egress/pending", "/v1/sandboxes/{key}/egress/pending"];

/// The routes only the operator's token takes: making, listing and revoking scoped
/// tokens.
pub const OPERATOR_ROUTES: &[&str] = &["/v1/tokens", "/v1/tokens/{id}"];

/// The mock-only routes (`crate::api::mock`, mounted over the mock substrate only): the
/// operator's token, as the tokens' routes (a scoped token must not script or fault
/// another tenant's sandbox).
pub const MOCK_ROUTES: &[&str] = &[
    "/v1/mock/script",
    "/v1/mock/faults",
    "/v1/mock/trace/{key}",
    "/v1/mock/control",
];

/// The routes whose call may create a container, admitted within a scoped token's
/// share of the ceiling (method, template).
pub const ENSURING_ROUTES: &[(&str, &str)] = &[
    ("POST", "/v1/sandboxes/{key}/exec"),
    ("POST", "/v1/sandboxes/{key}/exec/stream"),
    ("POST", "/v1/sandboxes/{key}/detached"),
    ("POST", "/v1/sandboxes/{key}/ensure"),
    ("POST", "/v1/sandboxes/{key}/snapshots"),
    ("GET", "/v1/sandboxes/{key}/pty"),
    ("PUT", "/v1/sandboxes/{key}/files"),
    ("PUT", "/v1/sandboxes/{key}/files/{*path}"),
    ("POST", "/v1/sandboxes/{key}/previews"),
];

/// What kind of route a request matched.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Class {
    Approver,
    Either,
    Operator,
    /// Every other route, and a path no route matches.
    Consumer,
}

fn class(matched: Option<&str>) -> Class {
    match matched {
        Some(m) if APPROVER_ROUTES.contains(&m) => Class::Approver,
        Some(m) if EITHER_ROUTES.contains(&m) => Class::Either,
        Some(m) if OPERATOR_ROUTES.contains(&m) || MOCK_ROUTES.contains(&m) => Class::Operator,
        _ => Class::Consumer,
    }
}

/// The token a request presented, recognized.
#[derive(Debug, Clone)]
enum Presented {
    Approver,
    Operator,
    Tenant(Arc<Tenant>),
    /// Missing, malformed, wrong or revoked.
    Nobody,
}

/// The verdict on a token for a route (pure): the caller it admits as, or the refusal.
fn decide(
    class: Class,
    who: Presented,
) -> Result<Option<Caller>, (StatusCode, ErrorCode, &'static str)> {
    let unauthorized = (
        StatusCode::UNAUTHORIZED,
        ErrorCode::Unauthorized,
        "missing or wrong bearer token",
    );
    match (class, who) {
        // The approver's routes read no consumer.
        (Class::Approver, Presented::Approver) => Ok(None),
        (Class::Approver, Presented::Operator | Presented::Tenant(_)) => Err((
            StatusCode::FORBIDDEN,
            ErrorCode::ApproverOnly,
            "approvals and secrets take the approver token, not a consumer token",
        )),
        // The approver lists every key's pending decisions.
        (Class::Either, Presented::Approver) => Ok(Some(Caller::Operator)),
        (Class::Either | Class::Consumer | Class::Operator, Presented::Operator) => {
            Ok(Some(Caller::Operator))
        }
        (Class::Either | Class::Consumer, Presented::Tenant(t)) => Ok(Some(Caller::Tenant(t))),
        (Class::Operator, Presented::Tenant(_)) => Err((
            StatusCode::FORBIDDEN,
            ErrorCode::OperatorOnly,
            "this route takes the operator's token, not a scoped one (the tokens' routes; the mock's)",
        )),
        (_, Presented::Approver | Presented::Nobody) => Err(unauthorized),
    }
}

use crate::compare::same;

/// Which token `t` is.
fn recognize(s: &ApiState, t: Option<&str>) -> Presented {
    let Some(t) = t else {
        return Presented::Nobody;
    };
    if same(t.as_bytes(), s.approver_token.as_bytes()) {
        Presented::Approver
    } else if same(t.as_bytes(), s.token.as_bytes()) {
        Presented::Operator
    } else if let Some(tenant) = s.tenants.verify(t) {
        Presented::Tenant(tenant)
    } else {
        Presented::Nobody
    }
}

/// A key outside a scoped token's pattern: the bytes an unknown sandbox's would be,
/// whoever holds it (another tenant, or nobody).
pub(crate) fn no_such_sandbox() -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        ErrorCode::NotFound,
        "no such sandbox",
    )
}

/// The auth layer.
pub(super) async fn auth(
    State(s): State<Arc<ApiState>>,
    headers: HeaderMap,
    req: Request,
    next: Next,
) -> Response {
    if req.uri().path() == "/v1/health" {
        return next.run(req).await;
    }
    let presented = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "));
    let matched = req
        .extensions()
        .get::<axum::extract::MatchedPath>()
        .map(|m| m.as_str().to_string());
    let caller = match decide(class(matched.as_deref()), recognize(&s, presented)) {
        Ok(c) => c,
        Err((status, code, message)) => {
            return ApiError::new(status, code, message).into_response();
        }
    };
    let Some(Caller::Tenant(tenant)) = &caller else {
        let mut req = req;
        if let Some(c) = caller {
            req.extensions_mut().insert(c);
        }
        return next.run(req).await;
    };
    // A scoped token: the key it names, then its share.
    let (mut parts, body) = req.into_parts();
    let key = RawPathParams::from_request_parts(&mut parts, &s)
        .await
        .ok()
        .and_then(|p| {
            p.iter()
                .find(|(name, _)| *name == "key")
                .map(|(_, v)| v.to_string())
        });
    let mut hold = None;
    if let Some(key) = &key {
        if !tenant.keys.matches(key) {
            tracing::info!(target: "stockade::api", tenant = %tenant.id, key = %key, "a key outside the token's pattern");
            return no_such_sandbox().into_response();
        }
        let ensuring = matched.as_deref().is_some_and(|m| {
            ENSURING_ROUTES.iter().any(|(method, t)| {
                *t == m
                    && parts.method == Method::from_bytes(method.as_bytes()).unwrap_or(Method::GET)
            })
        });
        if ensuring {
            match s
                .tenants
                .admit(tenant, key, s.runtime.substrate().as_ref())
                .await
            {
                Ok(h) => hold = Some(Arc::new(h)),
                Err(e) => return tenant_error(e).into_response(),
            }
        }
    }
    let mut req = Request::from_parts(parts, body);
    req.extensions_mut().insert(Caller::Tenant(tenant.clone()));
    if let Some(h) = &hold {
        // A route that goes on past its answer (the terminal) keeps it.
        req.extensions_mut().insert(h.clone());
    }
    let r = next.run(req).await;
    drop(hold);
    r
}

/// A tenant error as the API answers it.
pub(crate) fn tenant_error(e: TenantError) -> ApiError {
    match e {
        TenantError::Invalid(m) => {
            ApiError::new(StatusCode::BAD_REQUEST, ErrorCode::InvalidInput, m)
        }
        e @ TenantError::Overlap { .. } => {
            ApiError::new(StatusCode::CONFLICT, ErrorCode::KeysOverlap, e.to_string())
        }
        e @ TenantError::OverShare { .. } => ApiError::new(
            StatusCode::TOO_MANY_REQUESTS,
            ErrorCode::OverCapacity,
            e.to_string(),
        ),
        TenantError::Store(m) => {
            ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, ErrorCode::Failed, m)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::ROUTES;

    #[test]
    fn the_token_is_chosen_by_the_matched_route_not_the_paths_ending() {
        let rows: &[(&str, Option<&str>, Class)] = &[
            (
                "the approvals route takes the approver token",
                Some("/v1/sandboxes/{key}/approvals"),
                Class::Approver,
            ),
            ("listing secrets", Some("/v1/secrets"), Class::Approver),
            (
                "answering a pending egress decision",
                Some("/v1/egress/pending/{id}"),
                Class::Approver,
            ),
            (
                "listing pending egress decisions (either token)",
                Some("/v1/egress/pending"),
                Class::Either,
            ),
            (
                "setting or removing a secret",
                Some("/v1/secrets/{name}"),
                Class::Approver,
            ),
            ("making a token", Some("/v1/tokens"), Class::Operator),
            ("revoking a token", Some("/v1/tokens/{id}"), Class::Operator),
            (
                "scripting the mock",
                Some("/v1/mock/script"),
                Class::Operator,
            ),
            (
                "arming a mock fault",
                Some("/v1/mock/faults"),
                Class::Operator,
            ),
            (
                "a key's mock trace",
                Some("/v1/mock/trace/{key}"),
                Class::Operator,
            ),
            (
                "a direct mock control",
                Some("/v1/mock/control"),
                Class::Operator,
            ),
            (
                "learning one's own scope is any consumer's",
                Some("/v1/tokens/self"),
                Class::Consumer,
            ),
            (
                "a file whose path ends in /approvals is an upload",
                Some("/v1/sandboxes/{key}/files/{*path}"),
                Class::Consumer,
            ),
            (
                "an artifact named approvals is a read",
                Some("/v1/sandboxes/{key}/artifacts/{*name}"),
                Class::Consumer,
            ),
            ("exec", Some("/v1/sandboxes/{key}/exec"), Class::Consumer),
            ("no route matched", None, Class::Consumer),
        ];
        for (sentence, matched, want) in rows {
            assert_eq!(class(*matched), *want, "{sentence}");
        }
        for r in APPROVER_ROUTES
            .iter()
            .chain(EITHER_ROUTES)
            .chain(OPERATOR_ROUTES)
        {
            assert!(ROUTES.iter().any(|(_, t)| t == r), "{r} is a route");
        }
        // The mock's routes are never public routes (nor in the OpenAPI document).
        for r in MOCK_ROUTES {
            assert!(!ROUTES.iter().any(|(_, t)| t == r), "{r} is mock-only");
            assert!(
                crate::api::mock::ROUTES.iter().any(|(_, t)| t == r),
                "{r} is a mock route"
            );
        }
        // Matched templates write a rest parameter `{*path}`; ROUTES, as the
        // OpenAPI document, `{path}`.
        for (m, r) in ENSURING_ROUTES {
            let r = r.replace("{*", "{");
            assert!(
                ROUTES.iter().any(|(rm, t)| rm == m && *t == r),
                "{m} {r} is a route"
            );
        }
    }

    #[test]
    fn each_token_reaches_its_routes_and_is_refused_the_others_by_name() {
        let t = Arc::new(Tenant::for_tests("ci-*"));
        let tenant = || Presented::Tenant(t.clone());
        use Class::*;
        type Want = Result<Option<&'static str>, ErrorCode>;
        let rows: Vec<(&str, Class, Presented, Want)> = vec![
            (
                "the approver approves",
                Approver,
                Presented::Approver,
                Ok(None),
            ),
            (
                "the operator may not approve",
                Approver,
                Presented::Operator,
                Err(ErrorCode::ApproverOnly),
            ),
            (
                "nor a tenant",
                Approver,
                tenant(),
                Err(ErrorCode::ApproverOnly),
            ),
            (
                "nobody is unauthorized",
                Approver,
                Presented::Nobody,
                Err(ErrorCode::Unauthorized),
            ),
            (
                "the approver lists every key's asks",
                Either,
                Presented::Approver,
                Ok(Some("operator")),
            ),
            (
                "a tenant lists its own",
                Either,
                tenant(),
                Ok(Some("tenant")),
            ),
            (
                "the operator runs commands",
                Consumer,
                Presented::Operator,
                Ok(Some("operator")),
            ),
            (
                "a tenant runs commands",
                Consumer,
                tenant(),
                Ok(Some("tenant")),
            ),
            (
                "the approver does not",
                Consumer,
                Presented::Approver,
                Err(ErrorCode::Unauthorized),
            ),
            (
                "nobody does",
                Consumer,
                Presented::Nobody,
                Err(ErrorCode::Unauthorized),
            ),
            (
                "the operator makes tokens",
                Operator,
                Presented::Operator,
                Ok(Some("operator")),
            ),
            (
                "a tenant does not",
                Operator,
                tenant(),
                Err(ErrorCode::OperatorOnly),
            ),
            (
                "nor the approver",
                Operator,
                Presented::Approver,
                Err(ErrorCode::Unauthorized),
            ),
        ];
        for (sentence, class, who, want) in rows {
            let got = match decide(class, who) {
                Ok(None) => Ok(None),
                Ok(Some(Caller::Operator)) => Ok(Some("operator")),
                Ok(Some(Caller::Tenant(_))) => Ok(Some("tenant")),
                Err((_, code, _)) => Err(code),
            };
            assert_eq!(got, want, "{sentence}");
        }
    }
}
