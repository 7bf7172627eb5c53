//! `GET /`: the Web chat page, static and embedded in the binary (no CDN, no
//! build step). It asks for the owner token and talks to the `/v1` routes.

use axum::http::header;
use axum::response::IntoResponse;
use axum::routing::get;

use crate::http::AppState;

pub fn router() -> axum::Router<AppState> {
    axum::Router::new().route("/", get(index))
}

async fn index() -> impl IntoResponse {
    (
        [(header::CONTENT_TYPE, "text/html; charset=utf-8")],
        include_str!("web/index.html"),
    )
}
