// The command-line tools as a user runs them: `kreg list/info/run` and `kreg-host` on the
// default manifest, with their exit codes and the lines a user reads.
#include <gtest/gtest.h>

#include <sys/wait.h>
#include <array>
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

namespace {

struct Outcome {
  int exit_code = -1;
  std::string output;  // stdout and stderr
};

Outcome run(const std::string& args) {
  const std::string cmd =
      "cd " KREG_SOURCE_DIR " && KREG_PLUGIN_DIR=" KREG_PLUGIN_DIR " KREG_FORCE_BACKEND= " + args +
      " 2>&1";
  Outcome r;
  FILE* p = popen(cmd.c_str(), "r");
  if (p == nullptr) return r;
  std::array<char, 4096> buf{};
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), p)) > 0) r.output.append(buf.data(), n);
  const int status = pclose(p);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

const std::string kCli = KREG_CLI;

TEST(Tools, ListShowsTheSevenOpsWithTheirBackends) {
  Outcome r = run(kCli + " list");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  for (const char* op :
       {"layernorm.rmsnorm", "layernorm.fused_add_rmsnorm", "layernorm.gemma_rmsnorm",
        "layernorm.gemma_fused_add_rmsnorm", "activation.silu_and_mul", "activation.gelu_and_mul",
        "activation.gelu_tanh_and_mul"}) {
    EXPECT_NE(r.output.find(op), std::string::npos) << op << "\n" << r.output;
  }
  // CUDA builds list cuda first (priority), CPU-only builds the reference alone.
  EXPECT_TRUE(r.output.find("cuda,cpu") != std::string::npos ||
              r.output.find(" cpu ") != std::string::npos)
      << r.output;
  Outcome json = run(kCli + " list --group layernorm --json");
  ASSERT_EQ(json.exit_code, 0);
  EXPECT_EQ(json.output.find("activation."), std::string::npos);
  EXPECT_NE(json.output.find("\"op\":\"layernorm.rmsnorm\""), std::string::npos) << json.output;
  EXPECT_EQ(run(kCli + " list --group nosuch").exit_code, 2);
}

TEST(Tools, InfoFollowsAliases) {
  Outcome r = run(kCli + " info activation.silu_mul");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("activation.silu_and_mul"), std::string::npos);
  EXPECT_NE(r.output.find("deprecated alias"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("silu_and_mul(Tensor[T,2*D] x, Tensor(a!)[T,D] out) -> ()"),
            std::string::npos);
  EXPECT_EQ(run(kCli + " info layernorm.nosuch").exit_code, 2);
}

TEST(Tools, RunComparesWithTheReference) {
  Outcome r = run(kCli +
                  " run layernorm.fused_add_rmsnorm --shape T=3,H=100 --dtype f16 --backend cpu "
                  "--attr eps=1e-5");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("residual"), std::string::npos);
  EXPECT_NE(r.output.find("OK"), std::string::npos);
  Outcome missing = run(kCli + " run layernorm.rmsnorm --shape T=3 --backend cpu");
  EXPECT_EQ(missing.exit_code, 2);
  EXPECT_NE(missing.output.find("--shape needs a size for 'H'"), std::string::npos)
      << missing.output;
  Outcome bad_attr =
      run(kCli + " run layernorm.rmsnorm --shape T=3,H=8 --backend cpu --attr epsilon=1");
  EXPECT_EQ(bad_attr.exit_code, 2);
  EXPECT_NE(bad_attr.output.find("unknown attribute 'epsilon' (attributes: eps)"),
            std::string::npos);
  EXPECT_EQ(run(kCli + " run layernorm.rmsnorm --shape T=x --backend cpu").exit_code, 2);
  EXPECT_EQ(run(kCli + " frobnicate").exit_code, 2);
}

