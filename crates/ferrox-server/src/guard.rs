//! What keeps a web page from driving a server it was not served by.
//!
//! A page on another site can send requests to `http://127.0.0.1:8080` without any key when
//! the server has none: a `no-cors` POST arrives as `text/plain` with no preflight (CSRF),
//! and with DNS rebinding (a name of the attacker's that resolves to 127.0.0.1) the page
//! also reads the answers. As Ollama answers it:
//! * JSON endpoints take only `Content-Type: application/json` (in [`crate::routes::JsonBody`]):
//!   a browser sends that cross-origin only after a preflight, which only listed origins pass.
//! * Listening on loopback, a request whose `Host` is not a loopback name (`localhost`,
//!   `*.localhost`, an IP address) is refused: that is DNS rebinding.
//! * A request from a browser page (`Origin`) other than the server's own and the
//!   `--cors-origins` list is refused; only listed origins get CORS headers.

use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, HeaderValue, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use tower_http::cors::{AllowHeaders, AllowOrigin, CorsLayer};

use crate::{ApiError, AppState};

/// `--cors-origins`: browser origins (`scheme://host[:port]`) allowed to call the API from
/// their pages; `*` allows every origin.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AllowedOrigins(Vec<String>);

impl AllowedOrigins {
    /// From a comma-separated list; each entry must be an origin (or `*`).
    pub fn parse(list: &str) -> Result<AllowedOrigins, String> {
        let mut origins = Vec::new();
        for entry in list.split(',').map(str::trim).filter(|e| !e.is_empty()) {
            if entry != "*" && split_origin(entry).is_none() {
                return Err(format!(
                    "--cors-origins: `{entry}` is not an origin like http://localhost:3000"
                ));
            }
            origins.push(entry.trim_end_matches('/').to_ascii_lowercase());
        }
        Ok(AllowedOrigins(origins))
    }

