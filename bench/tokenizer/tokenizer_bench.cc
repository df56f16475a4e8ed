// Tokenizer benchmark: single-thread encode throughput (MB/s) and per-request latency of a
// ~512-token text. Workloads (each listed with its reference, measured in the same run):
//   unigram/throughput   ours vs libsentencepiece on a sentencepiece .model, corpus documents
//   unigram/latency512   ours vs libsentencepiece, one ~512-token text, p50/p99 over N requests
//   bpe:<name>/throughput  ours on a tokenizer.json (HF `tokenizers` is timed by hf_bench.py
//   bpe:<name>/latency512  on the very same texts, which this binary writes with --dump-texts)
// Before timing, ours and libsentencepiece must give identical ids on every text (the bench
// aborts otherwise). Times are thread CPU time. Output: one JSON object per line on stdout.
//
// usage: tokenizer_bench --corpus corpus.jsonl [--sp-model m.model] [--bpe name=tokenizer.json]...
//                        [--dump-texts DIR] [--seconds S]

#include <sentencepiece_processor.h>

#include <algorithm>
#include <chrono>
#include <ctime>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include <simdjson.h>

#include "common/json_writer.h"
#include "services/ivy/tokenizer/tokenizer.h"

namespace {

using garden::ivy::TokenId;
// Thread CPU time: time spent descheduled (a loaded machine) is not charged to either side.
struct Clock {
  using duration = std::chrono::nanoseconds;
  using time_point = std::chrono::time_point<Clock, duration>;
  static time_point now() {
    timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return time_point(duration(static_cast<int64_t>(ts.tv_sec) * 1000000000 + ts.tv_nsec));
  }
};

std::vector<std::string> loadCorpus(const std::string& path) {
  std::ifstream in(path);
  if (!in) {
    std::fprintf(stderr, "cannot open corpus %s\n", path.c_str());
    std::exit(2);
  }
  std::vector<std::string> out;
  simdjson::dom::parser parser;
  std::string line;
  while (std::getline(in, line)) {
    std::string_view s;
    simdjson::dom::element e;
    if (parser.parse(line).get(e) == simdjson::SUCCESS && e.get(s) == simdjson::SUCCESS) {
      out.emplace_back(s);
    }
  }
  return out;
}

// Documents of ~4 KB made by concatenating corpus samples in order (deterministic), 1 MB total.
std::vector<std::string> makeDocuments(const std::vector<std::string>& corpus) {
  std::vector<std::string> docs;
  std::string cur;
  size_t total = 0;
  for (size_t i = 0; total < (1u << 20); i = (i + 1) % corpus.size()) {
    cur += corpus[i];
    cur += "\n";
    if (cur.size() >= 4096) {
      total += cur.size();
      docs.push_back(std::move(cur));
      cur.clear();
    }
  }
  return docs;
}

// Corpus samples in order until `count` says ~512 tokens (400..512, or the first past 512).
template <typename CountFn>
std::string make512(const std::vector<std::string>& corpus, CountFn count) {
  std::string text;
  for (size_t i = 0;; i = (i + 1) % corpus.size()) {
    std::string next = text + corpus[i] + "\n";
    if (count(next) > 512) return count(text) >= 400 ? text : next;
    text = std::move(next);
  }
}

struct Timing {
  double mb_per_s = 0;
  double tokens_per_s = 0;
};

template <typename EncodeFn>
Timing throughput(const std::vector<std::string>& docs, double seconds, EncodeFn encode) {
  size_t bytes = 0, tokens = 0;
  for (const auto& d : docs) tokens += encode(d);  // warm-up
  tokens = 0;
  const auto start = Clock::now();
  double elapsed = 0;
  int rounds = 0;
  do {
    for (const auto& d : docs) {
      tokens += encode(d);
      bytes += d.size();
    }
    ++rounds;
    elapsed = std::chrono::duration<double>(Clock::now() - start).count();
  } while (elapsed < seconds);
  return {bytes / elapsed / 1e6, tokens / elapsed};
}

template <typename EncodeFn>
std::pair<double, double> latency(const std::string& text, int iters, EncodeFn encode) {
  std::vector<double> us;
  us.reserve(iters);
  for (int i = 0; i < 50; ++i) encode(text);
  for (int i = 0; i < iters; ++i) {
    const auto t0 = Clock::now();
    encode(text);
    us.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count());
  }
  std::sort(us.begin(), us.end());
  return {us[us.size() / 2], us[us.size() * 99 / 100]};
}

void emit(const std::string& workload, const std::string& impl, const std::string& key1,
          double v1, const std::string& key2, double v2, size_t tokens) {
  std::string out;
  garden::JsonWriter w(&out);
  w.beginObject().key("workload").value(workload).key("impl").value(impl).key(key1).value(v1);
  w.key(key2).value(v2).key("tokens").value(static_cast<uint64_t>(tokens)).endObject();
  std::printf("%s\n", out.c_str());
  std::fflush(stdout);
}

