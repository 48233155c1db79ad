// Opening libnccl.so.2 at run time (nccl.hpp).
#include "nccl.hpp"

#include <dlfcn.h>

#include <cstdlib>
#include <mutex>
#include <string>
#include <vector>

namespace kreg::communication {
namespace {

struct Loaded {
  Nccl api;
  bool ok = false;
  std::string why_not;
};

template <typename Fn>
bool resolve(void* handle, const char* symbol, const std::string& path, Fn* out,
             std::string* why_not) {
  void* p = dlsym(handle, symbol);
  if (p == nullptr) {
    *why_not = std::string("symbol ") + symbol + " missing in " + path;
    return false;
  }
  *out = reinterpret_cast<Fn>(p);
  return true;
}

bool load_from(void* handle, const std::string& path, Nccl* api, std::string* why_not) {
  api->path = path;
  return resolve(handle, "ncclGetVersion", path, &api->get_version, why_not) &&
         resolve(handle, "ncclGetUniqueId", path, &api->get_unique_id, why_not) &&
         resolve(handle, "ncclCommInitRank", path, &api->comm_init_rank, why_not) &&
         resolve(handle, "ncclCommDestroy", path, &api->comm_destroy, why_not) &&
         resolve(handle, "ncclCommAbort", path, &api->comm_abort, why_not) &&
         resolve(handle, "ncclCommGetAsyncError", path, &api->comm_get_async_error, why_not) &&
         resolve(handle, "ncclGetErrorString", path, &api->get_error_string, why_not) &&
         resolve(handle, "ncclAllReduce", path, &api->all_reduce, why_not) &&
         resolve(handle, "ncclAllGather", path, &api->all_gather, why_not) &&
         resolve(handle, "ncclReduceScatter", path, &api->reduce_scatter, why_not) &&
         resolve(handle, "ncclGroupStart", path, &api->group_start, why_not) &&
         resolve(handle, "ncclGroupEnd", path, &api->group_end, why_not);
}

Loaded load() {
  Loaded out;
  // The GPU machines need NVLink multicast (NVLS) off; a value the user set wins.
  setenv("NCCL_NVLS_ENABLE", "0", 0);
  std::vector<std::string> candidates;
  const char* env = std::getenv("KREG_NCCL_LIBRARY");
  if (env != nullptr && env[0] != '\0') {
    // An explicit choice is the only one tried: falling back would hide a wrong path.
    candidates.emplace_back(env);
  } else {
    candidates = {"libnccl.so.2", "/usr/local/cuda/lib64/libnccl.so.2"};
  }
  std::string errors;
  for (const std::string& path : candidates) {
    dlerror();
    void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (handle == nullptr) {
      const char* e = dlerror();
      if (!errors.empty()) errors += "; ";
      errors += e != nullptr ? e : path + ": cannot be opened";
      continue;
    }
    std::string why;
    if (!load_from(handle, path, &out.api, &why)) {
      dlclose(handle);
      if (!errors.empty()) errors += "; ";
      errors += why;
      continue;
    }
    int version = 0;
    const NcclResult r = out.api.get_version(&version);
    if (r != kNcclSuccess) {
      dlclose(handle);
      if (!errors.empty()) errors += "; ";
      errors += path + ": ncclGetVersion failed: " + out.api.error_text(r);
      continue;
    }
    // bf16 (ncclBfloat16) and ncclAvg arrived in 2.10.
    if (version < 21000) {
      dlclose(handle);
      if (!errors.empty()) errors += "; ";
      errors += path + ": NCCL version code " + std::to_string(version) +
                " is older than 2.10 (21000), which bf16 and avg need";
      continue;
    }
    out.api.version = version;
    out.ok = true;  // the handle stays open for the life of the process
    return out;
  }
  out.why_not = errors;
  return out;
}

}  // namespace

std::string Nccl::error_text(NcclResult r) const {
  const char* s = get_error_string != nullptr ? get_error_string(r) : nullptr;
  std::string out = s != nullptr ? s : "";
  return out.empty() ? "NCCL error " + std::to_string(r)
                     : out + " (ncclResult_t " + std::to_string(r) + ")";
}

const Nccl* nccl(std::string* why_not) {
  static std::once_flag once;
  static Loaded loaded;
  std::call_once(once, [] { loaded = load(); });
  if (!loaded.ok) {
    if (why_not != nullptr) *why_not = loaded.why_not;
    return nullptr;
  }
  return &loaded.api;
}

}  // namespace kreg::communication
