//! Peak bandwidths by device: the one place where whyslow turns the bandwidth
//! a trace reports into a utilization in [0, 1] (`Execution::trace_util`).
//!
//! | device (name contains) | NVLink GB/s | HBM GB/s | PCIe GB/s |
//! |---|---|---|---|
//! | V100                   | 150         | 900      | 25 |
//! | A100 (80GB)            | 300         | 1555 (2039) | 25 |
//! | H100 / H800            | 450         | 3350     | 50 |
//! | H200                   | 450         | 4800     | 50 |
//! | B200 / GB200           | 900         | 8000     | 50 |
//! | MI250                  | 200         | 3276     | 25 |
//! | MI300                  | 448         | 5300     | 50 |
//! | anything else          | 300         | 2000     | 25 |
//!
//! NVLink figures are per direction (what NCCL's bus bandwidth approaches);
//! the NIC is 25 GB/s (200 Gbit/s) whatever the device. These are nominal
//! peaks: utilizations are comparable across workers of one job (what the
//! localizer needs), not absolute efficiencies.

use whyslow_model::Resource;

/// Default NIC bandwidth, GB/s (200 Gbit/s).
pub const NIC_GBPS: f64 = 25.0;

struct Peaks {
    nvlink: f64,
    hbm: f64,
    pcie: f64,
}

fn peaks(device: Option<&str>) -> Peaks {
    let d = device.unwrap_or("").to_ascii_uppercase();
    let p = |nvlink, hbm, pcie| Peaks { nvlink, hbm, pcie };
    if d.contains("V100") {
        p(150.0, 900.0, 25.0)
    } else if d.contains("A100") {
        if d.contains("80GB") {
            p(300.0, 2039.0, 25.0)
        } else {
            p(300.0, 1555.0, 25.0)
        }
    } else if d.contains("H200") {
        p(450.0, 4800.0, 50.0)
    } else if d.contains("H100") || d.contains("H800") {
        p(450.0, 3350.0, 50.0)
    } else if d.contains("B200") || d.contains("GB200") {
        p(900.0, 8000.0, 50.0)
    } else if d.contains("MI250") {
        p(200.0, 3276.0, 25.0)
    } else if d.contains("MI300") {
        p(448.0, 5300.0, 50.0)
    } else {
        p(300.0, 2000.0, 25.0)
    }
}

/// Peak bandwidth of `resource` on `device`, GB/s; `None` for resources
/// without a bandwidth (SM, CPU).
pub fn peak_gbps(resource: Resource, device: Option<&str>) -> Option<f64> {
    let p = peaks(device);
    match resource {
        Resource::Nvlink => Some(p.nvlink),
        Resource::Nic => Some(NIC_GBPS),
        Resource::Pcie => Some(p.pcie),
        Resource::Dram => Some(p.hbm),
        Resource::Sm | Resource::Cpu => None,
    }
}

/// Bytes per element of a PyTorch dtype name as Kineto writes it ("Float",
/// "BFloat16", "c10::Half", "Long", …); `None` when unknown.
pub fn dtype_size(dtype: &str) -> Option<f64> {
    let d = dtype
        .trim()
        .trim_start_matches("c10::")
        .to_ascii_lowercase();
    let s = match d.as_str() {
        "float" | "float32" | "int" | "int32" | "uint32" | "complexhalf" => 4.0,
        "double" | "float64" | "long" | "int64" | "uint64" | "complexfloat" => 8.0,
        "half" | "float16" | "bfloat16" | "short" | "int16" | "uint16" => 2.0,
        "byte" | "char" | "bool" | "int8" | "uint8" => 1.0,
        "complexdouble" => 16.0,
        _ if d.starts_with("float8") => 1.0,
        _ => return None,
    };
    Some(s)
}

/// NCCL's bus-bandwidth factor for a collective over `n` ranks (as in
/// nccl-tests): all-reduce 2(n−1)/n; all-gather, reduce-scatter, all-to-all
/// (n−1)/n; broadcast, reduce, send/recv 1. The message size to divide by
/// time is the larger of the input and output sizes.
pub fn busbw_factor(collective: &str, n: f64) -> f64 {
    let c = collective.to_ascii_lowercase().replace(['_', ' '], "");
    if n <= 1.0 {
        return 1.0;
    }
    if c.contains("allreduce") {
        2.0 * (n - 1.0) / n
    } else if c.contains("allgather")
        || c.contains("reducescatter")
        || c.contains("alltoall")
        || c.contains("all2all")
    {
        (n - 1.0) / n
    } else {
        1.0
    }
}
