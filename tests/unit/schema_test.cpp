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
                      BadCase{"f(Tensor[0*T] x) -> ()",
                              "dimension coefficient: '0' is out of range [1, 2147483647]"},
                      BadCase{"f(Tensor(!) x) -> ()", "expected an alias name"},
                      BadCase{"f(tensor x) -> ()", "unknown parameter type 'tensor'"},
                      BadCase{"f(float eps=abc) -> ()", "is not a finite number"},
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

// Every number in a signature is parsed completely and range-checked: nothing wraps,
// truncates to 32 bits or reads as 0.
INSTANTIATE_TEST_SUITE_P(
    Numbers, SchemaErrors,
    ::testing::Values(
        BadCase{"f(Tensor[4294967296*N] x) -> ()",
                "dimension coefficient: '4294967296' is out of range [1, 2147483647]"},
        BadCase{"f(Tensor[2147483648*N] x) -> ()", "'2147483648' is out of range [1, 2147483647]"},
        BadCase{"f(Tensor[2147483649*N] x) -> ()", "'2147483649' is out of range"},
        BadCase{"f(Tensor[T, 99999999999999999999*N] x) -> ()", "column 13: dimension coefficient"},
        BadCase{"f(Tensor[99999999999999999999] x) -> ()",
                "dimension: '99999999999999999999' is out of range [0, 9223372036854775807]"},
        BadCase{"f(Tensor[9223372036854775808] x) -> ()", "out of range [0, 9223372036854775807]"},
        BadCase{"f(Tensor[-1] x) -> ()", "a dimension cannot be negative"},
        BadCase{"f(Tensor[-2*N] x) -> ()", "a dimension cannot be negative"},
        BadCase{"f(Tensor[4abc] x) -> ()", "expected ',' or ']', found 'a'"},
        BadCase{"f(Tensor[2*3] x) -> ()", "expected a dimension"},
        BadCase{"f(Tensor[2**N] x) -> ()", "expected a dimension"},
        BadCase{"f(int k=abc) -> ()", "column 9: default of int 'k': 'abc' is not an integer"},
        BadCase{"f(int k=4abc) -> ()", "'4abc' is not an integer"},
        BadCase{"f(int k=+4) -> ()", "'+4' is not an integer"},
        BadCase{"f(int k=0x10) -> ()", "is not an integer"},
        BadCase{"f(int k=) -> ()", "'' is not an integer"},
        BadCase{"f(int k=-) -> ()", "'-' is not an integer"},
        BadCase{"f(int k=9223372036854775808) -> ()",
                "'9223372036854775808' is out of range [-9223372036854775808, "
                "9223372036854775807]"},
        BadCase{"f(int k=-9223372036854775809) -> ()", "is out of range"},
        BadCase{"f(int k=1e3) -> ()", "is not an integer"},
        BadCase{"f(float eps=inf) -> ()", "default of float 'eps': 'inf' is not a finite number"},
        BadCase{"f(float eps=-inf) -> ()", "is not a finite number"},
        BadCase{"f(float eps=nan) -> ()", "is not a finite number"},
        BadCase{"f(float eps=infinity) -> ()", "is not a finite number"},
        BadCase{"f(float eps=1e400) -> ()", "'1e400' is out of range for a double"},
        BadCase{"f(float eps=-1e400) -> ()", "out of range for a double"},
        BadCase{"f(float eps=1e-6x) -> ()", "is not a finite number"},
        BadCase{"f(float eps=+1.0) -> ()", "is not a finite number"},
        BadCase{"f(float eps=0x1p3) -> ()", "is not a finite number"},
        BadCase{"f(float eps=1e) -> ()", "is not a finite number"},
        BadCase{"f(float eps=1.0.0) -> ()", "is not a finite number"},
        BadCase{"f(bool b=yes) -> ()", "default of bool 'b' must be true or false, got 'yes'"},
        BadCase{"f(bool b=2) -> ()", "must be true or false"}));

