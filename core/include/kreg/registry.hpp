// The registry: groups -> ops -> implementations, and the handles callers run them
// through.
//
// Selection (resolve): unknown op -> NOT_FOUND; an explicit backend that the op lacks ->
// NOT_FOUND; otherwise each implementation is checked against the actual arguments
// (device kind, the device's SM against the capability windows, backend availability,
// dtypes, ranks, named dimensions, contiguity). One left -> it; several -> the highest
// priority; none -> an error listing, per candidate, why it was rejected.
// KREG_FORCE_BACKEND=cpu (or "layernorm.rmsnorm=cpu,activation.*=cpu") forces a backend,
// read when the Registry is created.
//
// Call path: KernelHandle::call checks the arguments against precomputed expectations and
// calls the plugin through the C frame. It allocates nothing and takes no lock.
// Registry::call (lookup by name, then the same) takes no lock either.
//
// Threading: loading and registering (open, load_group, add) happen before threads call,
// or are serialized by the registry's mutex against each other; lookups and calls run
// from any number of threads. Handles point into the registry: it must outlive them.
// reload() may run while other threads call: it swaps each implementation's function
// pointer atomically and never unmaps code.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstring>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <variant>
#include <vector>

#include "kreg/abi.h"
#include "kreg/backend.hpp"
#include "kreg/checked_math.hpp"
#include "kreg/kernel_spec.hpp"
#include "kreg/manifest.hpp"
#include "kreg/plugin_library.hpp"
#include "kreg/resource.hpp"
#include "kreg/status.hpp"

namespace kreg {

class Registry;

// How one call runs, besides its arguments (the ABI 1.2 call frame's fields).
struct CallOptions {
  void* stream = nullptr;  // cudaStream_t for CUDA; null: the legacy default stream
  // Workspace allocation for kernels that need scratch memory (abi.h); null: the SDK's
  // default, cudaMallocAsync on the call's stream.
  const kreg_host_services* services = nullptr;
  uint64_t launch_flags = 0;  // KREG_LAUNCH_*: KREG_LAUNCH_PDL asks for programmatic
                              // dependent launch (kernels that cannot, ignore it)
};

namespace detail {

// Why an argument check failed; formatted into a message only off the fast path.
enum class CheckFailure : uint8_t {
  kNone,
  kTensorCount,
  kAttrCount,
  kNullTensor,
  kDevice,
  kDeviceMismatch,
  kDType,
  kSharedDType,
  kRank,
  kBadShape,  // ndim negative or above kMaxCallNdim, or a null shape with ndim > 0
  kNegativeDim,
  kTooLarge,  // elements * itemsize overflows int64
  kDim,
  kDimDivisible,
  kContiguous,
  kAttrType,
  kResourceNull,       // a Resource<...> attribute without a resource
  kResourceType,       // a resource of another type
  kResourceDestroyed,  // a resource that was destroyed
};

struct CheckResult {
  CheckFailure why = CheckFailure::kNone;
  int8_t arg = -1;  // tensor or attribute index
  int8_t dim = -1;
};

// The most dimensions a tensor of any-rank parameter ('Tensor x') may have: the core
// reads ndim shape entries and trusts nothing more about a caller's DLTensor.
inline constexpr int32_t kMaxCallNdim = 64;

struct TensorRule {
  int8_t ndim = -1;      // -1: any rank
  DTypeMask dtypes = 0;  // 0: the shared dtype variable
  DimExpr dims[kMaxRank];
};

// The compiled shape check, with no symbol table: every use of a dimension symbol after
// its first is compared with the first directly, cross-multiplied by the coefficients
// (shape[a][i] * coef_b == shape[b][j] * coef_a); literal dimensions compare with their
// value; a first use with a coefficient (2*D) must be divisible by it.
struct DimPair {
  static constexpr uint8_t kLiteral = 0xff;
  uint8_t ta = 0, da = 0;  // this use
  uint8_t tb = 0, db = 0;  // the symbol's first use, or tb == kLiteral
  int8_t cb_shift = 0;     // log2(cb) when cb is a power of two, else -1
  int32_t ca = 1, cb = 1;
  int64_t literal = 0;
};
struct DimDivisor {
  uint8_t tensor = 0, dim = 0;
  int64_t mask = 0;  // coef - 1 when coef is a power of two, else 0
  int64_t coef = 1;
};
// Per tensor: the expected (ndim, dtype) pair as DLTensor lays them out, for one 64-bit
// compare. dtype 0 means "the shared dtype" (filled in per call).
struct FastTensor {
  int32_t ndim = -1;     // -1: any rank
  DTypeMask dtypes = 0;  // explicit set; 0: the shared dtype
};

// KernelHandle::call's fast path: the tensor words of the last call the full check
// accepted. accepts_tensors() is a function of the plan and, per tensor, of nothing but
// its nullness, device word, rank+dtype word, shape and strides (never data or
// byte_offset), so a call whose words are all equal to an accepted call's is accepted too,
// without the symbolic check. Strides enter that check only as "absent, or row-major for
// this shape", so a slot keeps the strides its call had or, for a call without, the
// row-major strides of its shape: a caller's strides are compared when it has some (equal
// to accepted ones: accepted), and a call without strides needs only the other words (no
// strides are always row-major). Anything else falls back to the full check, which stores
// the new words when it accepts. A seqlock: readers on any number of threads take no lock and
// retry nothing (a read that overlaps a store is a miss); one writer at a time, others skip
// storing. Attributes and resources are not cached: a resource may be destroyed any time.
struct ExactShapeCache {
  // One tensor's words, together (the compare of one tensor touches its slot only). A call
  // with a tensor of rank above kMaxRank is not stored, so every stored rank indexes inside
  // the slot.
  struct Slot {
    // The tensor's rank+dtype word (rank_dtype_word); kNullWord for a null tensor,
    // kEmptyWord before the first store. A call's word is compared only when
    // 0 <= ndim <= kMaxRank, so neither is ever a tensor's word with the other meaning.
    std::atomic<uint64_t> word{kEmptyWord};
    std::atomic<uint64_t> device{0};
    std::atomic<int64_t> shape[kMaxRank] = {};
    // The call's strides, or the row-major strides of its shape when it had none (what a
    // caller's strides are compared with, when it has some).
    std::atomic<int64_t> strides[kMaxRank] = {};
  };
  static constexpr uint64_t kNullWord = 0xffffffffu;   // ndim -1
  static constexpr uint64_t kEmptyWord = 0xfffffffeu;  // ndim -2
  // Even: stable; odd: being written; 0: nothing stored yet.
  std::atomic<uint64_t> seq{0};
  Slot slots[kMaxTensors];

