//! The API's errors: every refusal is a status and a stable code
//! ([`ErrorCode`], the wire crate's), answered as `{"error": {"code", "message"}}`;
//! and the path extractor that refuses an undecodable path the same way.

use axum::Json;
use axum::extract::{FromRequestParts, Path};
use axum::http::{StatusCode, header, request::Parts};
use axum::response::{IntoResponse, Response};
use stockade_wire::{self as wire, ErrorCode};

use stockade_runtime::bindings::FacadeError;
use stockade_runtime::runtime::CallError;

/// An API error: a status and a stable code.
#[derive(Debug)]
pub struct ApiError {
    pub(super) status: StatusCode,
    code: ErrorCode,
    pub(super) message: String,
}

impl ApiError {
    pub(super) fn new(
        status: StatusCode,
        code: impl Into<ErrorCode>,
        message: impl Into<String>,
    ) -> Self {
        Self {
            status,
            code: code.into(),
            message: message.into(),
        }
    }

    /// The code and message, as the body and the stream's error event carry them.
    pub(super) fn detail(self) -> wire::ErrorDetail {
        wire::ErrorDetail {
            code: self.code,
            message: self.message,
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status = self.status;
        let body = wire::ErrorBody {
            error: self.detail(),
        };
        let mut r = (status, Json(body)).into_response();
        if status == StatusCode::TOO_MANY_REQUESTS {
            r.headers_mut()
                .insert(header::RETRY_AFTER, header::HeaderValue::from_static("1"));
        }
        r
    }
}

impl From<CallError> for ApiError {
    fn from(e: CallError) -> Self {
        match e {
            CallError::Facade(FacadeError::NeedsApproval(m)) => {
                Self::new(StatusCode::FORBIDDEN, ErrorCode::NeedsApproval, m)
            }
            // 429 with Retry-After, as peers answer a concurrency limit: a client
            // retries it, and it is not a server fault (Schemathesis counted the 503).
            CallError::Facade(FacadeError::OverCapacity) => Self::new(
                StatusCode::TOO_MANY_REQUESTS,
                ErrorCode::OverCapacity,
                "the ticket gate is full: retry when a sandbox frees",
            ),
            CallError::Facade(FacadeError::InvalidInput(m)) => {
                Self::new(StatusCode::BAD_REQUEST, ErrorCode::InvalidInput, m)
            }
            CallError::Facade(FacadeError::Unreachable(m)) => {
                Self::new(StatusCode::BAD_GATEWAY, ErrorCode::Unreachable, m)
            }
            CallError::Facade(FacadeError::Failed(m)) => {
                Self::new(StatusCode::INTERNAL_SERVER_ERROR, ErrorCode::Failed, m)
            }
            CallError::Trap(m) => Self::new(StatusCode::INTERNAL_SERVER_ERROR, ErrorCode::Trap, m),
        }
    }
}

pub(super) type ApiResult<T> = Result<T, ApiError>;

/// The path's parameters; a path that does not decode (invalid percent-encoding, not
/// UTF-8) is refused with the typed `invalid-input`, like every other bad input, not
/// with axum's plain-text rejection (found by the API fuzz).
pub(super) struct Params<T>(pub(super) T);

impl<S: Send + Sync, T: serde::de::DeserializeOwned + Send> FromRequestParts<S> for Params<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        match Path::<T>::from_request_parts(parts, state).await {
            Ok(Path(t)) => Ok(Params(t)),
            Err(e) => Err(ApiError::new(
                StatusCode::BAD_REQUEST,
                ErrorCode::InvalidInput,
                e.body_text(),
            )),
        }
    }
}

/// The stream's last event when the call failed after its run started.
pub(super) fn error_event(e: ApiError) -> wire::StreamEvent {
    wire::StreamEvent::Error(wire::ErrorEvent {
        status: e.status.as_u16(),
        error: e.detail(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_full_ticket_gate_is_429_with_retry_after() {
        let r = ApiError::from(CallError::Facade(FacadeError::OverCapacity)).into_response();
        assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(r.headers()[header::RETRY_AFTER], "1");
        let r = ApiError::from(CallError::Facade(FacadeError::Failed("x".into()))).into_response();
        assert_eq!(r.status(), StatusCode::INTERNAL_SERVER_ERROR);
        assert!(r.headers().get(header::RETRY_AFTER).is_none());
    }
}
