// NCCL, opened at run time (dlopen): the communication group has no link dependency on
// libnccl and includes no nccl.h. The few types and functions it uses are declared here,
// matching NCCL 2.x's ABI (nccl.h of 2.28: the enum values and the 128-byte unique id
// have been stable since 2.0; bf16 needs 2.10).
//
// Loading is tried once per process, from $KREG_NCCL_LIBRARY if set, then "libnccl.so.2"
// (the loader's search path), then /usr/local/cuda/lib64/libnccl.so.2. A missing library
// or symbol makes nccl() return null with the reason, and the plugin keeps working on the
// CPU transport.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace kreg::communication {

inline constexpr size_t kNcclUniqueIdBytes = 128;
struct NcclUniqueId {
  char internal[kNcclUniqueIdBytes];
};
using NcclComm = struct NcclCommOpaque*;  // ncclComm_t
using NcclResult = int;                   // ncclResult_t
inline constexpr NcclResult kNcclSuccess = 0;
inline constexpr NcclResult kNcclInProgress = 7;

// ncclDataType_t
enum NcclDataType : int { kNcclFloat16 = 6, kNcclFloat32 = 7, kNcclBfloat16 = 9 };
// ncclRedOp_t
enum NcclRedOp : int { kNcclSum = 0, kNcclProd = 1, kNcclMax = 2, kNcclMin = 3, kNcclAvg = 4 };

// The resolved entry points (cudaStream_t is passed as void*: the same pointer).
struct Nccl {
  int version = 0;   // ncclGetVersion: 22809 for 2.28.9
  std::string path;  // the file that was opened
  NcclResult (*get_version)(int* version) = nullptr;
  NcclResult (*get_unique_id)(NcclUniqueId* id) = nullptr;
  NcclResult (*comm_init_rank)(NcclComm* comm, int nranks, NcclUniqueId id, int rank) = nullptr;
  NcclResult (*comm_destroy)(NcclComm comm) = nullptr;
  NcclResult (*comm_abort)(NcclComm comm) = nullptr;
  NcclResult (*comm_get_async_error)(NcclComm comm, NcclResult* error) = nullptr;
  const char* (*get_error_string)(NcclResult result) = nullptr;
  NcclResult (*all_reduce)(const void* send, void* recv, size_t count, NcclDataType dtype,
                           NcclRedOp op, NcclComm comm, void* stream) = nullptr;
  NcclResult (*all_gather)(const void* send, void* recv, size_t send_count, NcclDataType dtype,
                           NcclComm comm, void* stream) = nullptr;
  NcclResult (*reduce_scatter)(const void* send, void* recv, size_t recv_count, NcclDataType dtype,
                               NcclRedOp op, NcclComm comm, void* stream) = nullptr;
  NcclResult (*group_start)() = nullptr;
  NcclResult (*group_end)() = nullptr;

  // "unhandled cuda error (run with NCCL_DEBUG=INFO for details)" or "NCCL error 3".
  std::string error_text(NcclResult r) const;
};

// The loaded library (thread-safe, loaded once; never unloaded: NCCL keeps threads and
// CUDA state that outlive any one communicator). Null with *why_not (if given) set to the
// reason: "libnccl.so.2: cannot open shared object file: ...", "symbol ncclAllReduce
// missing in /usr/lib/libnccl.so.2". Sets NCCL_NVLS_ENABLE=0 (without overwriting a
// value the user set) before the first NCCL call.
const Nccl* nccl(std::string* why_not);

}  // namespace kreg::communication