  // True only when t's words equal the stored ones (t.size() must be the plan's count).
  bool matches(std::span<DLTensor* const> t) const;
  // Stores t's words; t must have passed accepts_tensors().
  void remember(std::span<DLTensor* const> t);

  // matches() for exactly N >= 1 tensors (t[0] .. t[N-1]) of the common kind: no loop,
  // constant slot offsets, few registers (CheckPlan::match_shapes, instantiated in
  // check_plan.cpp for arities 1 to 8). kUnusual: a tensor has no shape or a rank outside
  // 1..4, and matches() decides.
  enum class Verdict : uint32_t { kEqual, kDiffers, kUnusual };
  template <size_t N>
  Verdict compare_n(DLTensor* const* t) const;

  // Tensor x against slot i: nonzero when a word differs (nullness included; strides when x
  // has some) or x's shape cannot be read (matches()).
  uint64_t slot_differs(size_t i, const DLTensor* x) const;
  // compare_n's compare of one tensor: 0 when equal, kUnusualBits when compare_n leaves the
  // tensor to matches(), other bits when a word differs (a difference of all ones is taken
  // for kUnusual too, which only costs that call matches()).
  static constexpr uint64_t kUnusualBits = ~uint64_t{0};
  uint64_t compare_slot(size_t i, const DLTensor* x) const;
  template <size_t... I>
  uint64_t compare_slots(DLTensor* const* t, std::index_sequence<I...>) const;
};

struct CheckPlan;
// CheckPlan::match_shapes: t (num_tensors of them) word for word against the plan's ways.
using ShapeMatchFn = bool (*)(const CheckPlan& plan, DLTensor* const* t);
// The matcher for plans of any arity (a loop over num_tensors); make_impl installs one
// specialized for the plan's arity (up to 8 tensors).
bool match_shapes_any(const CheckPlan& plan, DLTensor* const* t);

// Everything a call is checked against, flattened for speed.
struct CheckPlan {
  // KernelHandle::call's inline path reads these first fields (one cache line) and the ways.
  // Chosen at make_impl for the plan's arity: true when the call's tensors equal one way's
  // words (t.size() must be num_tensors).
  ShapeMatchFn match_shapes = &match_shapes_any;
  // The attribute count of the inline path: num_attrs (every attribute given, so no
  // defaults to fill), or -1 when the op takes a resource (its liveness and generation are
  // checked out of line).
  int8_t inline_attrs = 0;
  int8_t num_tensors = 0;
  int8_t num_attrs = 0;
  int32_t device_type = kDLCPU;
  int32_t attr_types[kMaxAttrs] = {};  // KREG_ATTR_* (the inline path compares given ones)
  DTypeMask shared_dtypes = 0;
  int8_t num_required_attrs = 0;  // attributes up to the last one without a default
  int8_t num_symbols = 0;
  uint32_t optional_mask = 0;  // bit i: tensor i may be null ('Tensor?')
  uint32_t host_ok_mask = 0;   // bit i: tensor i may be in host memory ('Tensor@host')
  TensorRule tensors[kMaxTensors];
  kreg_attr defaults[kMaxAttrs] = {};
  // Compiled form for accepts(): the first tensor that takes the shared dtype, the
  // packed DLPack dtypes the shared variable admits, and the shape steps.
  int8_t first_shared = -1;
  uint8_t num_shared_words = 0;
  uint8_t num_pairs = 0;      // shape steps between required tensors
  uint8_t num_opt_pairs = 0;  // then steps from optional tensors (skipped when null)
  uint8_t num_divisors = 0;
  uint32_t shared_words[static_cast<int>(DType::kCount)] = {};
  FastTensor fast[kMaxTensors];
  DimPair pairs[kMaxTensors * kMaxRank];
  DimDivisor divisors[kMaxSymbols];
  // Resource<...> attributes (ABI 1.4): their positions and hash_id(type).
  int8_t num_resources = 0;
  int8_t resource_attrs[kMaxAttrs] = {};
  uint64_t resource_hash[kMaxAttrs] = {};

  // The tensor words of the last kShapeWays distinct calls accepted through accepts_call()
  // (the handle's fast path), replaced round-robin: one op called with a few shapes in
  // turn (rmsnorm over the hidden state, then over q's and k's heads) hits on all of them.
  static constexpr uint32_t kShapeWays = 4;
  mutable ExactShapeCache last[kShapeWays];
  mutable std::atomic<uint32_t> next_way{0};

