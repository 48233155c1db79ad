// Creating and destroying a Comm (comm.hpp): argument checks, the store, the rendezvous of
// the ranks and the NCCL communicator.
#include "comm.hpp"

#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>

#include "nccl.hpp"

#if defined(KREG_PLUGIN_HAS_CUDA)
#include <cuda_runtime.h>
#endif

namespace kreg::communication {
namespace {

// "<name>/join/ready" and "<name>/join/<r>": magic, world size, mode, [NCCL id].
constexpr char kJoinMagic[4] = {'K', 'C', 'J', '1'};
constexpr size_t kJoinHeader = 4 + 8 + 1;

std::string join_record(int64_t world_size, bool with_nccl, const NcclUniqueId* id) {
  std::string out(kJoinMagic, 4);
  char buf[8];
  std::memcpy(buf, &world_size, 8);
  out.append(buf, 8);
  out.push_back(with_nccl ? '\1' : '\0');
  if (id != nullptr) out.append(id->internal, kNcclUniqueIdBytes);
  return out;
}

// Checks another rank's record against this rank's view; fills *id from a ready record.
bool check_join_record(const std::string& rec, int64_t from_rank, int64_t world_size,
                       bool with_nccl, bool want_id, NcclUniqueId* id, std::string* why) {
  const size_t want = kJoinHeader + (want_id ? kNcclUniqueIdBytes : 0);
  if (rec.size() != want || std::memcmp(rec.data(), kJoinMagic, 4) != 0) {
    *why = "rank " + std::to_string(from_rank) + "'s record is not a kreg comm record (" +
           std::to_string(rec.size()) + " bytes; another program's key, or another kreg version)";
    return false;
  }
  int64_t their_world = 0;
  std::memcpy(&their_world, rec.data() + 4, 8);
  if (their_world != world_size) {
    *why = "rank " + std::to_string(from_rank) + " joined with world size " +
           std::to_string(their_world) + ", this rank with " + std::to_string(world_size);
    return false;
  }
  const bool their_nccl = rec[12] != '\0';
  if (their_nccl != with_nccl) {
    *why = "rank " + std::to_string(from_rank) + " joined " +
           (their_nccl ? "with a CUDA device" : "host only (device -1)") + ", this rank " +
           (with_nccl ? "with a CUDA device" : "host only (device -1)");
    return false;
  }
  if (want_id) std::memcpy(id->internal, rec.data() + kJoinHeader, kNcclUniqueIdBytes);
  return true;
}

bool valid_name(std::string_view name) {
  if (name.empty() || name.size() > kMaxCommNameBytes) return false;
  for (const char c : name) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                    c == '.' || c == '_' || c == ':' || c == '/' || c == '-';
    if (!ok) return false;
  }
  return true;
}

bool fail(std::string* error, std::string message) {
  if (error != nullptr) *error = std::move(message);
  return false;
}

// The rendezvous (comm.hpp). On return every rank knows that all ranks are alive and agree
// on the world size and the mode; *id is rank 0's NCCL id when with_nccl.
bool meet(Comm& c, bool with_nccl, NcclUniqueId* id, std::string* error) {
  const std::string where = c.where();
  const std::string url = c.store->url();
  const std::string prefix = c.name + "/join/";
  std::string err;
  if (c.rank != 0) {
    if (!c.store->set(prefix + std::to_string(c.rank),
                      join_record(c.world_size, with_nccl, nullptr), &err)) {
      return fail(error, where + ": announcing this rank in " + url + ": " + err);
    }
    std::string ready;
    if (!c.store->get(prefix + "ready", c.timeout_s, &ready, &err)) {
      return fail(error, where + ": waiting for rank 0's " + (with_nccl ? "NCCL id" : "go-ahead") +
                             " in " + url + ": " + err);
    }
    std::string why;
    if (!check_join_record(ready, 0, c.world_size, with_nccl, with_nccl, id, &why)) {
      return fail(error, where + ": comm '" + c.name + "' in " + url + ": " + why);
    }
    // The last rank to read the go-ahead removes it, so that the name can be used again.
    int64_t readers = 0;
    if (!c.store->add(prefix + "read", 1, &readers, &err)) {
      return fail(error,
                  where + ": counting readers of comm '" + c.name + "' in " + url + ": " + err);
    }
    if (readers == c.world_size - 1) {
      if (!c.store->erase(prefix + "ready", &err) || !c.store->erase(prefix + "read", &err)) {
        return fail(error, where + ": cleaning up comm '" + c.name + "' in " + url + ": " + err);
      }
    }
    return true;
  }
  for (int64_t r = 1; r < c.world_size; ++r) {
    std::string rec;
    const std::string key = prefix + std::to_string(r);
    if (!c.store->get(key, c.timeout_s, &rec, &err)) {
      return fail(error, where + ": waiting for rank " + std::to_string(r) + " to join comm '" +
                             c.name + "' in " + url + ": " + err);
    }
    std::string why;
    if (!check_join_record(rec, r, c.world_size, with_nccl, false, nullptr, &why)) {
      return fail(error, where + ": comm '" + c.name + "' in " + url + ": " + why);
    }
    if (!c.store->erase(key, &err)) {
      return fail(error, where + ": cleaning up comm '" + c.name + "' in " + url + ": " + err);
    }
  }
  if (!c.store->set(prefix + "ready",
                    join_record(c.world_size, with_nccl, with_nccl ? id : nullptr), &err)) {
    return fail(error, where + ": publishing the " + (with_nccl ? "NCCL id" : "go-ahead") + " in " +
                           url + ": " + err);
  }
  return true;
}

#if defined(KREG_PLUGIN_HAS_CUDA)
bool check_device(const Comm& c, std::string* error) {
  int count = 0;
  const cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess) {
    cudaGetLastError();
    return fail(error, c.where() + ": device " + std::to_string(c.device) +
                           ": no CUDA device usable: " + cudaGetErrorString(e));
  }
  if (c.device >= count) {
    return fail(error, c.where() + ": device " + std::to_string(c.device) + " does not exist (" +
                           std::to_string(count) + " CUDA device" + (count == 1 ? "" : "s") + ")");
  }
  return true;
}

