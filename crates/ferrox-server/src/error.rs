//! Errors in OpenAI's shape: `{"error": {"message", "type", "param", "code"}}` with the
//! matching HTTP status, for our own checks and for the framework's rejections alike.

use axum::body::Body;
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::{json, Value};

/// An error answered to a client.
#[derive(Clone, Debug)]
pub struct ApiError {
    pub status: StatusCode,
    pub message: String,
    pub kind: &'static str,
    pub param: Option<String>,
    pub code: Option<String>,
}

impl ApiError {
    pub fn new(status: StatusCode, kind: &'static str, message: impl Into<String>) -> ApiError {
        ApiError {
            status,
            message: message.into(),
            kind,
            param: None,
            code: None,
        }
    }

    /// 400 `invalid_request_error`.
    pub fn invalid(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::BAD_REQUEST, "invalid_request_error", message)
    }

    /// 400 naming the offending request field.
    pub fn param(param: &str, message: impl Into<String>) -> ApiError {
        ApiError::invalid(message).with_param(param)
    }

    /// 400 for a field we understand but do not support.
    pub fn unsupported(param: &str, message: impl Into<String>) -> ApiError {
        ApiError::invalid(message)
            .with_param(param)
            .with_code("unsupported_parameter")
    }

    pub fn unauthorized(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::UNAUTHORIZED, "authentication_error", message)
            .with_code("invalid_api_key")
    }

    pub fn not_found(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::NOT_FOUND, "invalid_request_error", message)
            .with_code("not_found")
    }

    pub fn unavailable(code: &str, message: impl Into<String>) -> ApiError {
        ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "unavailable_error",
            message,
        )
        .with_code(code)
    }

    pub fn internal(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "server_error", message)
            .with_code("internal_error")
    }

    pub fn with_param(mut self, param: &str) -> ApiError {
        self.param = Some(param.to_string());
        self
    }

    pub fn with_code(mut self, code: &str) -> ApiError {
        self.code = Some(code.to_string());
        self
    }

    /// The `{"error": {...}}` object (also sent as an SSE event after a stream started).
    pub fn body(&self) -> Value {
        json!({
            "error": {
                "message": self.message,
                "type": self.kind,
                "param": self.param,
                "code": self.code,
            }
        })
    }

    /// An error for a status some layer produced, with that layer's text as the message.
    pub fn from_status(status: StatusCode, text: &str) -> ApiError {
        let text = text.trim();
        let reason = status.canonical_reason().unwrap_or("error");
        let message = if text.is_empty() {
            reason.to_string()
        } else {
            text.to_string()
        };
        let (kind, code) = match status.as_u16() {
            401 => ("authentication_error", Some("invalid_api_key")),
            404 => ("invalid_request_error", Some("not_found")),
            405 => ("invalid_request_error", Some("method_not_allowed")),
            408 => ("invalid_request_error", Some("timeout")),
            413 => ("invalid_request_error", Some("request_too_large")),
            415 => ("invalid_request_error", Some("unsupported_media_type")),
            429 => ("rate_limit_error", Some("rate_limit_exceeded")),
            503 => ("unavailable_error", Some("unavailable")),
            s if s >= 500 => ("server_error", Some("internal_error")),
            _ => ("invalid_request_error", None),
        };
        ApiError {
            status,
            message,
            kind,
            param: None,
            code: code.map(str::to_string),
        }
    }
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}", self.status.as_u16(), self.message)
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut response = Response::new(Body::from(self.body().to_string()));
        *response.status_mut() = self.status;
        response.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        if self.status == StatusCode::UNAUTHORIZED {
            response
                .headers_mut()
                .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
        response
    }
}
