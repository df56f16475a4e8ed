#include "services/rose/tools/mkmodel.h"

#include <fcntl.h>
#include <sentencepiece_processor.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>
#include <vector>

#include "common/safetensors.h"
#include "services/rose/tools/mkmodel_common.h"

namespace garden::rose {
namespace {

namespace fs = std::filesystem;

using mkmodel::Prng;
using mkmodel::writeFile;

bool skipDir(const std::string& name) {
  return name.starts_with("build") || name.starts_with(".") || name == "node_modules" ||
         name == "models" || name == "fixtures" || name == "third_party";
}

bool textFile(const fs::path& p) {
  static const char* kExt[] = {".md", ".h", ".cc", ".py", ".proto", ".sh", ".txt"};
  const std::string ext = p.extension().string();
  for (const char* e : kExt) {
    if (ext == e) return true;
  }
  return false;
}

// Runs argv with cwd, stdout+stderr to log_path; returns the exit status.
Status runChild(const std::vector<std::string>& args, const std::string& cwd,
                const std::string& log_path) {
  std::vector<char*> argv;
  for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  pid_t pid = fork();
  if (pid < 0) return errnoStatus("fork", errno);
  if (pid == 0) {
    if (chdir(cwd.c_str()) != 0) _exit(126);
    int fd = open(log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd >= 0) {
      dup2(fd, 1);
      dup2(fd, 2);
      close(fd);
    }
    execvp(argv[0], argv.data());
    _exit(127);
  }
  int status = 0;
  while (waitpid(pid, &status, 0) < 0) {
    if (errno != EINTR) return errnoStatus("waitpid", errno);
  }
  if (WIFEXITED(status) && WEXITSTATUS(status) == 0) return okStatus();
  std::ifstream in(log_path);
  std::string log((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (log.size() > 2000) log = log.substr(log.size() - 2000);
  if (WIFEXITED(status) && WEXITSTATUS(status) == 127) {
    return notFound(args[0] + ": cannot execute (is sentencepiece's spm_train installed?)");
  }
  return internalError(args[0] + " failed (status " + std::to_string(status) + "): " + log);
}

}  // namespace

Result<int64_t> writeCorpus(const std::string& repo_root, const std::string& corpus_path) {
  std::error_code ec;
  if (!fs::is_directory(repo_root, ec))
    return notFound("--repo " + repo_root + ": not a directory");
  std::vector<fs::path> files;
  auto it = fs::recursive_directory_iterator(repo_root,
                                             fs::directory_options::skip_permission_denied, ec);
  if (ec) return internalError("cannot list " + repo_root + ": " + ec.message());
  for (auto end = fs::recursive_directory_iterator(); it != end; it.increment(ec)) {
    if (ec) break;
    const fs::path& p = it->path();
    if (it->is_directory(ec)) {
      if (skipDir(p.filename().string())) it.disable_recursion_pending();
      continue;
    }
    if (it->is_regular_file(ec) && textFile(p) && it->file_size(ec) < (512u << 10)) {
      files.push_back(fs::relative(p, repo_root, ec));
    }
  }
  std::sort(files.begin(), files.end());
  std::ofstream out(corpus_path, std::ios::binary | std::ios::trunc);
  if (!out) return internalError("cannot write " + corpus_path);
  int64_t used = 0;
  size_t total = 0;
  for (const auto& rel : files) {
    std::ifstream in(fs::path(repo_root) / rel, std::ios::binary);
    std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    if (total + text.size() > (16u << 20)) break;  // 16 MiB is plenty for a 2k vocab
    total += text.size();
    out << text;
    if (!text.empty() && text.back() != '\n') out << '\n';
    ++used;
  }
  if (used == 0) return notFound("--repo " + repo_root + ": no text files (*.md, *.cc, ...) found");
  return used;
}

Status makeDefaultModel(const MkModelOptions& o) {
  if (o.out_dir.empty()) return invalidArgument("--out is required");
  if (o.vocab_size < 300 || o.vocab_size > 32000) {
    return invalidArgument("--vocab-size must be in [300, 32000]");
  }
  std::error_code ec;
  fs::create_directories(fs::path(o.out_dir) / "1_Pooling", ec);
  if (ec) return internalError("cannot create " + o.out_dir + ": " + ec.message());
  fs::create_directories(fs::path(o.out_dir) / "2_Normalize", ec);

  // Tokenizer: train in a scratch dir with relative paths so the recorded trainer spec holds no
  // absolute (run-dependent) path.
  char tmpl[] = "/tmp/rose-mkmodel-XXXXXX";
  if (mkdtemp(tmpl) == nullptr) return errnoStatus("mkdtemp", errno);
  const fs::path work = tmpl;
  struct Cleanup {
    fs::path p;
    ~Cleanup() {
      std::error_code e;
      fs::remove_all(p, e);
    }
  } cleanup{work};
  ASSIGN_OR_RETURN(int64_t nfiles, writeCorpus(o.repo_root, (work / "corpus.txt").string()));
  (void)nfiles;
  RETURN_IF_ERROR(runChild(
      {o.spm_train, "--input=corpus.txt", "--model_prefix=tokenizer", "--model_type=unigram",
       "--vocab_size=" + std::to_string(o.vocab_size), "--hard_vocab_limit=false",
       "--byte_fallback=true", "--character_coverage=0.9995", "--num_threads=1",
       "--random_seed=20261130", "--input_sentence_size=0", "--minloglevel=1"},
      work.string(), (work / "spm_train.log").string()));
  fs::copy_file(work / "tokenizer.model", fs::path(o.out_dir) / "tokenizer.model",
                fs::copy_options::overwrite_existing, ec);
  if (ec) return internalError("cannot copy tokenizer.model: " + ec.message());
  sentencepiece::SentencePieceProcessor sp;
  if (auto st = sp.Load((fs::path(o.out_dir) / "tokenizer.model").string()); !st.ok()) {
    return internalError("trained tokenizer does not load: " + st.ToString());
  }
  const int64_t vocab = sp.GetPieceSize();

  // Weights.
  const int64_t h = o.hidden_size, d = o.head_dim, hq = o.num_heads, hkv = o.num_kv_heads,
                inter = o.intermediate_size;
  Prng rng(0x67617264656e0000ULL ^ o.seed);  // "garden"
  const DType dt = o.bf16 ? DType::kBF16 : DType::kF32;
  std::vector<TensorToWrite> ts;
  auto add = [&](std::string name, std::vector<int64_t> shape, float scale, float offset) {
    size_t n = 1;
    for (int64_t s : shape) n *= static_cast<size_t>(s);
    ts.push_back({std::move(name), dt, std::move(shape),
                  mkmodel::randomWeights(rng, n, scale, offset, o.bf16)});
  };
  // Uniform[-a, a] has std a/sqrt(3): linear layers get std ~ 1/sqrt(fan_in).
  auto lin = [](int64_t fan_in) { return 1.7320508f / std::sqrt(static_cast<float>(fan_in)); };
  add("model.embed_tokens.weight", {vocab, h}, 1.0f, 0.f);
  for (int64_t l = 0; l < o.num_layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    add(p + "input_layernorm.weight", {h}, 0.1f, 1.f);
    add(p + "self_attn.q_proj.weight", {hq * d, h}, lin(h), 0.f);
    add(p + "self_attn.k_proj.weight", {hkv * d, h}, lin(h), 0.f);
    add(p + "self_attn.v_proj.weight", {hkv * d, h}, lin(h), 0.f);
    add(p + "self_attn.o_proj.weight", {h, hq * d}, lin(hq * d), 0.f);
    add(p + "self_attn.q_norm.weight", {d}, 0.1f, 1.f);
    add(p + "self_attn.k_norm.weight", {d}, 0.1f, 1.f);
    add(p + "post_attention_layernorm.weight", {h}, 0.1f, 1.f);
    add(p + "mlp.gate_proj.weight", {inter, h}, lin(h), 0.f);
    add(p + "mlp.up_proj.weight", {inter, h}, lin(h), 0.f);
    add(p + "mlp.down_proj.weight", {h, inter}, lin(inter), 0.f);
  }
  add("model.norm.weight", {h}, 0.1f, 1.f);
  RETURN_IF_ERROR(writeSafetensors((fs::path(o.out_dir) / "model.safetensors").string(), ts,
                                   {{"format", "pt"}}));

  std::ostringstream cfg;
  cfg << "{\n"
      << "  \"architectures\": [\"Qwen3ForCausalLM\"],\n"
      << "  \"model_type\": \"qwen3\",\n"
      << "  \"hidden_size\": " << h << ",\n"
      << "  \"intermediate_size\": " << inter << ",\n"
      << "  \"num_hidden_layers\": " << o.num_layers << ",\n"
      << "  \"num_attention_heads\": " << hq << ",\n"
      << "  \"num_key_value_heads\": " << hkv << ",\n"
      << "  \"head_dim\": " << d << ",\n"
      << "  \"vocab_size\": " << vocab << ",\n"
      << "  \"max_position_embeddings\": " << o.max_position << ",\n"
      << "  \"rms_norm_eps\": 1e-06,\n"
      << "  \"rope_theta\": 1000000.0,\n"
      << "  \"tie_word_embeddings\": true,\n"
      << "  \"attention_bias\": false,\n"
      << "  \"hidden_act\": \"silu\",\n"
      << "  \"torch_dtype\": \"" << (o.bf16 ? "bfloat16" : "float32") << "\",\n"
      << "  \"bos_token_id\": " << sp.bos_id() << ",\n"
      << "  \"eos_token_id\": " << sp.eos_id() << ",\n"
      << "  \"garden_default_model\": \"random weights (seed " << o.seed
      << "): the embeddings are meaningless\"\n"
      << "}\n";
  RETURN_IF_ERROR(writeFile(fs::path(o.out_dir) / "config.json", cfg.str()));
  RETURN_IF_ERROR(writeFile(fs::path(o.out_dir) / "modules.json",
                            "[\n"
                            "  {\"idx\": 0, \"name\": \"0\", \"path\": \"\", \"type\": "
                            "\"sentence_transformers.models.Transformer\"},\n"
                            "  {\"idx\": 1, \"name\": \"1\", \"path\": \"1_Pooling\", \"type\": "
                            "\"sentence_transformers.models.Pooling\"},\n"
                            "  {\"idx\": 2, \"name\": \"2\", \"path\": \"2_Normalize\", \"type\": "
                            "\"sentence_transformers.models.Normalize\"}\n"
                            "]\n"));
  std::ostringstream pool;
  pool << "{\n  \"word_embedding_dimension\": " << h
       << ",\n  \"pooling_mode_cls_token\": false,\n  \"pooling_mode_mean_tokens\": false,\n"
          "  \"pooling_mode_max_tokens\": false,\n  \"pooling_mode_mean_sqrt_len_tokens\": false,\n"
          "  \"pooling_mode_weightedmean_tokens\": false,\n  \"pooling_mode_lasttoken\": true,\n"
          "  \"include_prompt\": true\n}\n";
  RETURN_IF_ERROR(writeFile(fs::path(o.out_dir) / "1_Pooling" / "config.json", pool.str()));
  return okStatus();
}

}  // namespace garden::rose
