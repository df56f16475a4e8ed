#pragma once
// Flags: command-line flags for the garden binaries, parsed with Boost.Program_options (hidden in
// flags.cc; this header pulls in no Boost). A binary declares typed flags bound to its own
// variables; the variable's value at add() time is the default shown in --help.
//
//   int port = 8080;
//   std::vector<std::string> tulips;
//   bool verbose = false;
//   garden::Flags flags("ivy", "Garden HTTP gateway");
//   flags.add("port", &port, "HTTP port")
//        .add("tulip", &tulips, "tulip endpoints (repeat or comma-separate)")
//        .add("verbose", &verbose, "log at debug level");
//   flags.parseOrExit(argc, argv);   // prints --help (exit 0) or the error + usage (exit 2)
//
// Syntax: `--name value`, `--name=value` (a negative number needs `--name=-5`); bool flags are
// switches (`--verbose`) that also accept a value `--verbose=false` / `--verbose false` (true,
// false, 1, 0, yes, no, on, off); vector flags may repeat and each value is split on commas, items
// trimmed of spaces, empty items dropped (`--hosts=,` gives an empty list; `--hosts=` is an error).
// Flag names are lowercase letters, digits, '-' and '_'; no prefix abbreviations. `--help` / `-h`
// is built in. Positional arguments are rejected.
//
// Environment fallback (opt-in with useEnv): a flag not given on the command line is read from
// <PREFIX><NAME upper-cased, '-' → '_'>, e.g. useEnv("GARDEN_") makes --max-batch-tokens read
// GARDEN_MAX_BATCH_TOKENS. The command line wins over the environment.
//
// Errors are INVALID_ARGUMENT naming the flag: unknown flag, missing value, bad value (an int flag
// given "12x", an unsigned flag given "-1", out of range), flag repeated (non-vector), positional
// argument, bad value in an environment variable (the variable is named). On error, bound variables
// may be partially assigned; binaries exit.
//
// A vector flag given on the command line (or in the environment) replaces its default.
//
// Threads: single-threaded use at startup. The bound variables must outlive parse(); the Flags
// object may be destroyed right after it (the variables keep the values).

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace garden {

class Flags {
 public:
  Flags(std::string_view program, std::string_view description);
  ~Flags();
  Flags(const Flags&) = delete;
  Flags& operator=(const Flags&) = delete;

  // Declares --name bound to *var (CHECK-fails on a duplicate or malformed name).
  Flags& add(std::string_view name, std::string* var, std::string_view help);
  Flags& add(std::string_view name, bool* var, std::string_view help);
  Flags& add(std::string_view name, int32_t* var, std::string_view help);
  Flags& add(std::string_view name, int64_t* var, std::string_view help);
  Flags& add(std::string_view name, uint32_t* var, std::string_view help);
  Flags& add(std::string_view name, uint64_t* var, std::string_view help);
  Flags& add(std::string_view name, double* var, std::string_view help);
  Flags& add(std::string_view name, std::vector<std::string>* var, std::string_view help);

  // Enables the environment fallback with the given variable prefix (e.g. "GARDEN_").
  Flags& useEnv(std::string_view prefix);

  // Parses argv[1..argc). OK with helpRequested() true when --help/-h was given (nothing else is
  // assigned then). argv[0] is ignored.
  Status parse(int argc, const char* const* argv);
  Status parse(int argc, char** argv) { return parse(argc, const_cast<const char* const*>(argv)); }
  // parse(); on --help prints helpText() to stdout and exits 0; on error prints
  // "<program>: <message>" and a hint to stderr and exits 2.
  void parseOrExit(int argc, char** argv);

  bool helpRequested() const;
  // "Usage: <program> [flags]\n<description>\n\nFlags:\n  --port arg (=8080)  HTTP port\n..."
  std::string helpText() const;
  // True if the flag was given on the command line or taken from the environment.
  bool wasSet(std::string_view name) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace garden
