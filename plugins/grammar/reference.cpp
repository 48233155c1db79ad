// CPU reference of the grammar group: the plain bit loop that defines what the CUDA
// kernel computes.
#include <cstdint>
#include <limits>

#include "grammar.hpp"
#include "kreg/dtype.hpp"
#include "kreg/dtype_visit.hpp"
#include "kreg/numeric.hpp"

namespace kreg::grammar {
namespace {

// Token v of a row is allowed when bit v % 32 of word v / 32 is set; a disallowed logit
// becomes -inf, an allowed one is not written.
template <typename T>
void mask_row(T* logits, const int32_t* words, int64_t vocab) {
  const T neg_inf = store_from_float<T>(-std::numeric_limits<float>::infinity());
  for (int64_t v = 0; v < vocab; ++v) {
    const auto word = static_cast<uint32_t>(words[v / 32]);
    if (((word >> (v % 32)) & 1u) == 0) logits[v] = neg_inf;
  }
}

}  // namespace

KernelStatus apply_token_bitmask_cpu(Context& ctx, DLTensor& logits, const DLTensor& bitmask,
                                     const DLTensor* indices) {
  if (KernelStatus st = check_args(ctx, logits, bitmask, indices); !st.ok()) return st;
  const int64_t batch = logits.shape[0];
  const int64_t vocab = logits.shape[1];
  const int64_t words = bitmask.shape[1];
  const int32_t* mask = data_ptr<const int32_t>(bitmask);
  const int32_t* rows = indices ? data_ptr<const int32_t>(*indices) : nullptr;
  const int64_t count = indices ? indices->shape[0] : batch;
  // Every index is checked before any row is masked, so a refused call writes nothing.
  for (int64_t r = 0; r < count && rows; ++r) {
    if (rows[r] < 0 || rows[r] >= batch) {
      return ctx.fail(KREG_INVALID_ARGUMENT, "%s: indices[%lld] = %d is outside [0, B = %lld)",
                      ctx.op(), static_cast<long long>(r), rows[r], static_cast<long long>(batch));
    }
  }
  if (vocab == 0) return kOk;  // rows of no logits: nothing to mask, however many (B may be huge)
  return host::visit_float_dtype(ctx, ctx.op(), logits, [&](auto tag) {
    using T = decltype(tag);
    T* base = data_ptr<T>(logits);
    for (int64_t r = 0; r < count; ++r) {
      const int64_t row = rows ? rows[r] : r;
      mask_row(base + row * vocab, mask + row * words, vocab);
    }
  });
}

}  // namespace kreg::grammar
