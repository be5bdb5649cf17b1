//! The NCCL fallback tracer on a real libnccl (PyPI's nvidia-nccl-cu12; no
//! GPU needed): a process loads the library and calls ncclAllReduce,
//! ncclReduce, ncclSend and ncclAllGather with no communicator. NCCL refuses
//! each call (ncclInvalidArgument), but the calls were made: the probes see
//! each one's arguments (count, datatype, peer; ncclReduce's communicator
//! read from the stack) and its result.
//!
//! The library: `WHYSLOW_NCCL_LIB` (`.ci/run` fetches it into
//! `target/nccl/`), else `target/nccl/libnccl.so.2`. Without it, or without
//! BPF, the test says why and returns, unless `WHYSLOW_REQUIRE_NCCL=1` /
//! `WHYSLOW_REQUIRE_BPF=1` (CI) make that a failure.

use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use whyslow_collectives::nccl::{nccl_library, NcclTracer, NCCL_OPS};

const CALLS: &str = r#"
import ctypes, sys
lib = ctypes.CDLL(sys.argv[1])
print("ready", flush=True)
sys.stdin.readline()
N = None
r = [lib.ncclAllReduce(N, N, ctypes.c_size_t(1000), 7, 0, N, N),
     lib.ncclReduce(N, N, ctypes.c_size_t(1000), 7, 0, 0, N, N),
     lib.ncclSend(N, ctypes.c_size_t(500), 9, 3, N, N),
     lib.ncclAllGather(N, N, ctypes.c_size_t(250), 6, N, N)]
print(" ".join(map(str, r)), flush=True)
sys.stdin.readline()
"#;

fn library() -> Option<PathBuf> {
    let lib = std::env::var_os("WHYSLOW_NCCL_LIB")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/../../../target/nccl/libnccl.so.2"
            ))
        });
    if lib.exists() {
        return Some(lib);
    }
    if std::env::var("WHYSLOW_REQUIRE_NCCL").as_deref() == Ok("1") {
        panic!(
            "WHYSLOW_REQUIRE_NCCL=1 but {} does not exist",
            lib.display()
        );
    }
    eprintln!(
        "skipped: no libnccl at {} (set WHYSLOW_NCCL_LIB, or let .ci/run fetch it)",
        lib.display()
    );
    None
}

#[test]
#[ignore = "system test (./scripts/test --all): uprobes on a real libnccl (root, BPF)"]
fn the_probes_see_each_nccl_call_and_its_arguments() {
    let Some(lib) = library() else { return };
    let mut tracer = match NcclTracer::open() {
        Ok(t) => t,
        Err(e) if std::env::var("WHYSLOW_REQUIRE_BPF").as_deref() != Ok("1") => {
            whyslow_testkit::skip(&format!("BPF is not available here: {e}"));
            return;
        }
        Err(e) => panic!("WHYSLOW_REQUIRE_BPF=1 but the tracer cannot load: {e}"),
    };
    let python = std::env::var("PYTHON").unwrap_or_else(|_| "python3".into());
    let mut child = Command::new(python)
        .arg("-c")
        .arg(CALLS)
        .arg(&lib)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("python3 runs");
    let mut out = BufReader::new(child.stdout.take().expect("stdout"));
    let mut stdin = child.stdin.take().expect("stdin");
    let mut line = String::new();
    out.read_line(&mut line).expect("ready line");
    assert_eq!(line.trim(), "ready");
    let pid = child.id();
    let mapped = nccl_library(pid).expect("the process mapped libnccl");
    let n = tracer.attach(pid, &mapped).expect("attach");
    assert_eq!(n, NCCL_OPS.len(), "every traced entry point is exported");
    writeln!(stdin).expect("go");
    line.clear();
    out.read_line(&mut line).expect("results");
    let results: Vec<i32> = line
        .split_whitespace()
        .map(|x| x.parse().expect("a result"))
        .collect();
    assert_eq!(results.len(), 4);
    assert!(results.iter().all(|&r| r != 0), "NCCL refused: {results:?}");
    let mut events = Vec::new();
    let until = Instant::now() + Duration::from_secs(5);
    while events.len() < 4 && Instant::now() < until {
        events.extend(tracer.poll(Duration::from_millis(200)));
    }
    let _ = writeln!(stdin);
    let _ = child.wait();
    let seen: Vec<(&str, u64, i32, i32, u64, i32)> = events
        .iter()
        .map(|e| {
            (
                NCCL_OPS[e.op].1,
                e.count,
                e.datatype,
                e.peer,
                e.comm,
                e.result,
            )
        })
        .collect();
    assert_eq!(
        seen,
        vec![
            ("allreduce", 1000, 7, -1, 0, results[0]),
            ("reduce", 1000, 7, -1, 0, results[1]),
            ("send", 500, 9, 3, 0, results[2]),
            ("allgather", 250, 6, -1, 0, results[3]),
        ],
        "{events:#?}"
    );
    assert!(events
        .iter()
        .all(|e| e.pid == pid && e.exit_ns >= e.entry_ns));
    let st = tracer.stats().expect("stats");
    assert_eq!((st.events, st.read_errors), (4, 0), "{st:?}");
    tracer.detach(pid);
}
