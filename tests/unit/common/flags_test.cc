// Tests for common/flags: every flag type, defaults, switches, lists, --help, environment fallback
// and the INVALID_ARGUMENT messages (which must name the flag or variable).

#include "common/flags.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <initializer_list>
#include <string>
#include <vector>

namespace garden {
namespace {

// Owns argv storage for a parse() call.
class Argv {
 public:
  Argv(std::initializer_list<std::string> args) : storage_{"prog"} {
    for (const auto& a : args) storage_.push_back(a);
    for (auto& s : storage_) ptrs_.push_back(s.data());
    ptrs_.push_back(nullptr);
  }
  Argv(const Argv&) = delete;
  Argv& operator=(const Argv&) = delete;
  int argc() const { return static_cast<int>(storage_.size()); }
  char** argv() { return ptrs_.data(); }

 private:
  std::vector<std::string> storage_;
  std::vector<char*> ptrs_;
};

struct Vars {
  std::string name = "default-name";
  bool verbose = false;
  bool enabled = true;
  int32_t port = 8080;
  int64_t big = -1;
  uint32_t workers = 4;
  uint64_t bytes = 1024;
  double ratio = 0.5;
  std::vector<std::string> hosts = {"a", "b"};
};

void declare(Flags& f, Vars& v) {
  f.add("name", &v.name, "model name")
      .add("verbose", &v.verbose, "verbose logging")
      .add("enabled", &v.enabled, "feature on")
      .add("port", &v.port, "HTTP port")
      .add("big", &v.big, "an int64")
      .add("workers", &v.workers, "worker count")
      .add("max-bytes", &v.bytes, "byte budget")
      .add("ratio", &v.ratio, "a ratio")
      .add("hosts", &v.hosts, "host list");
}

Status parseWith(Vars& v, Argv&& args) {
  Flags f("prog", "test program");
  declare(f, v);
  return f.parse(args.argc(), args.argv());
}

std::string errorOf(std::initializer_list<std::string> args) {
  Vars v;
  Status st = parseWith(v, Argv(args));
  EXPECT_FALSE(st.isOk());
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  return st.message();
}

TEST(Flags, DefaultsKeptWhenAbsent) {
  Vars v;
  Flags f("prog", "");
  declare(f, v);
  Argv a({});
  ASSERT_TRUE(f.parse(a.argc(), a.argv()).isOk());
  EXPECT_EQ(v.name, "default-name");
  EXPECT_EQ(v.port, 8080);
  EXPECT_EQ(v.hosts, (std::vector<std::string>{"a", "b"}));
  EXPECT_FALSE(f.helpRequested());
  EXPECT_FALSE(f.wasSet("port"));
}

TEST(Flags, AllTypesBothSyntaxes) {
  Vars v;
  Flags f("prog", "");
  declare(f, v);
  Argv a({"--name=qwen", "--port", "9000", "--big=-9223372036854775808", "--workers", "4294967295",
          "--max-bytes=18446744073709551615", "--ratio=1e-3", "--verbose", "--enabled=false"});
  Status st = f.parse(a.argc(), a.argv());
  ASSERT_TRUE(st.isOk()) << st.toString();
  EXPECT_EQ(v.name, "qwen");
  EXPECT_EQ(v.port, 9000);
  EXPECT_EQ(v.big, INT64_MIN);
  EXPECT_EQ(v.workers, 4294967295u);
  EXPECT_EQ(v.bytes, UINT64_MAX);
  EXPECT_EQ(v.ratio, 1e-3);
  EXPECT_TRUE(v.verbose);
  EXPECT_FALSE(v.enabled);
  EXPECT_TRUE(f.wasSet("port"));
  EXPECT_TRUE(f.wasSet("max-bytes"));
  EXPECT_FALSE(f.wasSet("hosts"));
}

TEST(Flags, NegativeIntegerWithEquals) {
  Vars v;
  ASSERT_TRUE(parseWith(v, Argv({"--port=-5", "--ratio=-2.5"})).isOk());
  EXPECT_EQ(v.port, -5);
  EXPECT_EQ(v.ratio, -2.5);
}

TEST(Flags, BoolSpellings) {
  for (auto [text, want] : std::vector<std::pair<std::string, bool>>{{"true", true},
                                                                     {"1", true},
                                                                     {"yes", true},
                                                                     {"ON", true},
                                                                     {"False", false},
                                                                     {"0", false},
                                                                     {"no", false},
                                                                     {"off", false}}) {
    Vars v;
    v.verbose = !want;
    Status st = parseWith(v, Argv({"--verbose=" + text}));
    ASSERT_TRUE(st.isOk()) << text << ": " << st.toString();
    EXPECT_EQ(v.verbose, want) << text;
  }
  std::string m = errorOf({"--verbose=maybe"});
  EXPECT_NE(m.find("--verbose"), std::string::npos) << m;
  EXPECT_NE(m.find("maybe"), std::string::npos) << m;
}

TEST(Flags, SwitchDoesNotSwallowNextToken) {
  Vars v;
  Status st = parseWith(v, Argv({"--verbose", "--port", "1"}));
  ASSERT_TRUE(st.isOk()) << st.toString();
  EXPECT_TRUE(v.verbose);
  EXPECT_EQ(v.port, 1);
  // A switch followed by a non-flag token takes it as its value (positional arguments don't
  // exist, so nothing else could be meant).
  Vars v2;
  v2.verbose = true;
  st = parseWith(v2, Argv({"--verbose", "false", "--port=2"}));
  ASSERT_TRUE(st.isOk()) << st.toString();
  EXPECT_FALSE(v2.verbose);
  EXPECT_EQ(v2.port, 2);
  std::string m = errorOf({"--verbose", "model-dir"});
  EXPECT_NE(m.find("--verbose"), std::string::npos) << m;
  EXPECT_NE(m.find("model-dir"), std::string::npos) << m;
}

TEST(Flags, ListsRepeatSplitTrimAndReplaceDefault) {
  Vars v;
  Status st = parseWith(v, Argv({"--hosts=x, y,,z", "--hosts", "w"}));
  ASSERT_TRUE(st.isOk()) << st.toString();
  EXPECT_EQ(v.hosts, (std::vector<std::string>{"x", "y", "z", "w"}));
  // Only separators: the list becomes empty.
  Vars v2;
  Status st2 = parseWith(v2, Argv({"--hosts=,"}));
  ASSERT_TRUE(st2.isOk()) << st2.toString();
  EXPECT_TRUE(v2.hosts.empty());
  std::string m = errorOf({"--hosts="});
  EXPECT_NE(m.find("flag '--hosts' requires a value"), std::string::npos) << m;
}

TEST(Flags, ErrorsNameTheFlag) {
  std::string m = errorOf({"--bogus=1"});
  EXPECT_NE(m.find("unknown flag"), std::string::npos) << m;
  EXPECT_NE(m.find("--bogus"), std::string::npos) << m;

  m = errorOf({"--port=12x"});
  EXPECT_NE(m.find("--port"), std::string::npos) << m;
  EXPECT_NE(m.find("12x"), std::string::npos) << m;

  m = errorOf({"--port="});
  EXPECT_NE(m.find("--port"), std::string::npos) << m;

  m = errorOf({"--port=3000000000"});
  EXPECT_NE(m.find("--port"), std::string::npos) << m;
  EXPECT_NE(m.find("out of range"), std::string::npos) << m;

  m = errorOf({"--workers=-1"});
  EXPECT_NE(m.find("--workers"), std::string::npos) << m;
  EXPECT_NE(m.find("non-negative"), std::string::npos) << m;

  m = errorOf({"--max-bytes=18446744073709551616"});
  EXPECT_NE(m.find("--max-bytes"), std::string::npos) << m;

  m = errorOf({"--ratio=fast"});
  EXPECT_NE(m.find("--ratio"), std::string::npos) << m;
  EXPECT_NE(m.find("number"), std::string::npos) << m;

  m = errorOf({"--ratio=1e999"});
  EXPECT_NE(m.find("--ratio"), std::string::npos) << m;
  EXPECT_NE(m.find("out of range"), std::string::npos) << m;

  m = errorOf({"--port= 5"});
  EXPECT_NE(m.find("--port"), std::string::npos) << m;

  m = errorOf({"--port"});
  EXPECT_NE(m.find("--port"), std::string::npos) << m;
  EXPECT_NE(m.find("requires a value"), std::string::npos) << m;

  m = errorOf({"--port=1", "--port=2"});
  EXPECT_NE(m.find("--port"), std::string::npos) << m;
  EXPECT_NE(m.find("more than once"), std::string::npos) << m;

  m = errorOf({"stray"});
  EXPECT_NE(m.find("'stray'"), std::string::npos) << m;

  // No prefix guessing: --po is not --port.
  m = errorOf({"--po=1"});
  EXPECT_NE(m.find("--po"), std::string::npos) << m;
  EXPECT_NE(m.find("unknown"), std::string::npos) << m;
}

TEST(Flags, HelpIsDetectedAndAssignsNothing) {
  for (std::string h : {"--help", "-h"}) {
    Vars v;
    Flags f("ivy", "Garden HTTP gateway");
    declare(f, v);
    Argv a({"--port=1", h, "--bogus"});
    ASSERT_TRUE(f.parse(a.argc(), a.argv()).isOk());
    EXPECT_TRUE(f.helpRequested());
    EXPECT_EQ(v.port, 8080);
  }
  Vars v;
  Flags f("ivy", "Garden HTTP gateway");
  declare(f, v);
  std::string help = f.helpText();
  EXPECT_NE(help.find("Usage: ivy [flags]"), std::string::npos) << help;
  EXPECT_NE(help.find("Garden HTTP gateway"), std::string::npos);
  EXPECT_NE(help.find("--port=INT"), std::string::npos) << help;
  EXPECT_NE(help.find("HTTP port (default: 8080)"), std::string::npos) << help;
  EXPECT_NE(help.find("--hosts=A,B,..."), std::string::npos) << help;
  EXPECT_NE(help.find("(default: \"a,b\")"), std::string::npos) << help;
  EXPECT_NE(help.find("--name=STRING"), std::string::npos) << help;
  EXPECT_NE(help.find("--verbose "), std::string::npos) << help;
  EXPECT_NE(help.find("-h, --help"), std::string::npos) << help;
}

TEST(Flags, EnvironmentFallback) {
  ::setenv("GARDEN_FLAGTEST_PORT", "7000", 1);
  ::setenv("GARDEN_FLAGTEST_MAX_BYTES", "77", 1);
  ::setenv("GARDEN_FLAGTEST_HOSTS", "h1,h2", 1);
  ::setenv("GARDEN_FLAGTEST_VERBOSE", "yes", 1);
  {
    Vars v;
    Flags f("prog", "");
    declare(f, v);
    f.useEnv("GARDEN_FLAGTEST_");
    Argv a({"--max-bytes=5"});
    Status st = f.parse(a.argc(), a.argv());
    ASSERT_TRUE(st.isOk()) << st.toString();
    EXPECT_EQ(v.port, 7000);
    EXPECT_EQ(v.bytes, 5u);  // the command line wins
    EXPECT_EQ(v.hosts, (std::vector<std::string>{"h1", "h2"}));
    EXPECT_TRUE(v.verbose);
    EXPECT_TRUE(f.wasSet("port"));
    EXPECT_NE(f.helpText().find("[env GARDEN_FLAGTEST_MAX_BYTES]"), std::string::npos);
  }
  {
    // Without useEnv the environment is ignored.
    Vars v;
    ASSERT_TRUE(parseWith(v, Argv({})).isOk());
    EXPECT_EQ(v.port, 8080);
  }
  ::setenv("GARDEN_FLAGTEST_PORT", "seven", 1);
  {
    Vars v;
    Flags f("prog", "");
    declare(f, v);
    f.useEnv("GARDEN_FLAGTEST_");
    Argv a({});
    Status st = f.parse(a.argc(), a.argv());
    ASSERT_FALSE(st.isOk());
    EXPECT_NE(st.message().find("GARDEN_FLAGTEST_PORT"), std::string::npos) << st.message();
    EXPECT_NE(st.message().find("seven"), std::string::npos) << st.message();
  }
  ::unsetenv("GARDEN_FLAGTEST_PORT");
  ::unsetenv("GARDEN_FLAGTEST_MAX_BYTES");
  ::unsetenv("GARDEN_FLAGTEST_HOSTS");
  ::unsetenv("GARDEN_FLAGTEST_VERBOSE");
}

TEST(Flags, DoubleDashEndsHelpScan) {
  // "--" ends flags for the help scan; what follows is positional and so rejected.
  Vars v;
  Flags f("prog", "");
  declare(f, v);
  Argv a({"--", "--help"});
  Status st = f.parse(a.argc(), a.argv());
  EXPECT_FALSE(f.helpRequested());
  EXPECT_FALSE(st.isOk());
}

using FlagsDeathTest = ::testing::Test;

TEST_F(FlagsDeathTest, ParseOrExit) {
  Vars v;
  Flags f("ivy", "desc");
  declare(f, v);
  Argv help({"--help"});
  EXPECT_EXIT(f.parseOrExit(help.argc(), help.argv()), ::testing::ExitedWithCode(0), "");
  Argv bad({"--port=x"});
  EXPECT_EXIT(f.parseOrExit(bad.argc(), bad.argv()), ::testing::ExitedWithCode(2),
              "ivy: flag '--port': invalid value 'x'");
}

TEST_F(FlagsDeathTest, DeclarationErrorsCheckFail) {
  int a = 0, b = 0;
  EXPECT_DEATH(
      {
        Flags f("p", "");
        f.add("x", &a, "").add("x", &b, "");
      },
      "declared twice");
  EXPECT_DEATH(
      {
        Flags f("p", "");
        f.add("Bad Name", &a, "");
      },
      "flag names");
  EXPECT_DEATH(
      {
        Flags f("p", "");
        f.add("help", &a, "");
      },
      "flag names");
}

}  // namespace
}  // namespace garden
