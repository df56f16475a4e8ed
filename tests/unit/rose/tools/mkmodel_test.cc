// rose-mkmodel's library: the default model is byte-for-byte deterministic, loads and runs, and
// failures (no text, no spm_train) are clear errors. The tokenizer is trained on a frozen copy of
// part of the repository so that concurrent edits to the tree cannot change the corpus mid-test.

#include "services/rose/tools/mkmodel.h"

#include <gtest/gtest.h>
#include <sentencepiece_processor.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>

#include "services/rose/model/qwen3.h"
#include "services/rose/ops/backend.h"

namespace garden::rose {
namespace {

namespace fs = std::filesystem;

struct TempDir {
  fs::path path;
  TempDir() {
    char t[] = "/tmp/mkmodel_test_XXXXXX";
    path = mkdtemp(t);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
};

std::map<std::string, std::string> readTree(const fs::path& dir) {
  std::map<std::string, std::string> out;
  for (const auto& e : fs::recursive_directory_iterator(dir)) {
    if (!e.is_regular_file()) continue;
    std::ifstream in(e.path(), std::ios::binary);
    out[fs::relative(e.path(), dir).string()] =
        std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  }
  return out;
}

class MkModel : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    snapshot_ = new TempDir();
    const char* src = std::getenv("GARDEN_SOURCE_DIR");
    const fs::path root = src ? src : ".";
    fs::create_directories(snapshot_->path / "services");
    fs::copy(root / "services/rose", snapshot_->path / "services/rose",
             fs::copy_options::recursive);
    fs::copy(root / "common", snapshot_->path / "common", fs::copy_options::recursive);
  }
  static void TearDownTestSuite() { delete snapshot_; }
  static TempDir* snapshot_;
};
TempDir* MkModel::snapshot_ = nullptr;

TEST_F(MkModel, TwoRunsGiveIdenticalBytesAndTheModelServes) {
  TempDir a, b, c;
  MkModelOptions o;
  o.repo_root = snapshot_->path.string();
  o.vocab_size = 1000;
  o.out_dir = (a.path / "m").string();
  ASSERT_TRUE(makeDefaultModel(o).isOk());
  o.out_dir = (b.path / "m").string();
  ASSERT_TRUE(makeDefaultModel(o).isOk());
  auto ta = readTree(a.path / "m");
  auto tb = readTree(b.path / "m");
  for (const char* f : {"config.json", "model.safetensors", "tokenizer.model", "modules.json",
                        "1_Pooling/config.json"}) {
    ASSERT_TRUE(ta.count(f)) << f;
  }
  EXPECT_EQ(ta, tb);

  // Another seed: other weights, same tokenizer.
  o.out_dir = (c.path / "m").string();
  o.seed = 1;
  ASSERT_TRUE(makeDefaultModel(o).isOk());
  auto tc = readTree(c.path / "m");
  EXPECT_NE(ta["model.safetensors"], tc["model.safetensors"]);
  EXPECT_EQ(ta["tokenizer.model"], tc["tokenizer.model"]);

  // The tokenizer loads and its size is the model's vocabulary; the model loads and runs.
  sentencepiece::SentencePieceProcessor sp;
  ASSERT_TRUE(sp.Load((a.path / "m/tokenizer.model").string()).ok());
  std::vector<int> ids;
  ASSERT_TRUE(sp.Encode("hello garden: a rose and a tulip", &ids).ok());
  ASSERT_FALSE(ids.empty());
  auto backend = std::move(makeBackend("cpu", BackendOptions{})).value();
  auto m = Qwen3Model::load((a.path / "m").string(), *backend, Qwen3Options{});
  ASSERT_TRUE(m.isOk()) << m.status().toString();
  EXPECT_EQ((*m)->vocabSize(), sp.GetPieceSize());
  EXPECT_EQ((*m)->hiddenSize(), 64);
  EXPECT_EQ((*m)->maxSeqLen(), 512);
  EXPECT_TRUE((*m)->config().tie_word_embeddings);
  EXPECT_EQ((*m)->pooling().mode, PoolMode::kLast);
  EXPECT_TRUE((*m)->pooling().from_files);
  std::vector<int32_t> toks(ids.begin(), ids.end());
  std::vector<int32_t> lens = {static_cast<int32_t>(toks.size())};
  ASSERT_TRUE((*m)->validate({toks, lens}).isOk());
  std::vector<float> out(64);
  (*m)->enqueueEmbed({toks, lens}, PoolMode::kLast, true, out.data());
  ASSERT_TRUE(backend->synchronize().isOk());
  double norm = 0;
  for (float v : out) {
    ASSERT_TRUE(std::isfinite(v));
    norm += static_cast<double>(v) * v;
  }
  EXPECT_NEAR(norm, 1.0, 1e-5);
}

TEST_F(MkModel, ClearErrors) {
  TempDir out, empty;
  MkModelOptions o;
  o.out_dir = (out.path / "m").string();
  o.repo_root = empty.path.string();
  EXPECT_EQ(makeDefaultModel(o).code(), StatusCode::kNotFound);  // no text files
  o.repo_root = "/nonexistent";
  EXPECT_EQ(makeDefaultModel(o).code(), StatusCode::kNotFound);
  o.repo_root = snapshot_->path.string();
  o.spm_train = "/nonexistent/spm_train";
  Status st = makeDefaultModel(o);
  EXPECT_EQ(st.code(), StatusCode::kNotFound) << st.toString();
  EXPECT_NE(st.message().find("spm_train"), std::string::npos);
  o.spm_train = "spm_train";
  o.vocab_size = 5;
  EXPECT_EQ(makeDefaultModel(o).code(), StatusCode::kInvalidArgument);
  o.vocab_size = 1000;
  o.out_dir.clear();
  EXPECT_EQ(makeDefaultModel(o).code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace garden::rose
