// kreg signatures as torch.library schemas (tools/python/torch_schema.cpp): the text torch
// parses, the functional form's results and why an op has none. Torch-free, so it runs
// where no torch is installed.
#include "torch_schema.hpp"

#include <gtest/gtest.h>

#include <cstdlib>

namespace kreg::python {
namespace {

TorchOpPlan plan(std::string_view op, std::string_view sig_text) {
  auto sig = parse_signature(sig_text);
  EXPECT_TRUE(sig.ok()) << sig.status().message();
  auto p = plan_torch_op(op, *sig);
  EXPECT_TRUE(p.ok()) << p.status().message();
  return p.ok() ? *p : TorchOpPlan{};
}

TEST(TorchSchema, KregFormAndAllocatingFunctionalForm) {
  const auto p = plan("layernorm.rmsnorm",
                      "rmsnorm(Tensor[T,H] x, Tensor[H] weight, Tensor(a!)[T,H] out, "
                      "float eps=1e-6) -> ()");
  EXPECT_EQ(p.ns, "kreg_layernorm");
  EXPECT_EQ(p.name, "rmsnorm");
  EXPECT_EQ(p.schema, "rmsnorm(Tensor x, Tensor weight, Tensor(a!) out, float eps=1e-06) -> ()");
  EXPECT_EQ(p.functional_name, "rmsnorm_functional");
  EXPECT_EQ(p.functional_schema,
            "rmsnorm_functional(Tensor x, Tensor weight, float eps=1e-06) -> Tensor");
  EXPECT_TRUE(p.reason.empty());
  ASSERT_EQ(p.inputs, (std::vector<int>{0, 1, 3}));
  ASSERT_EQ(p.results.size(), 1u);
  const TorchResult& r = p.results[0];
  EXPECT_EQ(r.param, 2);
  EXPECT_EQ(r.clone_of, -1);
  EXPECT_EQ(r.dtype_input, 0);  // the shared dtype, from x
  ASSERT_EQ(r.dims.size(), 2u);
  EXPECT_EQ(r.dims[0].input, 0);  // T from x dim 0
  EXPECT_EQ(r.dims[0].axis, 0);
  EXPECT_EQ(r.dims[1].input, 0);  // H from x dim 1 (its first binding)
  EXPECT_EQ(r.dims[1].axis, 1);
}

TEST(TorchSchema, InPlaceTensorsAreCopiedAndReturnedInOrder) {
  const auto p = plan("layernorm.fused_add_rmsnorm",
                      "fused_add_rmsnorm(Tensor(a!)[T,H] x, Tensor(b!)[T,H] residual, "
                      "Tensor[H] weight, float eps=1e-6) -> ()");
  EXPECT_EQ(p.schema,
            "fused_add_rmsnorm(Tensor(a!) x, Tensor(b!) residual, Tensor weight, float "
            "eps=1e-06) -> ()");
  EXPECT_EQ(p.functional_schema,
            "fused_add_rmsnorm_functional(Tensor x, Tensor residual, Tensor weight, float "
            "eps=1e-06) -> (Tensor, Tensor)");
  ASSERT_EQ(p.results.size(), 2u);
  EXPECT_EQ(p.results[0].clone_of, 0);
  EXPECT_EQ(p.results[1].clone_of, 1);
}

TEST(TorchSchema, CoefficientsFixedDtypesOptionalsAndAttributeDefaults) {
  const auto p = plan("g.op",
                      "op(Tensor[T,2*D] x, Tensor?<f32>[D] bias, Tensor<i32>(z!)[T,D,4] out_ids, "
                      "int k=-3, bool flag=true, str mode=\"a\\b\", float s=0.1) -> ()");
  // kreg's alias letters are free-form; torch's are numbered from 'a'.
  EXPECT_EQ(p.schema,
            "op(Tensor x, Tensor? bias, Tensor(a!) out_ids, int k=-3, bool flag=True, str "
            "mode=\"a\\\\b\", float s=0.1) -> ()");
  EXPECT_EQ(p.functional_schema,
            "op_functional(Tensor x, Tensor? bias, int k=-3, bool flag=True, str mode=\"a\\\\b\", "
            "float s=0.1) -> Tensor");
  ASSERT_EQ(p.results.size(), 1u);
  const TorchResult& r = p.results[0];
  EXPECT_EQ(r.dtype_input, -1);
  EXPECT_EQ(r.dtype, DType::kI32);
  ASSERT_EQ(r.dims.size(), 3u);
  EXPECT_EQ(r.dims[1].input, 0);  // D = x.size(1) / 2
  EXPECT_EQ(r.dims[1].axis, 1);
  EXPECT_EQ(r.dims[1].divisor, 2);
  EXPECT_EQ(r.dims[1].coef, 1);
  EXPECT_EQ(r.dims[2].literal, 4);
}

TEST(TorchSchema, FloatDefaultsRoundTrip) {
  for (const char* v : {"1e-6", "0.5", "3", "1e300", "-2.5e-12", "0.1"}) {
    const auto p = plan("g.f", std::string("f(Tensor x, float a=") + v + ") -> ()");
    const auto eq = p.schema.find("a=");
    ASSERT_NE(eq, std::string::npos);
    const std::string lit = p.schema.substr(eq + 2, p.schema.find(')', eq) - eq - 2);
    EXPECT_EQ(std::strtod(lit.c_str(), nullptr), std::strtod(v, nullptr)) << lit;
    EXPECT_NE(lit.find_first_of(".e"), std::string::npos) << lit;  // a float literal, not an int
  }
}

TEST(TorchSchema, OpsWithoutAFunctionalFormSayWhy) {
  struct Case {
    const char* sig;
    const char* reason;
  };
  for (const Case& c : {
           Case{"a(Tensor[T,E] x, Tensor<i32>(a!)[T,K] out_ids, int k) -> ()",
                "dimension K of the output 'out_ids' is not given by any input"},
           Case{"a(Tensor x, Tensor(a!) out) -> ()", "the output 'out' has no declared shape"},
           Case{"a(Tensor[N] x, Tensor<i32|i64>(a!)[N] out) -> ()",
                "the output 'out' may have several dtypes (i32|i64)"},
           Case{"a(Tensor<f32>[N] x, Tensor(a!)[N] out) -> ()",
                "no input carries the shared dtype of the output 'out'"},
           Case{"a(Tensor[N] x, Tensor?(a!)[N] out) -> ()", "the written tensor 'out' is optional"},
           Case{"a(Tensor x, int code) -> ()", "the op writes no tensor"},
       }) {
    const auto p = plan("g.a", c.sig);
    EXPECT_TRUE(p.functional_schema.empty()) << c.sig;
    EXPECT_EQ(p.reason, c.reason) << c.sig;
    EXPECT_FALSE(p.schema.empty()) << c.sig;  // the kreg form always exists
  }
}

TEST(TorchSchema, RefusesWhatTorchCannotParse) {
  auto sig = parse_signature("f(Tensor x, float a=inf) -> ()");
  if (sig.ok()) {
    auto p = plan_torch_op("g.f", *sig);
    ASSERT_FALSE(p.ok());
    EXPECT_NE(p.status().message().find("not finite"), std::string::npos) << p.status().message();
  }
  auto ok = parse_signature("f(Tensor x) -> ()");
  ASSERT_TRUE(ok.ok());
  EXPECT_FALSE(plan_torch_op("nogroup", *ok).ok());
  EXPECT_FALSE(plan_torch_op("bad-group.f", *ok).ok());
}

}  // namespace
}  // namespace kreg::python

namespace kreg::python {
namespace {

// A resource parameter travels as its registry id: a plain int in both schemas.
TEST(TorchSchema, ResourcesBecomeIntIds) {
  const auto p = plan("communication.all_reduce",
                      "all_reduce(Tensor(a!) x, Resource<communication.comm> comm, "
                      "str op=\"sum\") -> ()");
  EXPECT_EQ(p.schema, "all_reduce(Tensor(a!) x, int comm, str op=\"sum\") -> ()");
  EXPECT_NE(p.functional_schema.find("int comm"), std::string::npos) << p.functional_schema;
}

}  // namespace
}  // namespace kreg::python
