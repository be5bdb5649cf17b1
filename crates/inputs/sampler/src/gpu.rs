//! GPU utilization through NVML (PerfTracker §4.2: GPU kernels are governed
//! by SM activity, memory operations by PCIe, intra-host collectives by
//! NVLink), behind the cargo feature `nvml`. NVML (`libnvidia-ml.so`) is
//! loaded at run time by nvml-wrapper, so a build with the feature still runs
//! on hosts without a GPU or driver: sampling then reports
//! [`GpuStatus::NotAvailable`], and any counter a device does not support is
//! skipped with a note (never an error).
//!
//! **Untested on GPU hardware**: this module was written and is tested on a
//! host without a GPU; only the conversions below have unit tests.
//!
//! What NVML gives, and its limits at high rates — samples file (every tick):
//! - `sm`: `nvmlDeviceGetUtilizationRates().gpu`, the fraction of time over the
//!   driver's last sample period (1/6 s – 1 s depending on the product) in
//!   which *any* kernel ran. It is refreshed by the driver far slower than
//!   10 kHz and is "GPU busy", not per-SM activity (that needs DCGM profiling
//!   fields, not done here). Successive 10 kHz samples repeat the same value.
//! - `dram`: `utilization.memory`, the fraction of time device memory was
//!   read or written (same refresh limits) — a busy-time proxy, not bandwidth.
//! - `pcie`: `nvmlDeviceGetPcieThroughput` (TX and RX, KB/s over a 20 ms
//!   window) over the link's maximum per-direction bandwidth from its max
//!   generation and width ([`pcie_bytes_per_s`]); the series is max(tx, rx).
//!   Each call blocks ~20 ms in the driver (H100, driver 580: 20.6 ms per
//!   direction), so it runs on a thread of its own ([`PcieReader`]) and each
//!   tick takes its latest reading: read on the sampling thread it held a
//!   1 kHz sampler to 24 Hz. The reader keeps its own CPU under
//!   [`PCIE_MAX_CPU`] of a core ([`pcie_pause`]).
//! - `nvlink`: the cumulative NVLink data counters
//!   `NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_{TX,RX}` (KiB, summed over all links:
//!   field values with `scopeId = UINT_MAX`), differenced per interval
//!   ([`nvlink_utilization`]) over the capacity
//!   `NVML_FI_DEV_NVLINK_SPEED_MBPS_COMMON` × `NVML_FI_DEV_NVLINK_LINK_COUNT`
//!   ([`nvlink_bytes_per_s`], per direction); the series is max(tx, rx) and
//!   tx, rx go to the extra file (`nvlink_tx`, `nvlink_rx`). GPUs without
//!   NVLink (or drivers without these fields, before R450) get a note.
//!   The link count is that of the device's links, which may include inactive
//!   ones (utilization is then underestimated).
//!
//! Extra file (module `write`), at most [`GPU_SLOW_MAX_HZ`] readings a
//! second (the driver refreshes them slower than that), `id` = NVML index:
//! - `gpu_sm_clock`: SM clock / max SM clock ([`clock_fraction`]);
//! - `gpu_power_w`: board power in W (`nvmlDeviceGetPowerUsage`, mW);
//! - `gpu_temp_c`: GPU core temperature in °C;
//! - `gpu_throttle`: the clock event ("throttle") reasons bitmask of
//!   `nvmlDeviceGetCurrentClocksThrottleReasons` as an integer; the names of
//!   the reasons seen during the run are added to the notes
//!   ([`throttle_reason_names`]).
//!
//! DCGM profiling fields (true SM activity, tensor-core activity): not
//! sampled; they share hardware counters with the profiler (see
//! docs/agent.md on pausing other monitors).

use whyslow_model::Resource;

/// The most `gpu_sm_clock` / `gpu_power_w` / `gpu_temp_c` / `gpu_throttle`
/// readings per second.
pub const GPU_SLOW_MAX_HZ: f64 = 10.0;

/// The most CPU (fraction of one core) the PCIe reader may use: where the
/// driver spins through its 20 ms window instead of sleeping, the reader
/// pauses between readings.
pub const PCIE_MAX_CPU: f64 = 0.05;

