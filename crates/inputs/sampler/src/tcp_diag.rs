//! Per-connection TCP state through the kernel's socket diagnostics
//! (`NETLINK_SOCK_DIAG`, `inet_diag` with `INET_DIAG_INFO`: the `tcp_info`
//! that `ss -ti` prints). Loss shows in a host's counters
//! (`/proc/PID/net/snmp`); a link that is slow without losing anything —
//! a shaper, a congested or mis-negotiated port — shows only here: low
//! delivery rate while data is in flight, and a smoothed RTT far above the
//! connection's minimum as the queue in front of the slow link grows
//! (SysOM-AI §7 leaves such network causes unexplained; issue 29).
//!
//! One dump of the namespace's established TCP sockets costs one netlink
//! round trip; the caller keeps the sockets of the process it watches (by
//! inode, from `/proc/PID/fd`). No privilege is needed to read one's own
//! namespace; another's needs `setns` (CAP_SYS_ADMIN), done once per
//! watched process on a short-lived thread so the caller's namespace never
//! changes.

use std::collections::HashSet;
use std::fs;
use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::Path;

/// The counters of one connection's `tcp_info` that whyslow reads (fields
/// the running kernel does not have are `None`).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct TcpInfo {
    /// Smoothed RTT, µs.
    pub rtt_us: u32,
    /// Lowest RTT seen, µs (Linux 4.6+).
    pub min_rtt_us: Option<u32>,
    /// Segments retransmitted over the connection's life.
    pub total_retrans: u32,
    /// Bytes the peer acknowledged (this end sent and they arrived).
    pub bytes_acked: Option<u64>,
    /// Bytes received.
    pub bytes_received: Option<u64>,
    /// The latest delivery-rate sample, bytes per second (4.9+).
    pub delivery_rate: Option<u64>,
    /// Time with data in flight, µs (4.10+).
    pub busy_time_us: Option<u64>,
    /// Of it, time limited by the receiver's window, µs.
    pub rwnd_limited_us: Option<u64>,
    /// Of it, time limited by the send buffer, µs.
    pub sndbuf_limited_us: Option<u64>,
}

/// One established TCP connection of the namespace.
#[derive(Debug, Clone, PartialEq)]
pub struct TcpSocket {
    /// The socket's inode (matches `socket:[N]` in `/proc/PID/fd`).
    pub inode: u32,
    /// This end.
    pub local: SocketAddr,
    /// The other end.
    pub remote: SocketAddr,
    /// Its counters.
    pub info: TcpInfo,
}

const SOCK_DIAG_BY_FAMILY: u16 = 20;
const NLMSG_ERROR: u16 = 2;
const NLMSG_DONE: u16 = 3;
const NLM_F_REQUEST: u16 = 0x1;
const NLM_F_DUMP: u16 = 0x300;
const INET_DIAG_INFO: u16 = 2;
const TCP_ESTABLISHED: u32 = 1;
/// `struct inet_diag_msg`: family, state, timer, retrans, the socket id
/// (48 bytes), expires, rqueue, wqueue, uid, inode.
const DIAG_MSG_LEN: usize = 72;

/// A netlink socket for the socket diagnostics of one network namespace.
#[derive(Debug)]
pub struct DiagSocket {
    fd: OwnedFd,
    seq: u32,
}

impl DiagSocket {
    /// A diagnostics socket in the caller's own namespace.
    pub fn own() -> io::Result<DiagSocket> {
        // SAFETY: plain socket(2); the result is checked before use.
        let fd = unsafe {
            libc::socket(
                libc::AF_NETLINK,
                libc::SOCK_DGRAM | libc::SOCK_CLOEXEC,
                libc::NETLINK_SOCK_DIAG,
            )
        };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: fd is a fresh descriptor we own.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        let tv = libc::timeval {
            tv_sec: 1,
            tv_usec: 0,
        };
        // SAFETY: a valid timeval of the right size; failure only leaves
        // the socket blocking without a timeout.
        unsafe {
            libc::setsockopt(
                fd.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_RCVTIMEO,
                &tv as *const _ as *const libc::c_void,
                std::mem::size_of::<libc::timeval>() as libc::socklen_t,
            );
        }
        Ok(DiagSocket { fd, seq: 1 })
    }

