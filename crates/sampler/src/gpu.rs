//! GPU utilization through NVML (PerfTracker §4.2: GPU kernels are governed
//! by SM activity, memory operations by PCIe), behind the cargo feature
//! `nvml`. NVML (`libnvidia-ml.so`) is loaded at run time by nvml-wrapper, so
//! a build with the feature still runs on hosts without a GPU or driver:
//! sampling then reports [`GpuStatus::NotAvailable`].
//!
//! What NVML gives, and its limits at high rates:
//! - `sm`: `nvmlDeviceGetUtilizationRates().gpu`, the fraction of time over the
//!   driver's last sample period (1/6 s – 1 s depending on the product) in
//!   which *any* kernel ran. It is refreshed by the driver far slower than
//!   10 kHz and is "GPU busy", not per-SM activity (that needs DCGM profiling
//!   fields, not done here). Successive 10 kHz samples repeat the same value.
//! - `pcie`: `nvmlDeviceGetPcieThroughput` (TX and RX, KB/s over a 20 ms
//!   window) over the link's maximum bandwidth from its max generation and
//!   width; the series is max(tx, rx).
//! - NVLink, DRAM, clocks, power, temperature, throttle reasons: not sampled
//!   yet.

use whyslow_model::Resource;

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
    pub fn sample(&mut self) -> Vec<(Resource, f32)> {
        match self.0 {}
    }
}
