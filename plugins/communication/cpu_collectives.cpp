// The CPU transport of the communication group (comm.hpp): collectives through the store.
//
// Each collective is one exchange: every rank sets "<name>/<seq>/<rank>" to a record (a
// 16-byte header and its bytes, or an error message), gets every other rank's, and adds 1
// to "<name>/<seq>/done"; the rank that brings the counter to world_size has seen every
// rank finish reading, and erases the collective's keys. Results are computed from the
// records in rank order, so every rank computes bitwise the same values.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "comm.hpp"
#include "kreg/dtype.hpp"
#include "kreg/dtype_visit.hpp"
#include "kreg/numeric.hpp"

namespace kreg::communication {
namespace {

enum class Kind : uint8_t { kAllReduce = 1, kAllGather = 2, kReduceScatter = 3, kAddRmsnorm = 4 };

constexpr char kMagic[4] = {'K', 'C', 'C', '1'};
constexpr size_t kHeaderBytes = 16;
constexpr uint8_t kStatusData = 0;
constexpr uint8_t kStatusError = 1;
// A peer's error message is cut to this many bytes in ours.
constexpr size_t kMaxPeerMessage = 512;

struct Header {
  Kind kind{};
  uint8_t dtype = 0;  // kreg::DType
  uint8_t redop = 0;  // ReduceOp
  uint8_t status = kStatusData;
  int64_t count = 0;  // elements (data) or bytes (error message)
};

std::string encode(const Header& h, const void* body, size_t body_bytes) {
  std::string out(kHeaderBytes + body_bytes, '\0');
  std::memcpy(out.data(), kMagic, 4);
  out[4] = static_cast<char>(h.kind);
  out[5] = static_cast<char>(h.dtype);
  out[6] = static_cast<char>(h.redop);
  out[7] = static_cast<char>(h.status);
  std::memcpy(out.data() + 8, &h.count, 8);
  if (body_bytes > 0) std::memcpy(out.data() + kHeaderBytes, body, body_bytes);
  return out;
}

bool decode(const std::string& rec, Header* h) {
  if (rec.size() < kHeaderBytes || std::memcmp(rec.data(), kMagic, 4) != 0) return false;
  h->kind = static_cast<Kind>(static_cast<uint8_t>(rec[4]));
  h->dtype = static_cast<uint8_t>(rec[5]);
  h->redop = static_cast<uint8_t>(rec[6]);
  h->status = static_cast<uint8_t>(rec[7]);
  std::memcpy(&h->count, rec.data() + 8, 8);
  return true;
}

const char* dtype_text(uint8_t d) {
  switch (static_cast<DType>(d)) {
    case DType::kF32:
      return "f32";
    case DType::kF16:
      return "f16";
    case DType::kBF16:
      return "bf16";
    default:
      return "an unknown dtype";
  }
}

std::string dl_text(DLDataType t) {
  const auto d = from_dl(t);
  if (d && (*d == DType::kF32 || *d == DType::kF16 || *d == DType::kBF16)) {
    return dtype_text(static_cast<uint8_t>(*d));
  }
  return "dlpack(code=" + std::to_string(t.code) + ",bits=" + std::to_string(t.bits) +
         ",lanes=" + std::to_string(t.lanes) + ")";
}

std::string num(int64_t v) { return std::to_string(v); }

// The checks every tensor of the CPU transport needs; "" when fine. *dtype: its DType.
std::string check_tensor(const char* op, const char* arg, const DLTensor& t, DType* dtype) {
  if (t.device.device_type != kDLCPU && t.device.device_type != kDLCUDAHost) {
    return std::string(op) + ": " + arg + " is on DLPack device type " + num(t.device.device_type) +
           "; the CPU transport takes CPU tensors";
  }
  if (!detail::is_contiguous(t)) return std::string(op) + ": " + arg + " must be contiguous";
  const auto d = from_dl(t.dtype);
  if (!d || (*d != DType::kF32 && *d != DType::kF16 && *d != DType::kBF16)) {
    return std::string(op) + ": " + arg + " has dtype " + dl_text(t.dtype) +
           "; f32, f16 or bf16 expected";
  }
  *dtype = *d;
  return "";
}

std::string check_same_dtype(const char* op, const char* arg, const DLTensor& t, const char* ref,
                             DType want) {
  DType d{};
  std::string e = check_tensor(op, arg, t, &d);
  if (e.empty() && d != want) {
    e = std::string(op) + ": " + arg + " has dtype " + dtype_text(static_cast<uint8_t>(d)) +
        " but " + ref + " has " + dtype_text(static_cast<uint8_t>(want));
  }
  return e;
}

size_t elem_bytes(DType d) { return d == DType::kF32 ? 4 : 2; }

// What this rank sends: its data, or the reason it cannot take part.
struct Outgoing {
  Header header;
  const void* data = nullptr;
  std::string error;  // non-empty: this rank's own argument error
};

// One exchange (see the top of the file). On success *records holds every rank's record in
// rank order (this rank's own included) and every record has been checked against ours:
// same kind, dtype, reduction and count, right size. A rank's own error is returned after
// the exchange, so that the ranks stay in step and the others learn it.
KernelStatus exchange(Context& ctx, const char* op, Comm& c, Outgoing out,
                      std::vector<std::string>* records) {
  const size_t esize = elem_bytes(static_cast<DType>(out.header.dtype));
  const size_t bytes = static_cast<size_t>(out.header.count) * esize;
  if (out.error.empty() && c.world_size > 1 && bytes > comm::kMaxStoreValueBytes - kHeaderBytes) {
    // Still published (as an error), so that the other ranks fail at once too.
    out.error = std::string(op) + ": " + c.where() + ": " + num(out.header.count) + " elements (" +
                std::to_string(bytes) + " bytes) are more than the store carries in one value (" +
                std::to_string(comm::kMaxStoreValueBytes - kHeaderBytes) + " bytes)";
  }
  const std::lock_guard<std::mutex> lock(c.mutex);
  if (!c.broken.empty()) {
    return ctx.fail(KREG_FAILED_PRECONDITION,
                    "%s: %s: the comm is unusable after an earlier failure: %s", op,
                    c.where().c_str(), c.broken.c_str());
  }
  const uint64_t seq = c.seq++;
  if (!out.error.empty() && c.world_size == 1) {
    return ctx.fail(KREG_INVALID_ARGUMENT, "%s", out.error.c_str());
  }
  std::string mine;
  if (!out.error.empty()) {
    Header h = out.header;
    h.status = kStatusError;
    h.count = static_cast<int64_t>(out.error.size());
    mine = encode(h, out.error.data(), out.error.size());
  } else {
    mine = encode(out.header, out.data, bytes);
  }
  if (c.world_size == 1) {
    records->assign(1, std::move(mine));
    return kOk;
  }

  const std::string prefix = c.name + "/" + std::to_string(seq) + "/";
  const std::string url = c.store->url();
  std::string err;
  auto broken = [&](std::string why) {
    c.broken = std::move(why);
    return ctx.fail(KREG_UNAVAILABLE, "%s: %s", op, c.broken.c_str());
  };
  if (!c.store->set(prefix + num(c.rank), mine, &err)) {
    return broken(c.where() + ": publishing this rank's data (collective " + std::to_string(seq) +
                  ") in " + url + ": " + err);
  }
  records->assign(static_cast<size_t>(c.world_size), std::string());
  for (int64_t r = 0; r < c.world_size; ++r) {
    if (r == c.rank) continue;
    if (!c.store->get(prefix + num(r), c.timeout_s, &(*records)[r], &err)) {
      return broken(c.where() + ": waiting for rank " + num(r) + "'s data (collective " +
                    std::to_string(seq) + ") in " + url + ": " + err);
    }
  }
  int64_t done = 0;
  if (!c.store->add(prefix + "done", 1, &done, &err)) {
    return broken(c.where() + ": counting the ranks done with collective " + std::to_string(seq) +
                  " in " + url + ": " + err);
  }
  if (done == c.world_size) {
    for (int64_t r = 0; r < c.world_size; ++r) {
      if (!c.store->erase(prefix + num(r), &err)) {
        return broken(c.where() + ": cleaning up collective " + std::to_string(seq) + " in " + url +
                      ": " + err);
      }
    }
    if (!c.store->erase(prefix + "done", &err)) {
      return broken(c.where() + ": cleaning up collective " + std::to_string(seq) + " in " + url +
                    ": " + err);
    }
  }
  (*records)[c.rank] = std::move(mine);

  if (!out.error.empty()) return ctx.fail(KREG_INVALID_ARGUMENT, "%s", out.error.c_str());
  for (int64_t r = 0; r < c.world_size; ++r) {
    if (r == c.rank) continue;
    const std::string& rec = (*records)[r];
    Header theirs;
    const std::string who = c.where() + ": rank " + num(r);
    if (!decode(rec, &theirs) || theirs.kind != out.header.kind) {
      return ctx.fail(KREG_INVALID_ARGUMENT,
                      "%s: %s sent a record of another collective for collective %llu (%zu "
                      "bytes): the ranks called different ops",
                      op, who.c_str(), static_cast<unsigned long long>(seq), rec.size());
    }
    if (theirs.status == kStatusError) {
      const size_t n = rec.size() - kHeaderBytes;
      const std::string msg =
          comm::detail::escape(std::string_view(rec).substr(kHeaderBytes, n), kMaxPeerMessage);
      return ctx.fail(KREG_ABORTED, "%s: %s failed: %s", op, who.c_str(), msg.c_str());
    }
    if (theirs.dtype != out.header.dtype) {
      return ctx.fail(KREG_INVALID_ARGUMENT, "%s: %s has dtype %s, this rank %s", op, who.c_str(),
                      dtype_text(theirs.dtype), dtype_text(out.header.dtype));
    }
    if (theirs.redop != out.header.redop) {
      return ctx.fail(KREG_INVALID_ARGUMENT, "%s: %s reduces with '%s', this rank with '%s'", op,
                      who.c_str(),
                      theirs.redop <= 4 ? reduce_op_name(static_cast<ReduceOp>(theirs.redop)) : "?",
                      reduce_op_name(static_cast<ReduceOp>(out.header.redop)));
    }
    if (theirs.count != out.header.count) {
      return ctx.fail(KREG_INVALID_ARGUMENT, "%s: %s has %lld elements, this rank %lld", op,
                      who.c_str(), static_cast<long long>(theirs.count),
                      static_cast<long long>(out.header.count));
    }
    if (rec.size() != kHeaderBytes + static_cast<size_t>(out.header.count) * esize) {
      return ctx.fail(KREG_INVALID_ARGUMENT, "%s: %s sent %zu bytes for %lld elements", op,
                      who.c_str(), rec.size(), static_cast<long long>(out.header.count));
    }
  }
  return kOk;
}

template <typename T>
float load_at(const std::string& rec, int64_t i) {
  T v;
  std::memcpy(&v, rec.data() + kHeaderBytes + static_cast<size_t>(i) * sizeof(T), sizeof(T));
  return load_as_float(v);
}

float combine(ReduceOp op, float acc, float v) {
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAvg:
      return acc + v;
    case ReduceOp::kProd:
      return acc * v;
    case ReduceOp::kMax:
      return v > acc ? v : acc;
    case ReduceOp::kMin:
      return v < acc ? v : acc;
  }
  return acc;
}

// out[i] = reduce over ranks (in rank order) of records[r][begin + i], rounded once.
template <typename T>
void reduce_into(const std::vector<std::string>& records, ReduceOp op, int64_t begin, int64_t count,
                 T* out) {
  std::vector<float> acc(static_cast<size_t>(count));
  for (int64_t i = 0; i < count; ++i) acc[i] = load_at<T>(records[0], begin + i);
  for (size_t r = 1; r < records.size(); ++r) {
    for (int64_t i = 0; i < count; ++i)
      acc[i] = combine(op, acc[i], load_at<T>(records[r], begin + i));
  }
  const auto world = static_cast<float>(records.size());
  for (int64_t i = 0; i < count; ++i) {
    out[i] = store_from_float<T>(op == ReduceOp::kAvg ? acc[i] / world : acc[i]);
  }
}

// The reduction named by `op`, or an error message.
std::string parse_op(const char* kop, std::string_view op, ReduceOp* out) {
  const auto r = parse_reduce_op(op);
  if (!r) {
    return std::string(kop) + ": op '" + comm::detail::escape(op) +
           "' is not one of sum, prod, max, min, avg";
  }
  *out = *r;
  return "";
}

// layernorm.fused_add_rmsnorm's arithmetic (plugins/layernorm/reference.cpp), the same
// operations in the same order: the sum of squares of the fp32 sums in double, the norm
// of the unrounded fp32 sum, one rounding at each store.
template <typename T>
void fused_add_rmsnorm_rows(T* x, T* residual, const T* w, int64_t rows, int64_t hidden,
                            float eps) {
  if (hidden == 0) return;  // rows of no elements: nothing to do, however many (T may be huge)
  for (int64_t r = 0; r < rows; ++r) {
    T* xr = x + r * hidden;
    T* rr = residual + r * hidden;
    double sum_sq = 0.0;
    for (int64_t i = 0; i < hidden; ++i) {
      const double s = load_as_float(xr[i]) + load_as_float(rr[i]);
      sum_sq += s * s;
    }
    const float scale =
        1.0f / std::sqrt(static_cast<float>(sum_sq / static_cast<double>(hidden)) + eps);
    for (int64_t i = 0; i < hidden; ++i) {
      const float s = load_as_float(xr[i]) + load_as_float(rr[i]);
      rr[i] = store_from_float<T>(s);
      xr[i] = store_from_float<T>(s * scale * load_as_float(w[i]));
    }
  }
}

}  // namespace

