// The embeddings group's ops, registered by op (kreg/plugin.hpp).
#include "embeddings.hpp"

namespace kreg::embeddings {
namespace {

constexpr Op kOps[] = {
    {.signature = "lookup(Tensor<i32|i64>[T] ids, Tensor[V,H] table, Tensor(a!)[T,H] out, "
                  "Tensor?<i32>(b!)[1] invalid) -> ()",
     .dtypes = "bf16|f16|f32",
     .description =
         "Embedding lookup: out[t] = table[ids[t]] (bit-exact copy); an id outside [0, V) "
         "writes a zero row and adds 1 to the optional device-side counter invalid (which "
         "accumulates: the caller zeroes it). CUDA: a warp per 128-word chunk of a row, "
         "16-byte words where H and the pointers allow, ids read on the device (no host "
         "sync), evict-first stores, PDL",
     .impls = {cpu(bind<&lookup_cpu>, "reference.cpp"),
               KREG_IF_CUDA(cuda(bind<&lookup_cuda>, "lookup.cu"))}},
    {.signature = "vocab_parallel_lookup(Tensor<i32|i64>[T] ids, Tensor[Vs,H] table_shard, "
                  "Tensor(a!)[T,H] out, int vocab_start) -> ()",
     .dtypes = "bf16|f16|f32",
     .description =
         "One rank's part of a vocab-parallel embedding: ids in [vocab_start, vocab_start + "
         "Vs) read row id - vocab_start of the shard, all others write a zero row (a sum over "
         "the ranks is the full lookup). vocab_start < 0 or vocab_start + Vs past int64: "
         "argument error. CUDA: the lookup kernel with an offset",
     .impls = {cpu(bind<&vocab_parallel_lookup_cpu>, "reference.cpp"),
               KREG_IF_CUDA(cuda(bind<&vocab_parallel_lookup_cuda>, "lookup.cu"))}},
};

}  // namespace
}  // namespace kreg::embeddings

KREG_GROUP("embeddings", kreg::embeddings::kOps);
