//! Writing samples files.
//!
//! The samples file is the one `whyslow-ingest` reads
//! (`crates/inputs/ingest/src/samples.rs`): CSV with header `resource,ts_us,value`
//! and, when a worker is given, a fourth column `worker`. `ts_us` is written
//! with three decimals (ns digits); `value` is clamped to [0, 1] and NaN
//! values are skipped.
//!
//! The extra file (per-thread CPU and per-interface tx/rx, which the samples
//! file contract has no resource for) is named by [`extra_path_for`]:
//! `X.samples.csv` → `X.sampler-extra.csv` — deliberately *not* matching the
//! `*.samples.csv` pattern the `whyslow` CLI collects from a directory. Its
//! header is `kind,id,name,ts_us,value[,worker]` with `kind` one of
//! `thread_cpu` (id = tid, name = thread name, `training` marked by a `*`
//! prefix on the name), `nic_tx`, `nic_rx` (id = interface, name empty),
//! all fractions in [0, 1]; then the [`ExtraSeries`](crate::ExtraSeries)
//! kinds, name empty, values in their own unit (not clamped):
//!
//! | kind | id | value |
//! |---|---|---|
//! | `cpu_freq` | core the training thread ran on | current / max clock of that core (module [`cpufreq`](crate::cpufreq)) |
//! | `nvlink_tx`, `nvlink_rx` | NVML GPU index | NVLink data throughput / capacity, [0, 1] |
//! | `gpu_sm_clock` | NVML GPU index | SM clock / max SM clock |
//! | `gpu_power_w` | NVML GPU index | board power, W |
//! | `gpu_temp_c` | NVML GPU index | GPU temperature, °C |
//! | `gpu_throttle` | NVML GPU index | NVML clock throttle reasons bitmask (integer; [`throttle_reason_names`](crate::gpu::throttle_reason_names)) |

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use whyslow_model::{Resource, SampleSeries};

use crate::{SamplerError, Samples};

fn io_err(path: &Path) -> impl Fn(std::io::Error) -> SamplerError + '_ {
    move |source| SamplerError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// `ns` as µs with three decimals, exact.
fn fmt_us(ns: i64) -> String {
    let sign = if ns < 0 { "-" } else { "" };
    let a = ns.unsigned_abs();
    format!("{sign}{}.{:03}", a / 1000, a % 1000)
}

fn clean(v: f32) -> Option<f32> {
    (!v.is_nan()).then(|| v.clamp(0.0, 1.0))
}

/// Writes `series` as a whyslow samples file at `path` (with a `worker`
/// column when `worker` is given).
pub fn write_samples_csv(
    path: &Path,
    worker: Option<u32>,
    series: &BTreeMap<Resource, SampleSeries>,
) -> Result<(), SamplerError> {
    let e = io_err(path);
    let mut w = BufWriter::new(File::create(path).map_err(&e)?);
    let wcol = worker.map(|r| format!(",{r}")).unwrap_or_default();
    w.write_all(if worker.is_some() {
        b"resource,ts_us,value,worker\n"
    } else {
        b"resource,ts_us,value\n"
    })
    .map_err(&e)?;
    for (r, s) in series {
        for (&ts, &v) in s.ts_ns.iter().zip(&s.values) {
            if let Some(v) = clean(v) {
                writeln!(w, "{},{},{v}{wcol}", r.as_str(), fmt_us(ts)).map_err(&e)?;
            }
        }
    }
    w.flush().map_err(&e)
}

/// The extra file's path for a samples file path (see the module docs).
pub fn extra_path_for(samples_path: &Path) -> PathBuf {
    let name = samples_path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let stem = name
        .strip_suffix(".samples.csv")
        .or_else(|| name.strip_suffix(".csv"))
        .unwrap_or(&name);
    samples_path.with_file_name(format!("{stem}.sampler-extra.csv"))
}

/// Writes per-thread CPU, per-interface tx/rx and the other extra series
/// (CPU frequency, GPU clock/power/temperature/throttle, NVLink tx/rx) of
/// `samples` to `path` (the extra file; see the module docs).
pub fn write_extra_csv(
    path: &Path,
    worker: Option<u32>,
    samples: &Samples,
) -> Result<(), SamplerError> {
    let e = io_err(path);
    let mut w = BufWriter::new(File::create(path).map_err(&e)?);
    let wcol = worker.map(|r| format!(",{r}")).unwrap_or_default();
    w.write_all(if worker.is_some() {
        b"kind,id,name,ts_us,value,worker\n"
    } else {
        b"kind,id,name,ts_us,value\n"
    })
    .map_err(&e)?;
    let safe = |s: &str| s.replace([',', '"', '\n', '\r'], "_");
    for t in &samples.threads {
        let name = format!("{}{}", if t.training { "*" } else { "" }, safe(&t.name));
        for (&ts, &v) in t.series.ts_ns.iter().zip(&t.series.values) {
            if let Some(v) = clean(v) {
                writeln!(w, "thread_cpu,{},{name},{},{v}{wcol}", t.tid, fmt_us(ts)).map_err(&e)?;
            }
        }
    }
    for i in &samples.interfaces {
        let id = safe(&i.name);
        for (kind, s) in [("nic_tx", &i.tx), ("nic_rx", &i.rx)] {
            for (&ts, &v) in s.ts_ns.iter().zip(&s.values) {
                if let Some(v) = clean(v) {
                    writeln!(w, "{kind},{id},,{},{v}{wcol}", fmt_us(ts)).map_err(&e)?;
                }
            }
        }
    }
    for x in &samples.extra {
        let (kind, id) = (safe(&x.kind), safe(&x.id));
        for (&ts, &v) in x.series.ts_ns.iter().zip(&x.series.values) {
            if v.is_finite() {
                writeln!(w, "{kind},{id},,{},{v}{wcol}", fmt_us(ts)).map_err(&e)?;
            }
        }
    }
    w.flush().map_err(&e)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_us_exactly() {
        assert_eq!(fmt_us(1_700_000_000_123_456_789), "1700000000123456.789");
        assert_eq!(fmt_us(5), "0.005");
        assert_eq!(fmt_us(-1500), "-1.500");
    }

    #[test]
    fn extra_path_avoids_samples_pattern() {
        assert_eq!(
            extra_path_for(Path::new("d/rank-3.samples.csv")),
            Path::new("d/rank-3.sampler-extra.csv")
        );
        assert_eq!(
            extra_path_for(Path::new("x.csv")),
            Path::new("x.sampler-extra.csv")
        );
        assert_eq!(
            extra_path_for(Path::new("x")),
            Path::new("x.sampler-extra.csv")
        );
    }
}
