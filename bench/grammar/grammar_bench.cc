// Structured outputs: JSON Schema compile and per-token mask time over a real vocabulary
// (gpt-oss o200k_harmony, 201,088 ids: fetched by tests/conformance/tokenizer/fetch_assets.sh).
// Workloads, one per schema of tests/unit/common/grammar/test_schemas.h:
//   schema/<name>   JSON Schema -> byte grammar (what ivy does per request on a cache miss)
//   tables_<mode>/<name>   every state's token table over the vocabulary (once per schema;
//                   cached), wall time: noshare_1t (one thread, no table sharing), cold_1t /
//                   cold (sharing within the schema, empty process-wide cache; one / default
//                   threads), warm (the cache holds every other test schema's tables),
//                   tulip (the cache holds the JSON grammar's tables, as tulip walks them at
//                   start)
//   mask/<name>     one next-token bitmask along 5 random generations (RandomModel of
//                   tests/unit/common/grammar/random_model.h: masked sampling until the end
//                   token or 2000 steps), manual time = thread CPU time of fillNextTokenBitmask
//                   only; counters: mean_us / p50_us / p99_us / max_us per mask, tokens, finished
//                   generations
//
// usage: grammar_bench [--tokenizer tests/assets/tokenizers/gptoss/tokenizer.json]
//                      [google benchmark flags]

#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "common/grammar/json_schema.h"
#include "common/grammar/matcher.h"
#include "common/grammar/vocabulary.h"
#include "tests/unit/common/grammar/random_model.h"
#include "tests/unit/common/grammar/test_schemas.h"