/// How long the PCIe reader waits after a reading that took `wall_ns` and
/// `cpu_ns` of its thread's CPU, so that its CPU stays at most `max_cpu` of
/// a core: none when the driver slept through the reading.
pub fn pcie_pause(wall_ns: u64, cpu_ns: u64, max_cpu: f64) -> std::time::Duration {
    if max_cpu.partial_cmp(&0.0) != Some(std::cmp::Ordering::Greater) {
        return std::time::Duration::ZERO;
    }
    let budget_ns = cpu_ns as f64 / max_cpu;
    std::time::Duration::from_nanos((budget_ns - wall_ns as f64).clamp(0.0, 10e9) as u64)
}

/// Whether GPU sampling ran.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum GpuStatus {
    /// GPU sampling was not asked for.
    #[default]
    NotRequested,
    /// Not available, and why (built without `nvml`, no driver, no device).
    NotAvailable(String),
    /// Sampled the named device.
    Sampling {
        /// Device name from NVML.
        name: String,
        /// Limits of what was sampled (missing counters, …).
        notes: Vec<String>,
    },
}

/// One GPU reading: samples-file series and extra-file series.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct GpuReading {
    /// (resource, utilization in [0, 1]).
    pub resources: Vec<(Resource, f32)>,
    /// (extra kind, value in the kind's unit).
    pub extra: Vec<(&'static str, f32)>,
}

#[cfg(not(feature = "nvml"))]
pub(crate) struct GpuSampler(std::convert::Infallible);

#[cfg(not(feature = "nvml"))]
impl GpuSampler {
    pub fn open(_index: u32) -> Result<GpuSampler, String> {
        Err("built without the `nvml` feature".into())
    }
    pub fn name(&self) -> &str {
        match self.0 {}
    }
    pub fn notes(&self) -> &[String] {
        match self.0 {}
    }
    pub fn index(&self) -> u32 {
        match self.0 {}
    }
    pub fn sample(&mut self, _dt_ns: i64, _slow: bool) -> GpuReading {
        match self.0 {}
    }
    pub fn throttle_seen(&self) -> u64 {
        match self.0 {}
    }
    pub fn pcie_note(&self) -> Option<String> {
        match self.0 {}
    }
}

/// Per-direction PCIe bandwidth in bytes/s of a link of generation `gen`
/// (1–6) and `width` lanes: transfer rate × lanes × line-code efficiency / 8.
pub fn pcie_bytes_per_s(gen: u32, width: u32) -> Option<f64> {
    let (gt_per_s, efficiency) = match gen {
        1 => (2.5, 0.8),
        2 => (5.0, 0.8),
        3 => (8.0, 128.0 / 130.0),
        4 => (16.0, 128.0 / 130.0),
        5 => (32.0, 128.0 / 130.0),
        // Gen 6 uses PAM4 + FLIT mode; 242/256 FLIT efficiency.
        6 => (64.0, 242.0 / 256.0),
        _ => return None,
    };
    (width > 0).then(|| gt_per_s * 1e9 * width as f64 * efficiency / 8.0)
}

/// Per-direction NVLink capacity in bytes/s of `links` links at NVML's
/// common link speed `speed_mbps` (MB/s = 10^6 bytes/s per link and
/// direction: 25 781 on A100's NVLink 3); `None` without links or speed.
pub fn nvlink_bytes_per_s(speed_mbps: u64, links: u64) -> Option<f64> {
    (speed_mbps > 0 && links > 0).then_some(speed_mbps as f64 * 1e6 * links as f64)
}

/// Utilization over an interval of `dt_ns` from two readings of a
/// cumulative KiB counter, over `bytes_per_s`; clamped to [0, 1]. `None`
/// when the counter went backwards (reset or wrap), `dt_ns` ≤ 0 or the
/// capacity is not positive.
pub fn nvlink_utilization(
    prev_kib: u64,
    now_kib: u64,
    dt_ns: i64,
    bytes_per_s: f64,
) -> Option<f32> {
    if now_kib < prev_kib
        || dt_ns <= 0
        || bytes_per_s.partial_cmp(&0.0) != Some(std::cmp::Ordering::Greater)
    {
        return None;
    }
    let bytes = (now_kib - prev_kib) as f64 * 1024.0;
    Some((bytes / (bytes_per_s * dt_ns as f64 / 1e9)).clamp(0.0, 1.0) as f32)
}

