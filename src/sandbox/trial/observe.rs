//! What the sandbox observes about the agent stage from outside the agent's reach: kernel counters
//! of the container's memory cgroup and network namespace, and the relay's egress log, read as root
//! right after setup (the baseline) and right after the agent stage. The differences become audit
//! events; a container that did not survive the agent stage decides the trial's termination.
//!
//! - `oom_kill`: the kernel's OOM killer acted at the trial's memory limit (`oom_kill` of the cgroup's
//!   `memory.events` on cgroup v2, `memory.oom_control` on v1).
//! - `blocked_egress`: the agent tried to leave the sandbox. Signals that are real, cheap, and that
//!   the agent user can neither write nor reset:
//!   1. names it tried to resolve (the relay's DNS stub answers NXDOMAIN and logs them, see
//!      [`relay::RELAY`]): one event per name;
//!   2. TCP connects to non-loopback addresses (the relay logs sockets it sees in SYN_SENT): one
//!      event per address and port. Nothing on the trial network answers, so each is blocked;
//!   3. the network namespace's neighbour table (`/proc/net/arp` entries with flags 0x0: nobody
//!      answered ARP). Docker gives an internal network's containers a default route via a gateway
//!      address that, with `inhibit_ipv4`, no host holds: every packet to an outside address
//!      (TCP, UDP, a connect given up too soon for the relay to see) ends as an unanswered ARP for
//!      the gateway, and any other address is a probe for hosts on the trial subnet;
//!   4. the `OutNoRoutes` counters (`Ip:` in `/proc/net/snmp`, `Ip6OutNoRoutes` in
//!      `/proc/net/snmp6`): engines whose internal networks have no default route (and IPv6 here)
//!      fail outside destinations with ENETUNREACH, which the kernel counts.
//!
//!   Loopback connections (the proxy relay, a server the agent starts itself) are not egress and
//!   are not counted. Not observed: the destination of a UDP datagram or of a connect given up
//!   within the relay's 250 ms poll (only counted through 3 and 4).

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use super::Trial;
use crate::records::AuditEvent;
use crate::sandbox::relay;

/// Most `blocked_egress` events for names, and for connect destinations, per trial; the rest are
/// summarised in one event each.
const MAX_EVENTS: usize = 50;

/// One line of the relay's egress log (see [`relay::RELAY`]).
#[derive(Debug, Clone, PartialEq)]
pub enum Egress {
    /// `dns <qtype> <name>`: a query the stub answered NXDOMAIN.
    Dns { qtype: String, name: String },
    /// `connect <ip> <port> <uid>`: a TCP socket seen in SYN_SENT towards a non-loopback address.
    Connect { addr: String, port: u16 },
    /// `truncated`: the relay stopped logging.
    Truncated,
}

/// Kernel counters and the relay's log at one moment.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Counters {
    /// Cumulative OOM kills in the container's memory cgroup (`None`: not readable).
    pub oom_kills: Option<u64>,
    pub no_route_v4: u64,
    pub no_route_v6: u64,
    /// Addresses on the trial network that never answered ARP.
    pub arp_failed: BTreeSet<String>,
    /// The default route's gateway, if any.
    pub gateway: Option<String>,
    /// The relay's log, in order (it only grows: what the agent stage added comes after the
    /// baseline's lines).
    pub egress: Vec<Egress>,
}

/// The shell probe (run as root) that prints each source under a `==> PATH` header.
pub fn probe_script() -> String {
    format!(
        "for f in /sys/fs/cgroup/memory.events /sys/fs/cgroup/memory/memory.oom_control \
         /proc/net/snmp /proc/net/snmp6 /proc/net/arp /proc/net/route {}; do \
         if [ -r \"$f\" ]; then echo \"==> $f\"; cat \"$f\"; fi; done; true",
        relay::EGRESS_LOG
    )
}