  // The call path: true when the arguments satisfy the signature. Plain loads and
  // compares, no allocation.
  bool accepts(std::span<DLTensor* const> t, std::span<const kreg_attr> a) const;
  // KernelHandle::call's inline test: every attribute given with its type, no resource,
  // and the tensors equal to one way's words. False says nothing (call_general decides).
  bool accepts_inline(std::span<DLTensor* const> t, std::span<const kreg_attr> a) const;
  // accepts() for a call accepts_inline() refused (KernelHandle::call_general;
  // check_plan.cpp): the tensors compared with the ways unless accepts_inline() just did
  // (all attributes given), then the full check on a miss, remembering what it accepts.
  bool accepts_call(std::span<DLTensor* const> t, std::span<const kreg_attr> a) const;
  // The tensors alone (selection: attributes are checked per call).
  bool accepts_tensors(std::span<DLTensor* const> t) const;
  // The attributes alone: their count, types, and resources (type and liveness).
  bool accepts_attrs(std::span<const kreg_attr> a) const;
  // Off the call path: which argument is wrong, and how (for the error message).
  CheckResult diagnose(std::span<DLTensor* const> t, std::span<const kreg_attr> a) const;
};

struct OpEntry;
struct JitState;

// One registered implementation. Its address is stable for the registry's life.
struct Impl {
  // What a call reads besides the plan, first: the function, the jit kernel, and (at the
  // start of spec) the op id's characters pointer, on one cache line.
  std::atomic<kreg_kernel_fn> fn{nullptr};
  // Backend "jit", on a specialization (kreg/jit.hpp; not in any op table): the loaded
  // kernel, passed in the call frame.
  const void* jit_kernel = nullptr;
  KernelSpec spec;
  CheckPlan plan;
  const KernelBackend* backend = nullptr;
  const OpEntry* op = nullptr;
  std::vector<std::string> string_defaults;  // storage behind plan.defaults[i].value.s
  // Backend "jit". On the op's own record: the source of the running generation (a hot
  // swap stores the new one).
  std::atomic<const JitSource*> jit{nullptr};
  // On the op's record: the specialization chosen last, tried first (its own check says
  // whether it fits), so steady-state by-name calls take no lock. On a specialization:
  // the source it was compiled from and the device it was resolved for.
  mutable std::atomic<const Impl*> jit_last{nullptr};
  const JitSource* jit_origin = nullptr;
  int32_t jit_device = -1;
  // The generation of the group library `fn` belongs to, and the functions of earlier
  // generations (for calls that pass a resource an earlier generation created). A reload
  // appends to `history`, then stores `generation`, then `fn`.
  std::atomic<uint64_t> generation{0};
  mutable std::mutex history_mu;
  std::vector<std::pair<uint64_t, kreg_kernel_fn>> history;
};

// The function of `gen`'s generation of impl's op (null when that generation had none):
// for a call whose resource an earlier generation created (resource.hpp).
kreg_kernel_fn fn_of_generation(const Impl& impl, uint64_t gen);
Status no_generation_error(const Impl& impl, const kreg_resource& r);

struct OpEntry {
  std::string id;
  std::vector<Impl*> impls;  // highest priority first
};

// A string hash that reads eight bytes at a time: op ids are short, and the lookup is on
// Registry::call's path.
inline uint64_t hash_id(std::string_view s) {
  uint64_t h = 0x9e3779b97f4a7c15ull ^ s.size();
  const char* p = s.data();
  size_t n = s.size();
  for (; n >= 8; p += 8, n -= 8) {
    uint64_t w;
    std::memcpy(&w, p, 8);
    h = (h ^ w) * 0xbf58476d1ce4e5b9ull;
    h ^= h >> 31;
  }
  uint64_t tail = 0;
  for (size_t i = 0; i < n; ++i) tail |= uint64_t{static_cast<unsigned char>(p[i])} << (8 * i);
  h = (h ^ tail) * 0x94d049bb133111ebull;
  return h ^ (h >> 29);
}

// Every loaded op by full id: open addressing over a power-of-two table, immutable once
// built (a new one is published when a group's table changes), so reads take no lock.
class OpIndex {
 public:
  explicit OpIndex(const std::vector<const OpEntry*>& ops) {
    size_t cap = 8;
    while (cap < 2 * ops.size()) cap *= 2;
    slots_.resize(cap);
    mask_ = cap - 1;
    for (const OpEntry* op : ops) {
      const uint64_t h = hash_id(op->id);
      size_t i = h & mask_;
      while (slots_[i].op != nullptr) i = (i + 1) & mask_;
      slots_[i] = Slot{h, op};
    }
  }
  const OpEntry* find(std::string_view id) const {
    const uint64_t h = hash_id(id);
    for (size_t i = h & mask_;; i = (i + 1) & mask_) {
      const Slot& s = slots_[i];
      if (s.op == nullptr) return nullptr;
      if (s.hash == h && s.op->id == id) return s.op;
    }
  }

