// rose's Qwen3 forward pass on the CPU backend against Hugging Face transformers.
//
// fixtures/ was written by gen_fixtures.py (transformers 5.17, torch 2.11, float32, see
// fixtures/log.txt): a tiny random Qwen3ForCausalLM checkpoint saved with save_pretrained, and the
// outputs transformers computed for five sequences (lengths 1, 2, 5, 16, 37). Checked here:
//   - last hidden state (after the final norm), causal: every sequence alone and all five in one
//     ragged batch; cosine >= 0.99999 per sequence and max abs error per value <= 1e-4;
//   - pooled + L2-normalized embeddings (last / mean / cls; sentence-transformers reference);
//   - bidirectional attention (the reference calls HF's decoder layers without a mask under eager
//     attention; the generator validates that loop against Qwen3Model with a causal mask);
//   - reranker scores sigmoid(l_yes - l_no) with the untied lm_head and with tied embeddings;
//   - a Qwen3ForSequenceClassification head (score.weight, num_labels=1), loaded from a sharded
//     checkpoint (index.json + two files) assembled in a temp dir;
//   - the same checkpoint with names stripped of the `model.` prefix gives identical outputs.

#include <gtest/gtest.h>
#include <simdjson.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "common/safetensors.h"
#include "services/rose/model/qwen3.h"
#include "services/rose/ops/backend.h"

namespace garden::rose {
namespace {

namespace fs = std::filesystem;

constexpr double kMinCosine = 0.99999;
constexpr double kMaxAbs = 1e-4;

fs::path fixtures() {
  const char* src = std::getenv("GARDEN_SOURCE_DIR");
  fs::path root = src ? fs::path(src)
                      : fs::path(__FILE__).parent_path().parent_path().parent_path().parent_path();
  return root / "tests/conformance/qwen3/fixtures";
}

std::string readText(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

std::vector<float> floats(simdjson::dom::element e) {
  std::vector<float> v;
  for (auto x : e.get_array()) v.push_back(static_cast<float>(x.get_double().value()));
  return v;
}

struct Expected {
  std::vector<std::vector<int32_t>> seqs;
  int64_t hidden = 0;
  struct Mode {
    std::vector<std::vector<float>> hidden, last, mean, cls;
  } causal, bidir;
  int32_t yes = 0, no = 0;
  std::vector<float> scores_untied, scores_tied, scores_cls;
};

Expected loadExpected() {
  static simdjson::dom::parser parser;
  std::string text = readText(fixtures() / "expected.json");
  simdjson::dom::element root = parser.parse(text).value();
  Expected e;
  for (auto s : root["sequences"].get_array()) {
    std::vector<int32_t> ids;
    for (auto x : s.get_array()) ids.push_back(static_cast<int32_t>(x.get_int64().value()));
    e.seqs.push_back(ids);
  }
  e.hidden = root["hidden_size"].get_int64().value();
  auto mode = [&](const char* key, Expected::Mode& m) {
    auto o = root[key];
    for (auto h : o["hidden"].get_array()) m.hidden.push_back(floats(h));
    for (auto h : o["pooled"]["last"].get_array()) m.last.push_back(floats(h));
    for (auto h : o["pooled"]["mean"].get_array()) m.mean.push_back(floats(h));
    for (auto h : o["pooled"]["cls"].get_array()) m.cls.push_back(floats(h));
  };
  mode("causal", e.causal);
  mode("bidirectional", e.bidir);
  auto sc = root["score"];
  e.yes = static_cast<int32_t>(sc["yes_id"].get_int64().value());
  e.no = static_cast<int32_t>(sc["no_id"].get_int64().value());
  e.scores_untied = floats(sc["yes_no"]["scores"].value());
  e.scores_tied = floats(sc["tied"]["scores"].value());
  e.scores_cls = floats(sc["cls"]["scores"].value());
  return e;
}

struct Agreement {
  double min_cos = 1.0;
  double max_abs = 0.0;
};

void compareRows(const float* got, const std::vector<float>& want, Agreement& a,
                 const std::string& what) {
  double dot = 0, ng = 0, nw = 0, mx = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    dot += static_cast<double>(got[i]) * want[i];
    ng += static_cast<double>(got[i]) * got[i];
    nw += static_cast<double>(want[i]) * want[i];
    mx = std::max(mx, std::fabs(static_cast<double>(got[i]) - want[i]));
  }
  double cos = dot / std::sqrt(ng * nw);
  a.min_cos = std::min(a.min_cos, cos);
  a.max_abs = std::max(a.max_abs, mx);
  EXPECT_GE(cos, kMinCosine) << what;
  EXPECT_LE(mx, kMaxAbs) << what;
}

// A temp dir removed at scope exit.
struct TempDir {
  fs::path path;
  TempDir() {
    char tmpl[] = "/tmp/rose_conf_XXXXXX";
    path = mkdtemp(tmpl);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
};

class Qwen3Conformance : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { expected_ = new Expected(loadExpected()); }
  static void TearDownTestSuite() { delete expected_; }

