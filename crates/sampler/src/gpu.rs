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
//! - `dram`: `utilization.memory`, the fraction of time device memory was
//!   read or written (same refresh limits) — a busy-time proxy, not bandwidth.
//! - `pcie`: `nvmlDeviceGetPcieThroughput` (TX and RX, KB/s over a 20 ms
//!   window) over the link's maximum per-direction bandwidth from its max
//!   generation and width ([`pcie_bytes_per_s`]); the series is max(tx, rx).
//!   Each call blocks ~20 ms in the driver on some products, which caps the
//!   achieved rate far below 10 kHz when a GPU is sampled.
//! - NVLink, clocks, power, temperature, throttle reasons, DCGM profiling
//!   fields: not sampled yet.
//!
//! Not tested on a GPU yet (this crate was written on a host without one).

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

#[cfg(feature = "nvml")]
pub(crate) struct GpuSampler {
    nvml: nvml_wrapper::Nvml,
    index: u32,
    name: String,
    notes: Vec<String>,
    /// Per-direction PCIe capacity, bytes/s.
    pcie_bytes_per_s: Option<f64>,
    failed: bool,
}

#[cfg(feature = "nvml")]
impl GpuSampler {
    pub fn open(index: u32) -> Result<GpuSampler, String> {
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
            "nvlink: not sampled".to_string(),
        ];
        let pcie = match (dev.max_pcie_link_gen(), dev.max_pcie_link_width()) {
            (Ok(g), Ok(w)) => pcie_bytes_per_s(g, w),
            _ => None,
        };
        if pcie.is_none() {
            notes.push("pcie: link generation/width unknown, not sampled".into());
        }
        Ok(GpuSampler {
            nvml,
            index,
            name,
            notes,
            pcie_bytes_per_s: pcie,
            failed: false,
        })
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn notes(&self) -> &[String] {
        &self.notes
    }

    /// One reading per available resource; empty after the device failed.
    pub fn sample(&mut self) -> Vec<(Resource, f32)> {
        use nvml_wrapper::enum_wrappers::device::PcieUtilCounter;
        let mut out = Vec::with_capacity(3);
        if self.failed {
            return out;
        }
        let Ok(dev) = self.nvml.device_by_index(self.index) else {
            self.failed = true;
            return out;
        };
        if let Ok(u) = dev.utilization_rates() {
            out.push((Resource::Sm, (u.gpu as f32 / 100.0).clamp(0.0, 1.0)));
            out.push((Resource::Dram, (u.memory as f32 / 100.0).clamp(0.0, 1.0)));
        }
        if let Some(cap) = self.pcie_bytes_per_s {
            // KB/s (NVML: "KB/s" over a 20 ms window).
            let tx = dev.pcie_throughput(PcieUtilCounter::Send);
            let rx = dev.pcie_throughput(PcieUtilCounter::Receive);
            if let (Ok(tx), Ok(rx)) = (tx, rx) {
                let u = (tx.max(rx) as f64 * 1024.0 / cap).clamp(0.0, 1.0) as f32;
                out.push((Resource::Pcie, u));
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn pcie_capacity() {
        // Gen 4 x16 ≈ 31.5 GB/s per direction.
        let b = super::pcie_bytes_per_s(4, 16).unwrap();
        assert!((b / 1e9 - 31.5).abs() < 0.1, "{b}");
        assert!(super::pcie_bytes_per_s(0, 16).is_none());
        assert!(super::pcie_bytes_per_s(4, 0).is_none());
    }
}