 private:
  struct Slot {
    uint64_t hash = 0;
    const OpEntry* op = nullptr;
  };
  std::vector<Slot> slots_;
  size_t mask_ = 0;
};

// The Status for a kernel that returned `rc`: its message read from the `capacity`-byte
// buffer it was given (a plugin may have filled it without a terminating NUL), escaped.
Status kernel_error(const Impl& impl, int32_t rc, const char* message, size_t capacity);

inline uint32_t pack_dtype(DLDataType t) {
  return uint32_t{t.code} | (uint32_t{t.bits} << 8) | (uint32_t{t.lanes} << 16);
}

inline uint64_t device_word(const DLDevice& d) {
  uint64_t w;
  std::memcpy(&w, &d, sizeof w);
  return w;
}

// ndim and dtype are adjacent in DLTensor: one 8-byte load checks both.
static_assert(offsetof(DLTensor, dtype) == offsetof(DLTensor, ndim) + 4);
inline uint64_t rank_dtype_word(const DLTensor& t) {
  uint64_t w;
  std::memcpy(&w, reinterpret_cast<const char*>(&t) + offsetof(DLTensor, ndim), sizeof w);
  return w;
}
inline uint64_t rank_dtype_word(int32_t ndim, uint32_t dtype) {
  return static_cast<uint32_t>(ndim) | (uint64_t{dtype} << 32);
}

// Host memory a device may read: page-locked (kDLCUDAHost) or plain CPU as PyTorch
// exports pinned tensors (the kernel verifies the pointer is page-locked).
inline bool is_host_memory(DLDevice d) {
  return d.device_type == kDLCUDAHost || d.device_type == kDLCPU;
}

// Explicit strides that describe a row-major contiguous layout. Dimensions of size 1 may
// have any stride, and an empty tensor (a zero dimension) is contiguous whatever its
// strides say (exporters write 0 or anything there).
inline bool strides_row_major(const DLTensor& x) {
  int64_t expect = 1;
  for (int k = x.ndim - 1; k >= 0; --k) {
    if (x.shape[k] == 0) return true;
    if (x.shape[k] != 1 && x.strides[k] != expect) {
      for (int j = k - 1; j >= 0; --j) {
        if (x.shape[j] == 0) return true;
      }
      return false;
    }
    expect *= x.shape[k];
  }
  return true;
}

// A caller's shape is readable and sane: 0 <= ndim <= kMaxCallNdim, a shape array when
// ndim > 0, no negative extent, and the byte size (zero extents counted as one) fits in
// int64. Every later check and every kernel may then multiply extents freely.
inline bool shape_sane(const DLTensor& x) {
  if (static_cast<uint32_t>(x.ndim) > static_cast<uint32_t>(kMaxCallNdim)) return false;
  if (x.ndim > 0 && x.shape == nullptr) return false;
  return check_extents(x.shape, x.ndim, dl_item_bytes(x.dtype.bits, x.dtype.lanes), nullptr) ==
         kShapeOk;
}

// One repeated use of a dimension symbol against its first use: shape == (first / cb) * ca
// (the divisor check rejects a first use cb does not divide). Never overflows: a product
// past int64 cannot equal an extent.
inline bool dim_pair_matches(const DimPair& p, std::span<DLTensor* const> t) {
  const int64_t a = t[p.ta]->shape[p.da];
  if (p.tb == DimPair::kLiteral) return a == p.literal;
  int64_t n = t[p.tb]->shape[p.db];
  // Extents are non-negative here (shape_sane ran first), so a power-of-two coefficient
  // (2*D, the common case) is a shift rather than a 64-bit division on every call.
  if (p.cb_shift > 0) {
    n >>= p.cb_shift;
  } else if (p.cb_shift < 0) {
    n /= p.cb;
  }
  int64_t want;
  return checked_mul(n, p.ca, &want) && a == want;
}

inline bool CheckPlan::accepts(std::span<DLTensor* const> t, std::span<const kreg_attr> a) const {
  return accepts_attrs(a) && accepts_tensors(t);
}

inline bool CheckPlan::accepts_inline(std::span<DLTensor* const> t,
                                      std::span<const kreg_attr> a) const {
  // inline_attrs is -1 (never a size) when a resource must be checked.
  if (a.size() != static_cast<size_t>(inline_attrs)) [[unlikely]]
    return false;
  for (size_t j = 0; j < a.size(); ++j) {
    if (a[j].type != attr_types[j]) [[unlikely]]
      return false;
  }
  return t.size() == static_cast<size_t>(num_tensors) && match_shapes(*this, t.data());
}

inline bool CheckPlan::accepts_attrs(std::span<const kreg_attr> a) const {
  if (a.size() > static_cast<size_t>(num_attrs) ||
      a.size() < static_cast<size_t>(num_required_attrs)) [[unlikely]] {
    return false;
  }
  for (size_t j = 0; j < a.size(); ++j) {
    if (a[j].type != attr_types[j]) [[unlikely]]
      return false;
  }
  // Resources have no default, so they are among the attributes passed.
  for (int k = 0; k < num_resources; ++k) {
    const int j = resource_attrs[k];
    const kreg_resource* r = a[static_cast<size_t>(j)].value.r;
    if (r == nullptr) return false;
    const ResourceSlot* slot = slot_of(r);
    if (slot->type_hash != resource_hash[j] || !slot->live.load(std::memory_order_acquire)) {
      return false;
    }
  }
  return true;
}

inline bool CheckPlan::accepts_tensors(std::span<DLTensor* const> t) const {
  const size_t n = t.size();
  if (n != static_cast<size_t>(num_tensors)) [[unlikely]]
    return false;
  if (n > 0) {
    const DLTensor* x0 = t[0];
    if (x0 == nullptr || x0->device.device_type != device_type) [[unlikely]]
      return false;
    const uint64_t dev0 = device_word(x0->device);
    uint32_t shared = 0;
    if (first_shared >= 0) {
      const DLTensor* s = t[static_cast<size_t>(first_shared)];
      if (s == nullptr) [[unlikely]] {
        // Only optional tensors take the shared dtype: the first one given decides.
        for (size_t i = static_cast<size_t>(first_shared) + 1; s == nullptr && i < n; ++i) {
          if (fast[i].dtypes == 0) s = t[i];
        }
      }
      if (s != nullptr) [[likely]] {
        shared = pack_dtype(s->dtype);
        int k = 0;
        while (k < num_shared_words && shared_words[k] != shared) ++k;
        if (k == num_shared_words) [[unlikely]]
          return false;
      } else if (!((optional_mask >> first_shared) & 1u)) {
        return false;  // a required tensor is null
      }                // else every tensor of the shared dtype was omitted: nothing to agree on
    }
    for (size_t i = 0; i < n; ++i) {
      const DLTensor* x = t[i];
      if (x == nullptr) [[unlikely]] {
        if ((optional_mask >> i) & 1u) continue;
        return false;
      }
      if (device_word(x->device) != dev0) [[unlikely]] {
        if (!((host_ok_mask >> i) & 1u) || !is_host_memory(x->device)) return false;
      }
      const FastTensor& f = fast[i];
      if (f.dtypes == 0) {
        const uint64_t word = rank_dtype_word(*x);
        if (f.ndim >= 0 ? word != rank_dtype_word(f.ndim, shared) : (word >> 32) != shared)
            [[unlikely]] {
          return false;
        }
      } else {
        auto d = from_dl(x->dtype);
        if (!d || !(f.dtypes & mask_of(*d)) || (f.ndim >= 0 && x->ndim != f.ndim)) [[unlikely]] {
          return false;
        }
      }
      if (!shape_sane(*x)) [[unlikely]]
        return false;
      if (x->strides != nullptr && !strides_row_major(*x)) [[unlikely]]
        return false;
    }
    for (int i = 0; i < num_pairs; ++i) {
      if (!dim_pair_matches(pairs[i], t)) [[unlikely]]
        return false;
    }
    for (int i = num_pairs; i < num_pairs + num_opt_pairs; ++i) {
      if (t[pairs[i].ta] == nullptr) continue;
      if (!dim_pair_matches(pairs[i], t)) [[unlikely]]
        return false;
    }
    for (int i = 0; i < num_divisors; ++i) {
      const DimDivisor& d = divisors[i];
      const int64_t v = t[d.tensor]->shape[d.dim];
      if ((d.mask ? (v & d.mask) : (v % d.coef)) != 0) [[unlikely]]
        return false;
    }
  }
  return true;
}

// Bits that differ between a caller's n words and stored ones (n <= kMaxRank: the slot's
// size, said by the caller).
inline uint64_t words_differ(const int64_t* a, const std::atomic<int64_t>* b, uint32_t n) {
  uint64_t d = 0;
  for (uint32_t k = 0; k < n; ++k) {
    d |= static_cast<uint64_t>(a[k] ^ b[k].load(std::memory_order_relaxed));
  }
  return d;
}

inline uint64_t ExactShapeCache::slot_differs(size_t i, const DLTensor* x) const {
  const Slot& slot = slots[i];
  if (x == nullptr) return slot.word.load(std::memory_order_relaxed) ^ kNullWord;
  // The caller's ndim picks how many words are read: of its own arrays as many as the full
  // check reads (it reads ndim <= kMaxCallNdim), of the slot at most kMaxRank. Equal words
  // then say the ranks agree.
  const auto nd = static_cast<uint32_t>(x->ndim);
  const int64_t* xs = x->shape;
  if (nd > static_cast<uint32_t>(kMaxRank) || (xs == nullptr && nd != 0)) return 1;
  const int64_t* st = x->strides;
  return (rank_dtype_word(*x) ^ slot.word.load(std::memory_order_relaxed)) |
         (device_word(x->device) ^ slot.device.load(std::memory_order_relaxed)) |
         words_differ(xs, slot.shape, nd) |
         (st != nullptr ? words_differ(st, slot.strides, nd) : 0);
}

inline bool ExactShapeCache::matches(std::span<DLTensor* const> t) const {
  const uint64_t s = seq.load(std::memory_order_acquire);
  if (s == 0 || (s & 1) || t.size() > static_cast<size_t>(kMaxTensors)) [[unlikely]]
    return false;
  for (size_t i = 0; i < t.size(); ++i) {
    if (slot_differs(i, t[i]) != 0) return false;
  }
  // The loads above happen before the second read of seq: an overlapping store changed it.
  std::atomic_thread_fence(std::memory_order_acquire);
  return seq.load(std::memory_order_relaxed) == s;
}

// Words 0 .. n-1 of a caller's array against stored ones, for 1 <= n <= 4; any other n
// reads nothing and gives ExactShapeCache::kUnusualBits. Constant offsets; ranks tested in
// the order of their frequency in signatures (2, 1, then 3 and 4), each test always
// decided the same way for a tensor of a ranked parameter.
[[gnu::always_inline]] inline uint64_t words_differ_1to4(const int64_t* a,
                                                         const std::atomic<int64_t>* b,
                                                         uint32_t n) {
  auto x = [&](uint32_t k) {
    return static_cast<uint64_t>(a[k] ^ b[k].load(std::memory_order_relaxed));
  };
  if (n == 2) [[likely]]
    return x(0) | x(1);
  if (n == 1) return x(0);
  if (n - 3 > 1) [[unlikely]]
    return ExactShapeCache::kUnusualBits;
  const uint64_t d = x(0) | x(1) | x(2);
  return n == 4 ? d | x(3) : d;
}

[[gnu::always_inline]] inline uint64_t ExactShapeCache::compare_slot(size_t i,
                                                                     const DLTensor* x) const {
  const Slot& slot = slots[i];
  if (x == nullptr) [[unlikely]]  // an optional tensor left out
    return slot.word.load(std::memory_order_relaxed) ^ kNullWord;
  const uint64_t w = rank_dtype_word(*x);
  const int64_t* xs = x->shape;
  if (xs == nullptr) [[unlikely]]
    return kUnusualBits;
  // 1 <= nd <= 4 (else kUnusualBits): as many words of the caller's arrays as the full check
  // reads, inside the slot; equal rank+dtype words then say the ranks agree.
  const auto nd = static_cast<uint32_t>(w);
  uint64_t d = (w ^ slot.word.load(std::memory_order_relaxed)) |
               (device_word(x->device) ^ slot.device.load(std::memory_order_relaxed)) |
               words_differ_1to4(xs, slot.shape, nd);
  if (const int64_t* st = x->strides; st != nullptr) d |= words_differ_1to4(st, slot.strides, nd);
  return d;
}

template <size_t... I>
[[gnu::always_inline]] inline uint64_t ExactShapeCache::compare_slots(
    DLTensor* const* t, std::index_sequence<I...>) const {
  uint64_t d = 0;
  static_cast<void>((((d = compare_slot(I, t[I])) == 0) && ...));  // stops at the first difference
  return d;
}

template <size_t N>
[[gnu::always_inline]] inline ExactShapeCache::Verdict ExactShapeCache::compare_n(
    DLTensor* const* t) const {
  static_assert(N >= 1, "an empty way is told by kEmptyWord in slot 0");
  // Odd (a store in progress): s is then below every later value, so the last test fails.
  const uint64_t s = seq.load(std::memory_order_acquire) & ~uint64_t{1};
  if (const uint64_t d = compare_slots(t, std::make_index_sequence<N>{}); d != 0) {
    return d == kUnusualBits ? Verdict::kUnusual : Verdict::kDiffers;
  }
  // The loads above happen before the second read of seq: an overlapping store changed it.
  std::atomic_thread_fence(std::memory_order_acquire);
  return seq.load(std::memory_order_relaxed) == s ? Verdict::kEqual : Verdict::kDiffers;
}

// Calls fn through the C frame with every attribute (attrs.size() == plan.num_attrs,
// defaults filled in). The arguments must already have passed impl.plan.accepts().
// (options by value: inlined into KernelHandle::call, its fields are the caller's values.)
[[gnu::always_inline]] inline Status invoke_complete(const Impl& impl, kreg_kernel_fn fn,
                                                     std::span<DLTensor* const> tensors,
                                                     std::span<const kreg_attr> attrs,
                                                     CallOptions options) {
  const kreg_call_frame frame{sizeof(kreg_call_frame),
                              tensors.data(),
                              static_cast<int32_t>(tensors.size()),
                              static_cast<int32_t>(attrs.size()),
                              attrs.data(),
                              options.stream,
                              impl.spec.op.c_str(),
                              options.services,
                              options.launch_flags,
                              impl.jit_kernel};
  char message[256];
  message[0] = '\0';
  kreg_error err{sizeof(kreg_error), message, sizeof message};
  const int32_t rc = fn(&frame, &err);
  if (rc != KREG_OK) [[unlikely]] {
    return kernel_error(impl, rc, message, sizeof message);
  }
  return Status();
}

// Whether a checked call moves no element: it has tensors, each one given holds none (a
// zero extent), and the op takes no resource. kreg calls no implementation for such a call;
// it succeeds at once (docs/adding-a-group.md): no kernel loops over 2^40 empty rows or
// launches a grid of zero blocks. An op with a resource is called all the same (a
// collective still meets the other ranks). Off the handle's inline path, which never sees
// such a call (accepts_call does not remember one).
bool moves_nothing(const CheckPlan& plan, std::span<DLTensor* const> tensors);

// invoke() for calls that omit defaulted attributes or pass a resource (check_plan.cpp):
// fills in the defaults and runs the code of the generation that created the resource.
Status invoke_general(const Impl& impl, std::span<DLTensor* const> tensors,
                      std::span<const kreg_attr> attrs, const CallOptions& options);

// Fills in default attributes and calls the kernel through the C frame. The arguments
// must already have passed impl.plan.accepts().
inline Status invoke(const Impl& impl, std::span<DLTensor* const> tensors,
                     std::span<const kreg_attr> attrs, const CallOptions& options) {
  if (attrs.size() != static_cast<size_t>(impl.plan.inline_attrs)) [[unlikely]]
    return invoke_general(impl, tensors, attrs, options);
  return invoke_complete(impl, impl.fn.load(std::memory_order_acquire), tensors, attrs, options);
}

}  // namespace detail

// A named attribute value, for building attribute lists off the hot path.
// A resource passed by name (Resource::named, resource.hpp): a distinct type, so that no
// literal converts to it by accident.
struct ResourceArg {
  const kreg_resource* resource = nullptr;
};

struct NamedAttr {
  std::string name;
  std::variant<int64_t, double, bool, std::string, ResourceArg> value;
};

// Attributes in signature order with defaults filled in; owns its strings.
class AttrList {
 public:
  std::span<const kreg_attr> view() const { return attrs_; }

