//! The live UI's guard: what makes `report --serve` safe to leave running beside a run.
//!
//! The UI holds a run's trajectories and, with `--assistant`, an endpoint that spends an API key
//! on every `POST /api/ask`. A browser visiting any other site must reach neither:
//! - **DNS rebinding**: a page on `evil.example` whose name later resolves to 127.0.0.1 is, to
//!   the browser, same-origin with the UI. Its requests still carry `Host: evil.example:PORT`,
//!   so without `--token` every request's `Host` must name the bound address (`127.0.0.1:PORT`,
//!   or `localhost:PORT` / `[::1]:PORT` on loopback); anything else is answered 421.
//! - **Cross-site requests**: a form or `fetch(…, {mode: "no-cors"})` on another site can POST a
//!   `text/plain` body without a CORS preflight. State-changing endpoints (every `POST`) need an
//!   `Origin` equal to `http://` + the request's `Host` (403 otherwise; browsers send `Origin`
//!   on every POST, a script adds it) and `Content-Type: application/json` (415 otherwise), which
//!   a cross-site page cannot send without a preflight the UI never answers.
//! - **Beyond loopback** (`--bind 0.0.0.0:PORT`) the UI needs `--token T`: without it the server
//!   refuses to start. With a token the `Host` check is off (the names the machine is reached
//!   by are not known in advance) and every request needs the token instead (401 otherwise),
//!   as `Authorization: Bearer T` (scripts) or the `lego_rl_token` cookie. Opening
//!   `http://HOST:PORT/?token=T` once sets the cookie and redirects to `/`, so the token leaves
//!   the address bar and history. The cookie is `HttpOnly` (no script reads it) and
//!   `SameSite=Lax` (sent on a top-level navigation such as a link from a chat, never on a
//!   cross-site POST or fetch); a rebinding page is on another host name, where the cookie
//!   does not exist. A header or cookie, not a token in every URL: URLs end up in logs, history
//!   and `Referer`.
//!
//! The Origin and content-type checks stay on with a token: the token authenticates the person,
//! the checks keep another site from acting through that person's browser.

use std::net::SocketAddr;
use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::assist::ask;

/// The cookie that carries `--token` after the first visit.
pub const TOKEN_COOKIE: &str = "lego_rl_token";

/// Errors of setting the guard up.
#[derive(Debug, thiserror::Error)]
pub enum GuardError {
    #[error(
        "--bind {0}: serving beyond loopback needs --token (anyone who can reach the port could \
         read the run and spend the assistant's API key)"
    )]
    NeedsToken(SocketAddr),
    #[error("--token: expected at least 16 characters of [A-Za-z0-9_-]")]
    WeakToken,
}

/// What every request to the live UI is checked against.
#[derive(Debug, Clone)]
pub struct Guard {
    /// Accepted `Host` values (lowercase); unused with a token.
    hosts: Vec<String>,
    token: Option<String>,
    /// Off only for the tests that show each attack works without the guard
    /// ([`crate::env::UNGUARDED_UI_FOR_TESTS`]).
    enabled: bool,
}

impl Guard {
    /// The guard of a server bound to `addr`, with `token` when given.
    pub fn new(addr: SocketAddr, token: Option<String>) -> Result<Self, GuardError> {
        if let Some(t) = &token {
            let ok = t.len() >= 16
                && t.chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_');
            if !ok {
                return Err(GuardError::WeakToken);
            }
        } else if !addr.ip().is_loopback() {
            return Err(GuardError::NeedsToken(addr));
        }
        let port = addr.port();
        let mut hosts = vec![addr.to_string()];
        if addr.ip().is_loopback() {
            hosts.extend([
                format!("localhost:{port}"),
                format!("127.0.0.1:{port}"),
                format!("[::1]:{port}"),
            ]);
        }
        let enabled = std::env::var_os(crate::env::UNGUARDED_UI_FOR_TESTS).is_none();
        if !enabled {
            tracing::warn!(
                "{} is set: the live UI's Host, Origin, content-type and token checks are OFF \
                 (for the tests that show each attack works without them)",
                crate::env::UNGUARDED_UI_FOR_TESTS
            );
        }
        Ok(Guard {
            hosts,
            token,
            enabled,
        })
    }

    /// Why `method` with `headers` is refused, if it is: the status and a message.
    pub fn check(&self, method: &Method, headers: &HeaderMap) -> Result<(), (StatusCode, String)> {
        if !self.enabled {
            return Ok(());
        }
        let host = header_str(headers, header::HOST).to_ascii_lowercase();
        match &self.token {
            Some(t) if !has_token(headers, t) => {
                return Err((
                    StatusCode::UNAUTHORIZED,
                    "this UI needs its --token: open it once as /?token=TOKEN, or send \
                     Authorization: Bearer TOKEN"
                        .into(),
                ));
            }
            Some(_) => {}
            None if !self.hosts.contains(&host) => {
                return Err((
                    StatusCode::MISDIRECTED_REQUEST,
                    format!(
                        "Host `{host}` is not this server's address ({}); a page on another \
                         name cannot use this UI (DNS rebinding)",
                        self.hosts.join(", ")
                    ),
                ));
            }
            None => {}
        }
        if method != Method::GET && method != Method::HEAD {
            let origin = header_str(headers, header::ORIGIN);
            if origin.is_empty() || !origin.eq_ignore_ascii_case(&format!("http://{host}")) {
                return Err((
                    StatusCode::FORBIDDEN,
                    format!("Origin `{origin}`: a change needs a same-origin request (http://{host})"),
                ));
            }
            let ct = header_str(headers, header::CONTENT_TYPE).to_ascii_lowercase();
            let json = ct
                .split(';')
                .next()
                .is_some_and(|m| m.trim() == "application/json");
            if !json {
                return Err((
                    StatusCode::UNSUPPORTED_MEDIA_TYPE,
                    format!("Content-Type `{ct}`: expected application/json"),
                ));
            }
        }
        Ok(())
    }