    /// A diagnostics socket in the network namespace of `pid` (the
    /// caller's own when it is the same one). A socket stays in the
    /// namespace it was made in, so it is made on a thread that enters the
    /// namespace and ends; the caller's namespace never changes.
    pub fn of_process(proc_root: &Path, pid: i32) -> io::Result<DiagSocket> {
        let theirs = proc_root.join(pid.to_string()).join("ns/net");
        let same = match (fs::metadata(&theirs), fs::metadata("/proc/self/ns/net")) {
            (Ok(a), Ok(b)) => {
                use std::os::unix::fs::MetadataExt;
                a.ino() == b.ino() && a.dev() == b.dev()
            }
            (Err(e), _) => return Err(e),
            _ => false,
        };
        if same {
            return Self::own();
        }
        let ns = fs::File::open(&theirs)?;
        std::thread::spawn(move || {
            // SAFETY: setns on this thread only, with a namespace file we
            // hold open; the thread ends right after making the socket.
            if unsafe { libc::setns(ns.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
                return Err(io::Error::last_os_error());
            }
            Self::own()
        })
        .join()
        .map_err(|_| io::Error::other("the setns thread panicked"))?
    }

    /// The namespace's established TCP connections (IPv4 and IPv6) with
    /// their `tcp_info`.
    pub fn established(&mut self) -> io::Result<Vec<TcpSocket>> {
        let mut out = Vec::new();
        for family in [libc::AF_INET as u8, libc::AF_INET6 as u8] {
            self.dump(family, &mut out)?;
        }
        Ok(out)
    }

    fn dump(&mut self, family: u8, out: &mut Vec<TcpSocket>) -> io::Result<()> {
        self.seq = self.seq.wrapping_add(1);
        let req = request(family, self.seq);
        let mut addr: libc::sockaddr_nl = unsafe { std::mem::zeroed() };
        addr.nl_family = libc::AF_NETLINK as u16;
        // SAFETY: a buffer and a sockaddr_nl of the sizes passed.
        let sent = unsafe {
            libc::sendto(
                self.fd.as_raw_fd(),
                req.as_ptr() as *const libc::c_void,
                req.len(),
                0,
                &addr as *const _ as *const libc::sockaddr,
                std::mem::size_of::<libc::sockaddr_nl>() as libc::socklen_t,
            )
        };
        if sent < 0 {
            return Err(io::Error::last_os_error());
        }
        let mut buf = vec![0u8; 64 << 10];
        loop {
            // SAFETY: recv into a buffer of the length passed.
            let n = unsafe {
                libc::recv(
                    self.fd.as_raw_fd(),
                    buf.as_mut_ptr() as *mut libc::c_void,
                    buf.len(),
                    0,
                )
            };
            if n < 0 {
                return Err(io::Error::last_os_error());
            }
            match parse_messages(&buf[..n as usize], self.seq, out) {
                Parsed::More => continue,
                Parsed::Done => return Ok(()),
                Parsed::Error(e) => return Err(e),
            }
        }
    }
}

/// `nlmsghdr` + `inet_diag_req_v2` asking for every established TCP socket
/// of `family` with its `tcp_info`.
fn request(family: u8, seq: u32) -> Vec<u8> {
    let mut b = Vec::with_capacity(72);
    let len: u32 = 16 + 56;
    b.extend_from_slice(&len.to_ne_bytes());
    b.extend_from_slice(&SOCK_DIAG_BY_FAMILY.to_ne_bytes());
    b.extend_from_slice(&(NLM_F_REQUEST | NLM_F_DUMP).to_ne_bytes());
    b.extend_from_slice(&seq.to_ne_bytes());
    b.extend_from_slice(&0u32.to_ne_bytes());
    b.push(family);
    b.push(libc::IPPROTO_TCP as u8);
    b.push(1 << (INET_DIAG_INFO - 1)); // idiag_ext
    b.push(0);
    b.extend_from_slice(&(1u32 << TCP_ESTABLISHED).to_ne_bytes());
    b.extend_from_slice(&[0u8; 48]); // the socket id: any
    b
}

enum Parsed {
    More,
    Done,
    Error(io::Error),
}

fn u16_at(b: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_ne_bytes(b.get(at..at + 2)?.try_into().ok()?))
}

fn u32_at(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_ne_bytes(b.get(at..at + 4)?.try_into().ok()?))
}

