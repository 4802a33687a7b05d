//! The live UI's guard (src/report/guard.rs): forged requests (a rebinding `Host`, a cross-site
//! `text/plain` POST, a JSON same-origin POST, `--token`), and a real page on another origin in
//! headless Chromium that tries to plant a conversation and to spend the assistant through DNS
//! rebinding. Each attack is shown to work on an unguarded twin (the test-only switch
//! `LEGO_RL_UNGUARDED_UI_FOR_TESTS`) and to fail on the guarded server. The assistant is a local
//! endpoint that counts the requests reaching it (what an attacker would spend).

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::Path;

use serde_json::{json, Value};

use crate::assist::{failing_endpoint, small_run};
use crate::cdp::Browser;
use crate::common::lego;
use crate::report::{chromium, enc, http, http_get, raw_http, serve_with, Server};
use crate::synth::trajectory;

const UNGUARDED: (&str, &str) = ("LEGO_RL_UNGUARDED_UI_FOR_TESTS", "1");

fn start(
    run: &Path,
    upstream: &str,
    conversations: &Path,
    extra: &[&str],
    unguarded: bool,
) -> (Server, String) {
    let mut args = vec![
        format!("--assistant={upstream}"),
        format!("--conversations={}", conversations.display()),
    ];
    args.extend(extra.iter().map(|s| s.to_string()));
    serve_with(run, &args, if unguarded { &[UNGUARDED] } else { &[] })
}

fn post(addr: &str, host: &str, path: &str, origin: Option<&str>, content_type: &str, body: &str) -> u16 {
    let origin = origin.map(|o| format!("Origin: {o}\r\n")).unwrap_or_default();
    let head = format!(
        "POST {path} HTTP/1.1\r\nHost: {host}\r\n{origin}Content-Type: {content_type}\r\nContent-Length: {}\r\n",
        body.len()
    );
    raw_http(addr, &head, body).0
}

fn lines(path: &Path) -> usize {
    std::fs::read_to_string(path).map_or(0, |s| s.lines().count())
}

#[test]
fn forged_requests_are_refused_and_work_on_the_unguarded_twin() {
    let dir = tempfile::tempdir().unwrap();
    let (run, s) = small_run(dir.path());
    let id = trajectory(&s, 0, 0, 0, 0).id;
    let convo = json!({"id": id, "turns": [{"role": "user", "content": "planted"}]}).to_string();
    let ask = json!({ "id": id }).to_string();
    for unguarded in [true, false] {
        let (upstream, reached) = failing_endpoint();
        let saved = dir.path().join(format!("conversations-{unguarded}.jsonl"));
        let (_server, addr) = start(&run, &upstream, &saved, &[], unguarded);
        let port = addr.rsplit(':').next().unwrap();
        let evil = format!("evil.test:{port}");
        // DNS rebinding: the page and the API under another host name.
        let (status, _, _) = raw_http(&addr, &format!("GET / HTTP/1.1\r\nHost: {evil}\r\n"), "");
        let rebound_ask = post(
            &addr,
            &evil,
            "/api/ask",
            Some(&format!("http://{evil}")),
            "application/json",
            &ask,
        );
        // A cross-site form or no-cors fetch: text/plain, no preflight.
        let csrf = post(
            &addr,
            &addr,
            "/api/conversations",
            Some("http://evil.test"),
            "text/plain",
            &convo,
        );
        let csrf_ask = post(
            &addr,
            &addr,
            "/api/ask",
            Some("http://evil.test"),
            "text/plain",
            &ask,
        );
        if unguarded {
            assert_eq!(status, 200, "the twin serves a rebinding Host");
            assert_eq!(rebound_ask, 200);
            assert_eq!(csrf, 200, "the twin saves a cross-site text/plain conversation");
            assert_eq!(lines(&saved), 1);
            assert!(
                reached.load(std::sync::atomic::Ordering::SeqCst) >= 1,
                "the key is spent"
            );
            continue;
        }
        assert_eq!(status, 421, "rebinding Host refused");
        assert_eq!(rebound_ask, 421);
        assert_eq!(csrf, 403, "cross-site POST refused");
        assert_eq!(csrf_ask, 403);
        assert_eq!(lines(&saved), 0, "nothing planted");
        assert_eq!(
            reached.load(std::sync::atomic::Ordering::SeqCst),
            0,
            "nothing spent"
        );
        // The page's own requests pass: same-origin JSON, under the bound address or localhost.
        assert_eq!(http_get(&addr, "/api/summary").0, 200);
        let local = format!("localhost:{port}");
        assert_eq!(
            raw_http(&addr, &format!("GET / HTTP/1.1\r\nHost: {local}\r\n"), "").0,
            200
        );
        assert_eq!(
            post(
                &addr,
                &addr,
                "/api/conversations",
                Some(&format!("http://{addr}")),
                "text/plain",
                &convo
            ),
            415,
            "same origin but not JSON"
        );
        assert_eq!(
            post(
                &addr,
                &addr,
                "/api/conversations",
                None,
                "application/json",
                &convo
            ),
            403
        );
        let (status, body) = http(
            &addr,
            "POST",
            "/api/conversations",
            Some(&serde_json::from_str(&convo).unwrap()),
        );
        assert_eq!(status, 200, "{body}");
        assert_eq!(lines(&saved), 1);
        assert_eq!(http(&addr, "POST", "/api/ask", Some(&json!({ "id": id }))).0, 200);
        assert!(reached.load(std::sync::atomic::Ordering::SeqCst) >= 1);
    }
}

