//! The upload routes (`PUT …/files`, `PUT …/files/PATH`): their checks, the
//! server's upload slots, and the answer of a streamed upload (crate::upload).

use std::sync::Arc;

use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::{Extension, Json};
use serde::Deserialize;
use serde_json::{Value, json};
use stockade_wire::ErrorCode;

use super::error::{ApiError, ApiResult, Params};
use super::{ApiState, UPLOAD_BODY_BYTES};

/// `?dest=` of an archive upload: a directory relative to `/workspace`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct Dest {
    #[serde(default)]
    dest: String,
}

/// `PUT …/files?dest=DIR`: a tar archive unpacked into `/workspace/DIR`, streamed
/// (crate::upload).
pub(super) async fn put_archive(
    State(s): State<Arc<ApiState>>,
    Params(key): Params<String>,
    Extension(slots): Extension<UploadSlots>,
    dest: Result<Query<Dest>, axum::extract::rejection::QueryRejection>,
    body: axum::body::Body,
) -> ApiResult<(StatusCode, Json<Value>)> {
    let Query(dest) = dest.map_err(|e| {
        ApiError::new(
            StatusCode::BAD_REQUEST,
            ErrorCode::InvalidInput,
            e.body_text(),
        )
    })?;
    let dest = crate::upload::check_dest(&dest.dest)
        .map_err(|e| ApiError::new(StatusCode::BAD_REQUEST, ErrorCode::InvalidInput, e))?;
    let _slot = slots.take()?;
    upload(&s, &key, crate::upload::Upload::Archive { dest }, body).await
}

/// `PUT …/files/PATH`: one file's bytes written to `/workspace/PATH`, streamed. Its
/// length must be declared (`Content-Length`): the file's tar header goes first.
pub(super) async fn put_file(
    State(s): State<Arc<ApiState>>,
    Params((key, path)): Params<(String, String)>,
    Extension(slots): Extension<UploadSlots>,
    body: axum::body::Body,
) -> ApiResult<(StatusCode, Json<Value>)> {
    crate::upload::check_file_name(&path)
        .map_err(|e| ApiError::new(StatusCode::BAD_REQUEST, ErrorCode::InvalidInput, e))?;
    let Some(len) = axum::body::HttpBody::size_hint(&body).exact() else {
        return Err(ApiError::new(
            StatusCode::LENGTH_REQUIRED,
            ErrorCode::LengthRequired,
            "a file upload declares its length (Content-Length); an archive (PUT …/files) need not",
        ));
    };
    let _slot = slots.take()?;
    upload(&s, &key, crate::upload::Upload::File { path, len }, body).await
}

/// Stream an upload in; its answer.
async fn upload(
    s: &ApiState,
    key: &str,
    what: crate::upload::Upload,
    body: axum::body::Body,
) -> ApiResult<(StatusCode, Json<Value>)> {
    use crate::upload::Failure;
    if axum::body::HttpBody::size_hint(&body).lower() > UPLOAD_BODY_BYTES as u64 {
        return Err(ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            ErrorCode::PayloadTooLarge,
            Failure::TooLarge.to_string(),
        ));
    }
    match crate::upload::put(&s.runtime, key, what, body).await {
        Ok(put) => Ok((
            StatusCode::CREATED,
            Json(json!({ "dest": put.dest, "entries": put.entries })),
        )),
        Err(e) => Err(failure_error(key, e)),
    }
}

/// Why an upload did not go in, as the API answers it.
fn failure_error(key: &str, e: crate::upload::Failure) -> ApiError {
    use crate::upload::Failure;
    match e {
        e @ Failure::TooLarge => ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            ErrorCode::PayloadTooLarge,
            e.to_string(),
        ),
        Failure::Body(m) => ApiError::new(StatusCode::BAD_REQUEST, ErrorCode::MalformedBody, m),
        Failure::Refused(m) => ApiError::new(StatusCode::BAD_REQUEST, ErrorCode::InvalidInput, m),
        // The user is told what happened; the operator's log keeps the node's words.
        Failure::Unreachable(ref why) => {
            tracing::warn!(key, why = %why, "an upload's node could not be reached");
            ApiError::new(
                StatusCode::BAD_GATEWAY,
                ErrorCode::Unreachable,
                e.to_string(),
            )
        }
        Failure::Call(e) => e.into(),
        e @ Failure::Unpack(..) => ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            ErrorCode::PutFailed,
            e.to_string(),
        ),
    }
}

use crate::upload::MAX_CONCURRENT_UPLOADS;

/// The upload slots of one server (one per router).
#[derive(Clone)]
pub(super) struct UploadSlots(Arc<tokio::sync::Semaphore>);

impl UploadSlots {
    pub(super) fn new() -> Self {
        Self(Arc::new(tokio::sync::Semaphore::new(
            MAX_CONCURRENT_UPLOADS,
        )))
    }

    /// A slot for one upload, held until its answer; none free: 429.
    fn take(&self) -> ApiResult<tokio::sync::OwnedSemaphorePermit> {
        self.0.clone().try_acquire_owned().map_err(|_| {
            ApiError::new(
                StatusCode::TOO_MANY_REQUESTS,
                ErrorCode::UploadsBusy,
                format!("{MAX_CONCURRENT_UPLOADS} uploads are in progress on this server: retry"),
            )
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use stockade_runtime::bindings::FacadeError;
    use stockade_runtime::runtime::CallError;

    #[test]
    fn an_upload_whose_node_was_lost_is_a_502_in_the_users_terms() {
        let cut = CallError::Facade(FacadeError::Unreachable(
            "node node-1: run: Network connection lost".into(),
        ));
        let e = failure_error("k", crate::upload::Failure::from(cut));
        assert_eq!(e.status, StatusCode::BAD_GATEWAY);
        let d = e.detail();
        assert_eq!(d.code, ErrorCode::Unreachable);
        assert_eq!(
            d.message,
            "the upload did not complete: the sandbox's node could not be reached (nothing was written)"
        );
    }
}
