// The command-line tools as a user runs them: `kreg list/info/run` and `kreg-host` on the
// default manifest, with their exit codes and the lines a user reads.
#include <gtest/gtest.h>

#include <sys/wait.h>
#include <array>
#include <cstdio>
#include <string>

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
  EXPECT_EQ(missing.exit_code, 1);
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