/// `cur / max` of two clocks in MHz; `None` when `max` is 0.
pub fn clock_fraction(cur_mhz: u32, max_mhz: u32) -> Option<f32> {
    (max_mhz > 0).then(|| (cur_mhz as f64 / max_mhz as f64) as f32)
}

/// Milliwatts (NVML's power unit) to watts.
pub fn mw_to_w(mw: u32) -> f32 {
    (mw as f64 / 1000.0) as f32
}

/// NVML clock event ("throttle") reason bits (`nvmlClocksThrottleReason*`,
/// nvml.h) and their names, lowest bit first.
pub const THROTTLE_REASONS: [(u64, &str); 9] = [
    (0x1, "gpu_idle"),
    (0x2, "applications_clocks_setting"),
    (0x4, "sw_power_cap"),
    (0x8, "hw_slowdown"),
    (0x10, "sync_boost"),
    (0x20, "sw_thermal_slowdown"),
    (0x40, "hw_thermal_slowdown"),
    (0x80, "hw_power_brake_slowdown"),
    (0x100, "display_clock_setting"),
];

/// The names of the reasons set in an NVML throttle reasons bitmask
/// ([`THROTTLE_REASONS`]; unknown bits as `0x…`). Empty for 0 (none).
pub fn throttle_reason_names(bits: u64) -> Vec<String> {
    let mut out: Vec<String> = THROTTLE_REASONS
        .iter()
        .filter(|(b, _)| bits & b != 0)
        .map(|(_, n)| n.to_string())
        .collect();
    let known: u64 = THROTTLE_REASONS.iter().map(|(b, _)| b).sum();
    if bits & !known != 0 {
        out.push(format!("{:#x}", bits & !known));
    }
    out
}

/// The aggregate NVLink data counters, read through nvml-wrapper-sys because
/// nvml-wrapper's `field_values_for` cannot set `scopeId` (UINT_MAX = all
/// links).
#[cfg(feature = "nvml")]
struct NvLink {
    lib: nvml_wrapper_sys::bindings::NvmlLib,
    bytes_per_s: f64,
    last: Option<(u64, u64)>,
}

#[cfg(feature = "nvml")]
impl NvLink {
    fn open(dev: &nvml_wrapper::Device) -> Result<NvLink, String> {
        use nvml_wrapper::struct_wrappers::device::FieldValueSample;
        use nvml_wrapper::structs::device::FieldId;
        use nvml_wrapper_sys::bindings::field_id;
        let as_u64 = |v: &Result<FieldValueSample, nvml_wrapper::error::NvmlError>| -> Option<u64> {
            use nvml_wrapper::enums::device::SampleValue;
            match v.as_ref().ok()?.value.as_ref().ok()? {
                SampleValue::U32(x) => Some(*x as u64),
                SampleValue::U64(x) => Some(*x),
                SampleValue::I64(x) => u64::try_from(*x).ok(),
                SampleValue::F64(x) => (*x >= 0.0).then_some(*x as u64),
            }
        };
        let vals = dev
            .field_values_for(&[
                FieldId(field_id::NVML_FI_DEV_NVLINK_SPEED_MBPS_COMMON),
                FieldId(field_id::NVML_FI_DEV_NVLINK_LINK_COUNT),
            ])
            .map_err(|e| format!("nvlink: field values: {e}"))?;
        let speed = vals.first().and_then(as_u64).unwrap_or(0);
        let links = vals.get(1).and_then(as_u64).unwrap_or(0);
        let bytes_per_s = nvlink_bytes_per_s(speed, links)
            .ok_or_else(|| format!("nvlink: no links (speed {speed} MB/s, {links} links)"))?;
        // SAFETY: loads the same libnvidia-ml nvml-wrapper loaded (dlopen
        // returns the same handle); NVML is already initialized by `Nvml`.
        let lib = unsafe { nvml_wrapper_sys::bindings::NvmlLib::new("libnvidia-ml.so.1") }
            .or_else(|_| unsafe { nvml_wrapper_sys::bindings::NvmlLib::new("libnvidia-ml.so") })
            .map_err(|e| format!("nvlink: loading libnvidia-ml: {e}"))?;
        if lib.nvmlDeviceGetFieldValues.is_err() {
            return Err("nvlink: driver has no nvmlDeviceGetFieldValues".into());
        }
        let mut n = NvLink {
            lib,
            bytes_per_s,
            last: None,
        };
        n.last = Some(
            n.read(dev)
                .ok_or("nvlink: NVLINK_THROUGHPUT_DATA counters not supported")?,
        );
        Ok(n)
    }