KernelStatus all_reduce_cpu(Context& ctx, DLTensor& x, Comm& comm, std::string_view op) {
  constexpr const char* kOp = "communication.all_reduce";
  DType dtype = DType::kF32;
  ReduceOp redop = ReduceOp::kSum;
  Outgoing out;
  out.error = check_tensor(kOp, "x", x, &dtype);
  if (out.error.empty()) out.error = parse_op(kOp, op, &redop);
  out.header = {Kind::kAllReduce, static_cast<uint8_t>(dtype), static_cast<uint8_t>(redop),
                kStatusData, numel(x)};
  out.data = data_ptr<const void>(x);
  std::vector<std::string> records;
  const KernelStatus s = exchange(ctx, kOp, comm, out, &records);
  if (!s.ok()) return s;
  return host::visit_float_dtype(ctx, kOp, x, [&](auto tag) {
    using T = decltype(tag);
    reduce_into<T>(records, redop, 0, numel(x), data_ptr<T>(x));
  });
}

KernelStatus all_gather_cpu(Context& ctx, const DLTensor& x, DLTensor& out, Comm& comm) {
  constexpr const char* kOp = "communication.all_gather";
  DType dtype = DType::kF32;
  Outgoing o;
  o.error = check_tensor(kOp, "x", x, &dtype);
  if (o.error.empty()) o.error = check_same_dtype(kOp, "out", out, "x", dtype);
  int64_t want = 0;
  if (o.error.empty() &&
      (__builtin_mul_overflow(numel(x), comm.world_size, &want) || numel(out) != want)) {
    o.error = std::string(kOp) + ": out has " + num(numel(out)) + " elements; world size " +
              num(comm.world_size) + " times x's " + num(numel(x)) + " expected";
  }
  o.header = {Kind::kAllGather, static_cast<uint8_t>(dtype), 0, kStatusData, numel(x)};
  o.data = data_ptr<const void>(x);
  std::vector<std::string> records;
  const KernelStatus s = exchange(ctx, kOp, comm, o, &records);
  if (!s.ok()) return s;
  const size_t block = static_cast<size_t>(numel(x)) * elem_bytes(dtype);
  auto* dst = data_ptr<char>(out);
  for (size_t r = 0; r < records.size(); ++r) {
    if (block > 0) std::memcpy(dst + r * block, records[r].data() + kHeaderBytes, block);
  }
  return kOk;
}

