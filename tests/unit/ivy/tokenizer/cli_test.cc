// `ivy tokenize`: JSON-lines in, JSON-lines out, on the hand-built BPE tokenizer from a temp
// file, with stdin/stdout redirected around the call.
#include "services/ivy/tokenizer/cli.h"

#include <fcntl.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>

#include <gtest/gtest.h>

namespace garden::ivy {
std::string bpeJsonForCliTest();  // tokenizer_test.cc
namespace {

std::string runCli(const std::string& tokenizer_path, const std::string& input, bool decode,
                   int* rc) {
  const auto dir = std::filesystem::temp_directory_path();
  const std::string in_path = dir / ("cli_in_" + std::to_string(::getpid()));
  const std::string out_path = dir / ("cli_out_" + std::to_string(::getpid()));
  std::ofstream(in_path) << input;
  std::fflush(stdout);
  const int saved_in = ::dup(0), saved_out = ::dup(1);
  const int in_fd = ::open(in_path.c_str(), O_RDONLY);
  const int out_fd = ::open(out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
  ::dup2(in_fd, 0);
  ::dup2(out_fd, 1);
  std::clearerr(stdin);  // a previous run left stdin at EOF
  std::cin.clear();
  std::string a0 = "tokenize", a1 = "--tokenizer", a2 = tokenizer_path, a3 = "--decode";
  char* argv[] = {a0.data(), a1.data(), a2.data(), a3.data()};
  *rc = runTokenizeCli(decode ? 4 : 3, argv);
  std::fflush(stdout);
  ::dup2(saved_in, 0);
  ::dup2(saved_out, 1);
  ::close(in_fd);
  ::close(out_fd);
  ::close(saved_in);
  ::close(saved_out);
  std::cin.clear();
  std::stringstream ss;
  ss << std::ifstream(out_path).rdbuf();
  std::filesystem::remove(in_path);
  std::filesystem::remove(out_path);
  return ss.str();
}

TEST(Cli, EncodesAndDecodesJsonLines) {
  const std::string path =
      std::filesystem::temp_directory_path() / ("cli_tok_" + std::to_string(::getpid()) + ".json");
  std::ofstream(path) << bpeJsonForCliTest();
  int rc = -1;
  EXPECT_EQ(runCli(path, "\"hello\"\n\"<|start|>\"\n42\n", false, &rc),
            "[259]\n[60,124,115,116,97,114,116,124,62]\n{\"error\":\"line 3: expected a JSON "
            "string\"}\n");
  EXPECT_EQ(rc, 1);
  EXPECT_EQ(runCli(path, "[259,32,259]\n[261]\n", true, &rc), "\"hello hello\"\n\"<|start|>\"\n");
  EXPECT_EQ(rc, 0);
  std::filesystem::remove(path);
}

}  // namespace
}  // namespace garden::ivy
