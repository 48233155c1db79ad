#include "kreg/schema.hpp"

#include <gtest/gtest.h>

namespace kreg {
namespace {

TEST(Schema, ParsesTensorsAttributesAndDefaults) {
  auto sig = parse_signature(
      "rmsnorm(Tensor[T,H] x, Tensor[H] weight, Tensor(a!)[T,H] out, float eps=1e-6) -> ()");
  ASSERT_TRUE(sig.ok()) << sig.status().message();
  EXPECT_EQ(sig->name, "rmsnorm");
  EXPECT_EQ(sig->num_tensors, 3);
  EXPECT_EQ(sig->num_attrs, 1);
  EXPECT_EQ(sig->arg_kinds(), "TTTf");
  ASSERT_EQ(sig->symbols.size(), 2u);
  EXPECT_EQ(sig->symbols[0], "T");
  EXPECT_EQ(sig->symbols[1], "H");
  const Param& out = sig->params[2];
  EXPECT_EQ(out.name, "out");
  EXPECT_TRUE(out.mutated);
  EXPECT_EQ(out.alias, "a");
  EXPECT_TRUE(out.written());
  EXPECT_FALSE(out.read());  // "out*" is write-only
  EXPECT_TRUE(sig->params[0].read());
  EXPECT_FALSE(sig->params[0].written());
  const Param& eps = sig->params[3];
  EXPECT_EQ(eps.kind, ArgKind::kFloat);
  ASSERT_TRUE(eps.has_default);
  EXPECT_DOUBLE_EQ(eps.default_value.value.f, 1e-6);
  EXPECT_EQ(eps.default_value.type, KREG_ATTR_FLOAT);
  EXPECT_EQ(sig->shape_name(sig->params[0]), "[T,H]");
}

TEST(Schema, InPlaceTensorIsReadAndWritten) {
  auto sig = parse_signature("f(Tensor(a!)[T,H] x, Tensor(b!)[T,H] residual) -> ()");
  ASSERT_TRUE(sig.ok());
  EXPECT_TRUE(sig->params[0].read());
  EXPECT_TRUE(sig->params[0].written());
  EXPECT_TRUE(sig->params[1].read());
}

TEST(Schema, DimensionExpressionsAndLiterals) {
  auto sig =
      parse_signature("silu_and_mul(Tensor[T, 2*D] x, Tensor(a!)[T,D] out, Tensor[3,4] c) -> ()");
  ASSERT_TRUE(sig.ok()) << sig.status().message();
  const DimExpr& d = sig->params[0].dims[1];
  EXPECT_EQ(d.coef, 2);
  EXPECT_EQ(sig->symbols[static_cast<size_t>(d.symbol)], "D");
  EXPECT_EQ(sig->params[2].dims[0].literal, 3);
  EXPECT_EQ(sig->params[2].dims[0].symbol, -1);
  EXPECT_EQ(sig->shape_name(sig->params[0]), "[T,2*D]");
}

TEST(Schema, ExplicitDtypesAndUnrankedTensors) {
  auto sig = parse_signature("topk(Tensor[T,E] g, Tensor<i32|i64>(a!)[T,K] ids, Tensor any) -> ()");
  ASSERT_TRUE(sig.ok()) << sig.status().message();
  EXPECT_EQ(sig->params[1].dtypes, mask_of(DType::kI32) | mask_of(DType::kI64));
  EXPECT_EQ(sig->params[0].dtypes, 0u);
  EXPECT_FALSE(sig->params[2].ranked);
  EXPECT_EQ(sig->shape_name(sig->params[2]), "[*]");
}

TEST(Schema, AllAttributeTypesWithDefaults) {
  auto sig = parse_signature(
      "f(Tensor x, int k=8, float s=-0.5, bool renorm=true, str method=\"deepseek_v3\", int n) -> "
      "()");
  ASSERT_TRUE(sig.ok()) << sig.status().message();
  EXPECT_EQ(sig->arg_kinds(), "Tifbsi");
  EXPECT_EQ(sig->params[1].default_value.value.i, 8);
  EXPECT_DOUBLE_EQ(sig->params[2].default_value.value.f, -0.5);
  EXPECT_EQ(sig->params[3].default_value.value.i, 1);
  EXPECT_EQ(sig->params[4].default_text, "deepseek_v3");
  EXPECT_FALSE(sig->params[5].has_default);
}

TEST(Schema, EmptyParameterList) {
  auto sig = parse_signature("noop() -> ()");
  ASSERT_TRUE(sig.ok());
  EXPECT_EQ(sig->params.size(), 0u);
}

TEST(Schema, OptionalTensors) {
  auto sig = parse_signature("f(Tensor[T,E] x, Tensor?<f32>[E] bias, Tensor(a!)[T] out) -> ()");
  ASSERT_TRUE(sig.ok()) << sig.status().message();
  EXPECT_EQ(sig->arg_kinds(), "TOT");
  EXPECT_TRUE(sig->params[1].optional);
  EXPECT_FALSE(sig->params[0].optional);
  EXPECT_EQ(sig->params[1].dtypes, mask_of(DType::kF32));
}

TEST(Schema, HostMemoryTensors) {
  auto sig =
      parse_signature("f(Tensor<i64>[N] idx, Tensor@host[M,R] src, Tensor(a!)[M,R] dst) -> ()");
  ASSERT_TRUE(sig.ok()) << sig.status().message();
  EXPECT_TRUE(sig->params[1].host_ok);
  EXPECT_FALSE(sig->params[2].host_ok);
  EXPECT_EQ(sig->arg_kinds(), "TTT");
}

struct BadCase {
  const char* text;
  const char* expect;  // substring of the error
};

class SchemaErrors : public ::testing::TestWithParam<BadCase> {};

TEST_P(SchemaErrors, NamesTheProblemAndColumn) {
  auto sig = parse_signature(GetParam().text);
  ASSERT_FALSE(sig.ok()) << GetParam().text;
  EXPECT_EQ(sig.status().code(), KREG_INVALID_ARGUMENT);
  EXPECT_NE(sig.status().message().find(GetParam().expect), std::string::npos)
      << sig.status().message();
  EXPECT_NE(sig.status().message().find("column"), std::string::npos);
}

INSTANTIATE_TEST_SUITE_P(
    Bad, SchemaErrors,
    ::testing::Values(BadCase{"(Tensor x) -> ()", "expected an op name"},
                      BadCase{"f Tensor x -> ()", "expected '(' after the op name"},
                      BadCase{"f(Tensor x)", "expected '->'"},
                      BadCase{"f(Tensor x) -> Tensor", "outputs are passed as Tensor(a!)"},
                      BadCase{"f(Tensor x, Tensor x) -> ()", "duplicate parameter name 'x'"},
                      BadCase{"f(Tensor<q8> x) -> ()", "unknown dtype 'q8'"},
                      BadCase{"f(Tensor[T,] x) -> ()", "expected a dimension"},
                      BadCase{"f(Tensor[0*T] x) -> ()", "coefficient must be positive"},
                      BadCase{"f(Tensor(!) x) -> ()", "expected an alias name"},
                      BadCase{"f(tensor x) -> ()", "unknown parameter type 'tensor'"},
                      BadCase{"f(float eps=abc) -> ()", "is not a number"},
                      BadCase{"f(int k=1.5) -> ()", "is not an integer"},
                      BadCase{"f(bool b=yes) -> ()", "must be true or false"},
                      BadCase{"f(str s=abc) -> ()", "quoted string default"},
                      BadCase{"f(Tensor x) -> () extra", "expected the end of the signature"},
                      BadCase{"f(Tensor[T,H x) -> ()", "expected ',' or ']'"},
                      BadCase{"f(Tensor? x, Tensor y) -> ()", "first tensor cannot be optional"},
                      BadCase{"f(Tensor@host x) -> ()", "first tensor cannot be Tensor@host"},
                      BadCase{"f(Tensor x, Tensor@device y) -> ()", "expected 'host' after '@'"},
                      BadCase{"f(Tensor[T] x, Tensor?[E] b) -> ()",
                              "dimension 'E' of optional tensor 'b' is not used by any"}));

}  // namespace
}  // namespace kreg
