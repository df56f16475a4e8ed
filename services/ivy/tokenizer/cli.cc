#include "services/ivy/tokenizer/cli.h"

#include <simdjson.h>

#include <cstdio>
#include <iostream>
#include <string>
#include <string_view>
#include <vector>

#include "common/json_writer.h"
#include "services/ivy/tokenizer/tokenizer.h"

namespace garden::ivy {

int runTokenizeCli(int argc, char** argv) {
  std::string path;
  bool decode = false;
  for (int i = 1; i < argc; ++i) {
    std::string_view a = argv[i];
    if (a == "--tokenizer" && i + 1 < argc) {
      path = argv[++i];
    } else if (a.substr(0, 12) == "--tokenizer=") {
      path = std::string(a.substr(12));
    } else if (a == "--decode") {
      decode = true;
    } else if (a == "--help" || a == "-h") {
      std::fprintf(stdout,
                   "usage: ivy tokenize --tokenizer PATH [--decode]\n"
                   "  stdin: JSON-lines strings (or id arrays with --decode)\n"
                   "  stdout: JSON-lines id arrays (or strings with --decode)\n");
      return 0;
    } else {
      std::fprintf(stderr, "ivy tokenize: unknown argument \"%s\" (see --help)\n", argv[i]);
      return 2;
    }
  }
  if (path.empty()) {
    std::fprintf(stderr, "ivy tokenize: --tokenizer PATH is required\n");
    return 2;
  }
  auto tok = loadTokenizer(path);
  if (!tok.isOk()) {
    std::fprintf(stderr, "ivy tokenize: %s\n", tok.status().toString().c_str());
    return 2;
  }
  const Tokenizer& t = **tok;
  simdjson::dom::parser parser;
  std::string line, out;
  std::vector<TokenId> ids;
  int rc = 0;
  size_t line_no = 0;
  while (std::getline(std::cin, line)) {
    ++line_no;
    out.clear();
    JsonWriter w(&out);
    auto fail = [&](const std::string& msg) {
      out.clear();
      JsonWriter e(&out);
      e.beginObject().key("error").value("line " + std::to_string(line_no) + ": " + msg).endObject();
      rc = 1;
    };
    simdjson::dom::element doc;
    if (parser.parse(line).get(doc) != simdjson::SUCCESS) {
      fail("not valid JSON");
    } else if (!decode) {
      std::string_view text;
      if (doc.get(text) != simdjson::SUCCESS) {
        fail("expected a JSON string");
      } else {
        ids.clear();
        t.encode(text, &ids);
        w.beginArray();
        for (TokenId id : ids) w.value(id);
        w.endArray();
      }
    } else {
      simdjson::dom::array arr;
      bool ok = doc.get(arr) == simdjson::SUCCESS;
      ids.clear();
      if (ok) {
        for (auto v : arr) {
          int64_t id;
          if (v.get(id) != simdjson::SUCCESS || id < INT32_MIN || id > INT32_MAX) {
            ok = false;
            break;
          }
          ids.push_back(static_cast<TokenId>(id));
        }
      }
      if (!ok) {
        fail("expected a JSON array of integer ids");
      } else {
        auto text = t.decode(ids, false);
        if (!text.isOk()) {
          fail(text.status().message());
        } else {
          w.value(*text);
        }
      }
    }
    out.push_back('\n');
    std::fwrite(out.data(), 1, out.size(), stdout);
  }
  std::fflush(stdout);
  return rc;
}

}  // namespace garden::ivy