bool init_nccl(Comm& c, const NcclUniqueId& id, std::string* error) {
  int previous = -1;
  if (cudaGetDevice(&previous) != cudaSuccess) previous = -1;
  cudaError_t e = cudaSetDevice(static_cast<int>(c.device));
  if (e != cudaSuccess) {
    cudaGetLastError();
    return fail(error, c.where() + ": cudaSetDevice(" + std::to_string(c.device) +
                           ") failed: " + cudaGetErrorString(e));
  }
  NcclComm nc = nullptr;
  const NcclResult r =
      c.nccl->comm_init_rank(&nc, static_cast<int>(c.world_size), id, static_cast<int>(c.rank));
  // Leave the caller's current device as it was.
  if (previous >= 0 && previous != c.device && cudaSetDevice(previous) != cudaSuccess) {
    cudaGetLastError();
  }
  if (r != kNcclSuccess) {
    return fail(error, c.where() + ": ncclCommInitRank on cuda:" + std::to_string(c.device) +
                           " failed: " + c.nccl->error_text(r));
  }
  c.nccl_comm = nc;
  return true;
}
#endif

}  // namespace

std::string Comm::where() const {
  return "rank " + std::to_string(rank) + " of " + std::to_string(world_size);
}

std::optional<ReduceOp> parse_reduce_op(std::string_view op) {
  if (op == "sum") return ReduceOp::kSum;
  if (op == "prod") return ReduceOp::kProd;
  if (op == "max") return ReduceOp::kMax;
  if (op == "min") return ReduceOp::kMin;
  if (op == "avg") return ReduceOp::kAvg;
  return std::nullopt;
}

const char* reduce_op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
      return "sum";
    case ReduceOp::kProd:
      return "prod";
    case ReduceOp::kMax:
      return "max";
    case ReduceOp::kMin:
      return "min";
    case ReduceOp::kAvg:
      return "avg";
  }
  return "?";
}

