#include "services/rose/engine/llm_engine.h"

#include <simdjson.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <iterator>

#include "common/logging.h"
#include "common/metrics/registry.h"
#include "common/shm/llm_batch.h"

namespace garden::rose {
namespace {

using simdjson::dom::element;

// offset + bytes <= limit without overflow.
bool fits(uint64_t offset, uint64_t bytes, uint64_t limit) {
  return offset <= limit && bytes <= limit - offset;
}

Result<std::string> readFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return notFound(path + ": cannot open");
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

// eos_token_id of one JSON file: absent/null → false; an integer or a list of integers → ids.
Result<bool> eosIdsOf(const std::string& path, const std::string& text, std::vector<int32_t>* ids) {
  simdjson::dom::parser parser;
  element root;
  if (parser.parse(text.data(), text.size(), true).get(root))
    return invalidArgument(path + ": not valid JSON");
  simdjson::dom::object o;
  if (root.get_object().get(o)) return invalidArgument(path + ": not a JSON object");
  element e;
  if (o["eos_token_id"].get(e) || e.is_null()) return false;
  auto one = [&](element v) -> Status {
    int64_t id;
    if (v.get_int64().get(id) || id < 0 || id > INT32_MAX) {
      return invalidArgument(path +
                             ": eos_token_id: must be a non-negative integer or a list of "
                             "them");
    }
    if (std::find(ids->begin(), ids->end(), static_cast<int32_t>(id)) == ids->end())
      ids->push_back(static_cast<int32_t>(id));
    return okStatus();
  };
  simdjson::dom::array a;
  if (!e.get_array().get(a)) {
    for (element v : a) RETURN_IF_ERROR(one(v));
  } else {
    RETURN_IF_ERROR(one(e));
  }
  if (ids->size() > kMaxEosIds) {
    return invalidArgument(path + ": eos_token_id: " + std::to_string(ids->size()) +
                           " distinct ids, the shm channel carries at most " +
                           std::to_string(kMaxEosIds));
  }
  return !ids->empty();
}

}  // namespace

Result<bool> isGptOssCheckpoint(const std::string& dir) {
  const std::string path = dir + "/config.json";
  ASSIGN_OR_RETURN(std::string text, readFile(path));
  simdjson::dom::parser parser;
  element root;
  if (parser.parse(text.data(), text.size(), true).get(root))
    return invalidArgument(path + ": not valid JSON");
  std::string_view s;
  if (!root["model_type"].get_string().get(s) && s == "gpt_oss") return true;
  simdjson::dom::array archs;
  if (!root["architectures"].get_array().get(archs)) {
    for (element a : archs) {
      if (!a.get_string().get(s) && s == "GptOssForCausalLM") return true;
    }
  }
  return false;
}

Result<std::vector<int32_t>> loadEosIds(const std::string& dir) {
  std::vector<int32_t> ids;
  const std::string gen = dir + "/generation_config.json";
  if (Result<std::string> text = readFile(gen); text.isOk()) {
    ASSIGN_OR_RETURN(bool found, eosIdsOf(gen, *text, &ids));
    if (found) return ids;
  }
  const std::string cfg = dir + "/config.json";
  ASSIGN_OR_RETURN(std::string text, readFile(cfg));
  ASSIGN_OR_RETURN(bool found, eosIdsOf(cfg, text, &ids));
  (void)found;
  return ids;
}

Result<std::unique_ptr<LlmEngine>> LlmEngine::create(shm::Channel& channel, Backend& backend,
                                                     GptOssModel& model,
                                                     const LlmEngineOptions& opts) {
  if (opts.kv_num_blocks <= 0) return invalidArgument("kv_num_blocks must be positive");
  if (opts.kv_block_size <= 0) return invalidArgument("kv_block_size must be positive");
  if (opts.max_seqs <= 0 || opts.max_batch_tokens <= 0)
    return invalidArgument("max_seqs and max_batch_tokens must be positive");
  if (opts.eos_ids.size() > kMaxEosIds) {
    return invalidArgument("eos_ids: " + std::to_string(opts.eos_ids.size()) +
                           " ids, the shm channel carries at most " + std::to_string(kMaxEosIds));
  }
  for (int32_t id : opts.eos_ids) {
    if (id < 0 || id >= model.vocabSize()) {
      return invalidArgument("eos id " + std::to_string(id) + " is outside the vocabulary [0, " +
                             std::to_string(model.vocabSize()) + ")");
    }
  }
  const uint32_t n = channel.layout().slots;
  if (n == 0) return invalidArgument("channel has no slots");
  if (channel.layout().output_bytes < uint64_t{4} * static_cast<uint64_t>(opts.max_seqs)) {
    return invalidArgument(
        "the channel's output arena (" + std::to_string(channel.layout().output_bytes) +
        " bytes per slot) cannot hold max_seqs " + std::to_string(opts.max_seqs) + " sampled ids");
  }
  std::unique_ptr<LlmEngine> e(new LlmEngine(channel, backend, model, opts));
  ASSIGN_OR_RETURN(
      e->kv_, PagedKvCache::create(backend, model.kvShape(opts.kv_num_blocks, opts.kv_block_size),
                                   model.kvDType()));
  // A step's block ids: at most max_seqs tables of the longest sequence, and never more than
  // the input arena can carry.
  e->max_step_blocks_ = std::min<int64_t>(
      static_cast<int64_t>(opts.max_seqs) * kvBlocksFor(model.maxModelLen(), opts.kv_block_size),
      static_cast<int64_t>(channel.layout().input_bytes / sizeof(int32_t)));
  for (uint32_t i = 0; i < n; ++i) {
    auto s = std::make_unique<Slot>();
    ASSIGN_OR_RETURN(s->event, backend.createEvent());
    s->seqs.resize(static_cast<size_t>(opts.max_seqs));
    s->tokens.resize(static_cast<size_t>(opts.max_batch_tokens));
    s->blocks = std::make_unique_for_overwrite<int32_t[]>(static_cast<size_t>(e->max_step_blocks_));
    e->slots_.push_back(std::move(s));
  }
  // Sampled ids are copied straight into the output arena: let the backend pin it.
  auto all = channel.outputArenaAll();
  RETURN_IF_ERROR(backend.registerHostMemory(all.data(), all.size()));
  static auto& steps = metrics::Registry::global().counter(
      "rose_llm_steps_total", "LLM steps answered by rose, by outcome", {"outcome"});
  static auto& step_seconds =
      metrics::Registry::global()
          .histogram("rose_llm_step_seconds", "LLM step taken until its sampled ids were published")
          .get();
  LlmEngine* self = e.get();
  e->queue_.start({[self](uint32_t slot) { return self->slots_[slot]->event->wait(); },
                   [self](uint32_t slot) { self->slots_[slot]->busy.store(false); }, &steps,
                   &step_seconds, "llm step failed"});
  return e;
}

LlmEngine::~LlmEngine() {
  drain(std::chrono::seconds(30));
  auto all = channel_.outputArenaAll();
  backend_.unregisterHostMemory(all.data());
}

void LlmEngine::announceReady() {
  shm::ModelFacts f;
  f.hidden_size = static_cast<uint32_t>(model_.config().base.hidden_size);
  f.max_seq_len = static_cast<uint32_t>(model_.maxModelLen());
  f.vocab_size = static_cast<uint32_t>(model_.vocabSize());
  f.max_batch_tokens = static_cast<uint32_t>(opts_.max_batch_tokens);
  std::strncpy(f.name, opts_.model_name.c_str(), sizeof(f.name) - 1);
  std::strncpy(f.kind, "llm", sizeof(f.kind) - 1);
  f.kv_num_blocks = static_cast<uint32_t>(opts_.kv_num_blocks);
  f.kv_block_size = static_cast<uint32_t>(opts_.kv_block_size);
  f.max_seqs = static_cast<uint32_t>(opts_.max_seqs);
  for (size_t i = 0; i < opts_.eos_ids.size() && i < kMaxEosIds; ++i) {
    f.eos_ids[i] = opts_.eos_ids[i];
  }
  channel_.setWorkerPid(static_cast<int32_t>(getpid()));
  channel_.setModelFacts(f);
  channel_.beat();
  channel_.setState(shm::WorkerState::kReady);
}

Status LlmEngine::admit(const shm::BatchDesc& d, uint32_t* rows) {
  const shm::Layout& l = channel_.layout();
  if (d.kind != shm::BatchKind::kGenerate) {
    return invalidArgument("batch kind " + std::to_string(static_cast<uint32_t>(d.kind)) +
                           ": this worker serves an llm (gpt-oss) and takes only generate "
                           "batches (kind 3)");
  }
  if (d.num_seqs == 0) return invalidArgument("num_seqs is 0");
  if (d.num_seqs > static_cast<uint32_t>(opts_.max_seqs)) {
    return invalidArgument("num_seqs " + std::to_string(d.num_seqs) + " exceeds max_seqs " +
                           std::to_string(opts_.max_seqs));
  }
  if (d.num_tokens == 0) return invalidArgument("num_tokens is 0");
  if (d.num_tokens > opts_.max_batch_tokens) {
    return invalidArgument("num_tokens " + std::to_string(d.num_tokens) +
                           " exceeds max_batch_tokens " + std::to_string(opts_.max_batch_tokens));
  }
  if (d.num_blocks > max_step_blocks_) {
    return invalidArgument("num_blocks " + std::to_string(d.num_blocks) + " exceeds " +
                           std::to_string(max_step_blocks_) +
                           " (max_seqs block tables of max_model_len tokens, within the "
                           "input arena)");
  }
  struct Region {
    const char* name;
    uint64_t offset, bytes;
  };
  const Region regions[] = {
      {"seqs", d.seqs_offset, uint64_t{d.num_seqs} * sizeof(llm::LlmStepSeq)},
      {"tokens", d.tokens_offset, uint64_t{d.num_tokens} * sizeof(int32_t)},
      {"blocks", d.blocks_offset, uint64_t{d.num_blocks} * sizeof(int32_t)},
  };
  for (const Region& r : regions) {
    if (r.offset % shm::kLlmAlign != 0) {
      return invalidArgument(std::string(r.name) + "_offset " + std::to_string(r.offset) +
                             " is not " + std::to_string(shm::kLlmAlign) + "-byte aligned");
    }
    if (!fits(r.offset, r.bytes, l.input_bytes)) {
      return invalidArgument(std::string(r.name) + " (offset " + std::to_string(r.offset) + ", " +
                             std::to_string(r.bytes) + " bytes) run past the input arena (" +
                             std::to_string(l.input_bytes) + " bytes)");
    }
  }
  // Copy out of shared memory first: what is validated is what runs, whatever the other side
  // writes afterwards.
  Slot& s = *slots_[d.slot];
  auto in = channel_.inputArena(d.slot);
  std::memcpy(s.seqs.data(), in.data() + d.seqs_offset, regions[0].bytes);
  std::memcpy(s.tokens.data(), in.data() + d.tokens_offset, regions[1].bytes);
  if (d.num_blocks > 0) std::memcpy(s.blocks.get(), in.data() + d.blocks_offset, regions[2].bytes);

  int64_t sum = 0;
  uint32_t sampled = 0;
  for (uint32_t i = 0; i < d.num_seqs; ++i) {
    const llm::LlmStepSeq& q = s.seqs[i];
    if (q.logits != llm::LogitsMode::kNone) {
      return invalidArgument("sequence " + std::to_string(i) +
                             ": logits must be 0 (none): logits do not cross the shm channel");
    }
    sum += q.num_tokens;
    if (q.sample != 0) ++sampled;
  }
  if (sum != d.num_tokens) {
    return invalidArgument("the sequences' num_tokens sum to " + std::to_string(sum) +
                           ", BatchDesc.num_tokens is " + std::to_string(d.num_tokens));
  }
  if (uint64_t{sampled} * sizeof(int32_t) > l.output_bytes) {
    return invalidArgument(std::to_string(sampled) +
                           " sampled ids need more than the output "
                           "arena's " +
                           std::to_string(l.output_bytes) + " bytes");
  }
  *rows = sampled;
  const LlmStep step{std::span<const llm::LlmStepSeq>(s.seqs.data(), d.num_seqs),
                     std::span<const int32_t>(s.tokens.data(), d.num_tokens),
                     std::span<const int32_t>(s.blocks.get(), d.num_blocks)};
  return model_.validate(step, *kv_);
}

void LlmEngine::reject(const shm::BatchDesc& d, const Status& st,
                       std::chrono::steady_clock::time_point t) {
  rejected_.fetch_add(1);
  queue_.reject(d, st, t, "llm step rejected");
}

bool LlmEngine::step(std::chrono::microseconds wait) {
  channel_.beat();
  std::optional<shm::BatchDesc> got = channel_.waitSubmission(wait);
  channel_.beat();
  if (!got) return false;
  const shm::BatchDesc d = *got;
  const auto taken = std::chrono::steady_clock::now();

  if (Status st = checkTaken(
          d, slots_.size(), [this](uint32_t i) { return slots_[i]->busy.load(); }, "step");
      !st.isOk()) {
    reject(d, st, taken);
    return true;
  }
  Slot& slot = *slots_[d.slot];
  uint32_t rows = 0;
  if (Status st = admit(d, &rows); !st.isOk()) {
    reject(d, st, taken);
    return true;
  }

  slot.busy.store(true);
  int32_t* out =
      rows > 0 ? reinterpret_cast<int32_t*>(channel_.outputArena(d.slot).data()) : nullptr;
  const LlmStep step{std::span<const llm::LlmStepSeq>(slot.seqs.data(), d.num_seqs),
                     std::span<const int32_t>(slot.tokens.data(), d.num_tokens),
                     std::span<const int32_t>(slot.blocks.get(), d.num_blocks)};
  PagedKvCache* kv = kv_.get();
  backend_.launch([this, step, kv, out] { model_.enqueueStep(step, *kv, nullptr, out); });
  PendingCompletion p;
  p.launched = true;
  p.taken = taken;
  p.completion.batch_id = d.batch_id;
  p.completion.slot = d.slot;
  p.completion.status_code = 0;
  p.completion.rows = rows;
  p.completion.cols = 1;
  p.completion.output_bytes = uint64_t{rows} * sizeof(int32_t);
  if (Status st = backend_.recordEvent(*slot.event); !st.isOk()) {
    // Cannot track this step: wait for it here (rare, backend failure) and report the error.
    (void)backend_.synchronize();
    p.completion.status_code = static_cast<int32_t>(st.code());
    copyCompletionMessage(p.completion.message, st.message());
  }
  {
    static auto& tokens = metrics::Registry::global()
                              .counter("rose_llm_step_tokens_total",
                                       "Tokens run through LLM steps (prefill and decode)")
                              .get();
    tokens.inc(static_cast<double>(d.num_tokens));
  }
  run_.fetch_add(1);
  queue_.push(std::move(p));
  return true;
}

bool LlmEngine::drain(std::chrono::milliseconds timeout) { return queue_.drain(timeout); }

void LlmEngine::run(const std::function<bool()>& should_stop) {
  while (!should_stop()) step(opts_.poll);
  channel_.setState(shm::WorkerState::kStopping);
  channel_.wakeAll();
  if (!drain(std::chrono::seconds(30))) log::warn("stopping with llm steps still in flight");
}

LlmEngineStats LlmEngine::stats() const {
  return {run_.load(), rejected_.load(), queue_.published()};
}

}  // namespace garden::rose
