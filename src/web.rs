//! `GET /`: the Web chat page, static and embedded in the binary (no CDN, no
//! build step). It asks for the owner token and talks to the `/v1` routes.
//!
//! The page is plain HTML, CSS and JavaScript modules under `src/web/`, each
//! compiled in with `include_str!` and served with its content type and
//! `Cache-Control: no-cache` (a browser revalidates instead of running a stale
//! script against a newer broker). The page holds the owner token, so every
//! asset also carries a strict Content-Security-Policy: scripts, styles and
//! requests only from this origin, no framing, no inline script.

use axum::http::{HeaderName, HeaderValue, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;

/// Every embedded asset: its path, its content type and its text.
const ASSETS: &[(&str, &str, &str)] = &[
    ("/", HTML, include_str!("web/index.html")),
    ("/assets/app.css", CSS, include_str!("web/app.css")),
    ("/assets/app.js", JS, include_str!("web/app.js")),
    ("/assets/api.js", JS, include_str!("web/api.js")),
    ("/assets/sse.js", JS, include_str!("web/sse.js")),
    ("/assets/view.js", JS, include_str!("web/view.js")),
    ("/assets/changes.js", JS, include_str!("web/changes.js")),
    ("/assets/markdown.js", JS, include_str!("web/markdown.js")),
    ("/assets/attention.js", JS, include_str!("web/attention.js")),
    (
        "/assets/permissions.js",
        JS,
        include_str!("web/permissions.js"),
    ),
    // Pinned third-party modules; versions and licenses in web/vendor/README.md.
    (
        "/assets/vendor/marked.esm.js",
        JS,
        include_str!("web/vendor/marked.esm.js"),
    ),
    (
        "/assets/vendor/purify.es.mjs",
        JS,
        include_str!("web/vendor/purify.es.mjs"),
    ),
    ("/assets/icon.svg", SVG, include_str!("web/icon.svg")),
];

const HTML: &str = "text/html; charset=utf-8";
const CSS: &str = "text/css; charset=utf-8";
const JS: &str = "text/javascript; charset=utf-8";
const SVG: &str = "image/svg+xml";

/// Same-origin everything; `connect-src 'self'` covers the `/v1` calls and
/// the event stream; `img-src blob:` the attachments' thumbnails (fetched
/// with the token, shown from a `blob:` URL). No `unsafe-inline`: the page sets no inline script or
/// style attribute.
const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; \
                   img-src 'self' blob:; connect-src 'self'; base-uri 'none'; \
                   form-action 'none'; frame-ancestors 'none'";

/// The page's routes. Generic over the state so the caller's `AppState`
/// merges it and a test can mount it alone.
pub fn router<S: Clone + Send + Sync + 'static>() -> axum::Router<S> {
    ASSETS.iter().fold(
        axum::Router::new(),
        |router, &(path, content_type, body)| {
            router.route(path, get(move || async move { asset(content_type, body) }))
        },
    )
}

fn asset(content_type: &'static str, body: &'static str) -> Response {
    let headers: [(HeaderName, HeaderValue); 6] = [
        (header::CONTENT_TYPE, HeaderValue::from_static(content_type)),
        (header::CACHE_CONTROL, HeaderValue::from_static("no-cache")),
        (
            header::CONTENT_SECURITY_POLICY,
            HeaderValue::from_static(CSP),
        ),
        (
            header::X_CONTENT_TYPE_OPTIONS,
            HeaderValue::from_static("nosniff"),
        ),
        (
            header::REFERRER_POLICY,
            HeaderValue::from_static("no-referrer"),
        ),
        (header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY")),
    ];
    (headers, body).into_response()
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::body::Body;
    use axum::http::{Request, StatusCode};
    use tower::ServiceExt;

    async fn get_path(path: &str) -> Response {
        router::<()>()
            .oneshot(Request::get(path).body(Body::empty()).unwrap())
            .await
            .unwrap()
    }

    #[tokio::test]
    async fn every_asset_is_served_with_its_type_and_no_cache() {
        for &(path, content_type, body) in ASSETS {
            let response = get_path(path).await;
            assert_eq!(response.status(), StatusCode::OK, "{path}");
            let headers = response.headers();
            assert_eq!(headers[header::CONTENT_TYPE], content_type, "{path}");
            assert_eq!(headers[header::CACHE_CONTROL], "no-cache", "{path}");
            assert_eq!(headers[header::X_CONTENT_TYPE_OPTIONS], "nosniff", "{path}");
            assert!(
                headers[header::CONTENT_SECURITY_POLICY]
                    .to_str()
                    .unwrap()
                    .contains("connect-src 'self'"),
                "{path}"
            );
            let bytes = axum::body::to_bytes(response.into_body(), usize::MAX)
                .await
                .unwrap();
            assert_eq!(bytes, body.as_bytes(), "{path}");
        }
    }

    #[test]
    fn the_page_loads_only_embedded_assets() {
        let (_, _, page) = ASSETS[0];
        for (attr, rest) in [("src=\"", page), ("href=\"", page)] {
            for piece in rest.split(attr).skip(1) {
                let target = piece.split('"').next().unwrap();
                if target.starts_with('#') {
                    continue; // a link within the page
                }
                assert!(
                    ASSETS.iter().any(|&(path, _, _)| path == target),
                    "index.html refers to {target}, which is not embedded"
                );
            }
        }
        // Modules import each other by relative path: each must be embedded.
        for &(path, _, body) in ASSETS.iter().filter(|(_, ct, _)| *ct == JS) {
            for piece in body.split("from './").skip(1) {
                let target = format!("/assets/{}", piece.split('\'').next().unwrap());
                assert!(
                    ASSETS.iter().any(|&(p, _, _)| p == target),
                    "{path} imports {target}, which is not embedded"
                );
            }
        }
        assert!(!page.contains("http://") && !page.contains("https://"));
    }

    /// The vendored files are the pinned ones the README names, byte for byte.
    #[test]
    fn vendored_files_match_their_recorded_sha256() {
        use sha2::{Digest, Sha256};
        let readme = include_str!("web/vendor/README.md");
        let vendored: Vec<_> = ASSETS
            .iter()
            .filter(|(path, _, _)| path.starts_with("/assets/vendor/"))
            .collect();
        assert_eq!(vendored.len(), 2);
        for &&(path, _, body) in &vendored {
            let file = path.trim_start_matches("/assets/vendor/");
            let row = readme
                .lines()
                .find(|line| line.starts_with(&format!("| `{file}` |")))
                .unwrap_or_else(|| panic!("{file} has no row in vendor/README.md"));
            let sha = hex::encode(Sha256::digest(body.as_bytes()));
            assert!(
                row.contains(&format!("`{sha}`")),
                "{file}: sha256 {sha} is not the recorded one"
            );
        }
    }

    #[test]
    fn the_policy_allows_no_inline_script_or_style() {
        assert!(!CSP.contains("unsafe-"), "{CSP}");
        for directive in [
            "script-src 'self';",
            "style-src 'self';",
            "img-src 'self' blob:;",
        ] {
            assert!(CSP.contains(directive), "{CSP} lacks {directive}");
        }
    }
}
