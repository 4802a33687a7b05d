//! The proxy relay: the only way out of a trial container.
//!
//! Trial containers sit on an internal Docker network with no route to the host or anywhere else.
//! The rollout's proxy listens on a unix socket on the host ([`crate::proxy::Proxy::serve_unix`]);
//! that socket file is bind-mounted into the container at [`SOCKET`], and the container's main
//! process is a small relay, running as root, that listens on `127.0.0.1:`[`PORT`] and forwards
//! each connection to the socket. So the harness (as the non-root agent user) talks to
//! [`proxy_url`] and nothing else is reachable: no DNS, no host address, no other container.
//!
//! Why a unix socket and not a network sidecar: it needs no second container, no extra network,
//! no published host port, and works on any Docker-compatible engine whose daemon shares the
//! host's filesystem (local Docker, Podman, Slurm nodes). A remote `DOCKER_HOST` cannot bind-mount
//! the socket; run rollout on the engine's host there.
//!
//! The relay is Python (every task image is built from a base with `python3`); running as root
//! means the agent user cannot kill or replace it.

/// Loopback port the relay listens on inside the trial container.
pub const PORT: u16 = 8931;

/// Where the proxy's unix socket is mounted inside the trial container.
pub const SOCKET: &str = "/run/lego-rl/proxy.sock";

/// The proxy root URL for `token` as seen from inside a trial container (the Anthropic base URL;
/// OpenAI clients append `/v1`).
pub fn proxy_url(token: &str) -> String {
    format!("http://127.0.0.1:{PORT}/t/{token}")
}

/// The relay program (`python3 -c RELAY SOCKET PORT`): one asyncio task pair per connection,
/// half-closes passed through, both sides closed when both directions end.
pub const RELAY: &str = r#"
import asyncio, sys
SOCK, PORT = sys.argv[1], int(sys.argv[2])
async def pipe(r, w):
    try:
        while True:
            b = await r.read(65536)
            if not b:
                break
            w.write(b)
            await w.drain()
        if w.can_write_eof():
            w.write_eof()
    except Exception:
        pass
async def handle(cr, cw):
    try:
        ur, uw = await asyncio.open_unix_connection(SOCK)
    except OSError as e:
        print("lego-rl relay: proxy socket unavailable: %s" % e, file=sys.stderr, flush=True)
        cw.close()
        return
    await asyncio.gather(pipe(cr, uw), pipe(ur, cw))
    for w in (uw, cw):
        try:
            w.close()
        except Exception:
            pass
async def main():
    srv = await asyncio.start_server(handle, "127.0.0.1", PORT, backlog=1024)
    print("lego-rl relay: listening on 127.0.0.1:%d -> %s" % (PORT, SOCK), flush=True)
    async with srv:
        await srv.serve_forever()
asyncio.run(main())
"#;

/// The container command that runs the relay.
pub fn command() -> Vec<String> {
    vec![
        "python3".into(),
        "-c".into(),
        RELAY.into(),
        SOCKET.into(),
        PORT.to_string(),
    ]
}

/// Shell probe (bash `/dev/tcp`) that waits up to ~10 s for the relay to accept connections.
pub fn wait_script() -> String {
    format!(
        "for i in $(seq 100); do (exec 3<>/dev/tcp/127.0.0.1/{PORT}) 2>/dev/null && exit 0; sleep 0.1; done; \
         echo 'proxy relay did not start (does the image have python3?)' >&2; exit 1"
    )
}
