//! The chat page at `/`: built from `web/` (`scripts/build-web.sh`) into `web/dist/`
//! (`index.html`, `assets/app.js`, `assets/app.css`) and embedded in the binary, so the
//! server needs no files at run time.
//!
//! The page renders model output, which a prompt can make say anything; an image in it that
//! the browser fetched from another host would carry conversation text there. The page's
//! sanitizer turns remote images into links and drops whatever else would fetch; as a second
//! wall every response here carries a Content-Security-Policy ([`CSP`]) under which the page
//! loads and connects to this server only (images also from `data:` and `blob:`), runs no
//! inline script or style, and cannot be framed.

use std::sync::Arc;

use axum::http::{header, HeaderMap, HeaderName, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;

use crate::AppState;

/// The policy the page and its assets are served with.
pub(crate) const CSP: &str = "default-src 'self'; script-src 'self'; style-src 'self'; \
     img-src 'self' data: blob:; connect-src 'self'; object-src 'none'; base-uri 'none'; \
     form-action 'self'; frame-ancestors 'none'";

/// One embedded file of the page.
struct Asset {
    path: &'static str,
    content_type: &'static str,
    body: &'static [u8],
    /// FNV-1a of the body, the `ETag`: the names are fixed, so a browser revalidates each
    /// file (`no-cache`) and gets a 304 while the binary serves the same bytes.
    hash: u64,
}

const fn fnv1a(bytes: &[u8]) -> u64 {
    let mut hash = 0xcbf2_9ce4_8422_2325u64;
    let mut i = 0;
    while i < bytes.len() {
        hash ^= bytes[i] as u64;
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
        i += 1;
    }
    hash
}

macro_rules! asset {
    ($path:literal, $file:literal, $content_type:literal) => {{
        const BODY: &[u8] = include_bytes!(concat!("../web/dist/", $file));
        Asset {
            path: $path,
            content_type: $content_type,
            body: BODY,
            hash: fnv1a(BODY),
        }
    }};
}

static PAGE: Asset = asset!("/", "index.html", "text/html; charset=utf-8");
static SCRIPT: Asset = asset!(
    "/assets/app.js",
    "assets/app.js",
    "text/javascript; charset=utf-8"
);
static STYLE: Asset = asset!(
    "/assets/app.css",
    "assets/app.css",
    "text/css; charset=utf-8"
);

/// Everything the page is made of; `scripts/build-web.sh` checks the build writes these.
static ASSETS: [&Asset; 3] = [&PAGE, &SCRIPT, &STYLE];

fn serve(asset: &'static Asset, request: &HeaderMap) -> Response {
    let etag = format!("\"{:016x}\"", asset.hash);
    let fresh = request
        .get(header::IF_NONE_MATCH)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|tags| {
            tags.split(',')
                .map(|t| t.trim().trim_start_matches("W/"))
                .any(|t| t == etag || t == "*")
        });
    let headers: [(HeaderName, HeaderValue); 8] = [
        (
            header::CONTENT_TYPE,
            HeaderValue::from_static(asset.content_type),
        ),
        (header::CACHE_CONTROL, HeaderValue::from_static("no-cache")),
        (
            header::ETAG,
            HeaderValue::from_str(&etag).expect("hex digits"),
        ),
        (
            header::X_CONTENT_TYPE_OPTIONS,
            HeaderValue::from_static("nosniff"),
        ),
        (
            header::CONTENT_SECURITY_POLICY,
            HeaderValue::from_static(CSP),
        ),
        (
            header::REFERRER_POLICY,
            HeaderValue::from_static("no-referrer"),
        ),
        (header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY")),
        (
            header::X_DNS_PREFETCH_CONTROL,
            HeaderValue::from_static("off"),
        ),
    ];
    if fresh {
        (StatusCode::NOT_MODIFIED, headers).into_response()
    } else {
        (headers, asset.body).into_response()
    }
}

/// The page's routes: static, served without the API key (the page's own requests carry
/// the key the user enters).
pub(crate) fn routes() -> Router<Arc<AppState>> {
    ASSETS.iter().fold(Router::new(), |router, &asset| {
        router.route(
            asset.path,
            get(move |headers: HeaderMap| async move { serve(asset, &headers) }),
        )
    })
}

/// Whether a path is one of the page's static routes.
pub(crate) fn is_page_path(path: &str) -> bool {
    ASSETS.iter().any(|a| a.path == path)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The values of `attr="..."` in the page.
    fn attribute_values<'a>(html: &'a str, attr: &str) -> Vec<&'a str> {
        let needle = format!(" {attr}=\"");
        html.match_indices(&needle)
            .map(|(at, _)| {
                let rest = &html[at + needle.len()..];
                &rest[..rest.find('"').unwrap()]
            })
            .collect()
    }

    #[test]
    fn the_page_loads_only_what_the_server_embeds() {
        let html = std::str::from_utf8(PAGE.body).unwrap();
        let mut loaded: Vec<&str> = attribute_values(html, "src");
        loaded.extend(attribute_values(html, "href"));
        loaded.retain(|url| !url.starts_with("data:"));
        loaded.sort_unstable();
        assert_eq!(loaded, ["/assets/app.css", "/assets/app.js"]);
        assert!(loaded.iter().all(|path| is_page_path(path)));
        // Nothing the policy would block: no inline script or style.
        assert!(!html.contains("<style"), "inline <style> in the page");
        assert!(!html.contains(" style="), "a style attribute in the page");
        for (at, _) in html.match_indices("<script") {
            let tag = &html[at..at + html[at..].find('>').unwrap()];
            assert!(tag.contains(" src=\""), "an inline script: {tag}");
            assert!(
                html[at..].starts_with(&format!("{tag}></script>")),
                "a script with a body"
            );
        }
    }

    #[test]
    fn the_policy_keeps_the_page_to_its_server() {
        let directives: std::collections::HashMap<&str, &str> = CSP
            .split(';')
            .map(|d| d.trim().split_once(' ').unwrap())
            .collect();
        assert_eq!(directives["default-src"], "'self'");
        assert_eq!(directives["script-src"], "'self'");
        assert_eq!(directives["style-src"], "'self'");
        assert_eq!(directives["img-src"], "'self' data: blob:");
        assert_eq!(directives["connect-src"], "'self'");
        assert_eq!(directives["object-src"], "'none'");
        assert_eq!(directives["base-uri"], "'none'");
        assert_eq!(directives["form-action"], "'self'");
        assert_eq!(directives["frame-ancestors"], "'none'");
        assert!(HeaderValue::from_str(CSP).is_ok());
    }

    #[test]
    fn an_unchanged_file_is_not_sent_again() {
        let first = serve(&SCRIPT, &HeaderMap::new());
        assert_eq!(first.status(), StatusCode::OK);
        assert_eq!(
            first.headers()[header::CONTENT_TYPE],
            "text/javascript; charset=utf-8"
        );
        assert_eq!(first.headers()[header::X_CONTENT_TYPE_OPTIONS], "nosniff");
        assert_eq!(first.headers()[header::CONTENT_SECURITY_POLICY], CSP);
        let etag = first.headers()[header::ETAG].clone();
        let mut again = HeaderMap::new();
        again.insert(header::IF_NONE_MATCH, etag);
        assert_eq!(serve(&SCRIPT, &again).status(), StatusCode::NOT_MODIFIED);
        // Another file's tag does not match.
        let other = serve(&STYLE, &HeaderMap::new()).headers()[header::ETAG].clone();
        let mut stale = HeaderMap::new();
        stale.insert(header::IF_NONE_MATCH, other);
        assert_eq!(serve(&SCRIPT, &stale).status(), StatusCode::OK);
    }
}