fn u64_at(b: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_ne_bytes(b.get(at..at + 8)?.try_into().ok()?))
}

/// Reads one datagram of netlink messages into `out`. Anything malformed
/// ends the dump as an error rather than a guess.
fn parse_messages(mut b: &[u8], seq: u32, out: &mut Vec<TcpSocket>) -> Parsed {
    let bad =
        |what: &str| Parsed::Error(io::Error::new(io::ErrorKind::InvalidData, what.to_string()));
    while b.len() >= 16 {
        let (Some(len), Some(kind), Some(got_seq)) = (u32_at(b, 0), u16_at(b, 4), u32_at(b, 8))
        else {
            return bad("short netlink header");
        };
        let len = len as usize;
        if len < 16 || len > b.len() {
            return bad("netlink message length out of range");
        }
        let body = &b[16..len];
        if got_seq == seq {
            match kind {
                NLMSG_DONE => return Parsed::Done,
                NLMSG_ERROR => {
                    let errno = u32_at(body, 0).map_or(0, |e| e as i32);
                    return if errno == 0 {
                        Parsed::Done
                    } else {
                        Parsed::Error(io::Error::from_raw_os_error(-errno))
                    };
                }
                SOCK_DIAG_BY_FAMILY => {
                    if let Some(s) = parse_diag_msg(body) {
                        out.push(s);
                    }
                }
                _ => {}
            }
        }
        b = &b[len.next_multiple_of(4).min(b.len())..];
    }
    Parsed::More
}

/// One `inet_diag_msg` and its attributes; `None` without `tcp_info`.
fn parse_diag_msg(body: &[u8]) -> Option<TcpSocket> {
    if body.len() < DIAG_MSG_LEN {
        return None;
    }
    let family = body[0];
    let sport = u16::from_be_bytes([body[4], body[5]]);
    let dport = u16::from_be_bytes([body[6], body[7]]);
    let addr = |at: usize| -> Option<IpAddr> {
        let raw: [u8; 16] = body.get(at..at + 16)?.try_into().ok()?;
        Some(if family == libc::AF_INET as u8 {
            IpAddr::V4(Ipv4Addr::new(raw[0], raw[1], raw[2], raw[3]))
        } else {
            let v6 = Ipv6Addr::from(raw);
            v6.to_ipv4_mapped().map_or(IpAddr::V6(v6), IpAddr::V4)
        })
    };
    let local = SocketAddr::new(addr(8)?, sport);
    let remote = SocketAddr::new(addr(24)?, dport);
    let inode = u32_at(body, 68)?;
    let mut attrs = &body[DIAG_MSG_LEN..];
    while attrs.len() >= 4 {
        let len = u16_at(attrs, 0)? as usize;
        let kind = u16_at(attrs, 2)?;
        if len < 4 || len > attrs.len() {
            return None;
        }
        if kind == INET_DIAG_INFO {
            return Some(TcpSocket {
                inode,
                local,
                remote,
                info: parse_tcp_info(&attrs[4..len])?,
            });
        }
        attrs = &attrs[len.next_multiple_of(4).min(attrs.len())..];
    }
    None
}

/// `struct tcp_info` (linux/tcp.h): fields only ever appended, so a field
/// beyond the kernel's length is absent rather than misread.
pub fn parse_tcp_info(b: &[u8]) -> Option<TcpInfo> {
    Some(TcpInfo {
        rtt_us: u32_at(b, 68)?,
        total_retrans: u32_at(b, 100)?,
        bytes_acked: u64_at(b, 120),
        bytes_received: u64_at(b, 128),
        min_rtt_us: u32_at(b, 148),
        delivery_rate: u64_at(b, 160),
        busy_time_us: u64_at(b, 168),
        rwnd_limited_us: u64_at(b, 176),
        sndbuf_limited_us: u64_at(b, 184),
    })
}

/// Dumps younger than this are shared by the processes of one namespace.
const SHARE_FOR: std::time::Duration = std::time::Duration::from_millis(500);

type Dumps = std::collections::HashMap<u64, (std::time::Instant, std::sync::Arc<Vec<TcpSocket>>)>;

static DUMPS: std::sync::Mutex<Option<Dumps>> = std::sync::Mutex::new(None);