KernelStatus reduce_scatter_cpu(Context& ctx, const DLTensor& x, DLTensor& out, Comm& comm,
                                std::string_view op) {
  constexpr const char* kOp = "communication.reduce_scatter";
  DType dtype = DType::kF32;
  ReduceOp redop = ReduceOp::kSum;
  Outgoing o;
  o.error = check_tensor(kOp, "x", x, &dtype);
  if (o.error.empty()) o.error = check_same_dtype(kOp, "out", out, "x", dtype);
  if (o.error.empty()) o.error = parse_op(kOp, op, &redop);
  int64_t want = 0;
  if (o.error.empty() &&
      (__builtin_mul_overflow(numel(out), comm.world_size, &want) || numel(x) != want)) {
    o.error = std::string(kOp) + ": x has " + num(numel(x)) + " elements; world size " +
              num(comm.world_size) + " times out's " + num(numel(out)) + " expected";
  }
  // Every rank sends all of x (the transport is the simple one, not the fast one).
  o.header = {Kind::kReduceScatter, static_cast<uint8_t>(dtype), static_cast<uint8_t>(redop),
              kStatusData, numel(x)};
  o.data = data_ptr<const void>(x);
  std::vector<std::string> records;
  const KernelStatus s = exchange(ctx, kOp, comm, o, &records);
  if (!s.ok()) return s;
  return host::visit_float_dtype(ctx, kOp, out, [&](auto tag) {
    using T = decltype(tag);
    const int64_t n = numel(out);
    reduce_into<T>(records, redop, comm.rank * n, n, data_ptr<T>(out));
  });
}

