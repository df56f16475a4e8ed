// Tests for common/logging: exact line format, every field kind parsed back with simdjson, level
// filtering, and that concurrent lines written to a real fd never interleave.

#include "common/logging.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <simdjson.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <limits>
#include <string>
#include <thread>
#include <vector>

namespace garden::log {
namespace {

using std::chrono::milliseconds;
using std::chrono::system_clock;

// 2026-11-30T02:51:11.123Z
const system_clock::time_point kTs{milliseconds(1796007071123)};

// Restores the global logging state a test changes.
class LoggingTest : public ::testing::Test {
 protected:
  void SetUp() override {
    saved_level_ = level();
    saved_service_ = service();
    setSinkForTesting([this](std::string_view line) { lines_.emplace_back(line); });
  }
  void TearDown() override {
    setSinkForTesting(nullptr);
    setLevel(saved_level_);
    setService(saved_service_);
  }
  Level saved_level_;
  std::string saved_service_;
  std::vector<std::string> lines_;
};

TEST(LogFormat, ExactLine) {
  std::string line = formatLine(Level::kInfo, "tulip", "request",
                                {{"request_id", "abc"}, {"latency_us", 812}}, kTs);
  EXPECT_EQ(line,
            "{\"ts\":\"2026-11-30T02:51:11.123Z\",\"level\":\"info\",\"svc\":\"tulip\","
            "\"msg\":\"request\",\"request_id\":\"abc\",\"latency_us\":812}\n");
}

TEST(LogFormat, Timestamps) {
  EXPECT_EQ(formatTimestamp(kTs), "2026-11-30T02:51:11.123Z");
  EXPECT_EQ(formatTimestamp(system_clock::time_point{}), "1970-01-01T00:00:00.000Z");
  EXPECT_EQ(formatTimestamp(system_clock::time_point{milliseconds(-1)}),
            "1969-12-31T23:59:59.999Z");
  EXPECT_EQ(formatTimestamp(system_clock::time_point{milliseconds(951782400007)}),
            "2000-02-29T00:00:00.007Z");
  // Sub-millisecond precision is truncated, not rounded.
  EXPECT_EQ(formatTimestamp(kTs + std::chrono::microseconds(999)), "2026-11-30T02:51:11.123Z");
}

TEST(LogFormat, EveryFieldKindParsesBack) {
  const std::string owned = "owned \"string\"\n";
  const Status st = invalidArgument("field 'input' is \"bad\"");
  const std::string_view view = "view\\";
  std::string line = formatLine(Level::kWarn, "svc\"x", "msg\twith\x01 ctrl and \xFF bad utf8",
                                {{"s", view},
                                 {"c", "literal"},
                                 {"o", owned},
                                 {"i", -42},
                                 {"i64", std::numeric_limits<int64_t>::min()},
                                 {"u64", std::numeric_limits<uint64_t>::max()},
                                 {"sz", size_t{7}},
                                 {"d", 0.25},
                                 {"f", 0.1f},
                                 {"nan", std::numeric_limits<double>::quiet_NaN()},
                                 {"b", true},
                                 {"n", nullptr},
                                 {"st", st},
                                 {"ok", okStatus()}},
                                kTs);
  ASSERT_EQ(line.back(), '\n');
  ASSERT_EQ(line.find('\n'), line.size() - 1) << "a line must not contain a raw newline";

  simdjson::dom::parser parser;
  simdjson::dom::element doc;
  ASSERT_EQ(parser.parse(line).get(doc), simdjson::SUCCESS) << line;
  std::string_view s;
  EXPECT_EQ(doc["level"].get(s), simdjson::SUCCESS);
  EXPECT_EQ(s, "warn");
  EXPECT_EQ(doc["svc"].get(s), simdjson::SUCCESS);
  EXPECT_EQ(s, "svc\"x");
  EXPECT_EQ(doc["msg"].get(s), simdjson::SUCCESS);
  EXPECT_EQ(s, "msg\twith\x01 ctrl and \xEF\xBF\xBD bad utf8");
  EXPECT_EQ(doc["s"].get(s), simdjson::SUCCESS);
  EXPECT_EQ(s, "view\\");
  EXPECT_EQ(doc["c"].get(s), simdjson::SUCCESS);
  EXPECT_EQ(s, "literal");
  EXPECT_EQ(doc["o"].get(s), simdjson::SUCCESS);
  EXPECT_EQ(s, owned);
  int64_t i = 0;
  EXPECT_EQ(doc["i"].get(i), simdjson::SUCCESS);
  EXPECT_EQ(i, -42);
  EXPECT_EQ(doc["i64"].get(i), simdjson::SUCCESS);
  EXPECT_EQ(i, std::numeric_limits<int64_t>::min());
  uint64_t u = 0;
  EXPECT_EQ(doc["u64"].get(u), simdjson::SUCCESS);
  EXPECT_EQ(u, std::numeric_limits<uint64_t>::max());
  EXPECT_EQ(doc["sz"].get(u), simdjson::SUCCESS);
  EXPECT_EQ(u, 7u);
  double d = 0;
  EXPECT_EQ(doc["d"].get(d), simdjson::SUCCESS);
  EXPECT_EQ(d, 0.25);
  EXPECT_EQ(doc["f"].get(d), simdjson::SUCCESS);
  EXPECT_EQ(static_cast<float>(d), 0.1f);
  EXPECT_NE(line.find("\"f\":0.1,"), std::string::npos) << "floats use their shortest form";
  EXPECT_TRUE(doc["nan"].is_null());
  bool b = false;
  EXPECT_EQ(doc["b"].get(b), simdjson::SUCCESS);
  EXPECT_TRUE(b);
  EXPECT_TRUE(doc["n"].is_null());
  EXPECT_EQ(doc["st"].get(s), simdjson::SUCCESS);
  EXPECT_EQ(s, "INVALID_ARGUMENT: field 'input' is \"bad\"");
  EXPECT_EQ(doc["ok"].get(s), simdjson::SUCCESS);
  EXPECT_EQ(s, "OK");
}

TEST(LogLevel, Parse) {
  EXPECT_EQ(*parseLevel("debug"), Level::kDebug);
  EXPECT_EQ(*parseLevel("INFO"), Level::kInfo);
  EXPECT_EQ(*parseLevel("Warn"), Level::kWarn);
  EXPECT_EQ(*parseLevel("warning"), Level::kWarn);
  EXPECT_EQ(*parseLevel("error"), Level::kError);
  EXPECT_EQ(*parseLevel("off"), Level::kOff);
  auto bad = parseLevel("verbose");
  ASSERT_FALSE(bad.isOk());
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("verbose"), std::string::npos);
  EXPECT_FALSE(parseLevel("").isOk());
  for (Level l : {Level::kDebug, Level::kInfo, Level::kWarn, Level::kError, Level::kOff}) {
    EXPECT_EQ(*parseLevel(levelName(l)), l);
  }
}

TEST_F(LoggingTest, LevelFiltering) {
  setService("rose");
  setLevel(Level::kWarn);
  EXPECT_FALSE(enabled(Level::kDebug));
  EXPECT_FALSE(enabled(Level::kInfo));
  EXPECT_TRUE(enabled(Level::kWarn));
  EXPECT_TRUE(enabled(Level::kError));
  debug("d");
  info("i");
  warn("w", {{"k", 1}});
  error("e");
  ASSERT_EQ(lines_.size(), 2u);
  EXPECT_NE(lines_[0].find("\"level\":\"warn\",\"svc\":\"rose\",\"msg\":\"w\",\"k\":1}"),
            std::string::npos)
      << lines_[0];
  EXPECT_NE(lines_[1].find("\"level\":\"error\""), std::string::npos);

  setLevel(Level::kDebug);
  debug("d2");
  ASSERT_EQ(lines_.size(), 3u);
  EXPECT_NE(lines_[2].find("\"msg\":\"d2\""), std::string::npos);

  setLevel(Level::kOff);
  error("nothing");
  write(Level::kOff, "nothing either", {});
  EXPECT_EQ(lines_.size(), 3u);
  EXPECT_EQ(level(), Level::kOff);
}

TEST_F(LoggingTest, RuntimeFieldList) {
  setService("ivy");
  setLevel(Level::kInfo);
  std::vector<std::string> names = {"a", "b", "c"};
  std::vector<Field> fields;
  for (size_t i = 0; i < names.size(); ++i) fields.emplace_back(names[i], static_cast<int>(i));
  writeFields(Level::kInfo, "dyn", fields);
  writeFields(Level::kDebug, "filtered", fields);
  ASSERT_EQ(lines_.size(), 1u);
  EXPECT_NE(lines_[0].find("\"msg\":\"dyn\",\"a\":0,\"b\":1,\"c\":2}\n"), std::string::npos)
      << lines_[0];
}

TEST_F(LoggingTest, ServiceName) {
  setService("ivy");
  EXPECT_EQ(service(), "ivy");
  info("x");
  ASSERT_EQ(lines_.size(), 1u);
  EXPECT_NE(lines_[0].find("\"svc\":\"ivy\""), std::string::npos);
}

// Real fd 2 (redirected to a file): 8 threads writing long lines concurrently; every line must be
// intact JSON and none may be lost.
TEST(LogConcurrency, LinesDoNotInterleaveOnStderr) {
  char path[] = "/tmp/garden_log_XXXXXX";
  int fd = mkstemp(path);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(fcntl(fd, F_SETFL, O_APPEND), 0);
  int saved = dup(2);
  ASSERT_GE(saved, 0);
  Level saved_level = level();
  setLevel(Level::kInfo);
  fflush(stderr);
  ASSERT_EQ(dup2(fd, 2), 2);

  constexpr int kThreads = 8;
  constexpr int kLines = 2000;
  const std::string payload(300, 'p');
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([t, &payload] {
      for (int i = 0; i < kLines; ++i) {
        info("concurrent", {{"thread", t}, {"i", i}, {"payload", payload}});
      }
    });
  }
  for (auto& th : threads) th.join();