#[test]
fn a_token_is_needed_beyond_loopback_and_taken_from_a_header_or_cookie() {
    let dir = tempfile::tempdir().unwrap();
    let (run, _) = small_run(dir.path());
    let out = lego()
        .args(["report", "--serve", "--bind", "0.0.0.0:0"])
        .arg(&run)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("needs --token"),
        "{out:?}"
    );
    let token = "t0ken-for-the-live-ui-test";
    let (_server, addr) = serve_with(&run, &[format!("--token={token}")], &[]);
    let get = |extra: &str| {
        raw_http(
            &addr,
            &format!("GET /api/summary HTTP/1.1\r\nHost: box.lan:1\r\n{extra}"),
            "",
        )
        .0
    };
    assert_eq!(get(""), 401);
    assert_eq!(get("Authorization: Bearer wrong-token-wrong-token\r\n"), 401);
    assert_eq!(
        get(&format!("Authorization: Bearer {token}\r\n")),
        200,
        "any Host with the token"
    );
    let (status, head, _) = raw_http(
        &addr,
        &format!("GET /?token={token} HTTP/1.1\r\nHost: {addr}\r\n"),
        "",
    );
    assert_eq!(status, 303, "{head}");
    let cookie = head
        .lines()
        .find_map(|l| {
            l.strip_prefix("set-cookie: ")
                .or_else(|| l.strip_prefix("Set-Cookie: "))
        })
        .unwrap_or_else(|| panic!("no cookie in {head}"));
    assert!(
        cookie.contains("HttpOnly") && cookie.contains("SameSite=Lax"),
        "{cookie}"
    );
    let pair = cookie.split(';').next().unwrap();
    assert_eq!(get(&format!("Cookie: {pair}\r\n")), 200);
}

/// The attacker's site: `/` is a page that tries to plant a conversation on the UI cross-site
/// and then, as if its host name had been rebound to 127.0.0.1, asks through its own origin;
/// every other path is forwarded to the UI unchanged (its `Host` still names this site), which
/// is what the browser sends to a rebound name.
fn attacker(ui: &str, id: &str) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let page = format!(
        r#"<!doctype html><title>attack</title><pre id="result"></pre><script>
(async () => {{
  const out = {{}};
  const convo = JSON.stringify({{ id: {id}, turns: [{{ role: "user", content: "planted" }}] }});
  try {{ await fetch("http://{ui}/api/conversations", {{ method: "POST", mode: "no-cors", headers: {{ "content-type": "text/plain" }}, body: convo }}); out.csrf = "sent"; }} catch (e) {{ out.csrf = "blocked"; }}
  try {{ out.summary = (await fetch("/api/summary")).status; }} catch (e) {{ out.summary = "blocked"; }}
  try {{ const r = await fetch("/api/ask", {{ method: "POST", headers: {{ "content-type": "application/json" }}, body: JSON.stringify({{ id: {id} }}) }}); out.ask = r.status; await r.text(); }} catch (e) {{ out.ask = "blocked"; }}
  document.getElementById("result").textContent = JSON.stringify(out);
  document.title = "done";
}})();
</script>"#,
        id = serde_json::to_string(id).unwrap()
    );
    let ui = ui.to_string();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(s) = stream else { continue };
            let (page, ui) = (page.clone(), ui.clone());
            std::thread::spawn(move || forward_or_serve(s, &page, &ui));
        }
    });
    addr
}