 private:
  friend class KernelHandle;
  std::vector<kreg_attr> attrs_;
  std::vector<std::unique_ptr<std::string>> strings_;
};

// An op resolved to one implementation. Cheap to copy; valid while its Registry lives.
class KernelHandle {
 public:
  KernelHandle() = default;

  bool valid() const { return impl_ != nullptr; }
  // A jit specialization (kreg/jit.hpp): it accepts only the values it was compiled for
  // (H = 4096, bf16), so a caller that caches handles keeps one per specialization.
  bool specialized() const { return impl_->jit_kernel != nullptr; }
  // Whether these tensors pass the handle's check: no message, no allocation.
  bool accepts_tensors(std::span<DLTensor* const> tensors) const {
    return impl_->plan.accepts_tensors(tensors);
  }
  const KernelSpec& spec() const { return impl_->spec; }
  const std::string& op() const { return impl_->spec.op; }
  const std::string& backend() const { return impl_->spec.backend; }

  // Runs the kernel. `attrs` are positional in signature order; trailing attributes with
  // defaults may be omitted. Errors name the op, the argument and what was expected.
  // Inline: the exact-shape test (attributes all given, tensors equal to an accepted
  // call's words through the plan's arity-specialized compare) and the frame. Everything
  // else (a new shape, defaults, resources, errors) goes through call_general.
  [[gnu::always_inline]] Status call(std::span<DLTensor* const> tensors,
                                     std::span<const kreg_attr> attrs,
                                     const CallOptions& options) const {
    return call_inline(tensors, attrs, options);
  }
  [[gnu::always_inline]] Status call(std::span<DLTensor* const> tensors,
                                     std::span<const kreg_attr> attrs = {},
                                     void* stream = nullptr) const {
    return call_inline(tensors, attrs, CallOptions{stream});
  }

