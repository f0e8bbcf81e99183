//! Request bodies: read within the size limit, parsed with errors that name the field.

use axum::body::Bytes;
use axum::extract::{FromRequest, Request};
use axum::http::StatusCode;
use serde::de::DeserializeOwned;

use super::error::ApiError;
use crate::defaults::MAX_BODY_BYTES;

/// The raw body, or a 413 / 400 JSON error.
pub struct RawBody(pub Bytes);

impl<S: Send + Sync> FromRequest<S> for RawBody {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        match Bytes::from_request(req, state).await {
            Ok(bytes) => Ok(RawBody(bytes)),
            Err(rejection) if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE => {
                Err(ApiError::PayloadTooLarge { limit: MAX_BODY_BYTES })
            }
            Err(rejection) => Err(ApiError::invalid_body(rejection.body_text())),
        }
    }
}

/// Parses JSON, naming the field at fault. An empty body parses as `null`, which optional bodies accept.
pub fn parse_json<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
    let bytes: &[u8] = if bytes.iter().all(u8::is_ascii_whitespace) { b"null" } else { bytes };
    let de = &mut serde_json::Deserializer::from_slice(bytes);
    serde_path_to_error::deserialize(de).map_err(|e| {
        let field = match e.path().to_string() {
            p if p == "?" || p == "." => "body".to_owned(),
            p => p,
        };
        let message = format!("malformed JSON at `{field}`: {}", e.inner());
        ApiError::InvalidBody { message, field: Some(field) }
    })
}