void dumpTexts(const std::string& dir, const std::string& name,
               const std::vector<std::string>& docs, const std::string& t512) {
  std::string out;
  {
    garden::JsonWriter w(&out);
    w.beginObject().key("latency512").value(t512).key("docs").beginArray();
    for (const auto& d : docs) w.value(d);
    w.endArray().endObject();
  }
  std::ofstream f(dir + "/" + name + ".json");
  f << out;
}

}  // namespace

int main(int argc, char** argv) {
  std::string corpus_path, sp_model, dump_dir;
  std::vector<std::pair<std::string, std::string>> bpes;
  double seconds = 2.0;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "%s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--corpus") corpus_path = next();
    else if (a == "--sp-model") sp_model = next();
    else if (a == "--dump-texts") dump_dir = next();
    else if (a == "--seconds") seconds = std::atof(next().c_str());
    else if (a == "--bpe") {
      std::string v = next();
      const size_t eq = v.find('=');
      if (eq == std::string::npos) {
        std::fprintf(stderr, "--bpe wants name=path\n");
        return 2;
      }
      bpes.push_back({v.substr(0, eq), v.substr(eq + 1)});
    } else {
      std::fprintf(stderr, "unknown argument %s\n", a.c_str());
      return 2;
    }
  }
  if (corpus_path.empty()) {
    std::fprintf(stderr, "--corpus is required\n");
    return 2;
  }
  const auto corpus = loadCorpus(corpus_path);
  const auto docs = makeDocuments(corpus);
  size_t doc_bytes = 0;
  for (const auto& d : docs) doc_bytes += d.size();
  std::fprintf(stderr, "%zu documents, %zu bytes\n", docs.size(), doc_bytes);

  if (!sp_model.empty()) {
    sentencepiece::SentencePieceProcessor spm;
    if (!spm.Load(sp_model).ok()) {
      std::fprintf(stderr, "cannot load %s\n", sp_model.c_str());
      return 2;
    }
    auto ours = garden::ivy::loadTokenizer(sp_model);
    if (!ours.isOk()) {
      std::fprintf(stderr, "%s\n", ours.status().toString().c_str());
      return 2;
    }
    const garden::ivy::Tokenizer& tok = **ours;
    std::vector<TokenId> ids;
    std::vector<int> ref;
    for (const auto& d : docs) {
      ids.clear();
      tok.encode(d, &ids);
      ref.clear();
      (void)spm.Encode(d, &ref);
      if (std::vector<int>(ids.begin(), ids.end()) != ref) {
        std::fprintf(stderr, "unigram: ours and libsentencepiece disagree; not timing\n");
        return 1;
      }
    }
    auto ours_count = [&](const std::string& t) {
      ids.clear();
      tok.encode(t, &ids);
      return ids.size();
    };
    auto spm_count = [&](const std::string& t) {
      ref.clear();
      (void)spm.Encode(t, &ref);
      return ref.size();
    };
    const std::string t512 = make512(corpus, ours_count);
    const size_t n512 = ours_count(t512);
    auto a = throughput(docs, seconds, ours_count);
    emit("unigram/throughput", "ours", "mb_per_s", a.mb_per_s, "tokens_per_s", a.tokens_per_s, 0);
    auto b = throughput(docs, seconds, spm_count);
    emit("unigram/throughput", "libsentencepiece", "mb_per_s", b.mb_per_s, "tokens_per_s",
         b.tokens_per_s, 0);
    auto la = latency(t512, 3000, ours_count);
    emit("unigram/latency512", "ours", "p50_us", la.first, "p99_us", la.second, n512);
    auto lb = latency(t512, 3000, spm_count);
    emit("unigram/latency512", "libsentencepiece", "p50_us", lb.first, "p99_us", lb.second, n512);
    if (!dump_dir.empty()) dumpTexts(dump_dir, "unigram", docs, t512);
  }
  for (const auto& [name, path] : bpes) {
    auto ours = garden::ivy::loadTokenizer(path);
    if (!ours.isOk()) {
      std::fprintf(stderr, "%s\n", ours.status().toString().c_str());
      return 2;
    }
    const garden::ivy::Tokenizer& tok = **ours;
    std::vector<TokenId> ids;
    auto count = [&](const std::string& t) {
      ids.clear();
      tok.encode(t, &ids);
      return ids.size();
    };
    const std::string t512 = make512(corpus, count);
    const size_t n512 = count(t512);
    auto a = throughput(docs, seconds, count);
    emit("bpe:" + name + "/throughput", "ours", "mb_per_s", a.mb_per_s, "tokens_per_s",
         a.tokens_per_s, 0);
    auto la = latency(t512, 3000, count);
    emit("bpe:" + name + "/latency512", "ours", "p50_us", la.first, "p99_us", la.second, n512);
    if (!dump_dir.empty()) dumpTexts(dump_dir, "bpe_" + name, docs, t512);
  }
  return 0;
}
