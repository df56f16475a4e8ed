// Qwen3Model loading (name mapping, dtype conversion, shape/dtype errors), batch validation, and
// pooling configuration from sentence-transformers files. Numerical agreement with transformers is
// the conformance suite's job (tests/conformance/qwen3); here the checkpoint is the same fixture,
// rewritten in temp dirs.

#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "common/safetensors.h"
#include "services/rose/model/pooling_config.h"
#include "services/rose/model/qwen3.h"
#include "services/rose/ops/backend.h"

namespace garden::rose {
namespace {

namespace fs = std::filesystem;

fs::path fixtures() {
  const char* src = std::getenv("GARDEN_SOURCE_DIR");
  return fs::path(src ? src : ".") / "tests/conformance/qwen3/fixtures";
}

struct TempDir {
  fs::path path;
  TempDir() {
    char t[] = "/tmp/qwen3_test_XXXXXX";
    path = mkdtemp(t);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
};

void writeText(const fs::path& p, const std::string& s) { std::ofstream(p, std::ios::binary) << s; }

std::string readText(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

// The fixture's tensors, editable.
std::vector<TensorToWrite> fixtureTensors() {
  auto f = SafetensorsFile::open((fixtures() / "model.safetensors").string());
  EXPECT_TRUE(f.isOk());
  std::vector<TensorToWrite> out;
  for (const auto& [name, tv] : (*f)->tensors()) {
    out.push_back({name, tv.dtype, tv.shape, std::vector<std::byte>(tv.data, tv.data + tv.bytes)});
  }
  return out;
}

// A checkpoint dir: the fixture config (optionally edited) + the given tensors.
void makeCheckpoint(const fs::path& dir, const std::vector<TensorToWrite>& ts,
                    const std::function<void(std::string&)>& edit_config = {}) {
  std::string cfg = readText(fixtures() / "config.json");
  if (edit_config) edit_config(cfg);
  writeText(dir / "config.json", cfg);
  ASSERT_TRUE(writeSafetensors((dir / "model.safetensors").string(), ts).isOk());
}

void replaceOnce(std::string& s, const std::string& from, const std::string& to) {
  auto p = s.find(from);
  ASSERT_NE(p, std::string::npos) << from;
  s.replace(p, from.size(), to);
}

class Qwen3ModelTest : public ::testing::Test {
 protected:
  void SetUp() override {
    BackendOptions o;
    o.threads = 1;
    o.max_batch_tokens = 64;
    backend_ = std::move(makeBackend("cpu", o)).value();
  }
  Result<std::unique_ptr<Qwen3Model>> load(const fs::path& dir, Qwen3Options o = {}) {
    o.max_batch_tokens = 64;
    return Qwen3Model::load(dir.string(), *backend_, o);
  }
  std::vector<float> embed(Qwen3Model& m, const std::vector<int32_t>& toks,
                           const std::vector<int32_t>& lens) {
    std::vector<float> out(lens.size() * 64);
    m.enqueueEmbed({toks, lens}, PoolMode::kLast, true, out.data());
    EXPECT_TRUE(backend_->synchronize().isOk());
    return out;
  }
  std::unique_ptr<Backend> backend_;
};

TEST_F(Qwen3ModelTest, LoadsFixtureAndReportsItsShape) {
  auto m = load(fixtures());
  ASSERT_TRUE(m.isOk()) << m.status().toString();
  EXPECT_EQ((*m)->hiddenSize(), 64);
  EXPECT_EQ((*m)->vocabSize(), 256);
  EXPECT_EQ((*m)->maxSeqLen(), 128);
  EXPECT_EQ((*m)->maxBatchTokens(), 64);
  EXPECT_TRUE((*m)->hasLmHead());
  EXPECT_FALSE((*m)->hasScoreHead());
  EXPECT_EQ((*m)->pooling().mode, PoolMode::kLast);  // no modules.json: the default
  EXPECT_FALSE((*m)->pooling().from_files);
}

// [TAG_EMBED_FP8] --weights fp8 needs FP8 linear layers (the cuda backend): a clear refusal on
// the CPU, naming the flag. (The FP8 path itself: tests/gpu fp8_dense_test, model_graph_test.)
TEST_F(Qwen3ModelTest, Fp8WeightsAreRefusedWhereTheBackendHasNoFp8Layers) {
  ASSERT_FALSE(backend_->supportsFp8Linear());
  Qwen3Options o;
  o.fp8_projections = kFp8All;
  auto m = load(fixtures(), o);
  ASSERT_FALSE(m.isOk());
  EXPECT_EQ(m.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(m.status().message().find("--weights fp8"), std::string::npos) << m.status().toString();
  EXPECT_NE(m.status().message().find("cpu"), std::string::npos) << m.status().toString();
}

TEST_F(Qwen3ModelTest, Bf16CheckpointEqualsF32OfTheSameRoundedWeights) {
  TempDir bf, f32;
  auto ts = fixtureTensors();
  std::vector<TensorToWrite> as_bf16, rounded_f32;
  for (const auto& t : ts) {
    const size_t n = t.data.size() / 4;
    std::vector<float> v(n);
    std::memcpy(v.data(), t.data.data(), t.data.size());
    TensorToWrite b{t.name, DType::kBF16, t.shape, std::vector<std::byte>(n * 2)};
    TensorToWrite r{t.name, DType::kF32, t.shape, std::vector<std::byte>(n * 4)};
    for (size_t i = 0; i < n; ++i) {
      const uint16_t h = f32ToBf16(v[i]);
      const float back = bf16ToF32(h);
      std::memcpy(b.data.data() + 2 * i, &h, 2);
      std::memcpy(r.data.data() + 4 * i, &back, 4);
    }
    as_bf16.push_back(std::move(b));
    rounded_f32.push_back(std::move(r));
  }
  makeCheckpoint(bf.path, as_bf16);
  makeCheckpoint(f32.path, rounded_f32);
  auto a = load(bf.path);
  auto b = load(f32.path);
  auto orig = load(fixtures());
  ASSERT_TRUE(a.isOk()) << a.status().toString();
  ASSERT_TRUE(b.isOk());
  const std::vector<int32_t> toks = {3, 1, 4, 1, 5, 9, 2, 6};
  const std::vector<int32_t> lens = {5, 3};
  auto ea = embed(**a, toks, lens);
  EXPECT_EQ(ea, embed(**b, toks, lens));
  // And bf16 rounding changed something (the test would pass vacuously otherwise).
  EXPECT_NE(ea, embed(**orig, toks, lens));
}

TEST_F(Qwen3ModelTest, BatchedEqualsEachSequenceAlone) {
  auto m = load(fixtures());
  ASSERT_TRUE(m.isOk());
  const std::vector<int32_t> toks = {10, 20, 30, 40, 50, 60, 70, 80, 90};
  const std::vector<int32_t> lens = {1, 4, 4};
  auto batched = embed(**m, toks, lens);
  size_t off = 0;
  for (size_t s = 0; s < lens.size(); ++s) {
    std::vector<int32_t> one(toks.begin() + static_cast<long>(off),
                             toks.begin() + static_cast<long>(off + static_cast<size_t>(lens[s])));
    auto alone = embed(**m, one, {lens[s]});
    for (size_t i = 0; i < 64; ++i) ASSERT_NEAR(batched[s * 64 + i], alone[i], 1e-6f);
    off += static_cast<size_t>(lens[s]);
  }
}

// [TAG_STEP_PROGRESS] A forward pass marks every layer on the backend's progress counter.
TEST_F(Qwen3ModelTest, ForwardMarksProgressPerLayer) {
  auto m = load(fixtures());
  ASSERT_TRUE(m.isOk());
  std::atomic<uint64_t> counter{0};
  backend_->setProgressCounter(&counter);
  const std::vector<int32_t> toks = {10, 20, 30};
  embed(**m, toks, {3});
  EXPECT_GE(counter.load(), static_cast<uint64_t>((*m)->config().num_hidden_layers));
  backend_->setProgressCounter(nullptr);
}

TEST_F(Qwen3ModelTest, LoaderErrorsNameTheTensor) {
  struct Case {
    const char* what;
    std::function<void(std::vector<TensorToWrite>&)> edit_tensors;
    std::function<void(std::string&)> edit_config;
    StatusCode code;
    const char* needle;
  };
  std::vector<Case> cases = {
      {"missing tensor",
       [](auto& ts) {
         std::erase_if(ts, [](const TensorToWrite& t) {
           return t.name == "model.layers.1.mlp.up_proj.weight";
         });
       },
       {},
       StatusCode::kInvalidArgument,
       "layers.1.mlp.up_proj.weight"},
      {"wrong shape",
       [](auto& ts) {
         for (auto& t : ts) {
           if (t.name == "model.layers.0.self_attn.k_proj.weight") {
             t.shape = {16, 128};
           }
         }
       },
       {},
       StatusCode::kInvalidArgument,
       "k_proj.weight"},
      {"integer weights",
       [](auto& ts) {
         for (auto& t : ts) {
           if (t.name == "model.norm.weight") t.dtype = DType::kI32;
         }
       },
       {},
       StatusCode::kInvalidArgument,
       "I32"},
      {"config disagrees with the weights",
       {},
       [](std::string& c) { replaceOnce(c, "\"hidden_size\": 64", "\"hidden_size\": 32"); },
       StatusCode::kInvalidArgument,
       "embed_tokens.weight"},
      {"another architecture",
       {},
       [](std::string& c) {
         replaceOnce(c, "\"model_type\": \"qwen3\"", "\"model_type\": \"llama\"");
       },
       StatusCode::kInvalidArgument,
       "llama"},
      {"unsupported rope",
       {},
       [](std::string& c) {
         replaceOnce(c, "\"rope_type\": \"default\"", "\"rope_type\": \"yarn\"");
       },
       StatusCode::kUnimplemented,
       "yarn"},
  };
  for (const Case& c : cases) {
    TempDir d;
    auto ts = fixtureTensors();
    if (c.edit_tensors) c.edit_tensors(ts);
    makeCheckpoint(d.path, ts, c.edit_config);
    auto m = load(d.path);
    ASSERT_FALSE(m.isOk()) << c.what;
    EXPECT_EQ(m.status().code(), c.code) << c.what << ": " << m.status().toString();
    EXPECT_NE(m.status().message().find(c.needle), std::string::npos)
        << c.what << ": " << m.status().message();
  }
  EXPECT_EQ(load("/nonexistent").status().code(), StatusCode::kNotFound);
}

TEST_F(Qwen3ModelTest, UntiedWithoutLmHeadCannotScoreYesNo) {
  TempDir d;
  auto ts = fixtureTensors();
  std::erase_if(ts, [](const TensorToWrite& t) { return t.name == "lm_head.weight"; });
  makeCheckpoint(d.path, ts);
  auto m = load(d.path);
  ASSERT_TRUE(m.isOk()) << m.status().toString();
  EXPECT_FALSE((*m)->hasLmHead());
  EXPECT_EQ((*m)->validateScore({17, 42}).code(), StatusCode::kFailedPrecondition);
}

TEST_F(Qwen3ModelTest, ValidateRejectsBadBatches) {
  auto m = load(fixtures());
  ASSERT_TRUE(m.isOk());
  std::vector<int32_t> t4 = {1, 2, 3, 4};
  struct Case {
    std::vector<int32_t> toks, lens;
    const char* needle;
  };
  std::vector<int32_t> many(65, 1);
  for (const Case& c : std::vector<Case>{{t4, {}, "no sequences"},
                                         {t4, {2, 1}, "sum to 3"},
                                         {t4, {4, 0}, "length 0"},
                                         {{1, 300}, {2}, "id 300"},
                                         {{1, -5}, {2}, "id -5"},
                                         {many, {65}, "max_batch_tokens"}}) {
    Status st = (*m)->validate({c.toks, c.lens});
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << c.needle;
    EXPECT_NE(st.message().find(c.needle), std::string::npos) << st.message();
  }
  EXPECT_TRUE((*m)->validate({t4, std::vector<int32_t>{1, 3}}).isOk());
  EXPECT_EQ((*m)->validateScore({17, -1}).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ((*m)->validateScore({-1, -1}).code(), StatusCode::kFailedPrecondition);
  EXPECT_TRUE((*m)->validateScore({17, 42}).isOk());
}

TEST_F(Qwen3ModelTest, PoolingFromSentenceTransformersFiles) {
  TempDir d;
  makeCheckpoint(d.path, fixtureTensors());
  fs::create_directories(d.path / "1_Pooling");
  writeText(d.path / "modules.json",
            R"([{"idx":0,"name":"0","path":"","type":"sentence_transformers.models.Transformer"},
                {"idx":1,"name":"1","path":"1_Pooling","type":"sentence_transformers.models.Pooling"},
                {"idx":2,"name":"2","path":"2_Normalize","type":"sentence_transformers.models.Normalize"}])");
  writeText(
      d.path / "1_Pooling/config.json",
      R"({"word_embedding_dimension":64,"pooling_mode_cls_token":false,"pooling_mode_mean_tokens":true,
                "pooling_mode_max_tokens":false,"pooling_mode_lasttoken":false})");
  auto pc = loadPoolingConfig(d.path.string());
  ASSERT_TRUE(pc.isOk()) << pc.status().toString();
  EXPECT_EQ(pc->mode, PoolMode::kMean);
  EXPECT_TRUE(pc->normalize);
  EXPECT_TRUE(pc->from_files);
  auto m = load(d.path);
  ASSERT_TRUE(m.isOk());
  EXPECT_EQ((*m)->pooling().mode, PoolMode::kMean);
  // The flag overrides the files.
  Qwen3Options o;
  o.pooling_override = PoolMode::kCls;
  auto m2 = load(d.path, o);
  ASSERT_TRUE(m2.isOk());
  EXPECT_EQ((*m2)->pooling().mode, PoolMode::kCls);

  // Newer spelling.
  writeText(d.path / "1_Pooling/config.json", R"({"pooling_mode":"cls"})");
  EXPECT_EQ(loadPoolingConfig(d.path.string())->mode, PoolMode::kCls);
  // Modes rose does not serve, and malformed files.
  writeText(d.path / "1_Pooling/config.json", R"({"pooling_mode_max_tokens":true})");
  EXPECT_EQ(loadPoolingConfig(d.path.string()).status().code(), StatusCode::kUnimplemented);
  EXPECT_EQ(load(d.path).status().code(), StatusCode::kUnimplemented);
  EXPECT_TRUE(load(d.path, o).isOk());  // an explicit --pooling still serves it
  writeText(d.path / "1_Pooling/config.json", R"({"pooling_mode_lasttoken":false})");
  EXPECT_EQ(loadPoolingConfig(d.path.string()).status().code(), StatusCode::kInvalidArgument);
  writeText(d.path / "1_Pooling/config.json", "{");
  EXPECT_EQ(loadPoolingConfig(d.path.string()).status().code(), StatusCode::kInvalidArgument);
  writeText(d.path / "modules.json", R"({"not":"a list"})");
  EXPECT_EQ(loadPoolingConfig(d.path.string()).status().code(), StatusCode::kInvalidArgument);
  // No Pooling module: defaults.
  writeText(d.path / "modules.json",
            R"([{"path":"","type":"sentence_transformers.models.Transformer"}])");
  auto def = loadPoolingConfig(d.path.string());
  ASSERT_TRUE(def.isOk());
  EXPECT_EQ(def->mode, PoolMode::kLast);
  EXPECT_FALSE(def->from_files);
}

TEST(PoolMode, ParseAndName) {
  EXPECT_EQ(*parsePoolMode("last"), PoolMode::kLast);
  EXPECT_EQ(*parsePoolMode("lasttoken"), PoolMode::kLast);
  EXPECT_EQ(*parsePoolMode("mean"), PoolMode::kMean);
  EXPECT_EQ(*parsePoolMode("cls"), PoolMode::kCls);
  EXPECT_FALSE(parsePoolMode("max").isOk());
  EXPECT_EQ(poolModeName(PoolMode::kMean), "mean");
}

}  // namespace
}  // namespace garden::rose
