// How much memory a device has free right now, so the harness can refuse an example that
// cannot fit before allocating any of it (rather than dying in bad_alloc or the OOM
// killer halfway through).
#pragma once

#include <cstdint>
#include <string>

#include <dlpack/dlpack.h>

#include "kreg/status.hpp"

namespace kreg::harness {

struct Available {
  uint64_t bytes = 0;
  std::string source;  // where the figure came from, for messages ("MemAvailable", ...)
};

// Host (kDLCPU, kDLCUDAHost): /proc/meminfo MemAvailable, else sysconf(_SC_AVPHYS_PAGES),
// lowered to the cgroup v2 limit's headroom (memory.max - memory.current) when there is
// one. CUDA: cudaMemGetInfo's free bytes on that device (UNAVAILABLE without CUDA).
Result<Available> available_memory(DLDevice device);

// OK when `need` bytes fit in what `device` has free; else RESOURCE_EXHAUSTED naming
// `what` (the tensors that need it), both figures and the source of the limit.
Status check_fits(DLDevice device, uint64_t need, const std::string& what);

// "1.6 TB (1599999999984 bytes)"
std::string byte_text(uint64_t bytes);

}  // namespace kreg::harness
