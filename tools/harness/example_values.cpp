#include "example_values.hpp"

#include <algorithm>
#include <climits>
#include <numeric>
#include <string>
#include <unordered_map>
#include <vector>

namespace kreg::harness {
namespace {

// topk_ids[T, K] over the op's num_experts: what moe.topk_softmax / grouped_topk produce.
Status routing_ids_over_num_experts(const ExampleSetting& s, Buffer& buf, std::mt19937_64& rng) {
  const std::optional<int64_t> experts = s.int_attr("num_experts");
  // Outside what an int32 id can name (or none at all) the op refuses the call: keep the
  // random fill and let its message say why.
  if (!experts || *experts < 1 || *experts > (int64_t{1} << 31)) return OkStatus();
  return fill_routing_ids(buf, *experts, rng);
}

// The first `picks` values (picks <= n) of a uniform random permutation of [0, n): a
// partial Fisher-Yates shuffle that keeps only the swapped positions, so time and memory
// follow `picks` however large n is (an --attr or --shape past int32's range must not
// allocate a pool of that size).
std::vector<int64_t> random_distinct(int64_t n, int64_t picks, std::mt19937_64& rng) {
  std::unordered_map<int64_t, int64_t> swapped;
  auto at = [&](int64_t i) {
    const auto it = swapped.find(i);
    return it == swapped.end() ? i : it->second;
  };
  std::vector<int64_t> out(static_cast<size_t>(picks));
  for (int64_t j = 0; j < picks; ++j) {
    std::uniform_int_distribution<int64_t> pick(j, n - 1);
    const int64_t r = pick(rng);
    const int64_t vj = at(j), vr = at(r);
    swapped[r] = vj;
    out[static_cast<size_t>(j)] = vr;
  }
  return out;
}

// A size from the example's --shape, nullopt when absent or past what an int32 index (the
// table's and the lengths' type) can hold: the generator then keeps the random fill.
std::optional<int64_t> int32_size(const ExampleSetting& s, const char* name) {
  const auto it = s.symbols.find(name);
  if (it == s.symbols.end() || it->second < 1 || it->second > INT32_MAX) return std::nullopt;
  return it->second;
}

// attention.decode's block_table[B, M]: the first B * M values of a random permutation of
// the N pages, dealt out row by row (repeating once all N are dealt), so a sequence's pages
// are distinct (N >= M) and scattered over the cache.
Status decode_scattered_pages(const ExampleSetting& s, Buffer& buf, std::mt19937_64& rng) {
  const std::optional<int64_t> pages = int32_size(s, "N");
  if (!pages || buf.shape().size() != 2) return OkStatus();
  const int64_t total = buf.numel();
  const std::vector<int64_t> dealt = random_distinct(*pages, std::min(total, *pages), rng);
  std::vector<double> v(static_cast<size_t>(total));
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<double>(dealt[i % dealt.size()]);
  return buf.from_doubles(v);
}

// attention.decode's seq_lens[B]: every sequence as long as its table holds (M * P tokens),
// the context the --shape describes.
Status decode_full_lengths(const ExampleSetting& s, Buffer& buf, std::mt19937_64&) {
  const std::optional<int64_t> m = int32_size(s, "M"), p = int32_size(s, "P");
  if (!m || !p || *m * *p > INT32_MAX) return OkStatus();
  return buf.from_doubles(
      std::vector<double>(static_cast<size_t>(buf.numel()), static_cast<double>(*m * *p)));
}

// The table. Add a row per (op, tensor) whose values must look like a model's.
constexpr ExampleValues kTable[] = {
    {"moe.align_block_size", "topk_ids",
     "routing ids: each row's K experts distinct, uniform over num_experts",
     routing_ids_over_num_experts},
    {"attention.decode", "block_table",
     "each sequence's M pages distinct, a random permutation of the N pages",
     decode_scattered_pages},
    {"attention.decode", "seq_lens", "every sequence full: M * P tokens", decode_full_lengths},
};

}  // namespace

std::optional<int64_t> ExampleSetting::int_attr(std::string_view name) const {
  size_t n = 0;
  for (const Param& p : spec.signature.params) {
    if (p.is_tensor()) continue;
    const size_t index = n++;
    if (p.name != name) continue;
    if (index < attrs.size()) {
      const kreg_attr& a = attrs[index];
      if (a.type == KREG_ATTR_INT) return a.value.i;
      return std::nullopt;
    }
    if (p.has_default && p.default_value.type == KREG_ATTR_INT) return p.default_value.value.i;
    return std::nullopt;
  }
  return std::nullopt;
}

std::span<const ExampleValues> example_values() { return kTable; }

Status fill_routing_ids(Buffer& buf, int64_t num_experts, std::mt19937_64& rng) {
  if (buf.shape().size() != 2) {
    return Status(KREG_INVALID_ARGUMENT, "fill_routing_ids: a [T, K] tensor, not rank " +
                                             std::to_string(buf.shape().size()));
  }
  if (num_experts < 1) {
    return Status(KREG_INVALID_ARGUMENT, "fill_routing_ids: num_experts = " +
                                             std::to_string(num_experts) + " must be positive");
  }
  const int64_t T = buf.shape()[0], K = buf.shape()[1];
  if (T == 0 || K == 0) return OkStatus();  // no ids to draw, however many empty rows
  // Per row the first min(K, E) values of a random permutation of the experts: a uniform
  // random choice in random order, in O(K) time and memory however large num_experts is.
  const int64_t picks = std::min(K, num_experts);
  std::vector<double> values;
  values.reserve(static_cast<size_t>(T * K));
  for (int64_t t = 0; t < T; ++t) {
    const std::vector<int64_t> row = random_distinct(num_experts, picks, rng);
    for (int64_t j = 0; j < K; ++j)
      values.push_back(static_cast<double>(row[static_cast<size_t>(j % picks)]));
  }
  return buf.from_doubles(values);
}

Status apply_example_values(const KernelSpec& spec, const SymbolMap& symbols,
                            std::span<const kreg_attr> attrs, ExampleArgs& args, uint64_t seed) {
  const ExampleSetting setting{spec, symbols, attrs};
  // A stream of its own, so that the table does not shift make_example's random fill.
  std::mt19937_64 rng(seed ^ 0x6a09e667f3bcc909ull);
  for (const ExampleValues& row : kTable) {
    if (row.op != spec.op) continue;
    size_t n = 0;
    for (const Param& p : spec.signature.params) {
      if (!p.is_tensor()) continue;
      Buffer* buf = args.buffer(n++);
      if (p.name != row.tensor || buf == nullptr || !p.read()) continue;
      if (Status st = row.make(setting, *buf, rng); !st.ok()) {
        return Status(st.code(), spec.op + " example '" + p.name + "': " + st.message());
      }
    }
  }
  return OkStatus();
}

}  // namespace kreg::harness