    /// Cumulative (tx, rx) KiB over all links.
    fn read(&self, dev: &nvml_wrapper::Device) -> Option<(u64, u64)> {
        use nvml_wrapper_sys::bindings::{
            field_id, nvmlFieldValue_t, nvmlReturn_enum_NVML_SUCCESS,
            nvmlValueType_enum_NVML_VALUE_TYPE_UNSIGNED_INT,
            nvmlValueType_enum_NVML_VALUE_TYPE_UNSIGNED_LONG,
            nvmlValueType_enum_NVML_VALUE_TYPE_UNSIGNED_LONG_LONG,
        };
        // SAFETY: nvmlFieldValue_t is a plain C struct (zero is valid); the
        // array outlives the call and its length is passed; the device
        // handle is valid while `dev` (and so NVML) is alive.
        unsafe {
            let mut v: [nvmlFieldValue_t; 2] = std::mem::zeroed();
            v[0].fieldId = field_id::NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX;
            v[1].fieldId = field_id::NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX;
            v[0].scopeId = u32::MAX;
            v[1].scopeId = u32::MAX;
            if self
                .lib
                .nvmlDeviceGetFieldValues(dev.handle(), 2, v.as_mut_ptr())
                != nvmlReturn_enum_NVML_SUCCESS
            {
                return None;
            }
            let get = |f: &nvmlFieldValue_t| -> Option<u64> {
                if f.nvmlReturn != nvmlReturn_enum_NVML_SUCCESS {
                    return None;
                }
                #[allow(non_upper_case_globals)]
                match f.valueType {
                    nvmlValueType_enum_NVML_VALUE_TYPE_UNSIGNED_LONG_LONG => Some(f.value.ullVal),
                    // c_ulong is u32 on 32-bit targets.
                    #[allow(clippy::unnecessary_cast)]
                    nvmlValueType_enum_NVML_VALUE_TYPE_UNSIGNED_LONG => Some(f.value.ulVal as u64),
                    nvmlValueType_enum_NVML_VALUE_TYPE_UNSIGNED_INT => Some(f.value.uiVal as u64),
                    _ => None,
                }
            };
            Some((get(&v[0])?, get(&v[1])?))
        }
    }

    /// (tx, rx) utilization since the last call.
    fn sample(&mut self, dev: &nvml_wrapper::Device, dt_ns: i64) -> Option<(f32, f32)> {
        let now = self.read(dev)?;
        let prev = self.last.replace(now)?;
        Some((
            nvlink_utilization(prev.0, now.0, dt_ns, self.bytes_per_s)?,
            nvlink_utilization(prev.1, now.1, dt_ns, self.bytes_per_s)?,
        ))
    }
}

/// PCIe throughput read on a thread of its own: NVML's
/// `nvmlDeviceGetPcieThroughput` blocks ~20 ms per direction. The thread has
/// its own NVML handle (NVML counts its initializations) and ends at its
/// next reading after the reader is dropped; nobody waits for it.
#[cfg(feature = "nvml")]
pub(crate) struct PcieReader {
    shared: std::sync::Arc<PcieShared>,
    started: std::time::Instant,
}

#[cfg(feature = "nvml")]
#[derive(Default)]
struct PcieShared {
    stop: std::sync::atomic::AtomicBool,
    /// The latest utilization as f32 bits; `u32::MAX` before the first.
    latest: std::sync::atomic::AtomicU32,
    readings: std::sync::atomic::AtomicU64,
    cpu_ns: std::sync::atomic::AtomicU64,
}

#[cfg(feature = "nvml")]
fn thread_cpu_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one timespec, which outlives the call.
    if unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) } != 0 {
        return 0;
    }
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