namespace {

using namespace garden::grammar;

std::string g_tokenizer = "tests/assets/tokenizers/gptoss/tokenizer.json";
std::shared_ptr<const Vocabulary> g_vocab;
int32_t g_end = 0;
int g_table_iters = std::getenv("GRAMMAR_BENCH_TABLE_ITERS") ? std::atoi(std::getenv("GRAMMAR_BENCH_TABLE_ITERS")) : 5;
std::map<std::string, std::shared_ptr<const CompiledGrammar>> g_compiled;

// Thread CPU time: time descheduled on a shared machine is not charged to the mask.
double threadSeconds() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

garden::Result<Grammar> grammarOf(const std::string& schema) {
  return schema == "json_object" ? jsonObjectGrammar() : jsonSchemaGrammar(schema);
}

void BM_Schema(benchmark::State& st, std::string schema) {
  for (auto _ : st) {
    auto g = grammarOf(schema);
    if (!g.isOk()) st.SkipWithError(g.status().message().c_str());
    benchmark::DoNotOptimize(g);
  }
}

// Token tables of one schema [TAG_TABLE_SHARING]. mode "cold": the process-wide table cache
// emptied first, tables walked by the default threads; "cold_1t": the same on one thread;
// "warm": the cache holds the tables of every other test schema (a tulip that has served other
// schemas), emptied and refilled untimed before each iteration; "tulip": the cache holds the JSON
// grammar's tables (tulip walks them at start); "noshare_1t": no sharing at all,
// one thread (the walk alone, as before sharing existed). Wall time (real time).
void BM_Tables(benchmark::State& st, std::string name, std::string schema, std::string mode) {
  auto g = grammarOf(schema);
  CompileOptions o;
  if (mode == "cold_1t" || mode == "noshare_1t") o.threads = 1;
  if (mode == "noshare_1t") o.share = false;
  std::shared_ptr<const CompiledGrammar> last;
  for (auto _ : st) {
    st.PauseTiming();
    CompiledGrammar::clearSharedTables();
    if (mode == "tulip") (void)CompiledGrammar::compile(*jsonObjectGrammar(), g_vocab);
    if (mode == "warm") {
      for (const auto& sc : garden::grammar::testing::schemaCases()) {
        if (sc.name != name) (void)CompiledGrammar::compile(*grammarOf(sc.schema), g_vocab);
      }
    }
    st.ResumeTiming();
    auto c = CompiledGrammar::compile(*g, g_vocab, o);
    last = *c;
  }
  const auto stats = last->stats();
  st.counters["states"] = stats.states;
  st.counters["built"] = stats.built;
  st.counters["uncertain_per_state"] = static_cast<double>(stats.uncertain) / stats.states;
  st.counters["MiB"] = static_cast<double>(last->memoryBytes()) / (1 << 20);
  if (mode == "cold") g_compiled[name] = last;
}

void BM_Mask(benchmark::State& st, std::string name, std::string schema) {
  auto c = g_compiled[name];
  if (!c) {  // a filter left out tables_cold/<name>: compile here (not timed: manual time)
    auto compiled = CompiledGrammar::compile(*grammarOf(schema), g_vocab);
    if (!compiled.isOk()) {
      st.SkipWithError("compile failed");
      return;
    }
    c = g_compiled[name] = *compiled;
  }
  std::vector<std::string_view> bytes;
  for (int32_t id = 0; id < g_vocab->size(); ++id) bytes.push_back(g_vocab->bytes(id));
  garden::grammar::testing::RandomModel model(bytes, 42, 6.f);
  std::vector<double> times;
  int64_t finished = 0;
  int64_t tokens = 0;
  std::vector<uint32_t> mask((static_cast<size_t>(g_vocab->size()) + 31) / 32);
  for (auto _ : st) {
    GrammarMatcher m(c, {g_end});
    double spent = 0;
    for (int step = 0; step < 2000 && !m.terminated(); ++step) {
      const double t0 = threadSeconds();
      m.fillNextTokenBitmask(mask);
      const double dt = threadSeconds() - t0;
      spent += dt;
      times.push_back(dt);
      const int32_t pick = model.sample(mask);  // not timed
      if (pick < 0) {
        st.SkipWithError("dead end");
        return;
      }
      if (!m.acceptToken(pick)) {
        st.SkipWithError("sampled token rejected");
        return;
      }
      ++tokens;
    }
    finished += m.terminated();
    st.SetIterationTime(spent);
  }
  std::sort(times.begin(), times.end());
  auto q = [&](double f) { return times[std::min(times.size() - 1, static_cast<size_t>(f * times.size()))] * 1e6; };
  double sum = 0;
  for (double t : times) sum += t;
  st.counters["mean_us"] = sum / times.size() * 1e6;
  st.counters["p50_us"] = q(0.5);
  st.counters["p99_us"] = q(0.99);
  st.counters["max_us"] = times.back() * 1e6;
  st.counters["tokens"] = static_cast<double>(tokens);
  st.counters["finished"] = static_cast<double>(finished);
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<char*> rest;
  for (int i = 0; i < argc; ++i) {
    if (std::strcmp(argv[i], "--tokenizer") == 0 && i + 1 < argc) {
      g_tokenizer = argv[++i];
    } else {
      rest.push_back(argv[i]);
    }
  }
  auto v = loadByteLevelVocabulary(g_tokenizer, 201088);
  if (!v.isOk()) {
    std::fprintf(stderr, "%s\n", v.status().message().c_str());
    return 2;
  }
  g_vocab = *v;
  auto end = addedTokenId(g_tokenizer, "<|return|>");
  g_end = end.isOk() ? *end : 200002;
  for (const auto& sc : garden::grammar::testing::schemaCases()) {
    benchmark::RegisterBenchmark(("schema/" + sc.name).c_str(), BM_Schema, sc.schema)
        ->Unit(benchmark::kMillisecond);
  }
  for (const char* mode : {"noshare_1t", "cold_1t", "cold", "tulip", "warm"}) {
    for (const auto& sc : garden::grammar::testing::schemaCases()) {
      benchmark::RegisterBenchmark(("tables_" + std::string(mode) + "/" + sc.name).c_str(),
                                   BM_Tables, sc.name, sc.schema, std::string(mode))
          ->Unit(benchmark::kMillisecond)
          ->UseRealTime()
          ->Iterations(std::string(mode) == "warm" ? std::max(1, g_table_iters / 2)
                                                   : g_table_iters);
    }
  }
  for (const auto& sc : garden::grammar::testing::schemaCases()) {
    benchmark::RegisterBenchmark(("mask/" + sc.name).c_str(), BM_Mask, sc.name, sc.schema)
        ->Unit(benchmark::kMicrosecond)
        ->UseManualTime()
        ->Iterations(g_table_iters);
  }
  int n = static_cast<int>(rest.size());
  benchmark::Initialize(&n, rest.data());
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