  // Builds a positional attribute list from names (unknown names, wrong types and
  // missing required attributes are errors naming them).
  Result<AttrList> attrs(const std::vector<NamedAttr>& named) const;

 private:
  friend class Registry;
  explicit KernelHandle(const detail::Impl* impl) : impl_(impl) {}
  Status explain(const detail::CheckResult& r, std::span<DLTensor* const> tensors,
                 std::span<const kreg_attr> attrs) const;
  [[gnu::always_inline]] Status call_inline(std::span<DLTensor* const> tensors,
                                            std::span<const kreg_attr> attrs,
                                            CallOptions options) const {
    const detail::Impl& impl = *impl_;
    if (impl.plan.accepts_inline(tensors, attrs)) [[likely]] {
      return detail::invoke_complete(impl, impl.fn.load(std::memory_order_acquire), tensors, attrs,
                                     options);
    }
    return call_general(tensors, attrs, options.stream, options.services, options.launch_flags);
  }
  // call() off its inline path (check_plan.cpp): the ways again, the full check and
  // remember on a miss, defaults, resources, or the error.
  // (The options as scalars: passed in registers, so the inline path's copy of them is
  // never in memory.)
  Status call_general(std::span<DLTensor* const> tensors, std::span<const kreg_attr> attrs,
                      void* stream, const kreg_host_services* services,
                      uint64_t launch_flags) const;

