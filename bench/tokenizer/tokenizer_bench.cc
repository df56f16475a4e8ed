// Tokenizer benchmark: single-thread encode throughput (MB/s) and per-request latency of a
// ~512-token text. Workloads (each listed with its reference, measured in the same run):
//   unigram/throughput   ours vs libsentencepiece on a sentencepiece .model, corpus documents
//   unigram/latency512   ours vs libsentencepiece, one ~512-token text, p50/p99 over N requests
//   bpe:<name>/throughput  ours on a tokenizer.json (HF `tokenizers` is timed by hf_bench.py
//   bpe:<name>/latency512  on the very same texts, which this binary writes with --dump-texts)
// Before timing, ours and libsentencepiece must give identical ids on every text (the bench
// aborts otherwise). Times are thread CPU time; ours and libsentencepiece are timed in
// alternation (document pass by pass, request by request) so that load on a shared machine
// falls on both alike. Output: one JSON object per line on stdout.
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

// Two encoders timed in alternation (one pass over the documents each, in turn), so a load
// change on a shared machine hits both sides alike; the ratio is what this is for.
template <typename EncodeA, typename EncodeB>
std::pair<Timing, Timing> throughputInterleaved(const std::vector<std::string>& docs,
                                                double seconds, EncodeA a, EncodeB b) {
  size_t bytes = 0, tokens_a = 0, tokens_b = 0;
  for (const auto& d : docs) tokens_a += a(d) + b(d);  // warm-up
  tokens_a = 0;
  double ta = 0, tb = 0;
  do {
    auto t0 = Clock::now();
    for (const auto& d : docs) tokens_a += a(d);
    auto t1 = Clock::now();
    for (const auto& d : docs) tokens_b += b(d);
    auto t2 = Clock::now();
    for (const auto& d : docs) bytes += d.size();
    ta += std::chrono::duration<double>(t1 - t0).count();
    tb += std::chrono::duration<double>(t2 - t1).count();
  } while (ta + tb < 2 * seconds);
  return {{bytes / ta / 1e6, tokens_a / ta}, {bytes / tb / 1e6, tokens_b / tb}};
}

// Per-request latency of two encoders, requests alternating a, b, a, b, ...
template <typename EncodeA, typename EncodeB>
std::pair<std::pair<double, double>, std::pair<double, double>> latencyInterleaved(
    const std::string& text, int iters, EncodeA a, EncodeB b) {
  std::vector<double> ua, ub;
  ua.reserve(iters);
  ub.reserve(iters);
  for (int i = 0; i < 50; ++i) {
    a(text);
    b(text);
  }
  for (int i = 0; i < iters; ++i) {
    const auto t0 = Clock::now();
    a(text);
    const auto t1 = Clock::now();
    b(text);
    const auto t2 = Clock::now();
    ua.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
    ub.push_back(std::chrono::duration<double, std::micro>(t2 - t1).count());
  }
  std::sort(ua.begin(), ua.end());
  std::sort(ub.begin(), ub.end());
  return {{ua[ua.size() / 2], ua[ua.size() * 99 / 100]},
          {ub[ub.size() / 2], ub[ub.size() * 99 / 100]}};
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
  bool per_line = false;  // diagnostic: ours vs libsentencepiece per corpus line (unigram)
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
    else if (a == "--per-line") per_line = true;
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
    if (per_line) {
      // Each non-empty corpus line repeated to ~4 KB, timed alone: which text classes have
      // the lowest ratio. One JSON line per corpus line.
      for (size_t li = 0; li < corpus.size(); ++li) {
        if (corpus[li].empty()) continue;
        std::string text;
        while (text.size() < 4096) text += corpus[li] + "\n";
        const std::vector<std::string> one{text};
        auto [pa, pb] = throughputInterleaved(one, 0.05, ours_count, spm_count);
        std::string out;
        garden::JsonWriter w(&out);
        w.beginObject().key("line").value(static_cast<int64_t>(li)).key("ours_mb_s")
            .value(pa.mb_per_s).key("spm_mb_s").value(pb.mb_per_s).key("ratio")
            .value(pa.mb_per_s / pb.mb_per_s).key("bytes").value(static_cast<uint64_t>(corpus[li].size()))
            .endObject();
        std::printf("%s\n", out.c_str());
      }
      return 0;
    }
    const std::string t512 = make512(corpus, ours_count);
    const size_t n512 = ours_count(t512);
    auto [a, b] = throughputInterleaved(docs, seconds, ours_count, spm_count);
    emit("unigram/throughput", "ours", "mb_per_s", a.mb_per_s, "tokens_per_s", a.tokens_per_s, 0);
    emit("unigram/throughput", "libsentencepiece", "mb_per_s", b.mb_per_s, "tokens_per_s",
         b.tokens_per_s, 0);
    auto [la, lb] = latencyInterleaved(t512, 3000, ours_count, spm_count);
    emit("unigram/latency512", "ours", "p50_us", la.first, "p99_us", la.second, n512);
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