  dup2(saved, 2);
  close(saved);
  close(fd);
  setLevel(saved_level);

  FILE* f = std::fopen(path, "rb");
  ASSERT_NE(f, nullptr);
  std::string all;
  char buf[1 << 16];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), f)) > 0) all.append(buf, n);
  std::fclose(f);
  std::remove(path);

  simdjson::dom::parser parser;
  std::vector<int> next(kThreads, 0);
  size_t count = 0;
  size_t pos = 0;
  while (pos < all.size()) {
    size_t nl = all.find('\n', pos);
    ASSERT_NE(nl, std::string::npos);
    std::string line = all.substr(pos, nl - pos);
    pos = nl + 1;
    simdjson::dom::element doc;
    ASSERT_EQ(parser.parse(line).get(doc), simdjson::SUCCESS) << line;
    int64_t t = -1, i = -1;
    ASSERT_EQ(doc["thread"].get(t), simdjson::SUCCESS);
    ASSERT_EQ(doc["i"].get(i), simdjson::SUCCESS);
    ASSERT_GE(t, 0);
    ASSERT_LT(t, kThreads);
    EXPECT_EQ(i, next[t]) << "lines of one thread stay in order";
    next[t] = static_cast<int>(i) + 1;
    ++count;
  }
  EXPECT_EQ(count, static_cast<size_t>(kThreads * kLines));
}

}  // namespace
}  // namespace garden::log