KernelStatus all_reduce_add_rmsnorm_cpu(Context& ctx, DLTensor& x, DLTensor& residual,
                                        const DLTensor& weight, Comm& comm, double eps) {
  constexpr const char* kOp = "communication.all_reduce_add_rmsnorm";
  DType dtype = DType::kF32;
  Outgoing o;
  o.error = check_tensor(kOp, "x", x, &dtype);
  if (o.error.empty()) o.error = check_same_dtype(kOp, "residual", residual, "x", dtype);
  if (o.error.empty()) o.error = check_same_dtype(kOp, "weight", weight, "x", dtype);
  if (o.error.empty() && x.ndim != 2) {
    o.error = std::string(kOp) + ": x has " + num(x.ndim) + " dimensions; [T, H] expected";
  }
  const int64_t hidden = o.error.empty() ? x.shape[1] : 0;
  if (o.error.empty() &&
      (residual.ndim != 2 || residual.shape[0] != x.shape[0] || residual.shape[1] != hidden)) {
    o.error = std::string(kOp) + ": residual must have x's shape [" + num(x.shape[0]) + ", " +
              num(hidden) + "]";
  }
  if (o.error.empty() && numel(weight) != hidden) {
    o.error = std::string(kOp) + ": weight has " + num(numel(weight)) +
              " elements; H = " + num(hidden) + " expected";
  }
  o.header = {Kind::kAddRmsnorm, static_cast<uint8_t>(dtype), 0, kStatusData, numel(x)};
  o.data = data_ptr<const void>(x);
  std::vector<std::string> records;
  const KernelStatus s = exchange(ctx, kOp, comm, o, &records);
  if (!s.ok()) return s;
  return host::visit_float_dtype(ctx, kOp, x, [&](auto tag) {
    using T = decltype(tag);
    reduce_into<T>(records, ReduceOp::kSum, 0, numel(x), data_ptr<T>(x));
    fused_add_rmsnorm_rows<T>(data_ptr<T>(x), data_ptr<T>(residual), data_ptr<const T>(weight),
                              x.shape[0], hidden, static_cast<float>(eps));
  });
}

}  // namespace kreg::communication
