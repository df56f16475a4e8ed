#include "services/rose/model/pooling_config.h"

#include <simdjson.h>

#include <filesystem>
#include <fstream>
#include <iterator>

namespace garden::rose {

Result<PoolMode> parsePoolMode(std::string_view s) {
  if (s == "last" || s == "lasttoken" || s == "last_token") return PoolMode::kLast;
  if (s == "mean" || s == "mean_tokens") return PoolMode::kMean;
  if (s == "cls" || s == "cls_token") return PoolMode::kCls;
  return invalidArgument("pooling mode '" + std::string(s) + "' (expected last, mean or cls)");
}

std::string_view poolModeName(PoolMode m) {
  switch (m) {
    case PoolMode::kLast:
      return "last";
    case PoolMode::kMean:
      return "mean";
    case PoolMode::kCls:
      return "cls";
  }
  return "?";
}

namespace {

Result<std::string> readFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return notFound(path + ": cannot open");
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

}  // namespace

Result<PoolingConfig> loadPoolingConfig(const std::string& dir) {
  namespace fs = std::filesystem;
  PoolingConfig pc;
  const std::string modules_path = dir + "/modules.json";
  std::error_code ec;
  if (!fs::exists(modules_path, ec)) return pc;

  ASSIGN_OR_RETURN(std::string modules_text, readFile(modules_path));
  simdjson::dom::parser parser;
  simdjson::dom::element root;
  if (auto e = parser.parse(modules_text).get(root); e) {
    return invalidArgument(modules_path + ": not valid JSON: " + simdjson::error_message(e));
  }
  simdjson::dom::array mods;
  if (root.get_array().get(mods)) return invalidArgument(modules_path + ": must be a JSON array");
  std::string pooling_path;
  bool normalize = false;
  for (auto m : mods) {
    std::string_view type, path;
    if (m["type"].get_string().get(type)) {
      return invalidArgument(modules_path + ": every module needs a string 'type'");
    }
    if (m["path"].get_string().get(path)) path = "";
    if (type.ends_with(".Pooling")) {
      if (path.find("..") != std::string_view::npos) {
        return invalidArgument(modules_path + ": Pooling path must stay inside the model dir");
      }
      pooling_path = dir + "/" + std::string(path) + "/config.json";
    } else if (type.ends_with(".Normalize")) {
      normalize = true;
    }
  }
  if (pooling_path.empty()) return pc;  // no Pooling module: keep the defaults

  ASSIGN_OR_RETURN(std::string text, readFile(pooling_path));
  simdjson::dom::parser p2;
  simdjson::dom::element cfg;
  if (auto e = p2.parse(text).get(cfg); e) {
    return invalidArgument(pooling_path + ": not valid JSON: " + simdjson::error_message(e));
  }
  if (!cfg.is_object()) return invalidArgument(pooling_path + ": must be a JSON object");
  int chosen = 0;
  PoolMode mode = PoolMode::kLast;
  std::string_view mode_s;
  if (!cfg["pooling_mode"].get_string().get(mode_s)) {
    auto pm = parsePoolMode(mode_s);
    if (!pm.isOk()) {
      return unimplemented(pooling_path + ": pooling_mode '" + std::string(mode_s) +
                           "' is not served by rose (last, mean, cls)");
    }
    mode = *pm;
    chosen = 1;
  } else {
    struct Flag {
      const char* key;
      int mode;  // 0 = unsupported
    };
    const Flag flags[] = {{"pooling_mode_lasttoken", 1},
                          {"pooling_mode_mean_tokens", 2},
                          {"pooling_mode_cls_token", 3},
                          {"pooling_mode_max_tokens", 0},
                          {"pooling_mode_mean_sqrt_len_tokens", 0},
                          {"pooling_mode_weightedmean_tokens", 0}};
    for (const Flag& f : flags) {
      bool on = false;
      if (cfg[f.key].get_bool().get(on) || !on) continue;
      if (f.mode == 0) {
        return unimplemented(pooling_path + ": " + f.key +
                             " is not served by rose (last, mean, cls)");
      }
      mode = static_cast<PoolMode>(f.mode);
      ++chosen;
    }
  }
  if (chosen == 0) return invalidArgument(pooling_path + ": no pooling mode is enabled");
  if (chosen > 1) {
    return unimplemented(pooling_path + ": several pooling modes at once are not served by rose");
  }
  pc.mode = mode;
  pc.normalize = normalize;
  pc.from_files = true;
  return pc;
}

}  // namespace garden::rose