// Every number on the command line is parsed completely and range-checked, every size
// overflow-checked and compared with free memory before anything is allocated: each bad
// value is a usage error (exit 2) whose message names the option and the problem.
TEST(Tools, RunRefusesEveryBadNumberNamingTheArgument) {
  struct Case {
    std::string args;
    std::string expect;
  } cases[] = {
      {"layernorm.rmsnorm --shape T=3,H=8 --attr eps=abc",
       "--attr eps: 'abc' is not a finite number"},
      {"layernorm.rmsnorm --shape T=3,H=8 --attr eps=1e-5x", "--attr eps: '1e-5x' is not a finite"},
      {"layernorm.rmsnorm --shape T=3,H=8 --attr eps=nan", "--attr eps: 'nan' is not a finite"},
      {"layernorm.rmsnorm --shape T=3,H=8 --attr eps=inf", "--attr eps: 'inf' is not a finite"},
      {"layernorm.rmsnorm --shape T=3,H=8 --attr eps=1e400",
       "'1e400' is out of range for a double"},
      {"layernorm.rmsnorm --shape T=3,H=8 --attr eps=", "--attr eps: '' is not a finite number"},
      {"layernorm.rmsnorm --shape T=3,H=8 --attr eps=1e-5 --attr eps=1e-6",
       "--attr eps is given twice"},
      {"moe.topk_softmax --shape T=4,E=8,K=2 --attr renormalize=yes",
       "--attr renormalize: 'yes' is not a bool (true, false, 1 or 0)"},
      {"moe.topk_softmax --shape T=4,E=8,K=2 --attr renormalize=TRUE", "is not a bool"},
      {"moe.grouped_topk --shape T=4,E=8,K=2 --attr n_group=4abc --attr topk_group=1",
       "--attr n_group: '4abc' is not an integer"},
      {"moe.grouped_topk --shape T=4,E=8,K=2 --attr n_group=99999999999999999999 --attr "
       "topk_group=1",
       "--attr n_group: '99999999999999999999' is out of range"},
      {"layernorm.rmsnorm --shape T=3,H=8 --seed=-1",
       "--seed: '-1' is out of range [0, 18446744073709551615]"},
      {"layernorm.rmsnorm --shape T=3,H=8 --seed 18446744073709551616",
       "--seed: "
       "'18446744073709551616' "
       "is out of range"},
      {"layernorm.rmsnorm --shape T=3,H=8 --seed 12abc", "--seed: '12abc' is not a non-negative"},
      {"layernorm.rmsnorm --shape T=3,H=8,T=4", "--shape: dimension 'T' is given twice"},
      {"layernorm.rmsnorm --shape T=3,H=8,X=2", "'X'"},
      {"layernorm.rmsnorm --shape T=4abc,H=8", "--shape T: '4abc' is not an integer"},
      {"layernorm.rmsnorm --shape T=-1,H=8",
       "--shape T: '-1' is out of range [0, 9223372036854775807]"},
      {"layernorm.rmsnorm --shape T=99999999999999999999,H=8",
       "--shape T: '99999999999999999999' is out of range [0, 9223372036854775807]"},
      {"layernorm.rmsnorm --shape T=+3,H=8", "--shape T: '+3' is not an integer"},
      {"layernorm.rmsnorm --shape T=0x10,H=8", "--shape T: '0x10' is not an integer"},
      {"layernorm.rmsnorm --shape T=3,,H=8", "--shape: '' is not NAME=SIZE"},
      {"layernorm.rmsnorm --shape T=3,H=8,", "--shape: '' is not NAME=SIZE"},
      {"layernorm.rmsnorm --shape T=3,=8", "--shape: '=8' is not NAME=SIZE"},
      // 2^61 * 8 elements: the element count would wrap to 0.
      {"layernorm.rmsnorm --shape T=2305843009213693952,H=8",
       "tensor 'x' [T,H] with T=2305843009213693952, H=8: shape [2305843009213693952,8] of bf16 "
       "(2 bytes each) is more than 9223372036854775807 bytes"},
      {"layernorm.rmsnorm --shape T=9223372036854775807,H=9223372036854775807", "is more than"},
      // No elements, but T * 4 bytes overflows: refused, and the message says why.
      {"layernorm.rmsnorm --shape T=4611686018427387904,H=0",
       "holds no elements, but its nonzero extents come to more than 9223372036854775807 bytes"},
      // 2*D overflows before any product does.
      {"activation.silu_and_mul --shape T=1,D=4611686018427387904",
       "dimension 2*D = 2 * 4611686018427387904 overflows int64"},
      // Fits int64, not this machine: refused before a byte is allocated (no bad_alloc).
      {"layernorm.rmsnorm --shape T=99999999999,H=8", "of host memory, more than the"},
      {"layernorm.rmsnorm --shape T=99999999999,H=8", "nothing was allocated"},
  };
  for (const Case& c : cases) {
    Outcome r = run(kCli + " run " + c.args + " --backend cpu");
    EXPECT_EQ(r.exit_code, 2) << c.args << "\n" << r.output;
    EXPECT_NE(r.output.find(c.expect), std::string::npos) << c.args << "\n" << r.output;
    EXPECT_EQ(r.output.find("OK"), std::string::npos) << c.args << "\n" << r.output;
  }
  // The edges of the ranges run.
  Outcome ok =
      run(kCli +
          " run layernorm.rmsnorm --shape T=0,H=8 --backend cpu --seed 18446744073709551615 "
          "--attr eps=1e-5");
  EXPECT_EQ(ok.exit_code, 0) << ok.output;
  Outcome b = run(kCli +
                  " run moe.topk_softmax --shape T=4,E=8,K=2 --backend cpu --attr "
                  "renormalize=true");
  EXPECT_EQ(b.exit_code, 0) << b.output;
  // num_experts past int32 (and at int64's end) reaches the op's own check: the example
  // table does not build an id pool of that size (it used to end in std::length_error).
  for (const char* e : {"9223372036854775807", "2147483648"}) {
    Outcome huge = run(kCli +
                       " run moe.align_block_size --shape T=4,K=2,P=64,B=4 --dtype i32 "
                       "--backend cpu --attr block_size=16 --attr num_experts=" +
                       e);
    EXPECT_NE(huge.output.find("attribute 'num_experts' = " + std::string(e) +
                               " must be between 1 and 2048"),
              std::string::npos)
        << huge.output;
    EXPECT_EQ(huge.output.find("terminate"), std::string::npos) << huge.output;
  }
  // bench's own usage errors (exit 2, the message naming the problem). Stable inputs are a
  // promise about what the previous kernel of a PDL chain writes: meaningless without
  // --pdl. --after needs the producer's shape, checked like the op's (against the CPU
  // reference here: no GPU is needed to learn that the arguments are wrong).
  for (const auto& [args, says] : std::vector<std::pair<std::string, std::string>>{
           {"--reps 0", "--reps: '0' is out of range [1, 1000000]"},
           {"--stable-inputs", "--stable-inputs requires --pdl"},
           {"--after attention.rope", "--after requires --after-shape"},
           {"--after attention.rope --after-shape T=1",
            "attention.rope: --after-shape needs a size for 'Hq'"},
           {"--after attention.rope --after-shape ''", "--after-shape: empty"},
           {"--after attention.rope --after-shape T=99999999999999999999",
            "--after-shape T: '99999999999999999999' is out of range [0, 9223372036854775807]"},
           {"--after attention.rope --after-shape "
            "T=4294967296,Hq=4294967296,D=4294967296,Hk=8,P=4096,R=128",
            "is more than 9223372036854775807 bytes"}}) {
    Outcome r = run(kCli + " bench layernorm.rmsnorm --shape T=3,H=8 " + args);
    EXPECT_EQ(r.exit_code, 2) << args << "\n" << r.output;
    EXPECT_NE(r.output.find(says), std::string::npos) << args << "\n" << r.output;
  }
}

