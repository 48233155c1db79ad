#include "memory.hpp"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <sstream>

#include "kreg/kernel_spec.hpp"
#include "kreg/parse_number.hpp"

#if defined(KREG_HAVE_CUDA)
#include <cuda_runtime.h>
#endif

namespace kreg::harness {

namespace {

// One decimal number from a small file (cgroup files hold "12345\n" or "max\n").
bool read_number_file(const char* path, uint64_t* out) {
  std::ifstream f(path);
  std::string word;
  if (!(f >> word)) return false;
  auto v = parse_uint(word, path);
  if (!v) return false;
  *out = *v;
  return true;
}

bool meminfo_available(uint64_t* out) {
  std::ifstream f("/proc/meminfo");
  std::string line;
  while (std::getline(f, line)) {
    if (line.rfind("MemAvailable:", 0) != 0) continue;
    std::istringstream in(line.substr(13));
    std::string kb;
    if (!(in >> kb)) return false;
    auto v = parse_uint(kb, "MemAvailable", UINT64_MAX / 1024);
    if (!v) return false;
    *out = *v * 1024;
    return true;
  }
  return false;
}

}  // namespace

std::string byte_text(uint64_t bytes) {
  static const char* const kUnits[] = {"B", "KB", "MB", "GB", "TB", "PB", "EB"};
  double v = static_cast<double>(bytes);
  int u = 0;
  while (v >= 1000 && u < 6) {
    v /= 1000;
    ++u;
  }
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.3g %s (%llu bytes)", v, kUnits[u],
                static_cast<unsigned long long>(bytes));
  return buf;
}

Result<Available> available_memory(DLDevice device) {
  if (device.device_type == kDLCPU || device.device_type == kDLCUDAHost) {
    Available a;
    if (meminfo_available(&a.bytes)) {
      a.source = "MemAvailable in /proc/meminfo";
    } else {
      const long pages = sysconf(_SC_AVPHYS_PAGES);
      const long page = sysconf(_SC_PAGESIZE);
      if (pages <= 0 || page <= 0) {
        return Status(KREG_UNAVAILABLE, "cannot tell how much host memory is free");
      }
      a.bytes = static_cast<uint64_t>(pages) * static_cast<uint64_t>(page);
      a.source = "sysconf(_SC_AVPHYS_PAGES)";
    }
    uint64_t max = 0, current = 0;
    if (read_number_file("/sys/fs/cgroup/memory.max", &max) &&
        read_number_file("/sys/fs/cgroup/memory.current", &current)) {
      const uint64_t headroom = max > current ? max - current : 0;
      if (headroom < a.bytes) {
        a.bytes = headroom;
        a.source = "the cgroup's memory.max";
      }
    }
    return a;
  }
  if (device.device_type == kDLCUDA) {
#if defined(KREG_HAVE_CUDA)
    int current = 0;
    if (cudaGetDevice(&current) != cudaSuccess) {
      return Status(KREG_UNAVAILABLE, "cudaGetDevice failed");
    }
    if (current != device.device_id && cudaSetDevice(device.device_id) != cudaSuccess) {
      return Status(KREG_UNAVAILABLE, "cannot select cuda:" + std::to_string(device.device_id));
    }
    size_t free_bytes = 0, total = 0;
    const cudaError_t e = cudaMemGetInfo(&free_bytes, &total);
    if (current != device.device_id) cudaSetDevice(current);
    if (e != cudaSuccess) {
      return Status(KREG_UNAVAILABLE, std::string("cudaMemGetInfo: ") + cudaGetErrorString(e));
    }
    return Available{free_bytes, "cudaMemGetInfo on cuda:" + std::to_string(device.device_id)};
#else
    return Status(KREG_UNAVAILABLE, "this kreg was built without CUDA; only CPU tensors work");
#endif
  }
  return Status(KREG_UNIMPLEMENTED,
                "no free-memory figure for " + device_type_name(device.device_type) + " memory");
}

Status check_fits(DLDevice device, uint64_t need, const std::string& what) {
  auto avail = available_memory(device);
  if (!avail) return avail.status();
  if (need <= avail->bytes) return OkStatus();
  const bool host = device.device_type == kDLCPU || device.device_type == kDLCUDAHost;
  return Status(KREG_RESOURCE_EXHAUSTED,
                what + " need " + byte_text(need) + " of " + (host ? "host" : "device") +
                    " memory, more than the " + byte_text(avail->bytes) + " free (" +
                    avail->source + "); nothing was allocated");
}

}  // namespace kreg::harness
