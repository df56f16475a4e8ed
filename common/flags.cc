#include "common/flags.h"

#include <boost/program_options.hpp>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <set>
#include <system_error>

namespace garden {
namespace po = boost::program_options;

namespace {

enum class Type { kString, kBool, kInt32, kInt64, kUint32, kUint64, kDouble, kList };

struct Flag {
  std::string name;
  std::string help;
  Type type;
  void* var;
  std::string default_text;  // as shown in --help; empty = none shown
};

constexpr const char* kPositional = "__positional__";

std::string quoteList(const std::vector<std::string>& v) {
  std::string s;
  for (size_t i = 0; i < v.size(); ++i) {
    if (i != 0) s += ',';
    s += v[i];
  }
  return s;
}

std::string_view typeHint(Type t) {
  switch (t) {
    case Type::kString:
      return "=STRING";
    case Type::kBool:
      return "";
    case Type::kInt32:
    case Type::kInt64:
      return "=INT";
    case Type::kUint32:
    case Type::kUint64:
      return "=UINT";
    case Type::kDouble:
      return "=NUMBER";
    case Type::kList:
      return "=A,B,...";
  }
  return "";
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

template <typename T>
Status parseInteger(std::string_view text, T* out, std::string_view expected) {
  T v{};
  auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), v, 10);
  if (ec == std::errc::result_out_of_range) {
    return invalidArgument("value '" + std::string(text) + "' is out of range (" +
                           std::to_string(std::numeric_limits<T>::min()) + ".." +
                           std::to_string(std::numeric_limits<T>::max()) + ")");
  }
  if (text.empty() || ec != std::errc() || ptr != text.data() + text.size()) {
    return invalidArgument("invalid value '" + std::string(text) + "' (expected " +
                           std::string(expected) + ")");
  }
  *out = v;
  return okStatus();
}

Status parseBool(std::string_view text, bool* out) {
  std::string lower(text);
  for (char& c : lower) c = static_cast<char>(c >= 'A' && c <= 'Z' ? c - 'A' + 'a' : c);
  if (lower == "true" || lower == "1" || lower == "yes" || lower == "on") {
    *out = true;
  } else if (lower == "false" || lower == "0" || lower == "no" || lower == "off") {
    *out = false;
  } else {
    return invalidArgument("invalid value '" + std::string(text) +
                           "' (expected true, false, 1, 0, yes, no, on or off)");
  }
  return okStatus();
}

// Assigns `values` (one per occurrence; one for scalars) to the flag's variable.
Status assign(const Flag& f, const std::vector<std::string>& values) {
  if (f.type == Type::kList) {
    auto* v = static_cast<std::vector<std::string>*>(f.var);
    v->clear();
    for (const std::string& occurrence : values) {
      std::string_view rest = occurrence;
      while (true) {
        size_t comma = rest.find(',');
        std::string_view item = trim(rest.substr(0, comma));
        if (!item.empty()) v->emplace_back(item);
        if (comma == std::string_view::npos) break;
        rest.remove_prefix(comma + 1);
      }
    }
    return okStatus();
  }
  const std::string& text = values.front();
  switch (f.type) {
    case Type::kString:
      *static_cast<std::string*>(f.var) = text;
      return okStatus();
    case Type::kBool:
      return parseBool(text, static_cast<bool*>(f.var));
    case Type::kInt32:
      return parseInteger(text, static_cast<int32_t*>(f.var), "an integer");
    case Type::kInt64:
      return parseInteger(text, static_cast<int64_t*>(f.var), "an integer");
    case Type::kUint32:
      return parseInteger(text, static_cast<uint32_t*>(f.var), "a non-negative integer");
    case Type::kUint64:
      return parseInteger(text, static_cast<uint64_t*>(f.var), "a non-negative integer");
    case Type::kDouble: {
      double d = 0;
      auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), d);
      if (ec == std::errc::result_out_of_range) {
        return invalidArgument("value '" + text + "' is out of range for a double");
      }
      if (text.empty() || ec != std::errc() || ptr != text.data() + text.size()) {
        return invalidArgument("invalid value '" + text + "' (expected a number)");
      }
      *static_cast<double*>(f.var) = d;
      return okStatus();
    }
    case Type::kList:
      break;
  }
  return internalError("unreachable flag type");
}

