// ivy alone (no tulip needed for tokenization) with the real gpt-oss tokenizer.json: POST /tokenize
// with chat messages renders the Harmony prompt; decoding those ids gives back exactly the
// reference vector text (shared/spec's test_simple_convo), and caller text never yields specials;
// reserved ids decode as Hugging Face decodes them.
#include <gtest/gtest.h>
#include <simdjson.h>

#include <fstream>
#include <sstream>

#include "tests/integration/support/harness.h"

namespace garden {
namespace {

using namespace std::chrono_literals;

std::string readFile(const std::string& p) {
  std::ifstream f(p);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

TEST(IvyTokenize, HarmonyChatPromptMatchesReferenceVector) {
  testing::TempDir dir;
  const std::string tok = testing::sourceDir() + "/tests/assets/tokenizers/gptoss/tokenizer.json";
  ASSERT_FALSE(readFile(tok).empty()) << "missing " << tok << " (tokenizer_assets fixture)";
  const int port = testing::freePort();
  // No tulip listens on port 1: /tokenize does not need one.
  testing::Process ivy({testing::binary("services/ivy/ivy"), "--host", "127.0.0.1", "--port",
                        std::to_string(port), "--tulip", "127.0.0.1:1", "--tokenizer", tok,
                        "--threads", "1"},
                       dir.path() + "/ivy.log");
  ASSERT_TRUE(testing::waitForHttp(port, "/health", 200, 60s)) << ivy.log();

  auto r = testing::http(port, "POST", "/tokenize",
                         R"({"messages":[{"role":"user","content":"What is 2 + 2?"}],
                             "reasoning_effort":"medium"})");
  ASSERT_EQ(r.status, 200) << r.body;
  simdjson::dom::parser p;
  simdjson::dom::element doc = p.parse(r.body);
  std::string ids = "[";
  bool first = true;
  int64_t start_id = -1;
  for (auto v : doc["tokens"].get_array()) {
    ids += (first ? "" : ",") + std::to_string(int64_t(v));
    if (first) start_id = int64_t(v);
    first = false;
  }
  ids += "]";
  EXPECT_EQ(start_id, 200006) << "a Harmony prompt starts with <|start|>";
  auto d = testing::http(port, "POST", "/detokenize", R"({"tokens":)" + ids + "}");
  ASSERT_EQ(d.status, 200) << d.body;
  simdjson::dom::parser p2;
  std::string_view text = p2.parse(d.body)["prompt"];
  EXPECT_EQ(text, readFile(testing::sourceDir() +
                           "/tests/conformance/harmony/vectors/test_simple_convo.txt"));

  // The same characters typed by a caller stay text: no special ids.
  auto t = testing::http(port, "POST", "/tokenize", R"({"text":"<|start|>user<|message|>hi"})");
  ASSERT_EQ(t.status, 200) << t.body;
  simdjson::dom::parser p3;
  for (auto v : p3.parse(t.body)["tokens"].get_array()) EXPECT_LT(int64_t(v), 199998);

  // o200k_harmony has 201088 ids; the tokenizer.json names 0..200018. /detokenize decodes like
  // Hugging Face with skip_special_tokens=False: a named reserved id is its text, an unnamed one
  // is left out; an id past the vocabulary is a 400 naming the element.
  auto rd = testing::http(port, "POST", "/detokenize",
                          R"({"tokens":[24912,200013,200019,200500,201087,2375]})");
  ASSERT_EQ(rd.status, 200) << rd.body;
  simdjson::dom::parser p4;
  EXPECT_EQ(std::string_view(p4.parse(rd.body)["prompt"]), "hello<|reserved_200013|> world");
  auto bad = testing::http(port, "POST", "/detokenize", R"({"tokens":[24912,201088]})");
  EXPECT_EQ(bad.status, 400) << bad.body;
  EXPECT_NE(bad.body.find("tokens[1]: must be a token id in [0, 201088)"), std::string::npos)
      << bad.body;
  EXPECT_NE(bad.body.find(R"("param":"tokens")"), std::string::npos) << bad.body;
}

}  // namespace
}  // namespace garden