  void SetUp() override {
    BackendOptions o;
    o.threads = 2;
    o.max_batch_tokens = 128;
    backend_ = std::move(makeBackend("cpu", o)).value();
  }

  std::unique_ptr<Qwen3Model> load(const fs::path& dir, int causal = -1) {
    Qwen3Options opts;
    opts.max_batch_tokens = 128;
    opts.causal = causal;
    auto m = Qwen3Model::load(dir.string(), *backend_, opts);
    EXPECT_TRUE(m.isOk()) << m.status().toString();
    return m.isOk() ? std::move(m).value() : nullptr;
  }

  // All sequences in one ragged batch.
  BatchInput allInOne() {
    tokens_.clear();
    lens_.clear();
    for (const auto& s : expected_->seqs) {
      tokens_.insert(tokens_.end(), s.begin(), s.end());
      lens_.push_back(static_cast<int32_t>(s.size()));
    }
    return {tokens_, lens_};
  }

  void checkHidden(Qwen3Model& m, const Expected::Mode& want, const char* label) {
    const int64_t h = expected_->hidden;
    Agreement alone, batched;
    for (size_t i = 0; i < expected_->seqs.size(); ++i) {
      const auto& s = expected_->seqs[i];
      std::vector<int32_t> len = {static_cast<int32_t>(s.size())};
      BatchInput in{s, len};
      ASSERT_TRUE(m.validate(in).isOk());
      std::vector<float> out(s.size() * static_cast<size_t>(h));
      m.enqueueHidden(in, out.data());
      ASSERT_TRUE(backend_->synchronize().isOk());
      compareRows(out.data(), want.hidden[i], alone,
                  std::string(label) + " hidden, sequence " + std::to_string(i) + " alone");
    }
    BatchInput in = allInOne();
    std::vector<float> out(tokens_.size() * static_cast<size_t>(h));
    m.enqueueHidden(in, out.data());
    ASSERT_TRUE(backend_->synchronize().isOk());
    size_t off = 0;
    for (size_t i = 0; i < expected_->seqs.size(); ++i) {
      compareRows(out.data() + off, want.hidden[i], batched,
                  std::string(label) + " hidden, sequence " + std::to_string(i) + " batched");
      off += want.hidden[i].size();
    }
    std::printf(
        "[%s] hidden vs transformers: alone min cos %.9f max abs %.3g; batched min cos "
        "%.9f max abs %.3g\n",
        label, alone.min_cos, alone.max_abs, batched.min_cos, batched.max_abs);
  }

  void checkPooled(Qwen3Model& m, const Expected::Mode& want, const char* label) {
    const int64_t h = expected_->hidden;
    BatchInput in = allInOne();
    Agreement a;
    for (auto [mode, ref] :
         {std::pair{PoolMode::kLast, &want.last}, std::pair{PoolMode::kMean, &want.mean},
          std::pair{PoolMode::kCls, &want.cls}}) {
      std::vector<float> out(lens_.size() * static_cast<size_t>(h));
      m.enqueueEmbed(in, mode, true, out.data());
      ASSERT_TRUE(backend_->synchronize().isOk());
      for (size_t i = 0; i < lens_.size(); ++i) {
        compareRows(out.data() + i * static_cast<size_t>(h), (*ref)[i], a,
                    std::string(label) + " pooled " + std::string(poolModeName(mode)) +
                        ", sequence " + std::to_string(i));
      }
    }
    std::printf(
        "[%s] pooled+normalized (last/mean/cls) vs sentence-transformers: min cos %.9f "
        "max abs %.3g\n",
        label, a.min_cos, a.max_abs);
  }

  void checkScores(Qwen3Model& m, const ScoreRequest& req, const std::vector<float>& want,
                   const char* label) {
    ASSERT_TRUE(m.validateScore(req).isOk()) << m.validateScore(req).toString();
    BatchInput in = allInOne();
    std::vector<float> out(lens_.size());
    m.enqueueScore(in, req, out.data());
    ASSERT_TRUE(backend_->synchronize().isOk());
    double worst = 0;
    for (size_t i = 0; i < want.size(); ++i) {
      const double err = std::fabs(static_cast<double>(out[i]) - want[i]);
      worst = std::max(worst, err / (std::fabs(want[i]) + 1e-6));
      EXPECT_LE(err, 2e-4 * std::fabs(want[i]) + 1e-6)
          << label << " sequence " << i << ": got " << out[i] << " want " << want[i];
    }
    std::printf("[%s] scores vs transformers: max relative error %.3g\n", label, worst);
  }

