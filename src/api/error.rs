//! The one HTTP error type. Every failure renders as JSON, whatever format the request asked for.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::json;

use crate::card::CardError;
use crate::query::ParamError;
use crate::registry::RegistryError;

#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    #[error(transparent)]
    InvalidParameter(#[from] ParamError),
    #[error("{message}")]
    InvalidBody { message: String, field: Option<String> },
    #[error("request body is over the {limit} byte limit")]
    PayloadTooLarge { limit: usize },
    #[error("request target is over the {limit} byte limit")]
    UriTooLong { limit: usize },
    #[error("{0} not found")]
    NotFound(String),
    /// Nothing in the view qualifies for a selection (`/resolve`).
    #[error("{0}")]
    NoMatch(String),
    #[error("{0}")]
    Forbidden(String),
    #[error("writes need a loopback client or a valid API key")]
    Unauthorized,
    /// A bounded resource is exhausted (watch streams): try again later.
    #[error("{0}")]
    Unavailable(String),
    #[error("internal error")]
    Internal { request_id: String },
    /// A registration past a configured limit (`max_agents_per_publisher`): nothing was registered.
    #[error("{message}")]
    LimitReached { message: String, setting: &'static str, limit: usize },
    /// Another agent already offers a capability of this registration, and the node rejects
    /// duplicates (`duplicate_capabilities = "reject"`): nothing was registered.
    #[error("capability `{capability}` is already offered by agent `{agent_id}`")]
    DuplicateCapability { capability: String, agent_id: String },
    /// The data directory cannot be written (full disk, read-only): nothing was registered.
    #[error("the node cannot store this change: {0}")]
    Storage(String),
}

impl ApiError {
    pub fn invalid_body(message: impl Into<String>) -> Self {
        Self::InvalidBody { message: message.into(), field: None }
    }

    /// Logs the cause under a fresh request id and hides it from the client.
    pub fn internal(cause: &dyn std::fmt::Display) -> Self {
        let request_id = format!("{:016x}", rand::random::<u64>());
        tracing::error!(%request_id, error = %cause, "request failed");
        Self::Internal { request_id }
    }
}

impl From<CardError> for ApiError {
    fn from(e: CardError) -> Self {
        match e {
            CardError::TooLarge { .. } => Self::InvalidBody { message: e.to_string(), field: None },
            _ => Self::InvalidBody { field: e.field().map(str::to_owned), message: e.to_string() },
        }
    }
}

impl From<RegistryError> for ApiError {
    fn from(e: RegistryError) -> Self {
        match e {
            RegistryError::NotFound(id) => Self::NotFound(format!("agent `{id}`")),
            RegistryError::Store(e) => {
                tracing::error!(error = %e, "store write failed");
                Self::Storage(e.to_string())
            }
            RegistryError::Witness(e) => {
                tracing::error!(error = %e, "store witness write failed");
                Self::Storage(e.to_string())
            }
            RegistryError::LocalLimit { limit, .. } => {
                Self::LimitReached { message: e.to_string(), setting: "max_agents_per_publisher", limit }
            }
            RegistryError::StoreOverLimit { .. } => Self::internal(&e),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let message = self.to_string();
        let (status, body) = match self {
            ApiError::InvalidParameter(p) => (
                StatusCode::BAD_REQUEST,
                json!({"error": "invalid_parameter", "message": message,
                       "details": {"parameter": p.parameter, "provided": p.provided, "allowed": p.allowed}}),
            ),
            ApiError::InvalidBody { field, .. } => {
                let mut body = json!({"error": "invalid_request", "message": message});
                if let Some(field) = field {
                    body["details"] = json!({"field": field});
                }
                (StatusCode::BAD_REQUEST, body)
            }
            ApiError::PayloadTooLarge { limit } => (
                StatusCode::PAYLOAD_TOO_LARGE,
                json!({"error": "payload_too_large", "message": message, "details": {"limit_bytes": limit}}),
            ),
            ApiError::UriTooLong { limit } => (
                StatusCode::URI_TOO_LONG,
                json!({"error": "uri_too_long", "message": message, "details": {"limit_bytes": limit}}),
            ),
            ApiError::NotFound(_) => {
                (StatusCode::NOT_FOUND, json!({"error": "not_found", "message": message}))
            }
            ApiError::NoMatch(_) => (StatusCode::NOT_FOUND, json!({"error": "no_match", "message": message})),
            ApiError::Forbidden(_) => {
                (StatusCode::FORBIDDEN, json!({"error": "forbidden", "message": message}))
            }
            ApiError::Unauthorized => {
                (StatusCode::UNAUTHORIZED, json!({"error": "unauthorized", "message": message}))
            }
            ApiError::Unavailable(_) => {
                (StatusCode::SERVICE_UNAVAILABLE, json!({"error": "unavailable", "message": message}))
            }
            ApiError::LimitReached { setting, limit, .. } => (
                StatusCode::CONFLICT,
                json!({"error": "limit_reached", "message": message,
                       "details": {"setting": setting, "limit": limit}}),
            ),
            ApiError::DuplicateCapability { capability, agent_id } => (
                StatusCode::CONFLICT,
                json!({"error": "duplicate_capability", "message": message,
                       "details": {"capability": capability, "agent_id": agent_id,
                                   "setting": "duplicate_capabilities"}}),
            ),
            ApiError::Storage(_) => (
                StatusCode::INSUFFICIENT_STORAGE,
                json!({"error": "storage_unavailable", "message": message}),
            ),
            ApiError::Internal { request_id } => (
                StatusCode::INTERNAL_SERVER_ERROR,
                json!({"error": "internal_error", "message": message, "request_id": request_id}),
            ),
        };
        (status, Json(body)).into_response()
    }
}
