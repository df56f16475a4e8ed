#include "services/ivy/harmony/cli.h"

#include <cstdio>
#include <iostream>
#include <iterator>
#include <memory>
#include <string>
#include <string_view>

#include "common/json_writer.h"
#include "services/ivy/harmony/encode.h"
#include "services/ivy/harmony/openai_request.h"
#include "services/ivy/harmony/render.h"
#include "services/ivy/tokenizer/tokenizer.h"

namespace garden::ivy::harmony {
namespace {

constexpr std::string_view kUsage =
    "usage: ivy harmony-render [--tokenizer=PATH] [--date=YYYY-MM-DD] [--keep-analysis] "
    "[--format=json|text] < request.json\n";

}  // namespace

int runHarmonyRenderCli(int argc, char** argv) {
  ChatRenderOptions options;
  std::string tokenizer_path;
  bool text_format = false;
  for (int i = 1; i < argc; ++i) {
    std::string_view a = argv[i];
    if (a == "harmony-render") continue;  // tolerated when main passes its whole argv
    if (a.starts_with("--tokenizer=")) {
      tokenizer_path = std::string(a.substr(12));
    } else if (a.starts_with("--date=")) {
      options.current_date = std::string(a.substr(7));
    } else if (a == "--keep-analysis") {
      options.render.auto_drop_analysis = false;
    } else if (a == "--format=text") {
      text_format = true;
    } else if (a == "--format=json") {
      text_format = false;
    } else if (a == "--help" || a == "-h") {
      std::cout << kUsage;
      return 0;
    } else {
      std::cerr << "unknown argument: " << a << "\n" << kUsage;
      return 2;
    }
  }
  std::string body((std::istreambuf_iterator<char>(std::cin)), std::istreambuf_iterator<char>());
  auto request = harmonyRequestFromOpenAiJson(body, options);
  if (!request.isOk()) {
    std::cerr << request.status().toString() << "\n";
    return 2;
  }
  auto segments =
      renderConversationForCompletion(request->messages, Role::kAssistant, options.render);
  if (!segments.isOk()) {
    std::cerr << segments.status().toString() << "\n";
    return 2;
  }
  std::string text = segmentsToString(*segments);
  std::optional<std::vector<TokenId>> ids;
  if (!tokenizer_path.empty()) {
    auto tokenizer = loadTokenizer(tokenizer_path);
    if (!tokenizer.isOk()) {
      std::cerr << tokenizer.status().toString() << "\n";
      return 1;
    }
    Status ok = checkHarmonyTokenizer(**tokenizer);
    if (!ok.isOk()) {
      std::cerr << ok.toString() << "\n";
      return 1;
    }
    ids = encodeSegments(*segments, **tokenizer);
  }
  std::string out;
  if (text_format) {
    out = text + "\n";
    if (ids) {
      for (size_t i = 0; i < ids->size(); ++i) {
        if (i) out += " ";
        out += std::to_string((*ids)[i]);
      }
      out += "\n";
    }
  } else {
    out = "{\"text\":";
    JsonWriter::appendQuoted(out, text);
    if (ids) {
      out += ",\"ids\":[";
      for (size_t i = 0; i < ids->size(); ++i) {
        if (i) out += ",";
        out += std::to_string((*ids)[i]);
      }
      out += "]";
    }
    out += "}\n";
  }
  std::cout << out;
  return std::cout.good() ? 0 : 1;
}

}  // namespace garden::ivy::harmony