  const detail::Impl* impl_ = nullptr;
};

struct ResolveOptions {
  std::optional<std::string> backend;  // explicit backend: absent -> error
};

// What to resolve for when no tensors exist yet (tools): device and shared dtype.
struct Target {
  DLDevice device{kDLCPU, 0};
  std::optional<DType> dtype;
  // Named dimension sizes, when known (kreg run/bench): a jit implementation is
  // specialized for them (kreg/jit.hpp); without them a target cannot select one.
  std::map<std::string, int64_t> dims;
};

// Where a GroupInfo's plugin and ops come from.
enum class GroupSource : uint8_t {
  kLoaded,    // the loaded library (or in-process registrations)
  kMetadata,  // a lazy group not loaded yet: its library's embedded metadata
  kNone,      // not loaded and no metadata (disabled, or a plugin built before SDK 1.2):
              // ops unknown until it loads
};
const char* group_source_name(GroupSource s);  // "loaded", "metadata", "none"

struct GroupInfo {
  std::string name;
  bool loaded = false;
  bool enabled = true;
  LoadMode load = LoadMode::kEager;
  GroupSource source = GroupSource::kNone;
  std::optional<PluginInfo> plugin;  // when loaded from a library, or from its metadata
  uint64_t generation = 0;           // 1 after the first load
  std::vector<std::string> ops;      // sorted
  std::string error;                 // last load error, if any
  // A lazy group whose metadata could not be read: why (it is listed with ops unknown
  // and still loads on first use).
  std::string metadata_note;
  // The running generation was mapped from a private copy of plugin->path, not from that
  // file itself (which may then be rewritten in place without harm).
  bool private_copy = false;
};

// Every load (open, load_group, a lazy first use) first applies path safety and the
// sha256 pin (kreg/admission.hpp); those cannot be turned off.
struct OpenOptions {
  // Load lazy groups too (tools whose job is loading: validate's dynamic rules, run,
  // bench). Listing needs no load: a lazy group's embedded metadata describes it.
  bool load_lazy_groups = false;
  // Load each group in a child process before loading it here (kreg/plugin_probe.hpp: a
  // fresh kreg-probe process, safe with threads and CUDA), and refuse a group that crashes,
  // hangs, exits or is refused there. Costs a process start and a load per group.
  bool precheck_in_child = false;
  double precheck_timeout_s = 10;
  // Load every group from a private copy of its library (kreg/regular_file.hpp's
  // PrivateCopy) instead of mapping the file itself, so that a build rewriting the file in
  // place cannot truncate code under a running process (SIGBUS). Watch mode needs it. Off
  // by default: the copy costs a file copy per group and space in $TMPDIR for the
  // process's life, and processes no longer share the library's pages. A pinned group is
  // always loaded from a private copy (the hashed bytes are the loaded bytes).
  bool private_copy = false;
};

// Hot swapping (Registry::reload, core/src/reload.cpp; docs/hot-swap.md).
struct ReloadOptions {
  // Load the candidate in a child process first (crash isolation, kreg/plugin_probe.hpp):
  // a library that crashes in its static initializers or init hook is refused without
  // touching this process. The child is a fresh kreg-probe process (no fork of this one).
  bool precheck_in_child = false;
  double precheck_timeout_s = 10;  // the whole child: load, init hook, unload
  // When set and it becomes true, a pre-check in progress is abandoned (its child killed)
  // and reload() fails with CANCELLED: PluginWatcher::stop() need not wait out a hang.
  const std::atomic<bool>* cancel = nullptr;
  // Reserved: a library that lacks an implementation the running generation has is
  // refused either way (its handles would have no code to reach); true changes nothing yet.
  bool allow_removed_ops = false;
  // Load this file instead of the manifest's library path (tests, tools).
  std::filesystem::path library;
};

// An alias followed to its end (Registry::resolve_alias).
struct AliasChain {
  // The name asked for, then each alias target in turn; back() is where the chain ends.
  std::vector<std::string> names;
  std::string message;  // the first alias's deprecation message
  bool found = false;   // back() is a registered op (false: the chain ends at a missing op)
  const std::string& op() const { return names.back(); }
  // "a -> b -> c"
  std::string text() const;
};

struct ReloadReport {
  std::string group;
  uint64_t generation = 0;             // the new generation
  std::string version;                 // the new generation's plugin version
  double latency_ms = 0;               // reload() from start to the swap being visible
  std::vector<std::string> added_ops;  // ops the previous generation did not have
};

class Registry {
 public:
  Registry();
  ~Registry();
  Registry(const Registry&) = delete;
  Registry& operator=(const Registry&) = delete;

  // Creates a registry for the manifest's groups and aliases and loads the enabled eager
  // groups. Fails on the first group that does not load, naming it. Each enabled lazy
  // group's library is admitted (path safety, pin) and its embedded metadata read, not
  // loaded: introspection answers from it, and the library is loaded on the first
  // resolve() or call() of one of its ops. A lazy group without readable metadata is
  // listed with its ops unknown (GroupInfo::metadata_note says why).
  static Result<std::unique_ptr<Registry>> open(const Manifest& manifest,
                                                const OpenOptions& options = {});

  // Loads one group's library (checks as in PluginLibrary::open, then registers its
  // kernels under the duplicate policy, then runs its init hook). All or nothing.
  Status load_group(const GroupEntry& entry);

  // Registers an implementation from this process (tests, benchmarks, embedders).
  // Identical re-registration is a no-op; a conflicting one is an error naming both.
  Status add(const KernelSpec& spec);

  // Hot swap: loads the group's library again (from a private copy of the file, so the
  // build may overwrite the original), admits it only if every implementation the group
  // has keeps its registration (signature, dtypes, capabilities, traits, priority), runs
  // its init hook, then points every existing implementation at the new code (one atomic
  // store each) and publishes its new ops. Handles obtained before stay valid and their
  // next call runs the new code. The previous generation stays mapped until the registry
  // is destroyed. On any error nothing changes and the running generation keeps serving.
  Result<ReloadReport> reload(std::string_view group, const ReloadOptions& options = {});

  // Adds a compatibility alias (old op id -> new op id). Calls through it work and warn
  // once on stderr with `message`. Aliases may chain (a -> b -> c); one that would close a
  // cycle is refused.
  Status add_alias(const std::string& from, const std::string& to, const std::string& message);

  // Not const: resolving an op of a lazy group that is not loaded yet loads it (the op
  // id's prefix names the group; an alias chain's end counts).
  Result<KernelHandle> resolve(std::string_view op, std::span<DLTensor* const> args,
                               const ResolveOptions& options = {});
  Result<KernelHandle> resolve(std::string_view op, const Target& target,
                               const ResolveOptions& options = {});

  // Lookup by name and call: the same selection as resolve() against these arguments,
  // then the call. Allocates nothing on success. Loads a lazy group as resolve() does.
  Status call(std::string_view op, std::span<DLTensor* const> tensors,
              std::span<const kreg_attr> attrs, const CallOptions& options);
  Status call(std::string_view op, std::span<DLTensor* const> tensors,
              std::span<const kreg_attr> attrs = {}, void* stream = nullptr) {
    return call(op, tensors, attrs, CallOptions{stream});
  }

