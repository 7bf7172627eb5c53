//! `GET /`: the Web chat page, static and embedded in the binary (no CDN, no
//! build step). It asks for the owner token and talks to the `/v1` routes.
//!
//! The page is plain HTML, CSS and JavaScript modules under `src/web/`, each
//! compiled in with `include_str!` and served with its content type and
//! `Cache-Control: no-cache` (a browser revalidates instead of running a stale
//! script against a newer broker). The page holds the owner token, so every
//! asset also carries a strict Content-Security-Policy: scripts, styles and
//! requests only from this origin, no framing, no inline script.
//!
//! It installs (WEB.md "Installable"): `/manifest.webmanifest` names it and
//! its icons (PNGs committed beside it, nothing made or fetched at build
//! time), and `/sw.js`, a service worker the broker fills in with the list
//! of these assets and a hash of their bytes, keeps the shell for offline use.

use axum::http::{HeaderName, HeaderValue, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;

/// Every embedded asset: its path, its content type and its bytes.
const ASSETS: &[(&str, &str, &[u8])] = &[
    ("/", HTML, include_bytes!("web/index.html")),
    ("/assets/app.css", CSS, include_bytes!("web/app.css")),
    ("/assets/app.js", JS, include_bytes!("web/app.js")),
    ("/assets/api.js", JS, include_bytes!("web/api.js")),
    ("/assets/sse.js", JS, include_bytes!("web/sse.js")),
    ("/assets/view.js", JS, include_bytes!("web/view.js")),
    ("/assets/changes.js", JS, include_bytes!("web/changes.js")),
    ("/assets/markdown.js", JS, include_bytes!("web/markdown.js")),
    (
        "/assets/attention.js",
        JS,
        include_bytes!("web/attention.js"),
    ),
    ("/assets/push.js", JS, include_bytes!("web/push.js")),
    (
        "/assets/permissions.js",
        JS,
        include_bytes!("web/permissions.js"),
    ),
    // Pinned third-party modules; versions and licenses in web/vendor/README.md.
    (
        "/assets/vendor/marked.esm.js",
        JS,
        include_bytes!("web/vendor/marked.esm.js"),
    ),
    (
        "/assets/vendor/purify.es.mjs",
        JS,
        include_bytes!("web/vendor/purify.es.mjs"),
    ),
    ("/assets/icon.svg", SVG, include_bytes!("web/icon.svg")),
    (
        "/assets/icon-192.png",
        PNG,
        include_bytes!("web/icon-192.png"),
    ),
    (
        "/assets/icon-512.png",
        PNG,
        include_bytes!("web/icon-512.png"),
    ),
    (
        "/manifest.webmanifest",
        MANIFEST,
        include_bytes!("web/manifest.webmanifest"),
    ),
];

/// The service worker's source; [`service_worker`] fills in its shell.
const SERVICE_WORKER: &str = include_str!("web/sw.js");

const HTML: &str = "text/html; charset=utf-8";
const CSS: &str = "text/css; charset=utf-8";
const JS: &str = "text/javascript; charset=utf-8";
const SVG: &str = "image/svg+xml";
const PNG: &str = "image/png";
const MANIFEST: &str = "application/manifest+json";

/// Same-origin everything; `connect-src 'self'` covers the `/v1` calls and
/// the event stream; `img-src blob:` the attachments' thumbnails (fetched
/// with the token, shown from a `blob:` URL). No `unsafe-inline`: the page sets no inline script or
/// style attribute. `manifest-src` and `worker-src` let the page install
/// (its manifest and its service worker, both from this origin).
const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; \
                   img-src 'self' blob:; connect-src 'self'; manifest-src 'self'; \
                   worker-src 'self'; base-uri 'none'; form-action 'none'; \
                   frame-ancestors 'none'";

/// The page's routes. Generic over the state so the caller's `AppState`
/// merges it and a test can mount it alone.
pub fn router<S: Clone + Send + Sync + 'static>() -> axum::Router<S> {
    ASSETS
        .iter()
        .fold(
            axum::Router::new(),
            |router, &(path, content_type, body)| {
                router.route(path, get(move || async move { asset(content_type, body) }))
            },
        )
        .route(
            "/sw.js",
            get(|| async { asset(JS, service_worker().as_bytes()) }),
        )
}