// FP8 outputs are compared as their values: the harness read every e4m3 code as NaN
// (every element a mismatch, so `kreg bench` refused to time the quantization kernels).
TEST(Tools, RunComparesFp8Codes) {
  for (const char* args : {"quantization.per_token_quant_fp8 --shape T=5,H=96",
                           "quantization.per_tensor_quant_fp8 --shape T=3,H=64",
                           "quantization.per_token_group_quant_fp8 --shape T=4,H=256,G=2"}) {
    Outcome r = run(kCli + " run " + args + " --dtype bf16 --backend cpu");
    EXPECT_EQ(r.exit_code, 0) << args << "\n" << r.output;
    EXPECT_EQ(r.output.find("nan"), std::string::npos) << args << "\n" << r.output;
    EXPECT_EQ(r.output.find("MISMATCH"), std::string::npos) << args << "\n" << r.output;
    EXPECT_NE(r.output.find("out        max_abs_err 0"), std::string::npos) << args << "\n"
                                                                            << r.output;
  }
}

// An optional tensor without a named shape (grammar's indices) is passed absent and the
// report says so; a required one (memory.copy_rows's src) is still a usage error.
TEST(Tools, RunLeavesAnOptionalRankFreeTensorAbsent) {
  Outcome r = run(kCli +
                  " run grammar.apply_token_bitmask --shape B=4,V=1000,W=32 --dtype f32 "
                  "--backend cpu");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("indices    absent (optional, no named shape to build it from)"),
            std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("logits"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("mismatches 0/4000  OK"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("no named shape, so"), std::string::npos) << r.output;
  // bench checks the same arguments: it times on a GPU, and without one says only that.
  Outcome b = run(kCli +
                  " bench grammar.apply_token_bitmask --shape B=4,V=1000,W=32 --dtype f32 "
                  "--reps 5");
  EXPECT_TRUE(b.exit_code == 0 ||
              (b.exit_code == 1 && b.output.find("no CUDA device") != std::string::npos))
      << b.output;
  if (b.exit_code == 0) {
    EXPECT_NE(b.output.find("indices    absent"), std::string::npos) << b.output;
    EXPECT_NE(b.output.find("checked vs cpu reference"), std::string::npos) << b.output;
  }

  for (const char* cmd : {" run --backend cpu", " bench"}) {
    Outcome req = run(kCli + cmd + " memory.copy_rows --shape N=4 --dtype f32");
    EXPECT_EQ(req.exit_code, 2) << cmd << "\n" << req.output;
    EXPECT_NE(req.output.find("tensor 'src' has no named shape, so run and bench cannot build it"),
              std::string::npos)
        << cmd << "\n"
        << req.output;
  }
}

TEST(Tools, BrokenManifestIsAUsageError) {
  Outcome r =
      run(kCli + " list --manifest " KREG_TEST_FIXTURES "/manifests/bad/duplicate_group.yaml");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.output.find("duplicate group name 'layernorm'"), std::string::npos) << r.output;
  EXPECT_EQ(run(kCli + " list --manifest /nonexistent/registry.yaml").exit_code, 2);
}

TEST(Tools, HostRunsTheMlpStepAndChecksIt) {
  Outcome r = run(std::string(KREG_HOST) + " --tokens 4 --hidden 256 --intermediate 512");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("group layernorm"), std::string::npos);
  EXPECT_NE(r.output.find("group activation"), std::string::npos);
  EXPECT_NE(r.output.find("kreg-host: OK"), std::string::npos) << r.output;
}

}  // namespace