  static Expected* expected_;
  std::unique_ptr<Backend> backend_;
  std::vector<int32_t> tokens_, lens_;
};

Expected* Qwen3Conformance::expected_ = nullptr;

TEST_F(Qwen3Conformance, CausalHiddenAndPooled) {
  auto m = load(fixtures());
  ASSERT_NE(m, nullptr);
  EXPECT_TRUE(m->causal());
  EXPECT_EQ(m->hiddenSize(), expected_->hidden);
  checkHidden(*m, expected_->causal, "causal");
  checkPooled(*m, expected_->causal, "causal");
}

TEST_F(Qwen3Conformance, BidirectionalHiddenAndPooled) {
  auto m = load(fixtures(), /*causal=*/0);
  ASSERT_NE(m, nullptr);
  EXPECT_FALSE(m->causal());
  checkHidden(*m, expected_->bidir, "bidirectional");
  checkPooled(*m, expected_->bidir, "bidirectional");
}

TEST_F(Qwen3Conformance, YesNoScoreWithUntiedLmHead) {
  auto m = load(fixtures());
  ASSERT_NE(m, nullptr);
  EXPECT_FALSE(m->config().tie_word_embeddings);
  EXPECT_FALSE(m->hasScoreHead());
  checkScores(*m, {expected_->yes, expected_->no}, expected_->scores_untied, "yes/no untied");
  // No classification head in this checkpoint: a clear error, not a crash.
  EXPECT_EQ(m->validateScore({-1, -1}).code(), StatusCode::kFailedPrecondition);
}

TEST_F(Qwen3Conformance, YesNoScoreWithTiedEmbeddings) {
  TempDir dir;
  std::string cfg = readText(fixtures() / "config.json");
  const std::string from = "\"tie_word_embeddings\": false";
  auto pos = cfg.find(from);
  ASSERT_NE(pos, std::string::npos);
  cfg.replace(pos, from.size(), "\"tie_word_embeddings\": true");
  std::ofstream(dir.path / "config.json") << cfg;
  fs::create_symlink(fs::absolute(fixtures() / "model.safetensors"),
                     dir.path / "model.safetensors");
  auto m = load(dir.path);
  ASSERT_NE(m, nullptr);
  checkScores(*m, {expected_->yes, expected_->no}, expected_->scores_tied, "yes/no tied");
}

TEST_F(Qwen3Conformance, ClassificationHeadFromShardedCheckpoint) {
  TempDir dir;
  fs::copy_file(fixtures() / "config_cls.json", dir.path / "config.json");
  fs::create_symlink(fs::absolute(fixtures() / "model.safetensors"),
                     dir.path / "model-00001-of-00002.safetensors");
  fs::create_symlink(fs::absolute(fixtures() / "score.safetensors"),
                     dir.path / "model-00002-of-00002.safetensors");
  // The index names every tensor of both shards.
  auto base = SafetensorsFile::open((fixtures() / "model.safetensors").string());
  ASSERT_TRUE(base.isOk());
  std::string idx = "{\"metadata\":{},\"weight_map\":{";
  for (const auto& [name, _] : (*base)->tensors()) {
    idx += "\"" + name + "\":\"model-00001-of-00002.safetensors\",";
  }
  idx += "\"score.weight\":\"model-00002-of-00002.safetensors\"}}";
  std::ofstream(dir.path / "model.safetensors.index.json") << idx;
  auto m = load(dir.path);
  ASSERT_NE(m, nullptr);
  EXPECT_TRUE(m->hasScoreHead());
  EXPECT_EQ(m->config().num_labels, 1);
  checkScores(*m, {-1, -1}, expected_->scores_cls, "classification head");
}

TEST_F(Qwen3Conformance, NamesWithoutModelPrefixGiveIdenticalOutputs) {
  TempDir dir;
  fs::copy_file(fixtures() / "config.json", dir.path / "config.json");
  auto base = SafetensorsFile::open((fixtures() / "model.safetensors").string());
  ASSERT_TRUE(base.isOk());
  std::vector<TensorToWrite> renamed;
  for (const auto& [name, tv] : (*base)->tensors()) {
    TensorToWrite t;
    t.name = name.starts_with("model.") ? name.substr(6) : name;
    t.dtype = tv.dtype;
    t.shape = tv.shape;
    t.data.assign(tv.data, tv.data + tv.bytes);
    renamed.push_back(std::move(t));
  }
  ASSERT_TRUE(writeSafetensors((dir.path / "model.safetensors").string(), renamed).isOk());
  auto a = load(fixtures());
  auto b = load(dir.path);
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  BatchInput in = allInOne();
  std::vector<float> out_a(tokens_.size() * static_cast<size_t>(expected_->hidden)),
      out_b(out_a.size());
  a->enqueueHidden(in, out_a.data());
  b->enqueueHidden(in, out_b.data());
  ASSERT_TRUE(backend_->synchronize().isOk());
  EXPECT_EQ(out_a, out_b);
  checkScores(*b, {expected_->yes, expected_->no}, expected_->scores_untied, "no prefix");
}

}  // namespace
}  // namespace garden::rose
