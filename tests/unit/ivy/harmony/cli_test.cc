// `ivy harmony-render` (runHarmonyRenderCli): stdin request -> JSON or text on stdout, exit codes.
// The id output with the real tokenizer is checked in tests/conformance/harmony.

#include "services/ivy/harmony/cli.h"

#include <gtest/gtest.h>

#include <iostream>
#include <sstream>
#include <string>
#include <vector>

namespace garden::ivy::harmony {
namespace {

struct CliResult {
  int rc;
  std::string out;
  std::string err;
};

CliResult runCli(std::vector<std::string> args, const std::string& input) {
  std::istringstream in(input);
  std::ostringstream out, err;
  auto* old_in = std::cin.rdbuf(in.rdbuf());
  auto* old_out = std::cout.rdbuf(out.rdbuf());
  auto* old_err = std::cerr.rdbuf(err.rdbuf());
  args.insert(args.begin(), "harmony-render");
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  int rc = runHarmonyRenderCli(static_cast<int>(argv.size()), argv.data());
  std::cin.rdbuf(old_in);
  std::cout.rdbuf(old_out);
  std::cerr.rdbuf(old_err);
  return {rc, out.str(), err.str()};
}

TEST(HarmonyCli, RendersJson) {
  CliResult r =
      runCli({"--date=2025-06-28"}, R"({"messages":[{"role":"user","content":"Hi \"there\""}]})");
  EXPECT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(r.out,
            "{\"text\":\"<|start|>system<|message|>You are ChatGPT, a large language model trained "
            "by OpenAI.\\nKnowledge cutoff: 2024-06\\nCurrent date: 2025-06-28\\n\\nReasoning: "
            "medium\\n\\n# Valid channels: analysis, commentary, final. Channel must be included "
            "for every message.<|end|><|start|>user<|message|>Hi \\\"there\\\"<|end|><|start|>"
            "assistant\"}\n");
}

TEST(HarmonyCli, TextFormatAndKeepAnalysis) {
  const std::string body = R"({"messages":[{"role":"user","content":"q"},
      {"role":"assistant","reasoning_content":"THINK","content":"a"},
      {"role":"user","content":"q2"}]})";
  CliResult dropped = runCli({"--format=text"}, body);
  EXPECT_EQ(dropped.rc, 0);
  EXPECT_EQ(dropped.out.find("THINK"), std::string::npos);
  EXPECT_EQ(dropped.out.back(), '\n');
  CliResult kept = runCli({"--format=text", "--keep-analysis"}, body);
  EXPECT_NE(kept.out.find("<|channel|>analysis<|message|>THINK<|end|>"), std::string::npos);
}

TEST(HarmonyCli, BadInputExitsTwoNamingTheField) {
  CliResult r =
      runCli({}, R"({"messages":[{"role":"user","content":"x"}],"reasoning_effort":"x"})");
  EXPECT_EQ(r.rc, 2);
  EXPECT_NE(r.err.find("reasoning_effort"), std::string::npos);
  EXPECT_TRUE(r.out.empty());
  EXPECT_EQ(runCli({"--bogus"}, "{}").rc, 2);
  CliResult missing = runCli({"--tokenizer=/nonexistent/tokenizer.json"},
                             R"({"messages":[{"role":"user","content":"x"}]})");
  EXPECT_EQ(missing.rc, 1);
  EXPECT_FALSE(missing.err.empty());
}

}  // namespace
}  // namespace garden::ivy::harmony