/// Parses [`probe_script`]'s output.
pub fn parse_probe(out: &str) -> Counters {
    let mut sections: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    let mut current = "";
    for line in out.lines() {
        if let Some(path) = line.strip_prefix("==> ") {
            current = path;
            sections.entry(current).or_default();
        } else if !current.is_empty() {
            sections.entry(current).or_default().push(line);
        }
    }
    let section = |path: &str| sections.get(path).map(Vec::as_slice).unwrap_or_default();
    let kv = |lines: &[&str], key: &str| {
        lines.iter().find_map(|l| {
            let mut it = l.split_whitespace();
            (it.next() == Some(key))
                .then(|| it.next().and_then(|v| v.parse::<u64>().ok()))
                .flatten()
        })
    };
    let mut c = Counters {
        oom_kills: kv(section("/sys/fs/cgroup/memory.events"), "oom_kill")
            .or_else(|| kv(section("/sys/fs/cgroup/memory/memory.oom_control"), "oom_kill")),
        no_route_v6: kv(section("/proc/net/snmp6"), "Ip6OutNoRoutes").unwrap_or(0),
        ..Default::default()
    };
    // `Ip: Forwarding DefaultTTL ... OutNoRoutes ...` then `Ip: 1 64 ... 3 ...`.
    let ip: Vec<Vec<&str>> = section("/proc/net/snmp")
        .iter()
        .filter(|l| l.starts_with("Ip: "))
        .map(|l| l.split_whitespace().collect())
        .collect();
    if let [names, values, ..] = ip.as_slice() {
        if let Some(i) = names.iter().position(|n| *n == "OutNoRoutes") {
            c.no_route_v4 = values.get(i).and_then(|v| v.parse().ok()).unwrap_or(0);
        }
    }
    // `IP address  HW type  Flags  HW address  Mask  Device`; flags 0x0: incomplete or failed.
    for l in section("/proc/net/arp").iter().skip(1) {
        let f: Vec<&str> = l.split_whitespace().collect();
        if f.len() >= 3 && f[2] == "0x0" {
            c.arp_failed.insert(f[0].to_string());
        }
    }
    // `Iface Destination Gateway ...`, addresses as little-endian hex.
    c.gateway = section("/proc/net/route").iter().skip(1).find_map(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        (f.len() > 2 && f[1] == "00000000")
            .then(|| u32::from_str_radix(f[2], 16).ok())
            .flatten()
            .map(|g| std::net::Ipv4Addr::from(g.swap_bytes()).to_string())
    });
    for line in section(relay::EGRESS_LOG) {
        let f: Vec<&str> = line.split(' ').collect();
        let entry = match f.as_slice() {
            ["truncated"] => Egress::Truncated,
            ["dns", qtype, name] => Egress::Dns {
                qtype: qtype.to_string(),
                name: name.to_string(),
            },
            ["connect", addr, port, ..] => match port.parse() {
                Ok(port) => Egress::Connect {
                    addr: addr.to_string(),
                    port,
                },
                Err(_) => continue,
            },
            _ => continue,
        };
        c.egress.push(entry);
    }
    c
}

fn event(kind: &str, detail: String) -> AuditEvent {
    AuditEvent {
        kind: kind.into(),
        detail,
        generation: None,
    }
}

/// `items` grouped by key in first-seen order, with the set of their tags and a count.
fn group<'a>(items: impl Iterator<Item = (String, &'a str)>) -> Vec<(String, BTreeSet<&'a str>, usize)> {
    let mut out: Vec<(String, BTreeSet<&str>, usize)> = Vec::new();
    for (key, tag) in items {
        match out.iter_mut().find(|(k, _, _)| *k == key) {
            Some((_, tags, n)) => {
                tags.insert(tag);
                *n += 1;
            }
            None => out.push((key, BTreeSet::from([tag]), 1)),
        }
    }
    out
}

fn times(n: usize, one: &str, many: &str) -> String {
    format!("{n} {}", if n == 1 { one } else { many })
}

