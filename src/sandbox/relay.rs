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

/// Where the relay records what it saw and refused (root-only, mode 0600; see [`RELAY`]). The
/// sandbox reads it as root after the agent stage ([`crate::sandbox::trial`]'s egress audit).
pub const EGRESS_LOG: &str = "/run/lego-rl/egress.log";

/// The relay program (`python3 -c RELAY SOCKET PORT EGRESS_LOG`): one asyncio task pair per
/// connection, half-closes passed through, both sides closed when both directions end.
///
/// It also records egress attempts, in [`EGRESS_LOG`], which the agent user can neither read nor
/// write (the trial turns them into `blocked_egress` audit events):
/// - DNS: before it accepts proxy connections it binds a stub resolver on `127.0.0.1:53` (UDP and
///   TCP) and points `/etc/resolv.conf` at it. The stub answers every query NXDOMAIN (no name leads
///   anywhere but the proxy, whose URL is an address) and logs `dns <qtype> <name>`, so attempts to
///   reach hosts by name (pip, curl, git clone, an SDK's default endpoint) are seen. Labels are
///   escaped (`\xNN` for anything outside `[A-Za-z0-9_-]`, a dot inside a label included).
///   Without the stub, lookups would go to Docker's embedded resolver, which resolves nothing useful
///   on an internal network and records nothing.
/// - TCP connects: every 250 ms it reads `/proc/net/tcp` and `/proc/net/tcp6` (the container's
///   network namespace, all users) and logs `connect <ip> <port> <uid>` once per socket in SYN_SENT
///   towards a non-loopback address other than the container's own. Nothing on the trial network
///   answers (the gateway address has no host behind it), so a connect that waits for its answer
///   sits in SYN_SENT for the ~3 s the kernel spends on ARP before failing with EHOSTUNREACH; one
///   given up within a poll interval can be missed (the kernel counters the trial reads still see
///   the unanswered ARP).
///
/// Logging stops after 10000 lines (a last `truncated` line says so). If port 53 cannot be bound
/// (no `CAP_NET_BIND_SERVICE`) or resolv.conf is not writable, the relay says so on stderr and
/// relays anyway: egress is still blocked by the network; only the names go unrecorded.
pub const RELAY: &str = r#"
import asyncio, os, socket, sys
SOCK, PORT, LOG = sys.argv[1], int(sys.argv[2]), sys.argv[3]
QTYPES = {1: "A", 2: "NS", 5: "CNAME", 6: "SOA", 12: "PTR", 15: "MX", 16: "TXT", 28: "AAAA", 33: "SRV", 65: "HTTPS", 255: "ANY"}
SAFE = set(b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-")
lines = 0
try:
    os.makedirs(os.path.dirname(LOG), exist_ok=True)
    fd = os.open(LOG, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    log = os.fdopen(fd, "a", buffering=1)
except OSError as e:
    print("lego-rl relay: egress log unavailable: %s" % e, file=sys.stderr, flush=True)
    log = None
def record(line):
    global lines
    if log is None or lines > 10000:
        return
    lines += 1
    log.write(("truncated" if lines > 10000 else line) + "\n")
def answer(q):
    if len(q) < 12:
        return None
    i, labels = 12, []
    while True:
        if i >= len(q):
            return None
        n = q[i]
        i += 1
        if n == 0:
            break
        if n & 0xC0 or i + n > len(q):
            return None
        labels.append("".join(chr(c) if c in SAFE else "\\x%02x" % c for c in q[i:i + n]))
        i += n
    if i + 4 > len(q):
        return None
    qtype = int.from_bytes(q[i:i + 2], "big")
    record("dns %s %s" % (QTYPES.get(qtype, str(qtype)), ".".join(labels) or "."))
    flags = bytes([0x80 | (q[2] & 0x79), 0x83])
    return q[:2] + flags + b"\x00\x01\x00\x00\x00\x00\x00\x00" + q[12:i + 4]
class Udp(asyncio.DatagramProtocol):
    def connection_made(self, t):
        self.t = t
    def datagram_received(self, data, addr):
        a = answer(data)
        if a is not None:
            self.t.sendto(a, addr)
async def dns_tcp(r, w):
    try:
        while True:
            n = int.from_bytes(await r.readexactly(2), "big")
            a = answer(await r.readexactly(n))
            if a is None:
                break
            w.write(len(a).to_bytes(2, "big") + a)
            await w.drain()
    except Exception:
        pass
    w.close()
def addr(h):
    ip, port = h.split(":")
    b = bytes.fromhex(ip)
    if len(b) == 4:
        return socket.inet_ntop(socket.AF_INET, b[::-1]), int(port, 16)
    b = b"".join(b[i:i + 4][::-1] for i in range(0, 16, 4))
    return socket.inet_ntop(socket.AF_INET6, b), int(port, 16)
async def watch():
    seen = set()
    while True:
        for f in ("/proc/net/tcp", "/proc/net/tcp6"):
            try:
                with open(f) as fh:
                    rows = fh.read().splitlines()[1:]
            except OSError:
                continue
            for row in rows:
                p = row.split()
                if len(p) < 10 or p[3] != "02" or (p[2], p[9]) in seen:
                    continue
                seen.add((p[2], p[9]))
                try:
                    (ra, rp), (la, _) = addr(p[2]), addr(p[1])
                except (ValueError, OSError):
                    continue
                if ra == la or ra.startswith("127.") or ra in ("::1", "::") or ra.startswith("::ffff:127."):
                    continue
                record("connect %s %d %s" % (ra, rp, p[7]))
        if len(seen) > 100000:
            seen.clear()
        await asyncio.sleep(0.25)
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
    loop = asyncio.get_running_loop()
    try:
        await loop.create_datagram_endpoint(Udp, local_addr=("127.0.0.1", 53))
        dns = await asyncio.start_server(dns_tcp, "127.0.0.1", 53)
        with open("/etc/resolv.conf", "w") as f:
            f.write("nameserver 127.0.0.1\noptions timeout:1 attempts:1\n")
    except OSError as e:
        print("lego-rl relay: no DNS stub (lookups go unrecorded): %s" % e, file=sys.stderr, flush=True)
    watcher = asyncio.ensure_future(watch())
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
        EGRESS_LOG.into(),
    ]
}

/// Shell probe (bash `/dev/tcp`) that waits up to ~10 s for the relay to accept connections.
pub fn wait_script() -> String {
    format!(
        "for i in $(seq 100); do (exec 3<>/dev/tcp/127.0.0.1/{PORT}) 2>/dev/null && exit 0; sleep 0.1; done; \
         echo 'proxy relay did not start (does the image have python3?)' >&2; exit 1"
    )
}