bool validName(std::string_view name) {
  if (name.empty() || name == "help" || name == "h") return false;
  if (!((name[0] >= 'a' && name[0] <= 'z') || (name[0] >= '0' && name[0] <= '9'))) return false;
  for (char c : name) {
    bool ok = (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-' || c == '_';
    if (!ok) return false;
  }
  return true;
}

std::string envName(std::string_view prefix, std::string_view flag) {
  std::string s(prefix);
  for (char c : flag) {
    s += c == '-' ? '_' : (c >= 'a' && c <= 'z' ? static_cast<char>(c - 'a' + 'A') : c);
  }
  return s;
}

std::string formatDouble(double d) {
  char buf[32];
  auto r = std::to_chars(buf, buf + sizeof(buf), d);
  return std::string(buf, r.ptr);
}

}  // namespace

struct Flags::Impl {
  std::string program;
  std::string description;
  std::vector<Flag> flags;
  std::string env_prefix;
  bool env_enabled = false;
  bool help_requested = false;
  std::set<std::string, std::less<>> set_names;

  Flags& add(Flags& self, std::string_view name, Type type, void* var, std::string_view help,
             std::string default_text) {
    CHECK_MSG(validName(name), "flag names are [a-z0-9][a-z0-9_-]* and not 'help'");
    for (const Flag& f : flags) CHECK_MSG(f.name != name, "flag declared twice");
    flags.push_back(Flag{std::string(name), std::string(help), type, var, std::move(default_text)});
    return self;
  }
};

Flags::Flags(std::string_view program, std::string_view description)
    : impl_(std::make_unique<Impl>()) {
  impl_->program = program;
  impl_->description = description;
}

Flags::~Flags() = default;

Flags& Flags::add(std::string_view name, std::string* var, std::string_view help) {
  return impl_->add(*this, name, Type::kString, var, help, var->empty() ? "" : "\"" + *var + "\"");
}
Flags& Flags::add(std::string_view name, bool* var, std::string_view help) {
  return impl_->add(*this, name, Type::kBool, var, help, *var ? "true" : "");
}
Flags& Flags::add(std::string_view name, int32_t* var, std::string_view help) {
  return impl_->add(*this, name, Type::kInt32, var, help, std::to_string(*var));
}
Flags& Flags::add(std::string_view name, int64_t* var, std::string_view help) {
  return impl_->add(*this, name, Type::kInt64, var, help, std::to_string(*var));
}
Flags& Flags::add(std::string_view name, uint32_t* var, std::string_view help) {
  return impl_->add(*this, name, Type::kUint32, var, help, std::to_string(*var));
}
Flags& Flags::add(std::string_view name, uint64_t* var, std::string_view help) {
  return impl_->add(*this, name, Type::kUint64, var, help, std::to_string(*var));
}
Flags& Flags::add(std::string_view name, double* var, std::string_view help) {
  return impl_->add(*this, name, Type::kDouble, var, help, formatDouble(*var));
}
Flags& Flags::add(std::string_view name, std::vector<std::string>* var, std::string_view help) {
  return impl_->add(*this, name, Type::kList, var, help,
                    var->empty() ? "" : "\"" + quoteList(*var) + "\"");
}

Flags& Flags::useEnv(std::string_view prefix) {
  impl_->env_enabled = true;
  impl_->env_prefix = prefix;
  return *this;
}

bool Flags::helpRequested() const { return impl_->help_requested; }

bool Flags::wasSet(std::string_view name) const {
  return impl_->set_names.find(name) != impl_->set_names.end();
}

std::string Flags::helpText() const {
  std::string s = "Usage: " + impl_->program + " [flags]\n";
  if (!impl_->description.empty()) s += impl_->description + "\n";
  s += "\nFlags:\n";
  auto line = [&s](std::string left, const std::string& right) {
    s += "  ";
    s += left;
    if (left.size() < 30) {
      s.append(30 - left.size(), ' ');
    } else {
      s += "\n";
      s.append(32, ' ');
    }
    s += right;
    s += "\n";
  };
  for (const Flag& f : impl_->flags) {
    std::string right = f.help;
    if (!f.default_text.empty()) right += " (default: " + f.default_text + ")";
    if (impl_->env_enabled) right += " [env " + envName(impl_->env_prefix, f.name) + "]";
    line("--" + f.name + std::string(typeHint(f.type)), right);
  }
  line("-h, --help", "show this help and exit");
  return s;
}

