//! cudaMalloc / cudaFree churn from the CUDA API summary: how often the caching allocator went to the driver.

use serde::Serialize;

use crate::timeline::profile::*;

/// cudaMalloc/cudaFree (and their driver-API and host-pinned relatives) calls and time: allocator churn.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct AllocatorCalls {
    pub device_alloc_calls: u64,
    pub device_alloc_ns: u64,
    pub device_free_calls: u64,
    pub device_free_ns: u64,
    pub host_alloc_calls: u64,
    pub host_alloc_ns: u64,
    pub host_free_calls: u64,
    pub host_free_ns: u64,
}

/// What an API name does to memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum AllocApi {
    DeviceAlloc,
    DeviceFree,
    HostAlloc,
    HostFree,
}

pub(crate) fn alloc_api(name: &str) -> Option<AllocApi> {
    // `cudaMalloc_v3020`, `cuMemAlloc_v2`: drop a version suffix.
    let base = match name.rfind("_v") {
        Some(i) if name[i + 2..].chars().all(|c| c.is_ascii_digit()) && i + 2 < name.len() => &name[..i],
        _ => name,
    };
    Some(match base {
        "cudaMalloc"
        | "cudaMallocAsync"
        | "cudaMallocFromPoolAsync"
        | "cudaMallocManaged"
        | "cudaMallocPitch"
        | "cudaMalloc3D"
        | "cudaMallocArray"
        | "cuMemAlloc"
        | "cuMemAllocAsync"
        | "cuMemAllocFromPoolAsync"
        | "cuMemAllocManaged"
        | "cuMemAllocPitch"
        | "cuMemCreate" => AllocApi::DeviceAlloc,
        "cudaFree" | "cudaFreeAsync" | "cudaFreeArray" | "cuMemFree" | "cuMemFreeAsync" | "cuMemRelease" => {
            AllocApi::DeviceFree
        }
        "cudaMallocHost" | "cudaHostAlloc" | "cuMemAllocHost" | "cuMemHostAlloc" => AllocApi::HostAlloc,
        "cudaFreeHost" | "cuMemFreeHost" => AllocApi::HostFree,
        _ => return None,
    })
}

impl ProfileData {
    /// cudaMalloc/cudaFree (and relatives) calls and time, from the CUDA API summary (or `apigpusum`).
    pub fn allocator_calls(&self) -> AllocatorCalls {
        let mut a = AllocatorCalls::default();
        let rows: Vec<(&str, u64, u64)> = if self.api.is_empty() {
            self.combined
                .iter()
                .filter(|c| c.category == "CUDA_API")
                .map(|c| (c.operation.as_str(), c.instances, c.time.total_ns))
                .collect()
        } else {
            self.api.iter().map(|c| (c.name.as_str(), c.calls, c.time.total_ns)).collect()
        };
        for (name, calls, ns) in rows {
            let (c, t) = match alloc_api(name) {
                Some(AllocApi::DeviceAlloc) => (&mut a.device_alloc_calls, &mut a.device_alloc_ns),
                Some(AllocApi::DeviceFree) => (&mut a.device_free_calls, &mut a.device_free_ns),
                Some(AllocApi::HostAlloc) => (&mut a.host_alloc_calls, &mut a.host_alloc_ns),
                Some(AllocApi::HostFree) => (&mut a.host_free_calls, &mut a.host_free_ns),
                None => continue,
            };
            *c += calls;
            *t += ns;
        }
        a
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn alloc_names() {
        assert_eq!(alloc_api("cudaMalloc"), Some(AllocApi::DeviceAlloc));
        assert_eq!(alloc_api("cudaMalloc_v3020"), Some(AllocApi::DeviceAlloc));
        assert_eq!(alloc_api("cuMemAlloc_v2"), Some(AllocApi::DeviceAlloc));
        assert_eq!(alloc_api("cudaFree"), Some(AllocApi::DeviceFree));
        assert_eq!(alloc_api("cudaHostAlloc"), Some(AllocApi::HostAlloc));
        assert_eq!(alloc_api("cudaMemcpyAsync"), None);
        assert_eq!(alloc_api("cudaStreamIsCapturing_v10000"), None);
    }
}