/// The service worker with its shell filled in: every asset's path, and a
/// version that is a hash of every asset's bytes (a new broker, a new cache).
fn service_worker() -> &'static str {
    static FILLED: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
        use sha2::{Digest, Sha256};
        let mut hash = Sha256::new();
        for &(path, _, body) in ASSETS {
            hash.update(path.as_bytes());
            hash.update((body.len() as u64).to_le_bytes());
            hash.update(body);
        }
        hash.update(SERVICE_WORKER.as_bytes());
        let version = hex::encode(&hash.finalize()[..8]);
        let shell: Vec<&str> = ASSETS.iter().map(|&(path, _, _)| path).collect();
        let shell = serde_json::to_string(&shell).expect("a list of paths is JSON");
        SERVICE_WORKER
            .replacen("__SHELL__", &shell, 1)
            .replacen("__VERSION__", &version, 1)
    });
    &FILLED
}

fn asset(content_type: &'static str, body: &'static [u8]) -> Response {
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
            assert_eq!(&bytes[..], body, "{path}");
        }
    }

    #[tokio::test]
    async fn the_service_worker_is_served_with_its_shell_filled_in() {
        let response = get_path("/sw.js").await;
        assert_eq!(response.status(), StatusCode::OK);
        assert_eq!(response.headers()[header::CONTENT_TYPE], JS);
        assert!(
            response.headers()[header::CONTENT_SECURITY_POLICY]
                .to_str()
                .unwrap()
                .contains("worker-src 'self'")
        );
        let bytes = axum::body::to_bytes(response.into_body(), usize::MAX)
            .await
            .unwrap();
        let text = std::str::from_utf8(&bytes).unwrap();
        assert!(!text.contains("__SHELL__") && !text.contains("__VERSION__"));
        for &(path, _, _) in ASSETS {
            assert!(
                text.contains(&format!("\"{path}\"")),
                "{path} not in the shell"
            );
        }
        let version = text.split("const VERSION = '").nth(1).unwrap();
        assert_eq!(version.split('\'').next().unwrap().len(), 16);
    }

    /// The manifest is JSON whose icons are embedded PNGs of the size they say.
    #[test]
    fn the_manifest_names_embedded_icons_of_their_size() {
        let (_, _, body) = ASSETS
            .iter()
            .find(|(path, _, _)| *path == "/manifest.webmanifest")
            .unwrap();
        let manifest: serde_json::Value = serde_json::from_slice(body).unwrap();
        assert_eq!(manifest["display"], "standalone");
        assert_eq!(manifest["start_url"], "/");
        let mut sizes = Vec::new();
        for icon in manifest["icons"].as_array().unwrap() {
            let src = icon["src"].as_str().unwrap();
            let &(_, content_type, bytes) = ASSETS
                .iter()
                .find(|(path, _, _)| *path == src)
                .unwrap_or_else(|| panic!("{src} is not embedded"));
            assert_eq!(icon["type"], content_type, "{src}");
            if content_type == PNG {
                // The IHDR chunk: width and height, big-endian, at 16 and 20.
                assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n", "{src}");
                let side = |at: usize| u32::from_be_bytes(bytes[at..at + 4].try_into().unwrap());
                assert_eq!(icon["sizes"], format!("{}x{}", side(16), side(20)), "{src}");
                sizes.push(side(16));
            }
        }
        sizes.sort();
        assert_eq!(sizes, [192, 512]);
    }

    #[test]
    fn the_page_loads_only_embedded_assets() {
        let page = std::str::from_utf8(ASSETS[0].2).unwrap();
        for (attr, rest) in [("src=\"", page), ("href=\"", page)] {
            for piece in rest.split(attr).skip(1) {
                let target = piece.split('"').next().unwrap();
                if target.starts_with('#') || target == "/sw.js" {
                    continue; // a link within the page; the generated worker
                }
                assert!(
                    ASSETS.iter().any(|&(path, _, _)| path == target),
                    "index.html refers to {target}, which is not embedded"
                );
            }
        }
        // Modules import each other by relative path: each must be embedded.
        for &(path, _, body) in ASSETS.iter().filter(|(_, ct, _)| *ct == JS) {
            let body = std::str::from_utf8(body).unwrap();
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
            let sha = hex::encode(Sha256::digest(body));
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
            "manifest-src 'self';",
            "worker-src 'self';",
        ] {
            assert!(CSP.contains(directive), "{CSP} lacks {directive}");
        }
    }
}