/// [`DiagSocket::established`], shared by the processes of the network
/// namespace `netns` read within half a second of each other: the kernel
/// walks its whole established-socket hash table per dump (about 1 ms per
/// address family here, whatever the number of sockets), and the ranks of
/// one node usually share a namespace. Without a namespace inode, a dump
/// of its own.
pub fn established_shared(
    diag: &mut DiagSocket,
    netns: Option<u64>,
) -> io::Result<std::sync::Arc<Vec<TcpSocket>>> {
    let Some(ns) = netns else {
        return diag.established().map(std::sync::Arc::new);
    };
    let now = std::time::Instant::now();
    if let Ok(guard) = DUMPS.lock() {
        if let Some((at, dump)) = guard.as_ref().and_then(|m| m.get(&ns)) {
            if now.duration_since(*at) < SHARE_FOR {
                return Ok(dump.clone());
            }
        }
    }
    let dump = std::sync::Arc::new(diag.established()?);
    if let Ok(mut guard) = DUMPS.lock() {
        let m = guard.get_or_insert_with(Default::default);
        m.retain(|_, (at, _)| now.duration_since(*at) < SHARE_FOR);
        m.insert(ns, (now, dump.clone()));
    }
    Ok(dump)
}

/// The inodes of the sockets `pid` holds (`socket:[N]` links in
/// `/proc/PID/fd`).
pub fn socket_inodes(proc_root: &Path, pid: i32) -> HashSet<u32> {
    let dir = proc_root.join(pid.to_string()).join("fd");
    let Ok(entries) = fs::read_dir(dir) else {
        return HashSet::new();
    };
    entries
        .flatten()
        .filter_map(|e| {
            let target = fs::read_link(e.path()).ok()?;
            let t = target.to_str()?;
            t.strip_prefix("socket:[")?.strip_suffix(']')?.parse().ok()
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use std::net::{TcpListener, TcpStream};

    #[test]
    fn a_loopback_connection_is_found_with_its_counters() {
        let server = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = server.local_addr().unwrap();
        let mut client = TcpStream::connect(addr).unwrap();
        let (mut conn, _) = server.accept().unwrap();
        let data = vec![7u8; 1 << 20];
        let reader = std::thread::spawn(move || {
            let mut got = vec![0u8; 1 << 20];
            conn.read_exact(&mut got).unwrap();
            conn
        });
        client.write_all(&data).unwrap();
        let _conn = reader.join().unwrap();

        let mine = socket_inodes(Path::new("/proc"), std::process::id() as i32);
        let mut diag = DiagSocket::of_process(Path::new("/proc"), std::process::id() as i32)
            .expect("sock_diag in one's own namespace needs no privilege");
        let all = diag.established().unwrap();
        let sender = all
            .iter()
            .find(|s| s.remote == addr && mine.contains(&s.inode))
            .unwrap_or_else(|| panic!("the client's socket among {all:?}"));
        assert_eq!(sender.local, client.local_addr().unwrap());
        let info = sender.info;
        assert!(info.bytes_acked.unwrap() >= 1 << 20, "{info:?}");
        assert!(info.rtt_us > 0 && info.min_rtt_us.unwrap() > 0, "{info:?}");
        let receiver = all
            .iter()
            .find(|s| s.local == addr && s.remote == sender.local)
            .expect("the server's end");
        assert!(receiver.info.bytes_received.unwrap() >= 1 << 20);
    }

    #[test]
    fn damaged_replies_are_errors_or_nothing_never_panics() {
        let mut out = Vec::new();
        let mut seed = 3u64;
        for len in [0usize, 3, 16, 17, 40, 88, 200, 4096] {
            for _ in 0..50 {
                let mut b: Vec<u8> = (0..len)
                    .map(|_| {
                        seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1);
                        (seed >> 56) as u8
                    })
                    .collect();
                if len >= 16 {
                    b[0..4].copy_from_slice(&(len as u32).to_ne_bytes());
                    b[4..6].copy_from_slice(&SOCK_DIAG_BY_FAMILY.to_ne_bytes());
                    b[8..12].copy_from_slice(&9u32.to_ne_bytes());
                }
                let _ = parse_messages(&b, 9, &mut out);
                let _ = parse_tcp_info(&b);
            }
        }
        assert!(parse_tcp_info(&[0u8; 60]).is_none());
        let short = parse_tcp_info(&[0u8; 104]).unwrap();
        assert_eq!((short.bytes_acked, short.busy_time_us), (None, None));
    }
}
