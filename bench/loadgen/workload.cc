#include "bench/loadgen/workload.h"

#include <algorithm>
#include <array>
#include <cmath>

namespace garden::bench {

Result<Mode> parseMode(std::string_view s) {
  if (s == "embed") return Mode::kEmbed;
  if (s == "score") return Mode::kScore;
  if (s == "chat") return Mode::kChat;
  return invalidArgument("--mode must be embed, score or chat, got '" + std::string(s) + "'");
}

Result<Protocol> parseProtocol(std::string_view s) {
  if (s == "grpc") return Protocol::kGrpc;
  if (s == "http") return Protocol::kHttp;
  return invalidArgument("--protocol must be grpc or http, got '" + std::string(s) + "'");
}

Result<InputKind> parseInputKind(std::string_view s) {
  if (s == "tokens") return InputKind::kTokens;
  if (s == "text") return InputKind::kText;
  return invalidArgument("--input must be tokens or text, got '" + std::string(s) + "'");
}

std::string_view modeName(Mode m) {
  switch (m) {
    case Mode::kEmbed:
      return "embed";
    case Mode::kScore:
      return "score";
    case Mode::kChat:
      return "chat";
  }
  return "?";
}

std::string_view protocolName(Protocol p) { return p == Protocol::kGrpc ? "grpc" : "http"; }
std::string_view inputKindName(InputKind k) { return k == InputKind::kTokens ? "tokens" : "text"; }

std::vector<int32_t> randomTokens(Rng& rng, int32_t len, int32_t lo, int32_t hi) {
  CHECK(lo < hi && len >= 0);
  std::uniform_int_distribution<int32_t> d(lo, hi - 1);
  std::vector<int32_t> out(static_cast<size_t>(len));
  for (auto& t : out) t = d(rng);
  return out;
}

namespace {
// Common English words (lower case, no punctuation): they tokenize to one or two pieces in most
// vocabularies, so a word count converges on a token target in a few probes.
constexpr std::array<std::string_view, 120> kWords = {
    "the",    "of",      "and",      "to",     "in",     "is",       "that",  "for",    "it",
    "as",     "was",     "with",     "be",     "by",     "on",       "not",   "he",     "this",
    "are",    "or",      "his",      "from",   "at",     "which",    "but",   "have",   "an",
    "had",    "they",    "you",      "were",   "their",  "one",      "all",   "we",     "can",
    "her",    "has",     "there",    "been",   "if",     "more",     "when",  "will",   "would",
    "who",    "so",      "no",       "time",   "people", "year",     "way",   "day",    "man",
    "thing",  "woman",   "life",     "child",  "world",  "school",   "state", "family", "student",
    "group",  "country", "problem",  "hand",   "part",   "place",    "case",  "week",   "company",
    "system", "program", "question", "work",   "number", "night",    "point", "home",   "water",
    "room",   "mother",  "area",     "money",  "story",  "fact",     "month", "lot",    "right",
    "study",  "book",    "eye",      "job",    "word",   "business", "issue", "side",   "kind",
    "head",   "house",   "service",  "friend", "father", "power",    "hour",  "game",   "line",
    "end",    "member",  "law",      "car",    "city",   "name",     "team",  "minute", "idea",
    "kid",    "body",    "garden"};
}  // namespace

std::string randomWords(Rng& rng, int32_t words) {
  std::uniform_int_distribution<size_t> d(0, kWords.size() - 1);
  std::string out;
  out.reserve(static_cast<size_t>(words) * 7);
  for (int32_t i = 0; i < words; ++i) {
    if (i) out.push_back(' ');
    out.append(kWords[d(rng)]);
  }
  return out;
}

int32_t nextWordCount(int32_t words, int32_t tokens, int32_t target) {
  if (tokens == target || tokens <= 0) return tokens <= 0 ? words + 1 : words;
  double scaled = std::round(static_cast<double>(words) * target / tokens);
  int32_t next = static_cast<int32_t>(scaled);
  if (tokens < target && next <= words) next = words + 1;
  if (tokens > target && next >= words) next = words - 1;
  return next < 1 ? 1 : next;
}

std::string workloadName(Mode mode, InputKind input, int32_t seq_len, int32_t batch,
                         int32_t concurrency) {
  std::string n(modeName(mode));
  n += input == InputKind::kTokens ? "_tok" : "_text";
  n += std::to_string(seq_len);
  if (mode != Mode::kChat) n += "_b" + std::to_string(batch);
  n += "_c" + std::to_string(concurrency);
  return n;
}

int32_t requestPool(Mode mode, int32_t pool, uint64_t count, uint64_t warmup, int32_t concurrency) {
  if (pool > 0) return pool;
  if (mode != Mode::kChat) return 32;
  const uint64_t per_run =
      count > 0 ? count + warmup : warmup + 4 * static_cast<uint64_t>(concurrency);
  return static_cast<int32_t>(std::clamp<uint64_t>(per_run, 32, 1u << 20));
}

}  // namespace garden::bench
