//! Headless Chromium driven over the DevTools protocol on a pipe (`--remote-debugging-pipe`:
//! JSON messages separated by NUL on fds 3 and 4), for tests that must click: `--dump-dom`
//! only loads a page, and the live UI's deep links wait for a click before they spend tokens.

use std::fs::File;
use std::io::{BufRead, BufReader, Write};
use std::os::fd::{AsRawFd, FromRawFd};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{channel, Receiver};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

/// A pipe's (read, write) ends, close-on-exec (`std::io::pipe` is newer than the crate's MSRV).
fn pipe() -> (File, File) {
    let mut fds = [0i32; 2];
    // SAFETY: pipe2 fills both fds on success; each is then owned by one File.
    unsafe {
        assert_eq!(libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC), 0, "pipe2");
        (File::from_raw_fd(fds[0]), File::from_raw_fd(fds[1]))
    }
}

/// A headless Chromium with one page attached.
pub(crate) struct Browser {
    child: Child,
    to: File,
    from: Receiver<Value>,
    next_id: u64,
    session: String,
}

impl Drop for Browser {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Browser {
    /// Starts Chromium on `profile` with `extra` flags and opens `url` in a page.
    pub(crate) fn open(bin: &Path, profile: &Path, extra: &[&str], url: &str) -> Browser {
        let (to_chrome_r, to_chrome_w) = pipe();
        let (from_chrome_r, from_chrome_w) = pipe();
        // Copies above the fds the child gets (3 and 4), so that neither dup2 below overwrites
        // the other's source when the pipes happen to be on 3 or 4 already.
        // SAFETY: fcntl(F_DUPFD_CLOEXEC) on open fds; the copies are closed after the spawn.
        let high = |fd: i32| unsafe { libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, 100) };
        let (r, w) = (high(to_chrome_r.as_raw_fd()), high(from_chrome_w.as_raw_fd()));
        assert!(r >= 100 && w >= 100, "fcntl: {}", std::io::Error::last_os_error());
        let mut cmd = Command::new(bin);
        cmd.args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-background-networking",
            "--no-first-run",
            "--disable-dev-shm-usage",
            "--remote-debugging-pipe",
        ])
        .arg(format!("--user-data-dir={}", profile.display()))
        .args(extra)
        .arg("about:blank")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
        // SAFETY: dup2 is async-signal-safe; it gives the child the pipe ends on the fds the
        // protocol names (dup2 clears close-on-exec on the copies).
        unsafe {
            cmd.pre_exec(move || {
                if libc::dup2(r, 3) < 0 || libc::dup2(w, 4) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let child = cmd.spawn().unwrap();
        // SAFETY: the copies made above, owned by nothing else.
        unsafe {
            libc::close(r);
            libc::close(w);
        }
        drop((to_chrome_r, from_chrome_w));
        let (tx, rx) = channel();
        std::thread::spawn(move || {
            let mut r = BufReader::new(from_chrome_r);
            let mut buf = Vec::new();
            while r.read_until(0, &mut buf).unwrap_or(0) > 0 {
                if buf.last() == Some(&0) {
                    buf.pop();
                }
                if let Ok(v) = serde_json::from_slice::<Value>(&buf) {
                    if tx.send(v).is_err() {
                        return;
                    }
                }
                buf.clear();
            }
        });
        let mut b = Browser {
            child,
            to: to_chrome_w,
            from: rx,
            next_id: 0,
            session: String::new(),
        };
        let target = b.call("Target.createTarget", json!({ "url": url }));
        let target = target["targetId"].as_str().unwrap().to_string();
        let s = b.call(
            "Target.attachToTarget",
            json!({ "targetId": target, "flatten": true }),
        );
        b.session = s["sessionId"].as_str().unwrap().to_string();
        b
    }

    fn call(&mut self, method: &str, params: Value) -> Value {
        self.next_id += 1;
        let id = self.next_id;
        let mut msg = json!({ "id": id, "method": method, "params": params });
        if !self.session.is_empty() {
            msg["sessionId"] = json!(self.session);
        }
        let mut bytes = msg.to_string().into_bytes();
        bytes.push(0);
        self.to.write_all(&bytes).unwrap();
        loop {
            let v = self
                .from
                .recv_timeout(Duration::from_secs(60))
                .unwrap_or_else(|_| panic!("no answer to {method}"));
            if v["id"] == id {
                assert!(v.get("error").is_none(), "{method}: {v}");
                return v["result"].clone();
            }
        }
    }

    /// The value of the JavaScript expression `js` in the page (promises awaited).
    pub(crate) fn eval(&mut self, js: &str) -> Value {
        let r = self.call(
            "Runtime.evaluate",
            json!({ "expression": js, "awaitPromise": true, "returnByValue": true }),
        );
        assert!(r.get("exceptionDetails").is_none(), "{js}: {r}");
        r["result"]["value"].clone()
    }

    /// Waits up to `secs` for `js` to be true in the page; false when it never is.
    pub(crate) fn wait_for(&mut self, js: &str, secs: u64) -> bool {
        let end = Instant::now() + Duration::from_secs(secs);
        while Instant::now() < end {
            if self.eval(&format!("!!({js})")) == json!(true) {
                return true;
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        false
    }

    /// The page's DOM as HTML.
    pub(crate) fn dom(&mut self) -> String {
        self.eval("document.documentElement.outerHTML")
            .as_str()
            .unwrap_or_default()
            .to_string()
    }
}