    /// With a token, `GET /?token=T` (T right) sets the cookie and redirects to `/`.
    fn token_visit(&self, req: &Request) -> Option<Response> {
        let t = self.token.as_ref()?;
        let q = req.uri().query()?;
        let given = q.split('&').find_map(|kv| kv.strip_prefix("token="))?;
        if req.method() != Method::GET || !same(given.as_bytes(), t.as_bytes()) {
            return None;
        }
        let cookie = format!("{TOKEN_COOKIE}={t}; Path=/; HttpOnly; SameSite=Lax");
        Some(
            (
                StatusCode::SEE_OTHER,
                [(header::SET_COOKIE, cookie), (header::LOCATION, "/".into())],
            )
                .into_response(),
        )
    }
}

fn header_str(h: &HeaderMap, name: header::HeaderName) -> String {
    h.get(name)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .trim()
        .to_string()
}

/// Compares in time independent of where the inputs differ.
fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

fn has_token(h: &HeaderMap, token: &str) -> bool {
    let bearer = header_str(h, header::AUTHORIZATION);
    if bearer
        .strip_prefix("Bearer ")
        .is_some_and(|b| same(b.trim().as_bytes(), token.as_bytes()))
    {
        return true;
    }
    h.get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|kv| kv.trim().strip_prefix(TOKEN_COOKIE)?.strip_prefix('='))
        .any(|v| same(v.as_bytes(), token.as_bytes()))
}

/// The axum middleware that applies `guard` to every request.
pub async fn middleware(State(guard): State<Arc<Guard>>, req: Request, next: Next) -> Response {
    if let Some(r) = guard.token_visit(&req) {
        return r;
    }
    match guard.check(req.method(), req.headers()) {
        Ok(()) => next.run(req).await,
        Err((status, msg)) => ask::error(status, msg),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(
                header::HeaderName::from_bytes(k.as_bytes()).unwrap(),
                v.parse().unwrap(),
            );
        }
        h
    }

    fn guard(bind: &str, token: Option<&str>) -> Guard {
        let mut g = Guard::new(bind.parse().unwrap(), token.map(str::to_string)).unwrap();
        g.enabled = true;
        g
    }

    #[test]
    fn host_must_name_the_bound_address() {
        let g = guard("127.0.0.1:8470", None);
        for ok in ["127.0.0.1:8470", "localhost:8470", "LOCALHOST:8470"] {
            assert!(g.check(&Method::GET, &headers(&[("host", ok)])).is_ok(), "{ok}");
        }
        for bad in ["evil.example:8470", "127.0.0.1:80", "", "localhost"] {
            let e = g.check(&Method::GET, &headers(&[("host", bad)])).unwrap_err();
            assert_eq!(e.0, StatusCode::MISDIRECTED_REQUEST, "{bad}");
        }
    }

    #[test]
    fn a_post_needs_same_origin_and_json() {
        let g = guard("127.0.0.1:8470", None);
        let post = |pairs: &[(&str, &str)]| g.check(&Method::POST, &headers(pairs)).map_err(|e| e.0);
        let host = ("host", "127.0.0.1:8470");
        let json = ("content-type", "application/json; charset=utf-8");
        assert_eq!(post(&[host, ("origin", "http://127.0.0.1:8470"), json]), Ok(()));
        assert_eq!(post(&[host, json]), Err(StatusCode::FORBIDDEN), "no Origin");
        assert_eq!(
            post(&[host, ("origin", "http://evil.example"), json]),
            Err(StatusCode::FORBIDDEN)
        );
        assert_eq!(
            post(&[
                host,
                ("origin", "http://127.0.0.1:8470"),
                ("content-type", "text/plain")
            ]),
            Err(StatusCode::UNSUPPORTED_MEDIA_TYPE)
        );
    }

    #[test]
    fn beyond_loopback_a_token_is_needed_and_checked() {
        assert!(matches!(
            Guard::new("0.0.0.0:8470".parse().unwrap(), None),
            Err(GuardError::NeedsToken(_))
        ));
        assert!(matches!(
            Guard::new("0.0.0.0:8470".parse().unwrap(), Some("short".into())),
            Err(GuardError::WeakToken)
        ));
        let t = "0123456789abcdef-xyz";
        let g = guard("0.0.0.0:8470", Some(t));
        let get = |pairs: &[(&str, &str)]| g.check(&Method::GET, &headers(pairs)).map_err(|e| e.0);
        let host = ("host", "box.lan:8470");
        assert_eq!(get(&[host]), Err(StatusCode::UNAUTHORIZED));
        assert_eq!(get(&[host, ("authorization", &format!("Bearer {t}"))]), Ok(()));
        assert_eq!(
            get(&[host, ("cookie", &format!("a=b; {TOKEN_COOKIE}={t}"))]),
            Ok(())
        );
        assert_eq!(
            get(&[host, ("cookie", &format!("{TOKEN_COOKIE}={t}x"))]),
            Err(StatusCode::UNAUTHORIZED)
        );
    }
}