fn forward_or_serve(mut s: TcpStream, page: &str, ui: &str) {
    let mut r = BufReader::new(s.try_clone().unwrap());
    let mut head = String::new();
    let mut len = 0usize;
    let mut line = String::new();
    while r.read_line(&mut line).unwrap_or(0) > 0 && line != "\r\n" {
        let lower = line.to_ascii_lowercase();
        if let Some(v) = lower.strip_prefix("content-length:") {
            len = v.trim().parse().unwrap_or(0);
        }
        if !lower.starts_with("connection:") {
            head.push_str(&line);
        }
        line.clear();
    }
    let mut body = vec![0; len];
    let _ = r.read_exact(&mut body);
    if head.starts_with("GET / ") {
        let _ = write!(
            s,
            "HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{page}",
            page.len()
        );
        return;
    }
    let Ok(mut up) = TcpStream::connect(ui) else {
        return;
    };
    let _ = up.write_all(format!("{head}Connection: close\r\n\r\n").as_bytes());
    let _ = up.write_all(&body);
    let _ = std::io::copy(&mut up, &mut s);
}

#[test]
fn a_page_on_another_origin_cannot_plant_a_conversation_or_reach_the_assistant() {
    let dir = tempfile::tempdir().unwrap();
    let (run, s) = small_run(dir.path());
    let id = trajectory(&s, 0, 0, 0, 0).id;
    let Some(chrome) = chromium() else { return };
    for unguarded in [true, false] {
        let (upstream, reached) = failing_endpoint();
        let saved = dir.path().join(format!("conversations-{unguarded}.jsonl"));
        let (_server, addr) = start(&run, &upstream, &saved, &[], unguarded);
        let site = attacker(&addr, &id);
        let port = site.rsplit(':').next().unwrap();
        let mut b = Browser::open(
            &chrome,
            &dir.path().join(format!("profile-{unguarded}")),
            &["--host-resolver-rules=MAP evil.test 127.0.0.1"],
            &format!("http://evil.test:{port}/"),
        );
        assert!(b.wait_for("document.title === 'done'", 60), "{}", b.dom());
        let result: Value = serde_json::from_str(
            b.eval("document.getElementById('result').textContent")
                .as_str()
                .unwrap(),
        )
        .unwrap();
        let spent = reached.load(std::sync::atomic::Ordering::SeqCst);
        if unguarded {
            assert_eq!(
                lines(&saved),
                1,
                "the twin takes the planted conversation: {result}"
            );
            assert_eq!(result["summary"], 200, "{result}");
            assert_eq!(result["ask"], 200, "{result}");
            assert!(spent >= 1, "the twin spends the key: {result}");
        } else {
            assert_eq!(lines(&saved), 0, "{result}");
            assert_eq!(result["summary"], 421, "{result}");
            assert_eq!(result["ask"], 421, "{result}");
            assert_eq!(spent, 0, "{result}");
        }
    }
}

#[test]
fn a_deep_link_opens_the_ask_box_and_waits_for_a_click() {
    let dir = tempfile::tempdir().unwrap();
    let (run, s) = small_run(dir.path());
    let id = trajectory(&s, 0, 0, 0, 0).id;
    let Some(chrome) = chromium() else { return };
    let (upstream, reached) = failing_endpoint();
    let saved = dir.path().join("conversations.jsonl");
    let (_server, addr) = start(&run, &upstream, &saved, &[], false);
    let mut b = Browser::open(
        &chrome,
        &dir.path().join("profile"),
        &[],
        &format!("http://{addr}/#traj={}&ask=save", enc(&id)),
    );
    assert!(b.wait_for("document.getElementById('ask-go')", 30), "{}", b.dom());
    // Long enough for a page that asked on load to have asked.
    std::thread::sleep(std::time::Duration::from_secs(3));
    let dom = b.dom();
    assert!(dom.contains("press Ask to send"), "the box says it waits");
    assert_eq!(
        b.eval("document.querySelectorAll('.ask-answer').length"),
        json!(0),
        "nothing asked"
    );
    assert_eq!(reached.load(std::sync::atomic::Ordering::SeqCst), 0);
    b.eval("document.getElementById('ask-go').click()");
    assert!(
        b.wait_for("document.querySelector('.ask-answer.failed')", 30),
        "{}",
        b.dom()
    );
    assert!(
        reached.load(std::sync::atomic::Ordering::SeqCst) >= 1,
        "the click asks"
    );
}
