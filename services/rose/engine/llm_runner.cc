#include "services/rose/engine/llm_runner.h"

#include <simdjson.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>

#include "common/logging.h"
#include "common/metrics/registry.h"
#include "common/shm/llm_batch.h"

namespace garden::rose {
namespace {

using simdjson::dom::element;

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

Result<std::unique_ptr<LlmRunner>> LlmRunner::create(Backend& backend, GptOssModel& model,
                                                     const LlmRunnerOptions& opts) {
  auto wrapped = std::make_unique<GptOssStepModel>(model);
  ASSIGN_OR_RETURN(std::unique_ptr<LlmRunner> r, create(backend, *wrapped, opts));
  r->owned_model_ = std::move(wrapped);
  return r;
}

Result<std::unique_ptr<LlmRunner>> LlmRunner::create(Backend& backend, LlmStepModel& model,
                                                     const LlmRunnerOptions& opts) {
  if (opts.kv_num_blocks <= 0) return invalidArgument("kv_num_blocks must be positive");
  if (opts.kv_block_groups < 1 || opts.kv_num_blocks % opts.kv_block_groups != 0)
    return invalidArgument("kv_block_groups must be >= 1 and divide kv_num_blocks");
  if (opts.kv_block_size <= 0) return invalidArgument("kv_block_size must be positive");
  if (opts.kv_num_blocks_window < 0 ||
      (opts.kv_num_blocks_window > 0 &&
       (model.kvWindow() <= 0 || opts.kv_num_blocks_window % opts.kv_block_groups != 0))) {
    return invalidArgument(
        "kv_num_blocks_window must be 0, or a multiple of kv_block_groups for a model whose "
        "sliding layers can keep a window pool");
  }
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
  std::unique_ptr<LlmRunner> r(new LlmRunner(backend, model, opts));
  const KvCacheShape shape =
      model.kvShape(opts.kv_num_blocks, opts.kv_block_size, opts.kv_num_blocks_window);
  if (!opts.kv_export.empty() && backend.name() == "cpu") {  // [TAG_KV_PULL]
    ASSIGN_OR_RETURN(r->export_, SharedKvPools::createNamed(opts.kv_export, shape,
                                                            model.kvDType()));
    ASSIGN_OR_RETURN(r->kv_, r->export_->cache());
  } else if (!opts.kv_export.empty()) {  // [TAG_KV_PULL_CUDA] device memory, IPC handles
    ASSIGN_OR_RETURN(r->kv_, PagedKvCache::create(backend, shape, model.kvDType()));
    ASSIGN_OR_RETURN(const PeerMemoryHandle k, backend.exportPeerMemory(r->kv_->keys(0).data));
    ASSIGN_OR_RETURN(const PeerMemoryHandle v, backend.exportPeerMemory(r->kv_->values(0).data));
    ASSIGN_OR_RETURN(r->export_, SharedKvPools::createNamedDevice(opts.kv_export, shape,
                                                                  model.kvDType(), k, v));
  } else {
    ASSIGN_OR_RETURN(r->kv_, PagedKvCache::create(backend, shape, model.kvDType()));
  }
  // (A sharded model's cache holds one dp group's share of the window ids.)
  if ((r->kv_->shape().num_blocks_window > 0) != (opts.kv_num_blocks_window > 0)) {
    return invalidArgument("kv_num_blocks_window: the model keeps no window pool (sliding layers "
                           "among its first 64 only)");
  }
  return r;
}

RunnerTraits LlmRunner::traits() const {
  return {"llm", "step", "rose_llm_steps_total", "LLM steps answered by rose, by outcome",
          "rose_llm_step_seconds", "LLM step taken until its sampled ids were published"};
}

shm::Layout LlmRunner::layoutFor(uint32_t slots) const {
  const auto max_seqs = static_cast<uint64_t>(opts_.max_seqs);
  // With a window pool each sequence carries its window table too [TAG_KV_WINDOW_GROUP].
  const auto tables =
      static_cast<uint64_t>(kvBlocksFor(model_.maxModelLen(), opts_.kv_block_size)) *
      (opts_.kv_num_blocks_window > 0 ? 2u : 1u);
  shm::Layout l;
  l.slots = slots;
  // Room for at least one whole sampler-state reload (a full context plus the largest
  // logit_bias) [TAG_LLM_SAMPLER_STATE], so a sequence's first step always fits.
  l.input_bytes = shm::llmStepBytes(
      max_seqs, static_cast<uint64_t>(opts_.max_batch_tokens), max_seqs * tables,
      static_cast<uint64_t>(model_.maxModelLen()) + 2 * llm::kMaxLogitBias);
  l.output_bytes = std::max<uint64_t>(4096, max_seqs * shm::kLlmLogprobsCols * sizeof(int32_t));
  return l;
}

Status LlmRunner::bind(const shm::Layout& layout) {
  if (layout.output_bytes < uint64_t{sizeof(int32_t)} * static_cast<uint64_t>(opts_.max_seqs)) {
    return invalidArgument("the channel's output arena (" + std::to_string(layout.output_bytes) +
                           " bytes per slot) cannot hold max_seqs " +
                           std::to_string(opts_.max_seqs) + " sampled ids");
  }
  output_bytes_ = layout.output_bytes;
  // A step's block ids: at most max_seqs tables of the longest sequence, and never more than
  // the input arena can carry.
  max_step_blocks_ = std::min<int64_t>(
      static_cast<int64_t>(opts_.max_seqs) *
          kvBlocksFor(model_.maxModelLen(), opts_.kv_block_size) *
          (opts_.kv_num_blocks_window > 0 ? 2 : 1),
      static_cast<int64_t>(layout.input_bytes / sizeof(int32_t)));
  slots_.resize(layout.slots);
  for (Slot& s : slots_) {
    s.seqs.resize(static_cast<size_t>(opts_.max_seqs));
    s.tokens.resize(static_cast<size_t>(opts_.max_batch_tokens));
    s.blocks = std::make_unique_for_overwrite<int32_t[]>(static_cast<size_t>(max_step_blocks_));
  }
  return okStatus();
}

shm::ModelFacts LlmRunner::facts() const {
  shm::ModelFacts f;
  f.hidden_size = static_cast<uint32_t>(model_.hiddenSize());
  f.max_seq_len = static_cast<uint32_t>(model_.maxModelLen());
  f.vocab_size = static_cast<uint32_t>(model_.vocabSize());
  f.max_batch_tokens = static_cast<uint32_t>(opts_.max_batch_tokens);
  f.kv_num_blocks = static_cast<uint32_t>(opts_.kv_num_blocks);
  f.kv_block_size = static_cast<uint32_t>(opts_.kv_block_size);
  f.kv_block_groups = static_cast<uint32_t>(opts_.kv_block_groups);
  if (opts_.kv_num_blocks_window > 0) {  // [TAG_KV_WINDOW_GROUP]
    f.kv_num_blocks_window = static_cast<uint32_t>(opts_.kv_num_blocks_window);
    f.kv_window = static_cast<uint32_t>(model_.kvWindow());
  }
  f.max_seqs = static_cast<uint32_t>(opts_.max_seqs);
  for (size_t i = 0; i < opts_.eos_ids.size() && i < kMaxEosIds; ++i) {
    f.eos_ids[i] = opts_.eos_ids[i];
  }
  if (model_.supportsSamplerState()) f.llm_caps |= shm::kLlmCapSamplerState;
  if (model_.supportsTokenMask()) f.llm_caps |= shm::kLlmCapTokenMask;
  if (late_masks_) f.llm_caps |= shm::kLlmCapLateMask;
  if (pullServed()) f.llm_caps |= shm::kLlmCapKvPull;  // [TAG_KV_PULL]
  std::snprintf(f.kv_export, sizeof(f.kv_export), "%s", opts_.kv_export.c_str());
  std::snprintf(f.sampler, sizeof(f.sampler), "%.*s", static_cast<int>(backend_.name().size()),
                backend_.name().data());
  return f;
}

LlmStep LlmRunner::stagedStep(uint32_t slot, const shm::BatchDesc& d) const {
  const Slot& s = slots_[slot];
  const int64_t words = static_cast<int64_t>(shm::llmMaskWords(
      static_cast<uint64_t>(model_.vocabSize())));
  return LlmStep{std::span<const llm::LlmStepSeq>(s.seqs.data(), d.num_seqs),
                 std::span<const int32_t>(s.tokens.data(), d.num_tokens),
                 std::span<const int32_t>(s.blocks.get(), d.num_blocks),
                 std::span<const int32_t>(s.state.data(), d.num_state),
                 std::span<const uint32_t>(s.masks.data(), s.num_masks * static_cast<size_t>(words)),
                 words};
}

Status LlmRunner::mapPullSource(SharedKvPools& pools) {
  RETURN_IF_ERROR(checkKvPoolLocation(pools.onDevice(), backend_));
  return pools.onDevice() ? pools.mapDevice(backend_) : okStatus();
}

Result<const SharedKvPools*> LlmRunner::pullSource(const std::string& name, int32_t pid) {
  for (auto& [n, pools] : pull_sources_) {
    if (n != name) continue;
    if (pools->pid() == pid) return pools.get();
    // Re-created by another process (its worker restarted): open it again, after the copies
    // still queued from the old mapping ran.
    ASSIGN_OR_RETURN(auto fresh, SharedKvPools::openNamed(name, pid));
    RETURN_IF_ERROR(mapPullSource(*fresh));
    RETURN_IF_ERROR(backend_.synchronize());
    pools = std::move(fresh);
    return pools.get();
  }
  if (pull_sources_.size() >= kMaxPullSources) {
    return resourceExhausted("kv pull: already reading " + std::to_string(kMaxPullSources) +
                             " exports; '" + name + "' would be one more");
  }
  ASSIGN_OR_RETURN(auto pools, SharedKvPools::openNamed(name, pid));
  if (opts_.kv_export == name && pools->pid() == static_cast<int32_t>(getpid())) {
    return invalidArgument("kv pull: source " + name + " is this worker's own cache");
  }
  RETURN_IF_ERROR(mapPullSource(*pools));
  pull_sources_.emplace_back(name, std::move(pools));
  return pull_sources_.back().second.get();
}

Result<OutputShape> LlmRunner::admitPull(const shm::BatchDesc& d,
                                         std::span<const std::byte> input) {
  if (!pullServed()) {
    return invalidArgument("kv pull batches (kind 4) are not served by this worker (a sharded "
                           "model: its cache lives in the ranks; no kLlmCapKvPull)");
  }
  if (d.num_seqs != 0 || d.num_tokens != 0) {
    return invalidArgument("kv pull: num_seqs and num_tokens must be 0");
  }
  if (d.flags != 0) return invalidArgument("flags " + std::to_string(d.flags) + ": none apply to a kv pull");
  if (d.seqs_offset % shm::kLlmAlign != 0 ||
      !arenaFits(d.seqs_offset, sizeof(shm::KvPullDesc), input.size())) {
    return invalidArgument("kv pull: the KvPullDesc at seqs_offset " +
                           std::to_string(d.seqs_offset) +
                           " is misaligned or runs past the input arena (" +
                           std::to_string(input.size()) + " bytes)");
  }
  shm::KvPullDesc pd;
  std::memcpy(&pd, input.data() + d.seqs_offset, sizeof(pd));
  const uint64_t entries = 2 * (uint64_t{pd.num_pairs} + pd.num_window_pairs);
  if (entries != d.num_blocks) {
    return invalidArgument("kv pull: num_blocks " + std::to_string(d.num_blocks) +
                           " != 2 * (num_pairs " + std::to_string(pd.num_pairs) +
                           " + num_window_pairs " + std::to_string(pd.num_window_pairs) + ")");
  }
  if (entries == 0) return invalidArgument("kv pull: no pairs");
  if (d.blocks_offset % shm::kLlmAlign != 0 ||
      !arenaFits(d.blocks_offset, entries * sizeof(int32_t), input.size())) {
    return invalidArgument("kv pull: the pairs (offset " + std::to_string(d.blocks_offset) + ", " +
                           std::to_string(entries * sizeof(int32_t)) +
                           " bytes) are misaligned or run past the input arena");
  }
  if (pd.source[sizeof(pd.source) - 1] != '\0' || pd.source[0] == '\0') {
    return invalidArgument("kv pull: source must be a non-empty, NUL-terminated name");
  }
  if (pd.source_pid <= 0) return invalidArgument("kv pull: source_pid must be positive");
  Slot& s = slots_[d.slot];
  s.pull_pairs.resize(entries);
  std::memcpy(s.pull_pairs.data(), input.data() + d.blocks_offset, entries * sizeof(int32_t));
  s.pull_full = 2 * size_t{pd.num_pairs};
  ASSIGN_OR_RETURN(const SharedKvPools* src, pullSource(pd.source, pd.source_pid));
  const std::span<const int32_t> all(s.pull_pairs);
  RETURN_IF_ERROR(checkKvBlockPairs(src->view(), *kv_, all.first(s.pull_full),
                                    all.subspan(s.pull_full)));
  s.pull_source = src;
  s.sampled = 0;
  s.logprobs = false;
  s.late = nullptr;
  return OutputShape{0, 1, sizeof(int32_t)};
}

Result<OutputShape> LlmRunner::admit(const shm::BatchDesc& d, std::span<const std::byte> input) {
  slots_[d.slot].pull_source = nullptr;
  if (d.kind == shm::BatchKind::kKvPull) return admitPull(d, input);  // [TAG_KV_PULL]
  if (d.kind != shm::BatchKind::kGenerate) {
    return invalidArgument("batch kind " + std::to_string(static_cast<uint32_t>(d.kind)) +
                           ": this worker serves an llm (gpt-oss) and takes only generate "
                           "batches (kind 3) and kv pulls (kind 4)");
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
      {"state", d.state_offset, uint64_t{d.num_state} * sizeof(int32_t)},
  };
  for (const Region& r : regions) {
    if (r.offset % shm::kLlmAlign != 0) {
      return invalidArgument(std::string(r.name) + "_offset " + std::to_string(r.offset) +
                             " is not " + std::to_string(shm::kLlmAlign) + "-byte aligned");
    }
    if (!arenaFits(r.offset, r.bytes, input.size())) {
      return invalidArgument(std::string(r.name) + " (offset " + std::to_string(r.offset) + ", " +
                             std::to_string(r.bytes) + " bytes) run past the input arena (" +
                             std::to_string(input.size()) + " bytes)");
    }
  }
  // Copy out of shared memory first: what is validated is what runs, whatever the other side
  // writes afterwards.
  Slot& s = slots_[d.slot];
  std::memcpy(s.seqs.data(), input.data() + d.seqs_offset, regions[0].bytes);
  std::memcpy(s.tokens.data(), input.data() + d.tokens_offset, regions[1].bytes);
  if (d.num_blocks > 0) {
    std::memcpy(s.blocks.get(), input.data() + d.blocks_offset, regions[2].bytes);
  }
  s.state.resize(d.num_state);
  if (d.num_state > 0) std::memcpy(s.state.data(), input.data() + d.state_offset, regions[3].bytes);

  int64_t sum = 0;
  uint32_t sampled = 0;
  bool logprobs = false;
  for (uint32_t i = 0; i < d.num_seqs; ++i) {
    const llm::LlmStepSeq& q = s.seqs[i];
    if (q.logits != llm::LogitsMode::kNone) {
      return invalidArgument("sequence " + std::to_string(i) +
                             ": logits must be 0 (none): logits do not cross the shm channel");
    }
    sum += q.num_tokens;
    if (q.sample != 0) ++sampled;
    if (q.sample != 0 && q.sampling.logprobs >= 0) logprobs = true;
  }
  // Token bitmasks [TAG_TOKEN_MASK]: as many as the largest mask_index, at seqlens_offset.
  uint32_t num_masks = 0;
  for (uint32_t i = 0; i < d.num_seqs; ++i) {
    const llm::LlmStepSeq& q = s.seqs[i];
    if (q.mask_index < 0 || static_cast<uint32_t>(q.mask_index) > d.num_seqs ||
        (q.mask_index > 0 && q.sample == 0)) {
      return invalidArgument("sequence " + std::to_string(i) + ": mask_index " +
                             std::to_string(q.mask_index) +
                             " (0 = none; 1..num_seqs, and only with sample != 0)");
    }
    num_masks = std::max(num_masks, static_cast<uint32_t>(q.mask_index));
  }
  s.num_masks = num_masks;
  s.late = nullptr;
  const bool late = (d.flags & shm::kBatchLateMasks) != 0;
  if (d.flags & ~shm::kBatchLateMasks) {
    return invalidArgument("flags " + std::to_string(d.flags) + " has unknown bits");
  }
  if (late && !late_masks_) {
    return invalidArgument("flags: late token masks (kBatchLateMasks) are not served by this "
                           "worker (it does not announce kLlmCapLateMask)");
  }
  if (late && num_masks == 0) {
    return invalidArgument("flags: late token masks but no sequence has a mask_index");
  }
  if (num_masks > 0) {
    const uint64_t words = shm::llmMaskWords(static_cast<uint64_t>(model_.vocabSize()));
    const uint64_t bytes = uint64_t{num_masks} * words * sizeof(uint32_t);
    // [TAG_LATE_MASKS] Late: a ready word and padding before the masks, read after it is set.
    const uint64_t head = late ? shm::kLateMaskHeaderBytes : 0;
    if (d.seqlens_offset % shm::kLlmAlign != 0 ||
        !arenaFits(d.seqlens_offset, head + bytes, input.size())) {
      return invalidArgument("token masks (offset " + std::to_string(d.seqlens_offset) + ", " +
                             std::to_string(head + bytes) + " bytes) are misaligned or run past "
                             "the input arena (" + std::to_string(input.size()) + " bytes)");
    }
    s.masks.resize(num_masks * words);
    if (late) {
      // The arena is the channel's mapping: the pointer stays valid while the slot holds this
      // step (tulip reuses the slot only after its completion).
      s.late = const_cast<std::byte*>(input.data()) + d.seqlens_offset;
    } else {
      std::memcpy(s.masks.data(), input.data() + d.seqlens_offset, bytes);
    }
  }
  if (sum != d.num_tokens) {
    return invalidArgument("the sequences' num_tokens sum to " + std::to_string(sum) +
                           ", BatchDesc.num_tokens is " + std::to_string(d.num_tokens));
  }
  const OutputShape shape{sampled, logprobs ? shm::kLlmLogprobsCols : 1, sizeof(int32_t)};
  if (shape.bytes() > output_bytes_) {
    return invalidArgument(std::to_string(sampled) +
                           " sampled ids need more than the output arena's " +
                           std::to_string(output_bytes_) + " bytes");
  }
  // [TAG_LLM_PREV_TOKEN] Against the step launched last (this thread's count): the model's own
  // count moves when the backend's queue runs enqueueStep, which may not have happened yet.
  RETURN_IF_ERROR(model_.validate(stagedStep(d.slot, d), *kv_, launched_sampled_));
  s.sampled = sampled;
  s.logprobs = logprobs;
  return shape;
}

Status LlmRunner::launch(const shm::BatchDesc& d, std::span<std::byte> output) {
  Slot& slot = slots_[d.slot];
  if (slot.pull_source != nullptr) {  // [TAG_KV_PULL]
    const std::span<const int32_t> all(slot.pull_pairs);
    static auto& pulled = metrics::Registry::global()
                              .counter("rose_kv_pull_blocks_total",
                                       "KV blocks copied into this worker's cache from another "
                                       "worker's export (prefill/decode handoff)")
                              .get();
    pulled.inc(static_cast<double>(all.size() / 2));
    return copyKvBlocks(backend_, slot.pull_source->view(), *kv_, all.first(slot.pull_full),
                        all.subspan(slot.pull_full));
  }
  LlmStep step = stagedStep(d.slot, d);
  if (slot.late != nullptr) {  // [TAG_LATE_MASKS]
    std::byte* region = slot.late;
    uint32_t* dst = slot.masks.data();
    const size_t bytes = slot.masks.size() * sizeof(uint32_t);
    const auto timeout = opts_.late_mask_timeout;
    const uint64_t batch_id = d.batch_id;
    step.await_masks = [region, dst, bytes, timeout, batch_id] {
      static auto& waited = metrics::Registry::global()
                                .counter("rose_llm_late_mask_wait_seconds_total",
                                         "Time LLM steps waited for late token masks after "
                                         "their forward pass was launched")
                                .get();
      const auto t0 = std::chrono::steady_clock::now();
      const bool ok = shm::awaitLateMasks(region, timeout);
      waited.inc(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
      if (!ok) {
        log::warn("late token masks did not come; sampling without them",
                  {{"batch_id", batch_id}, {"timeout_ms", timeout.count()}});
        return false;
      }
      std::memcpy(dst, region + shm::kLateMaskHeaderBytes, bytes);
      return true;
    };
  }
  int32_t* out = slot.sampled > 0 ? reinterpret_cast<int32_t*>(output.data()) : nullptr;
  // Logprob records follow the ids (common/shm/llm_batch.h); 4-byte aligned.
  auto* lps = slot.sampled > 0 && slot.logprobs
                  ? reinterpret_cast<llm::LlmTokenLogprobs*>(output.data() +
                                                             sizeof(int32_t) * slot.sampled)
                  : nullptr;
  PagedKvCache* kv = kv_.get();
  launched_sampled_ = slot.sampled;
  backend_.launch([this, step, kv, out, lps] { model_.enqueueStep(step, *kv, out, lps); });
  static auto& tokens = metrics::Registry::global()
                            .counter("rose_llm_step_tokens_total",
                                     "Tokens run through LLM steps (prefill and decode)")
                            .get();
  tokens.inc(static_cast<double>(d.num_tokens));
  return okStatus();
}

}  // namespace garden::rose