Comm* create_comm(int64_t rank, int64_t world_size, std::string_view store_url, int64_t device,
                  std::string_view name, double timeout_s, std::string* error) {
  const std::string who =
      "comm (rank " + std::to_string(rank) + " of " + std::to_string(world_size) + ")";
  if (world_size < 1 || world_size > kMaxWorldSize) {
    fail(error, who + ": world_size " + std::to_string(world_size) + " is outside 1.." +
                    std::to_string(kMaxWorldSize));
    return nullptr;
  }
  if (rank < 0 || rank >= world_size) {
    fail(error, who + ": rank " + std::to_string(rank) + " is outside 0.." +
                    std::to_string(world_size - 1));
    return nullptr;
  }
  if (device < -1 || device > INT32_MAX) {
    fail(error, who + ": device " + std::to_string(device) +
                    " is neither -1 (host only) nor a CUDA device index");
    return nullptr;
  }
  if (!(timeout_s > 0.0 && timeout_s <= kMaxTimeoutSeconds)) {  // NaN fails too
    char buf[64];
    std::snprintf(buf, sizeof buf, "%g", timeout_s);
    fail(error, who + ": timeout " + buf + " s is outside (0, 3600]");
    return nullptr;
  }
  if (!valid_name(name)) {
    fail(error, who + ": name '" + comm::detail::escape(name) + "' (" +
                    std::to_string(name.size()) + " bytes) must be 1.." +
                    std::to_string(kMaxCommNameBytes) + " bytes of A-Z a-z 0-9 . _ : / -");
    return nullptr;
  }
  if (world_size > 1 && store_url.empty()) {
    fail(error, who + ": a store URL (tcp://HOST:PORT or file:///dir) is needed for world size " +
                    std::to_string(world_size));
    return nullptr;
  }
#if !defined(KREG_PLUGIN_HAS_CUDA)
  if (device >= 0) {
    fail(error, who + ": device " + std::to_string(device) +
                    ": this build of the communication group has no CUDA support (device -1 "
                    "for the CPU transport)");
    return nullptr;
  }
#endif

  auto c = std::make_unique<Comm>();
  c->rank = rank;
  c->world_size = world_size;
  c->device = device;
  c->name = std::string(name);
  c->timeout_s = timeout_s;

  const bool with_nccl = device >= 0;
  NcclUniqueId id{};
  if (with_nccl) {
    std::string why;
    c->nccl = nccl(&why);
    if (c->nccl == nullptr) {
      fail(error, c->where() + ": device " + std::to_string(device) + " needs NCCL: " + why);
      return nullptr;
    }
#if defined(KREG_PLUGIN_HAS_CUDA)
    if (!check_device(*c, error)) return nullptr;
#endif
  }
  if (!store_url.empty()) {
    std::string err;
    c->store = comm::connect_store(store_url, timeout_s, &err);
    if (c->store == nullptr) {
      fail(error, c->where() + ": connecting to the store " + comm::detail::escape(store_url) +
                      ": " + err);
      return nullptr;
    }
  }
  if (with_nccl && rank == 0) {
    const NcclResult r = c->nccl->get_unique_id(&id);
    if (r != kNcclSuccess) {
      fail(error, c->where() + ": ncclGetUniqueId failed: " + c->nccl->error_text(r));
      return nullptr;
    }
  }
  if (world_size > 1 && !meet(*c, with_nccl, &id, error)) return nullptr;
#if defined(KREG_PLUGIN_HAS_CUDA)
  if (with_nccl && !init_nccl(*c, id, error)) return nullptr;
#endif
  return c.release();
}

void destroy_comm(Comm* comm) {
  if (comm == nullptr) return;
  if (comm->nccl_comm != nullptr && comm->nccl != nullptr) {
    auto* nc = static_cast<NcclComm>(comm->nccl_comm);
    NcclResult async = kNcclSuccess;
    const NcclResult r = comm->nccl->comm_get_async_error(nc, &async);
    // A communicator in error may never finish its pending work: destroy would wait on it.
    if (r != kNcclSuccess || (async != kNcclSuccess && async != kNcclInProgress)) {
      comm->nccl->comm_abort(nc);
    } else {
      comm->nccl->comm_destroy(nc);
    }
    comm->nccl_comm = nullptr;
  }
  delete comm;
}

}  // namespace kreg::communication

namespace kreg::communication::detail {

bool is_contiguous(const DLTensor& t) {
  if (t.strides == nullptr) return true;
  int64_t expected = 1;
  for (int i = t.ndim - 1; i >= 0; --i) {
    if (t.shape[i] != 1 && t.strides[i] != expected) return false;
    expected *= t.shape[i];
  }
  return true;
}

}  // namespace kreg::communication::detail