/// Audit events for what changed between `before` (after setup) and `after` (after the agent).
pub fn audit_events(before: &Counters, after: &Counters, memory_bytes: i64) -> Vec<AuditEvent> {
    let mut out = Vec::new();
    let ooms = after
        .oom_kills
        .unwrap_or(0)
        .saturating_sub(before.oom_kills.unwrap_or(0));
    if ooms > 0 {
        out.push(event(
            "oom_kill",
            format!(
                "the kernel's OOM killer killed {} in the agent stage at the trial's memory limit ({} MiB)",
                times(ooms as usize, "process", "processes"),
                memory_bytes >> 20
            ),
        ));
    }
    let new = &after.egress[before.egress.len().min(after.egress.len())..];
    let names = group(new.iter().filter_map(|e| match e {
        Egress::Dns { qtype, name } => Some((name.clone(), qtype.as_str())),
        _ => None,
    }));
    let connects = group(new.iter().filter_map(|e| match e {
        Egress::Connect { addr, port } => Some((format!("{addr} port {port}"), "tcp")),
        _ => None,
    }));
    for (name, types, n) in names.iter().take(MAX_EVENTS) {
        let types: Vec<&str> = types.iter().copied().collect();
        out.push(event(
            "blocked_egress",
            format!(
                "dns {name} ({}, {}; answered NXDOMAIN)",
                types.join("/"),
                times(*n, "query", "queries")
            ),
        ));
    }
    for (dest, _, n) in connects.iter().take(MAX_EVENTS) {
        out.push(event(
            "blocked_egress",
            format!(
                "tcp connect to {dest} ({}; no host answers on the trial network)",
                times(*n, "attempt", "attempts")
            ),
        ));
    }
    let hidden = names.len().saturating_sub(MAX_EVENTS) + connects.len().saturating_sub(MAX_EVENTS);
    let truncated = new.contains(&Egress::Truncated);
    if hidden > 0 || truncated {
        out.push(event(
            "blocked_egress",
            format!(
                "{hidden} more names or destinations not listed{}",
                if truncated {
                    " (the relay stopped logging after 10000 lines)"
                } else {
                    ""
                }
            ),
        ));
    }
    for ip in after.arp_failed.difference(&before.arp_failed) {
        let detail = if after.gateway.as_deref() == Some(ip.as_str()) {
            format!(
                "packets to outside addresses went to the trial network's gateway address {ip}, where no host \
                 answers (ARP unanswered)"
            )
        } else {
            format!("{ip} on the trial network: no such host (ARP unanswered)")
        };
        out.push(event("blocked_egress", detail));
    }
    let v4 = after.no_route_v4.saturating_sub(before.no_route_v4);
    let v6 = after.no_route_v6.saturating_sub(before.no_route_v6);
    if v4 + v6 > 0 {
        out.push(event(
            "blocked_egress",
            format!(
                "{} to addresses outside the trial network had no route (IPv4 {v4}, IPv6 {v6})",
                times((v4 + v6) as usize, "packet", "packets")
            ),
        ));
    }
    out
}

/// How the trial container came out of the agent stage.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum Aftermath {
    Alive,
    /// Stopped or gone; `oom`: the engine says the OOM killer acted in it.
    Dead {
        oom: bool,
        detail: String,
    },
}

impl Trial {
    /// Reads the counters as root (outside the agent's reach); a short, fixed time limit.
    pub(super) async fn probe(&self) -> Option<Counters> {
        let id = self.container.as_deref()?;
        match self
            .engine
            .exec(id, "root", "/", &[], &probe_script(), Duration::from_secs(10))
            .await
        {
            Ok(out) if out.ok() => Some(parse_probe(&out.stdout)),
            Ok(out) => {
                tracing::warn!(
                    "trial {}: probe exited {:?}: {}",
                    self.trial_id,
                    out.exit_code,
                    out.stderr
                );
                None
            }
            Err(e) => {
                tracing::warn!("trial {}: probe: {e}", self.trial_id);
                None
            }
        }
    }

