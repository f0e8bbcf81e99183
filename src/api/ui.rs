//! The operator's dashboard: `GET /ui` and its assets under `/ui/...`.
//!
//! Plain HTML, CSS and JavaScript modules compiled into the binary (`include_str!`), with no build
//! step and nothing loaded from elsewhere. The page only reads this daemon's own JSON API and watch
//! stream (same origin); it has no write action. Every answer carries a Content-Security-Policy that
//! allows scripts, styles and connections to this origin only and no inline code, so a card's text
//! (which comes from any publisher on the mesh) can never run as script, even if a rendering bug
//! put it into markup.

use axum::extract::Path;
use axum::http::header::{self, HeaderName};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;

use super::error::ApiError;

/// Same-origin only, nothing inline, no framing, no plugins, no `<base>`, no form posts.
pub const CONTENT_SECURITY_POLICY: &str = "default-src 'none'; script-src 'self'; style-src 'self'; \
     img-src 'self'; connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

/// The assets are small and served from memory on loopback: revalidating on every load costs little,
/// and a page never mixes scripts from an older binary with a newer API.
const CACHE_CONTROL: &str = "no-cache";

/// One file of the dashboard, served at `/ui/{name}`.
pub struct Asset {
    pub name: &'static str,
    pub content_type: &'static str,
    pub body: &'static str,
}

const JS: &str = "text/javascript; charset=utf-8";

/// The page itself, served at `/ui` and `/ui/`.
pub const INDEX: Asset = Asset {
    name: "index.html",
    content_type: "text/html; charset=utf-8",
    body: include_str!("ui/index.html"),
};

/// Every file under `/ui/`; any other name is 404.
pub const ASSETS: &[Asset] = &[
    INDEX,
    Asset { name: "style.css", content_type: "text/css; charset=utf-8", body: include_str!("ui/style.css") },
    Asset { name: "app.js", content_type: JS, body: include_str!("ui/app.js") },
    Asset { name: "api.js", content_type: JS, body: include_str!("ui/api.js") },
    Asset { name: "dom.js", content_type: JS, body: include_str!("ui/dom.js") },
    Asset { name: "agents.js", content_type: JS, body: include_str!("ui/agents.js") },
    Asset { name: "agent.js", content_type: JS, body: include_str!("ui/agent.js") },
    Asset { name: "mesh.js", content_type: JS, body: include_str!("ui/mesh.js") },
    Asset { name: "icon.svg", content_type: "image/svg+xml", body: include_str!("ui/icon.svg") },
];

/// The dashboard's routes, merged into the API's router.
pub fn routes<S: Clone + Send + Sync + 'static>() -> Router<S> {
    Router::new().route("/ui", get(index)).route("/ui/", get(index)).route("/ui/{*name}", get(asset))
}

async fn index() -> Response {
    serve(&INDEX)
}

async fn asset(Path(name): Path<String>) -> Result<Response, ApiError> {
    ASSETS
        .iter()
        .find(|a| a.name == name)
        .map(serve)
        .ok_or_else(|| ApiError::NotFound(format!("dashboard file `{name}`")))
}