#[cfg(feature = "nvml")]
impl PcieReader {
    fn start(index: u32, cap_bytes_per_s: f64) -> Result<PcieReader, String> {
        use std::sync::atomic::Ordering::Relaxed;
        let shared = std::sync::Arc::new(PcieShared::default());
        shared.latest.store(u32::MAX, Relaxed);
        let s = shared.clone();
        std::thread::Builder::new()
            .name("whyslow-pcie".into())
            .spawn(move || {
                use nvml_wrapper::enum_wrappers::device::PcieUtilCounter;
                let Ok(nvml) = nvml_wrapper::Nvml::init() else {
                    return;
                };
                let Ok(dev) = nvml.device_by_index(index) else {
                    return;
                };
                while !s.stop.load(Relaxed) {
                    let (t0, c0) = (std::time::Instant::now(), thread_cpu_ns());
                    // KB/s (NVML: "KB/s" over a 20 ms window).
                    let tx = dev.pcie_throughput(PcieUtilCounter::Send);
                    let rx = dev.pcie_throughput(PcieUtilCounter::Receive);
                    let (Ok(tx), Ok(rx)) = (tx, rx) else {
                        return;
                    };
                    let u = (tx.max(rx) as f64 * 1024.0 / cap_bytes_per_s).clamp(0.0, 1.0) as f32;
                    s.latest.store(u.to_bits(), Relaxed);
                    s.readings.fetch_add(1, Relaxed);
                    let cpu = thread_cpu_ns().saturating_sub(c0);
                    s.cpu_ns.fetch_add(cpu, Relaxed);
                    let wall = t0.elapsed().as_nanos() as u64;
                    std::thread::sleep(pcie_pause(wall, cpu, PCIE_MAX_CPU));
                }
            })
            .map_err(|e| format!("no thread for the PCIe reader: {e}"))?;
        Ok(PcieReader {
            shared,
            started: std::time::Instant::now(),
        })
    }

    fn latest(&self) -> Option<f32> {
        let bits = self
            .shared
            .latest
            .load(std::sync::atomic::Ordering::Relaxed);
        (bits != u32::MAX).then(|| f32::from_bits(bits))
    }

    fn note(&self) -> String {
        use std::sync::atomic::Ordering::Relaxed;
        let secs = self.started.elapsed().as_secs_f64().max(1e-9);
        format!(
            "pcie: read on its own thread (NVML blocks ~20 ms per direction): {} readings in {:.1} s, \
             {:.1} % of a core",
            self.shared.readings.load(Relaxed),
            secs,
            100.0 * self.shared.cpu_ns.load(Relaxed) as f64 / 1e9 / secs
        )
    }
}

#[cfg(feature = "nvml")]
impl Drop for PcieReader {
    fn drop(&mut self) {
        self.shared
            .stop
            .store(true, std::sync::atomic::Ordering::Relaxed);
    }
}

#[cfg(feature = "nvml")]
pub(crate) struct GpuSampler {
    // Field order matters: `nvlink` (a second handle on the library) is
    // dropped before `nvml` shuts NVML down.
    nvlink: Option<NvLink>,
    nvml: nvml_wrapper::Nvml,
    index: u32,
    name: String,
    notes: Vec<String>,
    /// The PCIe throughput, read on its own thread.
    pcie: Option<PcieReader>,
    max_sm_mhz: Option<u32>,
    throttle_seen: u64,
    failed: bool,
}

