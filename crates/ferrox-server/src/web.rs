//! The chat page at `/`: one self-contained HTML file (scripts and styles inlined) built from
//! `web/` (`scripts/build-web.sh`) and embedded in the binary, so the server needs no files
//! at run time and the browser fetches nothing from elsewhere.

use axum::http::header;
use axum::response::{Html, IntoResponse};

const PAGE: &str = include_str!("../web/dist/index.html");

pub async fn chat_page() -> impl IntoResponse {
    (
        [
            (header::CACHE_CONTROL, "no-cache"),
            (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
        ],
        Html(PAGE),
    )
}
