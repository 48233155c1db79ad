// Realistic example values for the tensors whose uniform random fill (Buffer::fill_random:
// integers in [0, 16)) means nothing to their op: expert ids that routing would produce,
// say. A small explicit table maps (op, tensor name) to a generator; make_example runs the
// generators of its op after the random fill, so `kreg run` and `kreg bench` time and
// check these ops on the inputs they see in a model.
#pragma once

#include <cstdint>
#include <optional>
#include <random>
#include <span>
#include <string_view>

#include "harness.hpp"

namespace kreg::harness {

// What a generator is given: the op's signature, the example's sizes and the call's
// attributes (positional, as a call takes them; trailing ones may be omitted and then take
// the signature's defaults; empty when make_example is called without attributes).
struct ExampleSetting {
  const KernelSpec& spec;
  const SymbolMap& symbols;
  std::span<const kreg_attr> attrs;

  // Integer attribute `name`: the call's value, else the signature's default; nullopt when
  // neither is there (or `name` is no int attribute of the op).
  std::optional<int64_t> int_attr(std::string_view name) const;
};

// Overwrites `buf` (built and randomly filled from the signature) with realistic values. A
// generator that lacks what it needs (an attribute not given) leaves the random fill.
using ExampleGenerator = Status (*)(const ExampleSetting& setting, Buffer& buf,
                                    std::mt19937_64& rng);

struct ExampleValues {
  std::string_view op;      // "moe.align_block_size"
  std::string_view tensor;  // the tensor parameter's name: "topk_ids"
  std::string_view what;    // what the values are, for documentation and reports
  ExampleGenerator make;
};

// The table (example_values.cpp).
std::span<const ExampleValues> example_values();

// Runs every table entry of spec.op over `args` (tensors found by name; absent ones and
// write-only outputs are skipped), each generator with its own random stream drawn from
// `seed`, so one seed gives the same example every time.
Status apply_example_values(const KernelSpec& spec, const SymbolMap& symbols,
                            std::span<const kreg_attr> attrs, ExampleArgs& args, uint64_t seed);

// Expert ids as top-k routing produces them, for a [T, K] tensor over `num_experts`
// experts: each row's K ids distinct (K <= num_experts; beyond that each expert once
// before any repeats), every row a uniform random choice in random order.
Status fill_routing_ids(Buffer& buf, int64_t num_experts, std::mt19937_64& rng);

}  // namespace kreg::harness