fn serve(asset: &Asset) -> Response {
    let headers: [(HeaderName, &'static str); 6] = [
        (header::CONTENT_TYPE, asset.content_type),
        (header::CONTENT_SECURITY_POLICY, CONTENT_SECURITY_POLICY),
        (header::CACHE_CONTROL, CACHE_CONTROL),
        (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
        (header::REFERRER_POLICY, "no-referrer"),
        (header::X_FRAME_OPTIONS, "DENY"),
    ];
    (headers, asset.body).into_response()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{router, AppState};
    use crate::registry::health::Thresholds;
    use crate::registry::Registry;
    use axum::body::Body;
    use axum::http::{Request, StatusCode};
    use std::sync::Arc;
    use tower::ServiceExt;

    /// The whole API router, as the node serves it.
    fn app() -> (tempfile::TempDir, axum::Router) {
        let dir = tempfile::tempdir().unwrap();
        let me = crate::identity::Identity::ephemeral().keypair().clone();
        let (registry, _) = Registry::open(dir.path(), me, Thresholds::default()).unwrap();
        (dir, router(AppState::new(Arc::new(registry), None)))
    }

    async fn get(app: &axum::Router, path: &str) -> (StatusCode, axum::http::HeaderMap, Vec<u8>) {
        let response = app.clone().oneshot(Request::get(path).body(Body::empty()).unwrap()).await.unwrap();
        let (parts, body) = response.into_parts();
        let body = axum::body::to_bytes(body, usize::MAX).await.unwrap().to_vec();
        (parts.status, parts.headers, body)
    }

    /// The content type a browser needs for a file of this name (module scripts are refused under
    /// any other type, and `nosniff` makes the browser trust the header alone).
    fn expected_type(name: &str) -> &'static str {
        match name.rsplit_once('.').map(|(_, ext)| ext) {
            Some("html") => "text/html; charset=utf-8",
            Some("js") => "text/javascript; charset=utf-8",
            Some("css") => "text/css; charset=utf-8",
            Some("svg") => "image/svg+xml",
            other => panic!("no content type known for {other:?}"),
        }
    }

    fn header<'a>(headers: &'a axum::http::HeaderMap, name: &str) -> &'a str {
        headers.get(name).and_then(|v| v.to_str().ok()).unwrap_or_default()
    }

    #[tokio::test]
    async fn the_page_and_every_asset_are_served_with_their_type_and_policy() {
        let (_dir, app) = app();
        let mut paths: Vec<(String, &Asset)> = vec![("/ui".into(), &INDEX), ("/ui/".into(), &INDEX)];
        paths.extend(ASSETS.iter().map(|a| (format!("/ui/{}", a.name), a)));
        for (path, asset) in paths {
            let (status, headers, body) = get(&app, &path).await;
            assert_eq!(status, StatusCode::OK, "{path}");
            assert_eq!(header(&headers, "content-type"), expected_type(asset.name), "{path}");
            let csp = header(&headers, "content-security-policy");
            assert_eq!(csp, CONTENT_SECURITY_POLICY, "{path}");
            assert!(csp.contains("default-src 'none'") && csp.contains("script-src 'self';"), "{csp}");
            assert!(!csp.contains("unsafe-inline") && !csp.contains("unsafe-eval"), "{csp}");
            assert_eq!(header(&headers, "x-content-type-options"), "nosniff", "{path}");
            assert_eq!(header(&headers, "cache-control"), "no-cache", "{path}");
            assert_eq!(body, asset.body.as_bytes(), "{path}");
        }
    }

    #[tokio::test]
    async fn an_unknown_file_is_404() {
        let (_dir, app) = app();
        for path in ["/ui/nope.js", "/ui/APP.JS", "/ui/app.js/x", "/ui/../api/v1/health", "/ui/ui/app.js"] {
            let (status, headers, body) = get(&app, path).await;
            assert_eq!(status, StatusCode::NOT_FOUND, "{path}");
            assert_eq!(header(&headers, "content-type"), "application/json", "{path}");
            let body: serde_json::Value = serde_json::from_slice(&body).unwrap();
            assert_eq!(body["error"], "not_found", "{path}");
        }
        // The API around it is untouched.
        assert_eq!(get(&app, "/api/v1/health").await.0, StatusCode::OK);
    }

    /// What the policy would block must not be there: inline scripts, inline styles and handlers in the
    /// page, and markup built from strings in the scripts. And every file the page or a module loads is
    /// one that is served.
    #[test]
    fn the_page_loads_only_served_files_and_nothing_inline() {
        let served = |name: &str| ASSETS.iter().any(|a| a.name == name);
        let html = INDEX.body;
        let mut loaded = 0;
        for attr in ["src=\"/ui/", "href=\"/ui/"] {
            for (i, _) in html.match_indices(attr) {
                let rest = &html[i + attr.len()..];
                let name = &rest[..rest.find('"').unwrap()];
                assert!(served(name), "index.html loads /ui/{name}, which is not served");
                loaded += 1;
            }
        }
        assert!(loaded >= 3, "the page loads its script, style and icon");
        for tag in html.match_indices("<script").map(|(i, _)| &html[i..i + html[i..].find('>').unwrap()]) {
            assert!(tag.contains(" src=\"/ui/"), "inline script: {tag}");
        }
        assert!(!html.contains("<style") && !html.contains(" style=") && !html.contains(" onclick="));
        for asset in ASSETS.iter().filter(|a| a.name.ends_with(".js")) {
            for (i, _) in asset.body.match_indices(" from './") {
                let rest = &asset.body[i + " from './".len()..];
                let name = &rest[..rest.find('\'').unwrap()];
                assert!(served(name), "{} imports ./{name}, which is not served", asset.name);
            }
            for sink in ["innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval("] {
                assert!(!asset.body.contains(sink), "{} uses {sink}", asset.name);
            }
        }
    }
}
