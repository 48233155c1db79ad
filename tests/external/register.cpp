// The example group's ops, registered by op (kreg/plugin.hpp). The version comes from
// kreg_add_plugin(example VERSION 1.0.0 ...).
#include "example.hpp"

namespace example {
namespace {

constexpr kreg::Op kOps[] = {
    {.signature = "axpy(Tensor[N] x, Tensor[N] y, Tensor(a!)[N] out, float alpha=1.0) -> ()",
     .dtypes = "f32|f64",
     .description = "out = alpha * x + y",
     .impls = {kreg::cpu(kreg::bind<&axpy_cpu>, "reference.cpp")}},
    {.signature = "axmy(Tensor[N] x, Tensor[N] y, Tensor(a!)[N] out, float alpha=1.0) -> ()",
     .dtypes = "f32|f64",
     .description = "out = alpha * x - y",
     .impls = {kreg::cpu(kreg::bind<&axpy_cpu>, "reference.cpp")}},
};

}  // namespace
}  // namespace example

KREG_GROUP("example", example::kOps);