  // Introspection (sorted by name). Never loads anything: a lazy group that is not loaded
  // yet is described by its library's embedded metadata (specs with fn == nullptr).
  std::vector<GroupInfo> groups() const;
  std::vector<std::string> op_ids() const;
  // All implementations of an op, highest priority first; empty if unknown.
  std::vector<const KernelSpec*> implementations(std::string_view op) const;
  // Where `op` leads when it is an alias, following the whole chain (the one rule every
  // lookup uses: resolve, call, the tools, Python). nullopt when `op` is a registered op
  // (a real op wins over an alias of the same name) or no alias at all.
  std::optional<AliasChain> resolve_alias(std::string_view op) const;
  // resolve_alias's end of the chain and the first alias's message, when `op` is an alias.
  std::optional<std::pair<std::string, std::string>> alias(std::string_view op) const;

  // Resources (ABI 1.4, resource.hpp): creates one of `type` ("<group>.<name>", declared
  // by that group's library, which is loaded if lazy) with the type's creation parameters
  // by name (defaults filled in). The registry lock is not held while the plugin's create
  // runs (it may wait for other processes), so a reload may happen meanwhile: the resource
  // then belongs to the generation whose create made it.
  Result<Resource> create_resource(std::string_view type,
                                   const std::vector<NamedAttr>& params = {});
  // The resource types of the loaded groups, sorted.
  std::vector<ResourceTypeInfo> resource_types() const;
  // The resource with this id (Resource::id) for an attribute, live or destroyed (a call
  // with a destroyed one is refused as such); null for an id this registry never made.
  // For bindings that pass resources by id (kreg.torch). Takes the registry lock.
  const kreg_resource* find_resource(uint64_t id) const;

 private:
  struct Group;
  struct Alias {
    std::string to;
    std::string message;
    mutable std::atomic<bool> warned{false};
  };

  struct StringHash {
    using is_transparent = void;
    size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
  };

  // The op's entry in a loaded table; never loads.
  const detail::OpEntry* find_op(std::string_view op) const;
  // find_op, and when that finds nothing and `load`, loads the lazy group the op id names
  // (unless its metadata says it has no such op) and looks again.
  const detail::OpEntry* find_op(std::string_view op, bool load);
  // find_op, else the op at the end of `op`'s alias chain (warning once per alias used);
  // allocates nothing, so Registry::call through an alias stays allocation-free.
  const detail::OpEntry* find_op_or_alias(std::string_view op, bool load);
  // Why find_op_or_alias found nothing for `op`: unknown, an alias to a missing op, or a
  // group that failed to load.
  Status unknown_op(std::string_view op) const;
  // Walks the chain from alias `from`: calls visit(name) for each name after it and stops at
  // the first op that `lookup(name)` finds (returned) or at a name that is neither (nullptr).
  template <typename Lookup, typename Visit>
  const detail::OpEntry* follow_aliases(const Alias& from, Lookup&& lookup, Visit&& visit) const;
  Group* find_group(std::string_view name) const;
  // The metadata's specs of `op` when its group is not loaded yet (priority order).
  std::vector<const KernelSpec*> metadata_specs(std::string_view op) const;
  Status ensure_loaded(Group& g);
  Status add_alias_locked(const std::string& from, const std::string& to,
                          const std::string& message);
  Status load_locked(Group& g);
  void read_metadata_locked(Group& g);
  Status publish_locked(Group& g, const std::vector<KernelSpec>& specs);
  Group& group_locked(const std::string& name);
  // The one selection rule (selection.cpp), for resolve() and call(). Fast when `why` is
  // null: no strings, no allocation. With `attrs`, only an implementation that accepts
  // them too is chosen (call's fast path); without, tensors only. With `why`, the reasons
  // every candidate was rejected are written there when nothing is chosen.
  const detail::Impl* select(std::string_view op, const detail::OpEntry& entry,
                             std::span<DLTensor* const> args, const Target* target,
                             const std::span<const kreg_attr>* attrs, const ResolveOptions* options,
                             std::string* why) const;
  // KREG_FORCE_BACKEND's backend for `op` (points into force_), or null.
  const std::string* forced_backend(std::string_view op) const;
  // A jit implementation specialized for these arguments (jit_specialize.cpp): compiled or
  // taken from the cache and loaded on first use, then found again; null with the reason
  // in `why` (when given) if it cannot be had.
  const detail::Impl* specialize_jit(const detail::Impl& generic, std::span<DLTensor* const> args,
                                     const Target* target, std::string* why) const;

  // Serializes loading and registering (open, load_group, add, add_alias, reload, a lazy
  // load); lookups and calls never take it.
  mutable std::mutex mu_;
  // Groups are created by open() and add() only; their op tables are published
  // atomically, so lookups need no lock while a group loads.
  std::unordered_map<std::string, std::unique_ptr<Group>, StringHash, std::equal_to<>> groups_;
  std::unordered_map<std::string, std::unique_ptr<Alias>, StringHash, std::equal_to<>> aliases_;
  std::vector<std::unique_ptr<detail::Impl>> impls_;
  // Every loaded op by full id, rebuilt (copy-on-write) whenever a group table is
  // published: Registry::call finds an op with one hash lookup.
  std::atomic<const detail::OpIndex*> index_{nullptr};
  std::vector<std::unique_ptr<detail::OpIndex>> indexes_;
  // KREG_FORCE_BACKEND, parsed: (op pattern, backend); pattern "*", "group.*" or an op id.
  std::vector<std::pair<std::string, std::string>> force_;
  // How open() was asked to load; later loads (load_group, lazy groups) follow it.
  OpenOptions open_options_;
  // JIT specializations and the sources they were built from (jit_specialize.cpp).
  std::unique_ptr<detail::JitState> jit_;
  // Every resource ever created (resource.cpp): kept for the registry's life so that a
  // stale attribute finds a dead slot, destroyed first when the registry goes.
  std::vector<std::shared_ptr<detail::ResourceSlot>> resources_;
  uint64_t next_resource_id_ = 1;
  void destroy_resources();
};

// The canonical error message for a rejected selection, exposed for tests.
std::string describe_target(const Target& t);

}  // namespace kreg
