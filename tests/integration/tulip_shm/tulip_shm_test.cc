// A tulip killed with SIGKILL leaves its /dev/shm segment behind (issue 14, part 5)
// [TAG_SHM_STALE]. The next tulip on the same --shm-name removes it after checking it is stale
// (ours, mode 0600, its owner and worker gone) and serves; a tulip started on the name of a live
// one does not take it (it says why and stays not ready) and the live one keeps serving.
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fstream>
#include <string>
#include <vector>

#include "garden/v1/garden.grpc.pb.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "tests/integration/support/harness.h"

namespace garden {
namespace {

using namespace std::chrono_literals;
namespace v1 = garden::v1;

// A process that is gone or a zombie (its mappings are released either way).
bool gone(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  if (!in) return true;
  std::string stat;
  std::getline(in, stat);
  const size_t p = stat.rfind(')');
  return p != std::string::npos && p + 2 < stat.size() && stat[p + 2] == 'Z';
}

struct Tulip {
  int port = 0, metrics_port = 0;
  std::unique_ptr<testing::Process> proc;
  std::shared_ptr<grpc::Channel> channel;

  void start(const testing::TempDir& dir, const std::string& shm, const std::string& tag,
             int use_port = 0, int use_metrics = 0) {
    port = use_port ? use_port : testing::freePort();
    metrics_port = use_metrics ? use_metrics : testing::freePort();
    std::vector<std::string> argv =
        testing::tulipArgv(port, metrics_port, dir.path(), "tests/fakes/fake-rose", "shm");
    argv.back() = shm;  // tulipArgv ends with the --shm-name value
    proc = std::make_unique<testing::Process>(argv, dir.path() + "/tulip-" + tag + ".log");
    channel = grpc::CreateChannel("127.0.0.1:" + std::to_string(port),
                                  grpc::InsecureChannelCredentials());
  }
  bool serving() {
    auto health = grpc::health::v1::Health::NewStub(channel);
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + 2s);
    grpc::health::v1::HealthCheckResponse resp;
    return health->Check(&ctx, grpc::health::v1::HealthCheckRequest(), &resp).ok() &&
           resp.status() == grpc::health::v1::HealthCheckResponse::SERVING;
  }
  bool embedOk() {
    auto stub = v1::Tulip::NewStub(channel);
    v1::EmbedRequest req;
    req.add_inputs()->add_ids(7);
    v1::EmbedResponse resp;
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + 10s);
    return stub->Embed(&ctx, req, &resp).ok() && resp.embeddings_size() == 1;
  }
};

TEST(TulipShm, AKilledTulipsSegmentIsReplacedAndALiveOnesIsLeftAlone) {
  testing::TempDir dir;
  const std::string shm = "/garden-it-stale-" + std::to_string(getpid());
  const std::string file = "/dev/shm" + shm;
  Tulip a;
  a.start(dir, shm, "a");
  ASSERT_TRUE(testing::eventually(30s, [&] { return a.serving(); })) << a.proc->log();
  ASSERT_TRUE(a.embedOk());
  const std::vector<pid_t> a_rose = testing::childrenOf(a.proc->pid());
  ASSERT_EQ(a_rose.size(), 1u);

  // A second tulip on the same name while the first lives: refused, not ready, first unharmed.
  Tulip b;
  b.start(dir, shm, "b");
  EXPECT_TRUE(testing::eventually(30s, [&] {
    return b.proc->log().find("in use by live process " + std::to_string(a.proc->pid()) +
                              " (its owner)") != std::string::npos;
  })) << b.proc->log();
  EXPECT_FALSE(b.serving());
  EXPECT_TRUE(testing::childrenOf(b.proc->pid()).empty()) << "b must not start a rose on it";
  EXPECT_TRUE(a.embedOk()) << a.proc->log();
  b.proc->signal(SIGTERM, 30s);
  EXPECT_TRUE(a.embedOk());

  // SIGKILL: tulip cannot clean up; its rose dies with it (PR_SET_PDEATHSIG); the file stays.
  a.proc->signal(SIGKILL);
  ASSERT_TRUE(testing::eventually(30s, [&] { return gone(a_rose.front()); }));
  ASSERT_EQ(access(file.c_str(), F_OK), 0) << "SIGKILL should leave " << file;

  // The next tulip on the same ports and name removes the stale segment and serves.
  Tulip c;
  c.start(dir, shm, "c", a.port, a.metrics_port);
  ASSERT_TRUE(testing::eventually(30s, [&] { return c.serving(); })) << c.proc->log();
  EXPECT_TRUE(c.embedOk());
  EXPECT_NE(c.proc->log().find("removed a stale shared-memory segment"), std::string::npos)
      << c.proc->log();
  // A clean stop removes the name.
  // (Our channel goes first: with a client connection open, even an idle one, tulip's gRPC
  // shutdown waits out its whole --drain-timeout-ms.)
  c.channel.reset();
  const int status = c.proc->signal(SIGTERM, 30s);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status << "\n" << c.proc->log();
  EXPECT_NE(access(file.c_str(), F_OK), 0) << c.proc->log();
}

}  // namespace
}  // namespace garden
