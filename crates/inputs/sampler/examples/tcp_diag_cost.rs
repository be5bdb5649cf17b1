//! CPU cost of the per-connection TCP evidence (issue 29): one dump of the
//! namespace's established TCP sockets through sock_diag plus the watched
//! process's socket inodes from /proc/PID/fd, as the node agent does once
//! per rank per period.
//!
//!     cargo run --release -p whyslow-sampler --example tcp_diag_cost [CONNECTIONS] [ITERATIONS]
//!
//! Opens CONNECTIONS loopback connections (both ends in this process: 2×
//! sockets) and times ITERATIONS reads, in CPU time (getrusage).

use std::net::{TcpListener, TcpStream};
use std::path::Path;

use whyslow_sampler::tcp_diag::{socket_inodes, DiagSocket};

fn cpu_s() -> f64 {
    let mut u: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: getrusage fills the struct passed.
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut u) };
    let t = |v: libc::timeval| v.tv_sec as f64 + v.tv_usec as f64 / 1e6;
    t(u.ru_utime) + t(u.ru_stime)
}

fn main() {
    let mut args = std::env::args().skip(1);
    let n: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(32);
    let iters: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(2000);
    let server = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = server.local_addr().unwrap();
    let mut keep = Vec::new();
    for _ in 0..n {
        keep.push(TcpStream::connect(addr).unwrap());
        keep.push(server.accept().unwrap().0);
    }
    let pid = std::process::id() as i32;
    let mut diag = DiagSocket::of_process(Path::new("/proc"), pid).unwrap();
    let mine = socket_inodes(Path::new("/proc"), pid);
    let found = diag
        .established()
        .unwrap()
        .iter()
        .filter(|s| mine.contains(&s.inode))
        .count();
    let c0 = cpu_s();
    for _ in 0..iters {
        std::hint::black_box(diag.established().unwrap());
    }
    let dump = (cpu_s() - c0) / iters as f64;
    let c1 = cpu_s();
    for _ in 0..iters {
        std::hint::black_box(socket_inodes(Path::new("/proc"), pid));
    }
    let inodes = (cpu_s() - c1) / iters as f64;
    let period_s = 2.0;
    println!(
        "{n} connections ({found} sockets of this process found): dump {:.0} µs CPU, own sockets \
         {:.0} µs CPU; per {period_s} s period, 4 ranks in one namespace (one shared dump): \
         {:.3} % of a core; 4 ranks in 4 namespaces: {:.3} %",
        1e6 * dump,
        1e6 * inodes,
        100.0 * (dump + 4.0 * inodes) / period_s,
        100.0 * 4.0 * (dump + inodes) / period_s
    );
    drop(keep);
}