// The core's limits hold for every Signature the parser returns (the check plan has fixed
// arrays): the parser refuses more, naming the limit.
std::string repeat(const std::string& item, int n, const std::string& sep = ", ") {
  std::string s;
  for (int i = 0; i < n; ++i) s += (i ? sep : "") + item + std::to_string(i);
  return s;
}

TEST(Schema, RefusesMoreThanTheCoresLimits) {
  struct Case {
    std::string text;
    std::string expect;
  } cases[] = {
      {"f(" + repeat("Tensor t", kMaxTensors + 1) + ") -> ()", "more than 16 tensors"},
      {"f(Tensor x, " + repeat("int a", kMaxAttrs + 1) + ") -> ()", "more than 16 attributes"},
      {"f(Tensor[" + repeat("", kMaxRank + 1, ",").substr(0) + "] x) -> ()",
       "more than 8 dimensions in one tensor"},
      {"f(Tensor[" + repeat("A", 8, ",") + "] x, Tensor[" + repeat("B", 8, ",") +
           "] y, Tensor[Z] z) -> ()",
       "more than 16 dimension names"},
      {"f(" + std::string(kMaxSignatureBytes, ' ') + ") -> ()", "longer than 4096 bytes"},
  };
  for (const Case& c : cases) {
    auto sig = parse_signature(c.text);
    ASSERT_FALSE(sig.ok()) << c.text;
    EXPECT_NE(sig.status().message().find(c.expect), std::string::npos) << sig.status().message();
    EXPECT_LT(sig.status().message().size(), 700u) << "the message quotes an excerpt only";
  }
  // Exactly at the limits parses.
  EXPECT_TRUE(parse_signature("f(" + repeat("Tensor t", kMaxTensors) + ", " +
                              repeat("int a", kMaxAttrs) + ") -> ()")
                  .ok());
  EXPECT_TRUE(parse_signature("f(Tensor[" + repeat("A", 8, ",") + "] x, Tensor[" +
                              repeat("B", 8, ",") + "] y) -> ()")
                  .ok());
}

TEST(Schema, NumbersAtTheEdgesOfTheirRanges) {
  auto sig = parse_signature(
      "f(Tensor[2147483647*N, 9223372036854775807, 0] x, int lo=-9223372036854775808, "
      "int hi=9223372036854775807, float big=1.7e308, float tiny=-0.0, float e=1E-6, "
      "float n=3, bool t=True, bool f=false) -> ()");
  ASSERT_TRUE(sig.ok()) << sig.status().message();
  EXPECT_EQ(sig->params[0].dims[0].coef, 2147483647);
  EXPECT_EQ(sig->params[0].dims[1].literal, INT64_MAX);
  EXPECT_EQ(sig->params[0].dims[2].literal, 0);
  EXPECT_EQ(sig->params[1].default_value.value.i, INT64_MIN);
  EXPECT_EQ(sig->params[2].default_value.value.i, INT64_MAX);
  EXPECT_DOUBLE_EQ(sig->params[3].default_value.value.f, 1.7e308);
  EXPECT_DOUBLE_EQ(sig->params[5].default_value.value.f, 1e-6);
  EXPECT_DOUBLE_EQ(sig->params[6].default_value.value.f, 3.0);
  EXPECT_EQ(sig->params[7].default_value.value.i, 1);
  EXPECT_EQ(sig->params[8].default_value.value.i, 0);
}

TEST(Schema, NulInsideAStringDefaultIsRefused) {
  const std::string text("f(Tensor x, str s=\"a\0b\") -> ()", 29);
  ASSERT_EQ(text.find('\0'), 20u);
  auto sig = parse_signature(text);
  ASSERT_FALSE(sig.ok());
  EXPECT_NE(sig.status().message().find("string default of 's' contains a NUL byte"),
            std::string::npos)
      << sig.status().message();
  // The message shows the NUL escaped, never raw.
  EXPECT_EQ(sig.status().message().find('\0'), std::string::npos);
  EXPECT_NE(sig.status().message().find("\\0"), std::string::npos);
}

}  // namespace
}  // namespace kreg