    /// After the agent stage: records `oom_kill`/`blocked_egress` audit events and says whether the
    /// container survived (an engine that cannot tell counts as not surviving).
    pub(super) async fn observe_agent(&mut self) -> Aftermath {
        let Some(id) = self.container.clone() else {
            return Aftermath::Dead {
                oom: false,
                detail: "no container".into(),
            };
        };
        let mut after = None;
        // A killed container can still read as running for a moment: probe, and if the probe
        // fails, ask the engine again.
        for attempt in 0..2 {
            let state = match self.engine.container_state(&id).await {
                Ok(Some(s)) => s,
                Ok(None) => {
                    return Aftermath::Dead {
                        oom: false,
                        detail: "the container was removed during the agent stage".into(),
                    }
                }
                Err(e) => {
                    return Aftermath::Dead {
                        oom: false,
                        detail: e.to_string(),
                    }
                }
            };
            if !state.running {
                let detail = format!(
                    "the container stopped during the agent stage (exit {:?}{})",
                    state.exit_code,
                    if state.oom_killed { ", OOM-killed" } else { "" }
                );
                if state.oom_killed {
                    self.audit.push(event(
                        "oom_kill",
                        format!(
                            "{detail}: the agent's memory use at the trial's limit ({} MiB) took the sandbox down",
                            self.limits.memory_bytes >> 20
                        ),
                    ));
                }
                return Aftermath::Dead {
                    oom: state.oom_killed,
                    detail,
                };
            }
            after = self.probe().await;
            if after.is_some() || attempt == 1 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        if let Some(after) = after {
            let before = self.baseline.clone().unwrap_or_default();
            let events = audit_events(&before, &after, self.limits.memory_bytes);
            self.audit.extend(events);
        }
        Aftermath::Alive
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const V1: &str = "==> /sys/fs/cgroup/memory/memory.oom_control
oom_kill_disable 0
under_oom 0
oom_kill 2
==> /proc/net/snmp
Ip: Forwarding DefaultTTL InReceives InHdrErrors InAddrErrors ForwDatagrams InUnknownProtos InDiscards InDelivers OutRequests OutDiscards OutNoRoutes ReasmTimeout
Ip: 1 64 10 0 0 0 0 0 10 12 0 3 0
Icmp: InMsgs InErrors
Icmp: 0 0
==> /proc/net/snmp6
Ip6InReceives                   \t0
Ip6OutNoRoutes                  \t1
==> /proc/net/arp
IP address       HW type     Flags       HW address            Mask     Device
172.18.0.1       0x1         0x0         00:00:00:00:00:00     *        eth0
172.18.0.250     0x1         0x0         00:00:00:00:00:00     *        eth0
172.18.0.3       0x1         0x2         02:42:ac:12:00:03     *        eth0
==> /proc/net/route
Iface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask\t\tMTU\tWindow\tIRTT
eth0\t00000000\t010012AC\t0003\t0\t0\t0\t00000000\t0\t0\t0
eth0\t000012AC\t00000000\t0001\t0\t0\t0\t0000FFFF\t0\t0\t0
==> /run/lego-rl/egress.log
dns A example.com
dns AAAA example.com
connect 203.0.113.1 80 1000
dns A pypi.org
connect 203.0.113.1 80 1000
bogus line
truncated
";

    #[test]
    fn parses_cgroup_v1_snmp_arp_route_and_the_relay_log() {
        let c = parse_probe(V1);
        assert_eq!(c.oom_kills, Some(2));
        assert_eq!((c.no_route_v4, c.no_route_v6), (3, 1));
        assert_eq!(
            c.arp_failed.iter().map(String::as_str).collect::<Vec<_>>(),
            ["172.18.0.1", "172.18.0.250"]
        );
        assert_eq!(c.gateway.as_deref(), Some("172.18.0.1"));
        assert_eq!(c.egress.len(), 6);
        assert_eq!(
            c.egress[2],
            Egress::Connect {
                addr: "203.0.113.1".into(),
                port: 80
            }
        );
        assert_eq!(c.egress[5], Egress::Truncated);
        let v2 = parse_probe("==> /sys/fs/cgroup/memory.events\nlow 0\nhigh 0\nmax 5\noom 1\noom_kill 1\n");
        assert_eq!(v2.oom_kills, Some(1));
        assert_eq!(parse_probe("").oom_kills, None);
    }

    #[test]
    fn events_count_only_what_the_agent_stage_added() {
        let after = parse_probe(V1);
        let before = Counters {
            oom_kills: Some(0),
            no_route_v4: 1,
            // The baseline saw the first log line already.
            egress: after.egress[..1].to_vec(),
            ..Default::default()
        };
        let ev = audit_events(&before, &after, 256 << 20);
        let details: Vec<(&str, &str)> = ev.iter().map(|e| (e.kind.as_str(), e.detail.as_str())).collect();
        assert_eq!(
            details,
            [
                (
                    "oom_kill",
                    "the kernel's OOM killer killed 2 processes in the agent stage at the trial's memory limit (256 MiB)"
                ),
                ("blocked_egress", "dns example.com (AAAA, 1 query; answered NXDOMAIN)"),
                ("blocked_egress", "dns pypi.org (A, 1 query; answered NXDOMAIN)"),
                (
                    "blocked_egress",
                    "tcp connect to 203.0.113.1 port 80 (2 attempts; no host answers on the trial network)"
                ),
                (
                    "blocked_egress",
                    "0 more names or destinations not listed (the relay stopped logging after 10000 lines)"
                ),
                (
                    "blocked_egress",
                    "packets to outside addresses went to the trial network's gateway address 172.18.0.1, where no \
                     host answers (ARP unanswered)"
                ),
                ("blocked_egress", "172.18.0.250 on the trial network: no such host (ARP unanswered)"),
                (
                    "blocked_egress",
                    "3 packets to addresses outside the trial network had no route (IPv4 2, IPv6 1)"
                ),
            ]
        );
        assert!(audit_events(&after, &after, 1 << 30).is_empty());
    }
}
