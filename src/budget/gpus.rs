//! GPUs by name, with the total memory `nvidia-smi` reports for them (MiB). That is the capacity before the CUDA
//! context, which the budget counts as a line of its own.

use serde::Serialize;

#[derive(Clone, Debug, Serialize)]
pub struct Gpu {
    pub name: String,
    pub capacity_bytes: u64,
}

/// (names, nvidia-smi total MiB, what it is). Every figure is the "Memory-Usage" total of a real `nvidia-smi` table.
const GPUS: &[(&[&str], u64, &str)] = &[
    (&["h100-80gb", "h100", "h100-sxm", "h100-pcie"], 81_559, "NVIDIA H100 80GB HBM3"),
    (&["h200", "h200-141gb"], 143_771, "NVIDIA H200"),
    (&["a100-80gb", "a100"], 81_920, "NVIDIA A100 80GB (SXM4 or PCIe)"),
    (&["a100-40gb"], 40_960, "NVIDIA A100 40GB (SXM4 or PCIe)"),
    (&["l40s", "l40", "a40"], 46_068, "NVIDIA L40S / A40 (48 GB)"),
    (&["l4"], 23_034, "NVIDIA L4 (24 GB)"),
    (&["a10g", "a10"], 23_028, "NVIDIA A10G / A10 (24 GB)"),
    (&["4090", "rtx4090", "rtx-4090", "3090-ti"], 24_564, "GeForce RTX 4090 / 3090 Ti (24 GB)"),
    (&["3090", "rtx3090", "rtx-3090"], 24_576, "GeForce RTX 3090 (24 GB)"),
    (&["t4"], 15_360, "Tesla T4 (16 GB)"),
];

/// A `--gpu` name not in the table.
#[derive(Debug, thiserror::Error)]
#[error("--gpu {name:?}: unknown GPU; known: {} (or give --gpu-memory 80GiB)", known().join(", "))]
pub struct UnknownGpu {
    pub name: String,
}

/// Looks a GPU up by name (case and `nvidia-`/`rtx` prefixes do not matter).
pub fn find(name: &str) -> Result<Gpu, UnknownGpu> {
    let key = name.trim().to_ascii_lowercase().replace(['_', ' '], "-");
    let key = key.trim_start_matches("nvidia-").trim_start_matches("geforce-");
    for (names, mib, _) in GPUS {
        if names.contains(&key) {
            return Ok(Gpu { name: names[0].to_string(), capacity_bytes: mib << 20 });
        }
    }
    Err(UnknownGpu { name: name.to_string() })
}

/// The primary names, for help and errors.
pub fn known() -> Vec<&'static str> {
    GPUS.iter().map(|(n, _, _)| n[0]).collect()
}

/// A GPU given by its capacity.
pub fn custom(bytes: u64) -> Gpu {
    Gpu { name: format!("{} GPU", crate::units::bytes(bytes)), capacity_bytes: bytes }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names() {
        assert_eq!(find("H100-80GB").unwrap().capacity_bytes, 81_559 << 20);
        assert_eq!(find("nvidia-h100").unwrap().name, "h100-80gb");
        assert_eq!(find("4090").unwrap().capacity_bytes, 24_564 << 20);
        assert!(find("tpu-v5").unwrap_err().to_string().contains("a100-40gb"));
    }
}