#[cfg(feature = "nvml")]
impl GpuSampler {
    pub fn open(index: u32) -> Result<GpuSampler, String> {
        use nvml_wrapper::enum_wrappers::device::Clock;
        let nvml = nvml_wrapper::Nvml::init().map_err(|e| format!("NVML not available: {e}"))?;
        let dev = nvml
            .device_by_index(index)
            .map_err(|e| format!("no GPU {index}: {e}"))?;
        let name = dev.name().unwrap_or_else(|_| format!("GPU {index}"));
        let mut notes = vec![
            "sm: NVML utilization.gpu (any kernel running, averaged over the driver's \
             1/6–1 s window), not per-SM activity; it repeats at high rates"
                .to_string(),
            "dram: NVML utilization.memory (time the device memory was read or written)"
                .to_string(),
        ];
        let pcie = match (dev.max_pcie_link_gen(), dev.max_pcie_link_width()) {
            (Ok(g), Ok(w)) => pcie_bytes_per_s(g, w),
            _ => None,
        };
        let pcie = match pcie.map(|cap| PcieReader::start(index, cap)) {
            Some(Ok(r)) => Some(r),
            Some(Err(why)) => {
                notes.push(format!("pcie: {why}; not sampled"));
                None
            }
            None => {
                notes.push("pcie: link generation/width unknown, not sampled".into());
                None
            }
        };
        let nvlink = match NvLink::open(&dev) {
            Ok(n) => Some(n),
            Err(why) => {
                notes.push(format!("{why}; nvlink not sampled"));
                None
            }
        };
        let max_sm_mhz = dev.max_clock_info(Clock::SM).ok().filter(|&m| m > 0);
        if max_sm_mhz.is_none() {
            notes.push("gpu_sm_clock: max SM clock unknown, not sampled".into());
        }
        Ok(GpuSampler {
            nvlink,
            nvml,
            index,
            name,
            notes,
            pcie,
            max_sm_mhz,
            throttle_seen: 0,
            failed: false,
        })
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn notes(&self) -> &[String] {
        &self.notes
    }

    pub fn index(&self) -> u32 {
        self.index
    }

    /// The OR of every throttle reasons bitmask read.
    pub fn throttle_seen(&self) -> u64 {
        self.throttle_seen
    }

    /// What the PCIe reader did: readings and its CPU (a note at the end).
    pub fn pcie_note(&self) -> Option<String> {
        self.pcie.as_ref().map(PcieReader::note)
    }

    /// One reading per available counter (`slow`: also the extra-file
    /// counters); empty after the device failed.
    pub fn sample(&mut self, dt_ns: i64, slow: bool) -> GpuReading {
        use nvml_wrapper::enum_wrappers::device::{Clock, TemperatureSensor};
        let mut out = GpuReading::default();
        if self.failed {
            return out;
        }
        let Ok(dev) = self.nvml.device_by_index(self.index) else {
            self.failed = true;
            return out;
        };
        if let Ok(u) = dev.utilization_rates() {
            out.resources
                .push((Resource::Sm, (u.gpu as f32 / 100.0).clamp(0.0, 1.0)));
            out.resources
                .push((Resource::Dram, (u.memory as f32 / 100.0).clamp(0.0, 1.0)));
        }
        if let Some(u) = self.pcie.as_ref().and_then(PcieReader::latest) {
            out.resources.push((Resource::Pcie, u));
        }
        if let Some(n) = self.nvlink.as_mut() {
            if let Some((tx, rx)) = n.sample(&dev, dt_ns) {
                out.resources.push((Resource::Nvlink, tx.max(rx)));
                out.extra.push(("nvlink_tx", tx));
                out.extra.push(("nvlink_rx", rx));
            }
        }
        if slow {
            if let (Some(max), Ok(cur)) = (self.max_sm_mhz, dev.clock_info(Clock::SM)) {
                if let Some(f) = clock_fraction(cur, max) {
                    out.extra.push(("gpu_sm_clock", f));
                }
            }
            if let Ok(mw) = dev.power_usage() {
                out.extra.push(("gpu_power_w", mw_to_w(mw)));
            }
            if let Ok(c) = dev.temperature(TemperatureSensor::Gpu) {
                out.extra.push(("gpu_temp_c", c as f32));
            }
            if let Ok(r) = dev.current_throttle_reasons() {
                self.throttle_seen |= r.bits();
                out.extra.push(("gpu_throttle", r.bits() as f32));
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_pcie_reader_pauses_only_when_the_driver_spins() {
        use std::time::Duration;
        // H100: 41 ms per reading asleep in the driver: no pause.
        assert_eq!(super::pcie_pause(41_000_000, 50_000, 0.05), Duration::ZERO);
        // Spinning through it: 41 ms of CPU wants 820 ms in all at 5 %.
        assert_eq!(
            super::pcie_pause(41_000_000, 41_000_000, 0.05),
            Duration::from_millis(779)
        );
        assert_eq!(super::pcie_pause(1, 1, 0.0), Duration::ZERO);
        assert_eq!(
            super::pcie_pause(1, u64::MAX, 1e-12),
            Duration::from_secs(10)
        );
    }

    #[test]
    fn pcie_capacity() {
        // Gen 4 x16 ≈ 31.5 GB/s per direction.
        let b = super::pcie_bytes_per_s(4, 16).unwrap();
        assert!((b / 1e9 - 31.5).abs() < 0.1, "{b}");
        assert!(super::pcie_bytes_per_s(0, 16).is_none());
        assert!(super::pcie_bytes_per_s(4, 0).is_none());
    }
}

#[cfg(test)]
mod conversion_tests {
    use super::*;

    #[test]
    fn nvlink_capacity_and_utilization() {
        // A100: 12 links at 25 781 MB/s ≈ 309 GB/s per direction.
        let cap = nvlink_bytes_per_s(25_781, 12).unwrap();
        assert!((cap / 1e9 - 309.4).abs() < 0.1, "{cap}");
        assert!(nvlink_bytes_per_s(0, 12).is_none());
        assert!(nvlink_bytes_per_s(25_781, 0).is_none());
        // Half the capacity for 1 ms: cap/2 * 1e-3 bytes = that / 1024 KiB.
        let kib = (cap / 2.0 * 1e-3 / 1024.0).round() as u64;
        let u = nvlink_utilization(1000, 1000 + kib, 1_000_000, cap).unwrap();
        assert!((u - 0.5).abs() < 1e-3, "{u}");
        // Idle, saturated (clamped), reset, bad interval, bad capacity.
        assert_eq!(nvlink_utilization(5, 5, 1_000_000, cap), Some(0.0));
        assert_eq!(
            nvlink_utilization(0, u64::MAX / 2048, 1_000_000, cap),
            Some(1.0)
        );
        assert_eq!(nvlink_utilization(10, 5, 1_000_000, cap), None);
        assert_eq!(nvlink_utilization(5, 10, 0, cap), None);
        assert_eq!(nvlink_utilization(5, 10, 1, 0.0), None);
        assert_eq!(nvlink_utilization(5, 10, 1, f64::NAN), None);
    }

    #[test]
    fn clocks_power_throttle() {
        assert_eq!(clock_fraction(705, 1410), Some(0.5));
        assert_eq!(clock_fraction(705, 0), None);
        assert_eq!(mw_to_w(312_500), 312.5);
        assert!(throttle_reason_names(0).is_empty());
        assert_eq!(
            throttle_reason_names(0x4 | 0x40),
            vec!["sw_power_cap", "hw_thermal_slowdown"]
        );
        assert_eq!(
            throttle_reason_names(0x1 | 0x1000),
            vec!["gpu_idle", "0x1000"]
        );
        // f32 (the extra file's value type) holds every combination exactly.
        let all: u64 = THROTTLE_REASONS.iter().map(|(b, _)| b).sum();
        assert_eq!(all as f32 as u64, all);
    }

    #[cfg(feature = "nvml")]
    #[test]
    fn throttle_bits_agree_with_nvml_wrapper() {
        use nvml_wrapper::bitmasks::device::ThrottleReasons as T;
        let ours = |n: &str| THROTTLE_REASONS.iter().find(|(_, m)| *m == n).unwrap().0;
        assert_eq!(ours("gpu_idle"), T::GPU_IDLE.bits());
        assert_eq!(
            ours("applications_clocks_setting"),
            T::APPLICATIONS_CLOCKS_SETTING.bits()
        );
        assert_eq!(ours("sw_power_cap"), T::SW_POWER_CAP.bits());
        assert_eq!(ours("hw_slowdown"), T::HW_SLOWDOWN.bits());
        assert_eq!(ours("sync_boost"), T::SYNC_BOOST.bits());
        assert_eq!(ours("sw_thermal_slowdown"), T::SW_THERMAL_SLOWDOWN.bits());
        assert_eq!(ours("hw_thermal_slowdown"), T::HW_THERMAL_SLOWDOWN.bits());
        assert_eq!(
            ours("hw_power_brake_slowdown"),
            T::HW_POWER_BRAKE_SLOWDOWN.bits()
        );
        assert_eq!(
            ours("display_clock_setting"),
            T::DISPLAY_CLOCK_SETTING.bits()
        );
    }

    #[test]
    fn without_nvml_or_gpu_not_available() {
        // Built without the feature, or with it on a host without a driver:
        // an explanation, never a panic.
        if let Some(why) = GpuSampler::open(0).err() {
            assert!(!why.is_empty());
        }
    }
}
