#include "services/rose/ops/sampler.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <iterator>
#include <limits>
#include <string>

namespace garden::rose {

Status validateSamplingParams(const SamplingParams& p) {
  if (!std::isfinite(p.temperature) || p.temperature < 0.f) {
    return invalidArgument("temperature: must be a finite number >= 0 (got " +
                           std::to_string(p.temperature) + ")");
  }
  if (!(p.top_p > 0.f && p.top_p <= 1.f)) {
    return invalidArgument("top_p: must be in (0, 1] (got " + std::to_string(p.top_p) + ")");
  }
  if (p.top_k < 0) {
    return invalidArgument("top_k: must be >= 0 (got " + std::to_string(p.top_k) + ")");
  }
  if (!(p.min_p >= 0.f && p.min_p <= 1.f)) {
    return invalidArgument("min_p: must be in [0, 1] (got " + std::to_string(p.min_p) + ")");
  }
  if (!(p.presence_penalty >= -2.f && p.presence_penalty <= 2.f)) {
    return invalidArgument("presence_penalty: must be in [-2, 2] (got " +
                           std::to_string(p.presence_penalty) + ")");
  }
  if (!(p.frequency_penalty >= -2.f && p.frequency_penalty <= 2.f)) {
    return invalidArgument("frequency_penalty: must be in [-2, 2] (got " +
                           std::to_string(p.frequency_penalty) + ")");
  }
  if (!std::isfinite(p.repetition_penalty) || !(p.repetition_penalty > 0.f)) {
    return invalidArgument("repetition_penalty: must be a finite number > 0 (got " +
                           std::to_string(p.repetition_penalty) + ")");
  }
  if (p.logprobs < -1 || p.logprobs > llm::kMaxTopLogprobs) {
    return invalidArgument("logprobs: must be in [-1, " + std::to_string(llm::kMaxTopLogprobs) +
                           "] (got " + std::to_string(p.logprobs) + ")");
  }
  if (p.state_slot < -1) {
    return invalidArgument("state_slot: must be >= -1 (got " + std::to_string(p.state_slot) + ")");
  }
  if (llm::needsPenaltyState(p) && p.state_slot < 0) {
    return invalidArgument("state_slot: penalties need the sequence's sampler state (got -1)");
  }
  return okStatus();
}

void SamplerSlot::reset(std::span<const int32_t> prompt, std::span<const int32_t> output,
                        std::span<const LogitBias> bias) {
  seen_.clear();
  has_bias_ = false;
  for (int32_t t : prompt) seen_[t].prompt = true;
  for (int32_t t : output) ++seen_[t].output;
  for (const LogitBias& b : bias) {
    Entry& e = seen_[b.id];
    e.has_bias = true;
    e.bias = b.bias;
    has_bias_ = true;
  }
}

void SamplerSlot::apply(std::span<float> w, const SamplingParams& p) const {
  const float r = p.repetition_penalty;
  for (const auto& [t, e] : seen_) {
    if (t < 0 || static_cast<size_t>(t) >= w.size()) continue;
    float x = w[static_cast<size_t>(t)];
    if (e.has_bias) x += e.bias;
    if (e.prompt || e.output > 0) {
      if (r != 1.f) x = x > 0.f ? x / r : x * r;
      x -= p.frequency_penalty * static_cast<float>(e.output) +
           (e.output > 0 ? p.presence_penalty : 0.f);
    }
    w[static_cast<size_t>(t)] = x;
  }
}

void computeLogprobs(std::span<const float> logits, int32_t n, int32_t sampled,
                     llm::LlmTokenLogprobs* out) {
  const float ninf = -std::numeric_limits<float>::infinity();
  float mx = ninf;
  for (float x : logits) {
    if (!std::isnan(x) && x > mx) mx = x;
  }
  double sum = 0.0;
  for (float x : logits) {
    if (std::isnan(x) || x == ninf) continue;
    sum += std::isinf(mx) ? (x == mx ? 1.0 : 0.0) : std::exp(static_cast<double>(x) - mx);
  }
  // logZ = mx + log(sum); lp(x) = x − logZ. All −inf (or NaN): every lp is −inf.
  auto lp = [&](float x) -> float {
    if (std::isnan(x) || x == ninf || sum == 0.0) return ninf;
    if (std::isinf(mx)) return x == mx ? static_cast<float>(-std::log(sum)) : ninf;
    return static_cast<float>((static_cast<double>(x) - mx) - std::log(sum));
  };
  const size_t v = logits.size();
  out->logprob = sampled >= 0 && static_cast<size_t>(sampled) < v
                     ? lp(logits[static_cast<size_t>(sampled)])
                     : ninf;
  n = std::max(0, std::min<int32_t>(n, static_cast<int32_t>(std::min<size_t>(v, llm::kMaxTopLogprobs))));
  out->num_top = n;
  if (n == 0) return;
  // The n best (value, id): one pass keeping a small sorted list.
  auto better = [](float a, int32_t ia, float b, int32_t ib) {
    return a != b ? a > b : ia < ib;
  };
  int32_t k = 0;
  float vals[llm::kMaxTopLogprobs];
  int32_t ids[llm::kMaxTopLogprobs];
  for (size_t i = 0; i < v; ++i) {
    const float x = std::isnan(logits[i]) ? ninf : logits[i];
    const int32_t id = static_cast<int32_t>(i);
    if (k == n && !better(x, id, vals[n - 1], ids[n - 1])) continue;
    int32_t j = k < n ? k++ : n - 1;
    while (j > 0 && better(x, id, vals[j - 1], ids[j - 1])) {
      vals[j] = vals[j - 1];
      ids[j] = ids[j - 1];
      --j;
    }
    vals[j] = x;
    ids[j] = id;
  }
  for (int32_t j = 0; j < n; ++j) {
    out->top_ids[j] = ids[j];
    out->top_logprobs[j] = lp(logits[static_cast<size_t>(ids[j])]);
  }
}

namespace {
uint64_t splitmix(uint64_t z) {
  z += 0x9e3779b97f4a7c15ULL;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}
}  // namespace

uint64_t mixCounter(uint64_t seed, uint64_t counter) {
  return splitmix(splitmix(seed) ^ (counter * 0xd1342543de82ef95ULL + 0x2545f4914f6cdd1dULL));
}

double uniformFromCounter(uint64_t seed, uint64_t counter) {
  return static_cast<double>(mixCounter(seed, counter) >> 11) * 0x1.0p-53;
}

int32_t argmaxToken(std::span<const float> logits) {
  int32_t best = 0;
  float best_v = -std::numeric_limits<float>::infinity();
  bool found = false;
  for (size_t i = 0; i < logits.size(); ++i) {
    const float v = logits[i];
    if (std::isnan(v)) continue;
    if (!found || v > best_v) {
      best_v = v;
      best = static_cast<int32_t>(i);
      found = true;
    }
  }
  return best;
}

int32_t applyTokenBitmask(std::span<float> logits, const uint32_t* mask) {
  int32_t first = -1;
  const float ninf = -std::numeric_limits<float>::infinity();
  for (size_t i = 0; i < logits.size(); ++i) {
    if (tokenAllowed(mask, static_cast<int32_t>(i))) {
      if (first < 0) first = static_cast<int32_t>(i);
    } else {
      logits[i] = ninf;
    }
  }
  return first;
}

namespace {
// [TAG_SAMPLER_RADIX] The ids of cand[0, n) (values neither −inf nor NaN, distinct ids below
// 2^id_bits) in the draw order — value descending, id ascending, −0 equal to +0 — into ids[0, n),
// by an LSD radix sort of 64-bit keys: the value's bits made order-preserving and inverted, above
// the id. The keys are distinct and ordered as the comparison is, so the order is the one every
// correct sort by that comparison gives: the same draws, at a fraction of std::sort's time on a
// 201k vocabulary.
void radixDrawOrder(const std::vector<std::pair<float, int32_t>>& cand, size_t n, int id_bits,
                    std::vector<uint64_t>& ids, std::vector<uint64_t>& tmp) {
  ids.resize(n);
  tmp.resize(n);
  for (size_t i = 0; i < n; ++i) {
    const float z = cand[i].first == 0.f ? 0.f : cand[i].first;  // −0 as +0
    uint32_t b;
    std::memcpy(&b, &z, sizeof b);
    const uint32_t ascending = (b & 0x80000000u) != 0 ? ~b : (b | 0x80000000u);
    ids[i] = (static_cast<uint64_t>(~ascending) << id_bits) | static_cast<uint32_t>(cand[i].second);
  }
  constexpr int kDigit = 11;
  constexpr uint64_t kMask = (uint64_t{1} << kDigit) - 1;
  size_t count[size_t{1} << kDigit];
  for (int shift = 0; shift < 32 + id_bits; shift += kDigit) {
    std::fill(std::begin(count), std::end(count), size_t{0});
    for (size_t i = 0; i < n; ++i) ++count[(ids[i] >> shift) & kMask];
    size_t at = 0;
    for (size_t& c : count) {
      const size_t k = c;
      c = at;
      at += k;
    }
    for (size_t i = 0; i < n; ++i) tmp[count[(ids[i] >> shift) & kMask]++] = ids[i];
    ids.swap(tmp);
  }
  const uint64_t id_mask = (uint64_t{1} << id_bits) - 1;
  for (size_t i = 0; i < n; ++i) ids[i] &= id_mask;
}
}  // namespace

const std::vector<std::pair<int32_t, double>>& Sampler::distribution(std::span<const float> logits,
                                                                     const SamplingParams& p) {
  const size_t v = logits.size();
  const float inv_t = 1.f / p.temperature;
  const float ninf = -std::numeric_limits<float>::infinity();
  cand_.resize(v);
  // [TAG_SAMPLER_NINF_TAIL] The draw order is (value descending, id ascending). The −inf
  // candidates (tokens a grammar mask or logit_bias removed, NaN) all come last in it, in id
  // order, so they are placed there directly and only the others are sorted: the same order
  // as sorting all of them, at a fraction of the cost when a mask leaves few tokens (a full sort
  // of a 201k vocabulary per draw was most of the CPU backend's time on masked requests).
  // A NaN logit (or 0 times an infinite 1/temperature) counts as −inf.
  const auto z_of = [&](size_t i) {
    const float z = logits[i] * inv_t;
    return std::isnan(z) ? ninf : z;
  };
  // One pass: the others from the front, the −inf ones from the back (then reversed into id
  // order).
  size_t nf = 0, tail = v;
  for (size_t i = 0; i < v; ++i) {
    const float z = z_of(i);
    if (z != ninf) {
      cand_[nf++] = {z, static_cast<int32_t>(i)};
    } else {
      cand_[--tail] = {ninf, static_cast<int32_t>(i)};
    }
  }
  std::reverse(cand_.begin() + static_cast<std::ptrdiff_t>(nf), cand_.end());
  auto order = [](const std::pair<float, int32_t>& a, const std::pair<float, int32_t>& b) {
    return a.first != b.first ? a.first > b.first : a.second < b.second;
  };
  const auto finite_end = cand_.begin() + static_cast<std::ptrdiff_t>(nf);
  size_t keep = v;
  if (p.top_k > 0 && static_cast<size_t>(p.top_k) < v) {
    keep = static_cast<size_t>(p.top_k);
  }
  if (keep < nf && keep <= 4096) {
    std::partial_sort(cand_.begin(), cand_.begin() + static_cast<std::ptrdiff_t>(keep), finite_end,
                      order);
  } else if (nf < 2048) {
    std::sort(cand_.begin(), finite_end, order);
  } else {  // [TAG_SAMPLER_RADIX]
    int id_bits = 1;
    while ((uint64_t{1} << id_bits) < v) ++id_bits;
    radixDrawOrder(cand_, nf, id_bits, order_, order_tmp_);
    for (size_t i = 0; i < nf; ++i) {
      const size_t id = static_cast<size_t>(order_[i]);
      cand_[i] = {z_of(id), static_cast<int32_t>(id)};
    }
  }
  if (p.min_p > 0.f && std::isfinite(cand_[0].first)) {
    // p_i >= min_p · p_max  ⇔  z_i − z_max >= log(min_p); the sorted prefix that passes.
    const double cut = static_cast<double>(cand_[0].first) + std::log(static_cast<double>(p.min_p));
    size_t n = 1;
    while (n < keep && static_cast<double>(cand_[n].first) >= cut) ++n;
    keep = n;
  }
  dist_.clear();
  const double mx = cand_[0].first;
  double sum = 0.0;
  for (size_t i = 0; i < keep; ++i) {
    const double z = cand_[i].first;
    double e;
    if (std::isinf(mx)) {  // +inf logits share the mass; all −inf: the first candidate
      e = mx > 0 ? (z == mx ? 1.0 : 0.0) : (i == 0 ? 1.0 : 0.0);
    } else {
      e = i < nf ? std::exp(z - mx) : 0.0;  // exp(−inf) = 0
    }
    dist_.emplace_back(cand_[i].second, e);
    sum += e;
  }
  for (auto& d : dist_) d.second /= sum;
  if (p.top_p < 1.f) {
    double mass = 0.0;
    size_t n = 0;
    while (n < dist_.size()) {
      mass += dist_[n].second;
      ++n;
      if (mass >= static_cast<double>(p.top_p)) break;
    }
    dist_.resize(n);
    for (auto& d : dist_) d.second /= mass;
  }
  return dist_;
}

int32_t Sampler::sample(std::span<const float> logits, const SamplingParams& p, uint64_t counter,
                        SamplerSlot* slot, llm::LlmTokenLogprobs* lp, const uint32_t* mask) {
  std::span<const float> w = logits;
  const bool adjust = slot != nullptr && slot->active(p) && !logits.empty();
  int32_t first_allowed = -1;
  if (adjust || (mask != nullptr && !logits.empty())) {
    w_.assign(logits.begin(), logits.end());
    if (adjust) slot->apply(w_, p);
    if (mask != nullptr) first_allowed = applyTokenBitmask(w_, mask);  // [TAG_TOKEN_MASK]
    w = w_;
  }
  int32_t tok = sample(w, p, counter);
  if (!tokenAllowed(mask, tok) && first_allowed >= 0) tok = first_allowed;
  if (lp != nullptr) {
    if (p.logprobs >= 0 && !logits.empty()) {
      computeLogprobs(logits, p.logprobs, tok, lp);
    } else {
      *lp = llm::LlmTokenLogprobs{};
    }
  }
  if (slot != nullptr) slot->addOutput(tok);
  return tok;
}

int32_t Sampler::sample(std::span<const float> logits, const SamplingParams& p, uint64_t counter) {
  if (logits.empty()) return 0;
  if (p.temperature <= 0.f) return argmaxToken(logits);
  const auto& d = distribution(logits, p);
  const double u = uniformFromCounter(p.seed, counter);
  double cum = 0.0;
  for (const auto& [id, prob] : d) {
    cum += prob;
    if (u < cum) return id;
  }
  return d.back().first;  // rounding: u ≥ the final cumulative sum
}

}  // namespace garden::rose