    fn allows(&self, origin: &str) -> bool {
        let origin = origin.to_ascii_lowercase();
        self.0.iter().any(|o| o == "*" || *o == origin)
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// `scheme://authority` of an origin, with the scheme's default port dropped.
fn split_origin(origin: &str) -> Option<(String, String)> {
    let (scheme, rest) = origin.split_once("://")?;
    let authority = rest.trim_end_matches('/');
    if scheme.is_empty() || authority.is_empty() || authority.contains(['/', '?', '#', '@']) {
        return None;
    }
    let scheme = scheme.to_ascii_lowercase();
    Some((scheme.clone(), normal_authority(authority, &scheme)))
}

fn normal_authority(authority: &str, scheme: &str) -> String {
    let authority = authority.to_ascii_lowercase();
    let default = match scheme {
        "https" => ":443",
        _ => ":80",
    };
    authority
        .strip_suffix(default)
        .map(str::to_string)
        .unwrap_or(authority)
}

/// The host of a `Host` header value, without its port.
fn host_name(host: &str) -> &str {
    if let Some(rest) = host.strip_prefix('[') {
        return rest.split(']').next().unwrap_or(rest);
    }
    match host.rsplit_once(':') {
        Some((name, port)) if port.bytes().all(|b| b.is_ascii_digit()) => name,
        _ => host,
    }
}

/// Whether a `Host` names this machine's loopback: `localhost`, a name under `.localhost`
/// (RFC 6761: always loopback), or an address (a browser reaches an address itself, so an
/// address cannot be rebound).
pub(crate) fn is_loopback_host(host: &str) -> bool {
    let name = host_name(host).trim_end_matches('.').to_ascii_lowercase();
    name == "localhost" || name.ends_with(".localhost") || name.parse::<IpAddr>().is_ok()
}

/// Whether the page at `origin` is this server's own (same authority as the request's
/// `Host`, or the `X-Forwarded-Host` a reverse proxy set).
fn same_origin(origin: &str, headers: &HeaderMap) -> bool {
    let Some((scheme, authority)) = split_origin(origin) else {
        return false;
    };
    [header::HOST.as_str(), "x-forwarded-host"]
        .iter()
        .filter_map(|h| headers.get(*h)?.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|host| normal_authority(host.trim(), &scheme) == authority)
}

fn forbidden(message: String) -> Response {
    ApiError::new(StatusCode::FORBIDDEN, "invalid_request_error", message)
        .with_code("forbidden")
        .into_response()
}

/// Refuses DNS-rebound requests (on loopback) and pages of foreign origins.
pub(crate) async fn browser_guard(
    State(state): State<Arc<AppState>>,
    req: Request,
    next: Next,
) -> Response {
    let headers = req.headers();
    if state.loopback {
        let host = headers
            .get(header::HOST)
            .map(|h| h.to_str().unwrap_or("\u{fffd}"))
            .or_else(|| req.uri().authority().map(|a| a.as_str()));
        if let Some(host) = host.filter(|h| !is_loopback_host(h)) {
            return forbidden(format!(
                "the Host `{}` is not a loopback name, and this server listens on loopback \
                 only: use http://localhost or http://127.0.0.1",
                host.escape_debug()
            ));
        }
    }
    if let Some(origin) = headers.get(header::ORIGIN) {
        let origin = origin.to_str().unwrap_or("\u{fffd}");
        if !same_origin(origin, headers) && !state.config.cors_origins.allows(origin) {
            return forbidden(format!(
                "requests from pages at `{}` are not allowed: start the server with \
                 --cors-origins {} to allow them",
                origin.escape_debug(),
                origin.escape_debug()
            ));
        }
    }
    next.run(req).await
}

/// CORS headers (and preflight answers) for the listed origins only.
pub(crate) fn cors_layer(origins: &AllowedOrigins) -> CorsLayer {
    let origins = origins.clone();
    CorsLayer::new()
        .allow_origin(AllowOrigin::predicate(move |origin: &HeaderValue, _| {
            origin.to_str().is_ok_and(|o| origins.allows(o))
        }))
        .allow_methods([Method::GET, Method::POST, Method::DELETE, Method::OPTIONS])
        .allow_headers(AllowHeaders::mirror_request())
        .expose_headers([header::HeaderName::from_static("x-request-id")])
        .max_age(Duration::from_secs(600))
}

/// Whether a request's `Content-Type` is JSON (`application/json`, parameters allowed, or
/// a `+json` type).
pub(crate) fn is_json_content_type(headers: &HeaderMap) -> bool {
    let Some(value) = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
    else {
        return false;
    };
    let essence = value
        .split(';')
        .next()
        .unwrap_or_default()
        .trim()
        .to_ascii_lowercase();
    essence == "application/json"
        || (essence.starts_with("application/") && essence.ends_with("+json"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_hosts() {
        for host in [
            "localhost",
            "localhost:8080",
            "LOCALHOST.",
            "app.localhost:3000",
            "127.0.0.1",
            "127.0.0.1:8080",
            "[::1]:8080",
            "[::1]",
            "10.1.2.3:80",
        ] {
            assert!(is_loopback_host(host), "{host}");
        }
        for host in [
            "evil.example",
            "evil.example:8080",
            "localhost.evil.example",
            "127.0.0.1.nip.io",
            "",
        ] {
            assert!(!is_loopback_host(host), "{host}");
        }
    }

    #[test]
    fn origins() {
        let mut headers = HeaderMap::new();
        headers.insert(header::HOST, HeaderValue::from_static("127.0.0.1:8080"));
        assert!(same_origin("http://127.0.0.1:8080", &headers));
        assert!(!same_origin("http://127.0.0.1:9090", &headers));
        assert!(!same_origin("http://evil.example", &headers));
        assert!(!same_origin("null", &headers));
        headers.insert(header::HOST, HeaderValue::from_static("chat.example:80"));
        assert!(same_origin("http://chat.example", &headers));
        headers.insert(
            "x-forwarded-host",
            HeaderValue::from_static("proxy.example"),
        );
        assert!(same_origin("http://proxy.example", &headers));

        let allowed = AllowedOrigins::parse("http://localhost:3000, https://app.example/").unwrap();
        assert!(allowed.allows("http://localhost:3000"));
        assert!(allowed.allows("https://APP.example"));
        assert!(!allowed.allows("http://localhost:3001"));
        assert!(AllowedOrigins::parse("*")
            .unwrap()
            .allows("http://anything"));
        assert!(AllowedOrigins::parse("localhost:3000").is_err());
        assert!(AllowedOrigins::parse("").unwrap().is_empty());
    }

    #[test]
    fn json_content_types() {
        let with = |v: &'static str| {
            let mut h = HeaderMap::new();
            h.insert(header::CONTENT_TYPE, HeaderValue::from_static(v));
            is_json_content_type(&h)
        };
        assert!(with("application/json"));
        assert!(with("Application/JSON; charset=utf-8"));
        assert!(with("application/vnd.api+json"));
        assert!(!with("text/plain"));
        assert!(!with("application/x-www-form-urlencoded"));
        assert!(!with("multipart/form-data; boundary=x"));
        assert!(!is_json_content_type(&HeaderMap::new()));
    }
}
