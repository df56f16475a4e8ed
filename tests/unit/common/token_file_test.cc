// TokenFile [TAG_TULIP_TOKEN]: the token file format, constant-time matching, Bearer checking, and
// reloading (explicit, on change, and keeping the old tokens when the file goes bad).
#include "common/token_file.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <thread>

namespace garden {
namespace {

using namespace std::chrono_literals;

class TempFile {
 public:
  TempFile() {
    char p[] = "/tmp/garden-token-test-XXXXXX";
    const int fd = mkstemp(p);
    EXPECT_GE(fd, 0);
    close(fd);
    path_ = p;
  }
  ~TempFile() { std::filesystem::remove(path_); }
  void write(const std::string& text) const { std::ofstream(path_, std::ios::trunc) << text; }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

TEST(TokenFile, ParsesLinesCommentsAndBlanks) {
  auto t = parseTokenLines("# tulip tokens\n\n  alpha \r\n\tbeta\n# old: gamma\n");
  ASSERT_TRUE(t.isOk());
  EXPECT_EQ(*t, (std::vector<std::string>{"alpha", "beta"}));
  EXPECT_EQ(parseTokenLines("# nothing\n   \n").status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(parseTokenLines("").status().code(), StatusCode::kInvalidArgument);
}

TEST(TokenFile, ConstantTimeEqualsIsEquality) {
  EXPECT_TRUE(constantTimeEquals("secret", "secret"));
  EXPECT_FALSE(constantTimeEquals("secreT", "secret"));
  EXPECT_FALSE(constantTimeEquals("secret1", "secret"));
  EXPECT_FALSE(constantTimeEquals("secre", "secret"));
  EXPECT_FALSE(constantTimeEquals("", "secret"));
  EXPECT_FALSE(constantTimeEquals("secretsecret", "secret"));  // the key cycled is not a match
  EXPECT_FALSE(constantTimeEquals("", ""));                    // an empty token matches nothing
}

TEST(TokenFile, BearerCheckNamesWhatIsWrong) {
  TokenFile tokens({"t-one", "t-two"});
  EXPECT_TRUE(checkBearer("Bearer t-one", tokens).isOk());
  EXPECT_TRUE(checkBearer("bearer t-two", tokens).isOk());
  EXPECT_TRUE(checkBearer("BEARER   t-two", tokens).isOk());
  const Status missing = checkBearer("", tokens);
  EXPECT_EQ(missing.code(), StatusCode::kUnauthenticated);
  EXPECT_NE(missing.message().find("missing token"), std::string::npos);
  const Status scheme = checkBearer("Basic dDpvbmU=", tokens);
  EXPECT_EQ(scheme.code(), StatusCode::kUnauthenticated);
  EXPECT_NE(scheme.message().find("Bearer <token>"), std::string::npos);
  EXPECT_EQ(checkBearer("Bearer ", tokens).code(), StatusCode::kUnauthenticated);
  const Status wrong = checkBearer("Bearer t-three", tokens);
  EXPECT_EQ(wrong.code(), StatusCode::kUnauthenticated);
  EXPECT_EQ(wrong.message(), "invalid token");
  EXPECT_EQ(checkBearer("Bearer t-on", tokens).code(), StatusCode::kUnauthenticated);
  EXPECT_EQ(tokens.first(), "t-one");
}

TEST(TokenFile, LoadNamesTheFlagAndTheFile) {
  auto gone = TokenFile::load("/nonexistent/garden-token", "--auth-token-file");
  EXPECT_EQ(gone.status().code(), StatusCode::kNotFound);
  EXPECT_NE(gone.status().message().find("--auth-token-file /nonexistent/garden-token"),
            std::string::npos);
  TempFile f;
  f.write("# only a comment\n");
  auto empty = TokenFile::load(f.path(), "--tulip-token-file");
  EXPECT_EQ(empty.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(empty.status().message().find("--tulip-token-file"), std::string::npos);
}

TEST(TokenFile, ReloadTakesANewTokenAndKeepsTheOldOnesWhenTheFileGoesBad) {
  TempFile f;
  f.write("first\n");
  auto loaded = TokenFile::load(f.path(), "--auth-token-file");
  ASSERT_TRUE(loaded.isOk());
  TokenFile& t = **loaded;
  EXPECT_TRUE(t.matches("first"));
  // Rotation: both for a while, then only the new one.
  f.write("second\nfirst\n");
  ASSERT_TRUE(t.reload().isOk());
  EXPECT_TRUE(t.matches("first"));
  EXPECT_TRUE(t.matches("second"));
  EXPECT_EQ(t.first(), "second");
  // A bad edit (no token) or a vanished file keeps what was there.
  f.write("# oops\n");
  EXPECT_FALSE(t.reload().isOk());
  EXPECT_TRUE(t.matches("second"));
  std::filesystem::remove(f.path());
  EXPECT_FALSE(t.reload().isOk());
  EXPECT_TRUE(t.matches("first"));
  EXPECT_EQ(t.size(), 2u);
}

TEST(TokenFile, AChangedFileIsPickedUpWithoutReload) {
  TempFile f;
  f.write("old-token\n");
  auto loaded = TokenFile::load(f.path(), "--auth-token-file");
  ASSERT_TRUE(loaded.isOk());
  TokenFile& t = **loaded;
  EXPECT_TRUE(t.matches("old-token"));
  f.write("a-new-token-of-another-size\n");
  // Looked at no more than once a second: the change shows within a few seconds (generous bound;
  // the wait ends as soon as it shows).
  const auto until = std::chrono::steady_clock::now() + 30s;
  while (!t.matches("a-new-token-of-another-size") && std::chrono::steady_clock::now() < until)
    std::this_thread::sleep_for(50ms);
  EXPECT_TRUE(t.matches("a-new-token-of-another-size"));
  EXPECT_FALSE(t.matches("old-token"));
}

}  // namespace
}  // namespace garden