Status Flags::parse(int argc, const char* const* argv) {
  Impl& im = *impl_;
  im.help_requested = false;
  im.set_names.clear();
  for (int i = 1; i < argc; ++i) {
    std::string_view a = argv[i];
    if (a == "--") break;
    if (a == "--help" || a == "-h") {
      im.help_requested = true;
      return okStatus();
    }
  }

  po::options_description desc;
  desc.add_options()("help,h", "");
  for (const Flag& f : im.flags) {
    if (f.type == Type::kList) {
      desc.add_options()(f.name.c_str(), po::value<std::vector<std::string>>()->composing());
    } else if (f.type == Type::kBool) {
      desc.add_options()(f.name.c_str(), po::value<std::string>()->implicit_value("true"));
    } else {
      desc.add_options()(f.name.c_str(), po::value<std::string>());
    }
  }
  desc.add_options()(kPositional, po::value<std::vector<std::string>>());
  po::positional_options_description positional;
  positional.add(kPositional, -1);

  po::variables_map vm;
  try {
    int style = po::command_line_style::unix_style & ~po::command_line_style::allow_guessing &
                ~po::command_line_style::allow_sticky;
    po::store(
        po::command_line_parser(argc, argv).options(desc).positional(positional).style(style).run(),
        vm);
  } catch (const po::unknown_option& e) {
    return invalidArgument("unknown flag '" + e.get_option_name() + "'");
  } catch (const po::multiple_occurrences& e) {
    return invalidArgument("flag '" + e.get_option_name() + "' given more than once");
  } catch (const po::invalid_command_line_syntax& e) {
    if (e.kind() == po::invalid_command_line_syntax::missing_parameter) {
      return invalidArgument("flag '" + e.get_option_name() + "' requires a value");
    }
    if (e.kind() == po::invalid_command_line_syntax::empty_adjacent_parameter) {
      return invalidArgument("flag '" + e.get_option_name() + "' requires a value after '='");
    }
    if (e.kind() == po::invalid_command_line_syntax::extra_parameter) {
      return invalidArgument("flag '" + e.get_option_name() + "' does not take a value");
    }
    return invalidArgument(std::string("bad command line: ") + e.what());
  } catch (const po::error& e) {
    return invalidArgument(std::string("bad command line: ") + e.what());
  }

  if (vm.count(kPositional) != 0) {
    const auto& extra = vm[kPositional].as<std::vector<std::string>>();
    return invalidArgument("unexpected positional argument '" + extra.front() +
                           "' (flags are --name=value)");
  }

  for (const Flag& f : im.flags) {
    std::vector<std::string> values;
    std::string source;
    if (vm.count(f.name) != 0) {
      if (f.type == Type::kList) {
        values = vm[f.name].as<std::vector<std::string>>();
      } else {
        values.push_back(vm[f.name].as<std::string>());
      }
      source = "flag '--" + f.name + "'";
    } else if (im.env_enabled) {
      std::string env = envName(im.env_prefix, f.name);
      const char* v = std::getenv(env.c_str());
      if (v == nullptr) continue;
      values.emplace_back(v);
      source = "environment variable " + env + " (for '--" + f.name + "')";
    } else {
      continue;
    }
    Status st = assign(f, values);
    if (!st.isOk()) return invalidArgument(source + ": " + st.message());
    im.set_names.insert(f.name);
  }
  return okStatus();
}

void Flags::parseOrExit(int argc, char** argv) {
  Status st = parse(argc, argv);
  if (!st.isOk()) {
    std::fprintf(stderr, "%s: %s\nRun '%s --help' for the list of flags.\n", impl_->program.c_str(),
                 st.message().c_str(), impl_->program.c_str());
    std::exit(2);
  }
  if (helpRequested()) {
    std::fputs(helpText().c_str(), stdout);
    std::fflush(stdout);
    std::exit(0);
  }
}

}  // namespace garden
