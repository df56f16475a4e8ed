// The CUDA IPC pieces of the multi-GPU work (services/rose/parallel/cuda/) between TWO PROCESSES
// on ONE GPU (a process cannot open its own IPC handle, so one process cannot test them): the
// test spawns this binary twice as ranks 0 and 1 (the DISABLED_ child test, run explicitly), they
// swap handles through files in a temporary directory and check:
//   - the IPC all-reduce (one-shot and two-shot, f32 and bf16, 1 .. 262,147 elements, out of and
//     in place: 32 calls in a row with fresh data, so both parity halves and the epochs recycle)
//     against a CPU sum in rank order — bit for bit, since the kernel adds in rank order with f32
//     accumulation and rounds once (bf16), like the CPU reference — and the error word clean;
//   - the KV-block handoff: rank 1 maps rank 0's paged K/V pools and copies 5 blocks of every
//     layer into other block ids of its own pools; every copied byte equals rank 0's pattern and
//     every other block keeps its sentinel; a bad pair is refused with INVALID_ARGUMENT.
// On one GPU the two ranks' kernels time-slice instead of running side by side, so the barriers
// wait for the other context's slice: correct, slow, and no measure of speed.
// Expected output: two "[rank r] all-reduce: 32 cases, 0 mismatches" lines, "[rank 1] kv handoff:
// ... 0 wrong bytes", and the test passing.

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "services/rose/parallel/cuda/ipc_comm.h"

extern char** environ;

namespace garden::rose::cuda {
namespace {

namespace fs = std::filesystem;

constexpr int kWorld = 2;

bool writeFileAtomic(const fs::path& p, const void* data, size_t n) {
  const fs::path tmp = p.string() + ".tmp";
  {
    std::ofstream f(tmp, std::ios::binary);
    f.write(static_cast<const char*>(data), static_cast<std::streamsize>(n));
    if (!f) return false;
  }
  std::error_code ec;
  fs::rename(tmp, p, ec);
  return !ec;
}

bool waitForFile(const fs::path& p, std::vector<char>& out, int timeout_s = 120) {
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(timeout_s);
  while (std::chrono::steady_clock::now() < end) {
    std::ifstream f(p, std::ios::binary);
    if (f) {
      out.assign(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
      return true;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return false;
}

// Deterministic inputs: rank r, element i, round k → a value in [-2, 2) (exact in bf16 when
// rounded, see below).
float inputValue(int r, int64_t i, int k) {
  uint32_t x =
      static_cast<uint32_t>(r * 7919 + k * 104729) ^ static_cast<uint32_t>(i * 2654435761u);
  x ^= x >> 15;
  x *= 2246822519u;
  x ^= x >> 13;
  return static_cast<float>(x % 65536) / 16384.f - 2.f;
}
uint16_t bf16Bits(float f) {  // round to nearest even, as __float2bfloat16
  uint32_t u;
  std::memcpy(&u, &f, 4);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}
float bf16Value(uint16_t b) {
  const uint32_t u = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

uint8_t kvPattern(int layer, int block, int64_t offset, int is_v) {
  return static_cast<uint8_t>((layer * 131 + block * 31 + offset * 7 + is_v * 101) & 0xff);
}

#define CHILD_CHECK(cond, msg)                                               \
  do {                                                                       \
    if (!(cond)) {                                                           \
      std::fprintf(stderr, "[rank %d] FAILED: %s (%s)\n", rank, msg, #cond); \
      return 1;                                                              \
    }                                                                        \
  } while (0)

int allReduceCases(int rank, IpcAllReduce& ar, cudaStream_t stream) {
  int cases = 0, mismatches = 0;
  const int64_t sizes[] = {1, 17, 4099, 262147};
  for (IpcDType dtype : {IpcDType::kF32, IpcDType::kBF16}) {
    for (IpcAlgo algo : {IpcAlgo::kOneShot, IpcAlgo::kTwoShot}) {
      for (int64_t n : sizes) {
        for (int round = 0; round < 2; ++round) {
          const bool in_place = round == 1;
          const size_t es = dtype == IpcDType::kF32 ? 4 : 2;
          std::vector<unsigned char> host(static_cast<size_t>(n) * es), want(host.size()),
              got(host.size());
          for (int64_t i = 0; i < n; ++i) {
            float sum = 0.f;
            for (int r = 0; r < kWorld; ++r) {
              float v = inputValue(r, i, cases);
              if (dtype == IpcDType::kBF16) v = bf16Value(bf16Bits(v));
              sum += v;  // rank order, f32
              if (r == rank) {
                if (dtype == IpcDType::kF32) {
                  std::memcpy(host.data() + i * 4, &v, 4);
                } else {
                  const uint16_t b = bf16Bits(v);
                  std::memcpy(host.data() + i * 2, &b, 2);
                }
              }
            }
            if (dtype == IpcDType::kF32) {
              std::memcpy(want.data() + i * 4, &sum, 4);
            } else {
              const uint16_t b = bf16Bits(sum);
              std::memcpy(want.data() + i * 2, &b, 2);
            }
          }
          void *d_in = nullptr, *d_out = nullptr;
          CHILD_CHECK(cudaMalloc(&d_in, host.size()) == cudaSuccess, "cudaMalloc");
          CHILD_CHECK(cudaMalloc(&d_out, host.size()) == cudaSuccess, "cudaMalloc");
          CHILD_CHECK(cudaMemset(d_out, 0xff, host.size()) == cudaSuccess, "poison");  // NaN
          CHILD_CHECK(
              cudaMemcpy(d_in, host.data(), host.size(), cudaMemcpyHostToDevice) == cudaSuccess,
              "upload");
          void* out = in_place ? d_in : d_out;
          const Status st = ar.allReduceSum(d_in, out, n, dtype, stream, &algo);
          CHILD_CHECK(st.isOk(), st.toString().c_str());
          CHILD_CHECK(cudaStreamSynchronize(stream) == cudaSuccess, "sync");
          CHILD_CHECK(
              cudaMemcpy(got.data(), out, got.size(), cudaMemcpyDeviceToHost) == cudaSuccess,
              "download");
          if (std::memcmp(got.data(), want.data(), got.size()) != 0) {
            ++mismatches;
            std::fprintf(stderr, "[rank %d] mismatch: dtype %d algo %d n %lld in_place %d\n", rank,
                         static_cast<int>(dtype), static_cast<int>(algo), static_cast<long long>(n),
                         in_place ? 1 : 0);
          }
          cudaFree(d_in);
          cudaFree(d_out);
          ++cases;
        }
      }
    }
  }
  const Status err = ar.checkError();
  CHILD_CHECK(err.isOk(), err.toString().c_str());
  std::printf("[rank %d] all-reduce: %d cases, %d mismatches\n", rank, cases, mismatches);
  return mismatches == 0 ? 0 : 1;
}

int kvHandoff(int rank, const fs::path& dir, cudaStream_t stream) {
  constexpr int kLayers = 3, kSrcBlocks = 10, kDstBlocks = 12;
  constexpr int64_t kBlockBytes = 16 * 2 * 64 * 2;  // block 16 x 2 kv heads x head_dim 64, bf16
  if (rank == 0) {
    const size_t bytes = static_cast<size_t>(kLayers * kSrcBlocks * kBlockBytes);
    std::vector<uint8_t> k(bytes), v(bytes);
    for (int l = 0; l < kLayers; ++l) {
      for (int b = 0; b < kSrcBlocks; ++b) {
        for (int64_t o = 0; o < kBlockBytes; ++o) {
          const size_t at = static_cast<size_t>((l * kSrcBlocks + b) * kBlockBytes + o);
          k[at] = kvPattern(l, b, o, 0);
          v[at] = kvPattern(l, b, o, 1);
        }
      }
    }
    void *dk = nullptr, *dv = nullptr;
    CHILD_CHECK(cudaMalloc(&dk, bytes) == cudaSuccess && cudaMalloc(&dv, bytes) == cudaSuccess,
                "cudaMalloc kv");
    CHILD_CHECK(cudaMemcpy(dk, k.data(), bytes, cudaMemcpyHostToDevice) == cudaSuccess &&
                    cudaMemcpy(dv, v.data(), bytes, cudaMemcpyHostToDevice) == cudaSuccess,
                "upload kv");
    auto hk = exportIpcHandle(dk);
    auto hv = exportIpcHandle(dv);
    CHILD_CHECK(hk.isOk() && hv.isOk(), "export kv handles");
    IpcHandle both[2] = {hk.value(), hv.value()};
    CHILD_CHECK(writeFileAtomic(dir / "kv.handles", both, sizeof(both)), "write kv handles");
    std::vector<char> done;
    CHILD_CHECK(waitForFile(dir / "kv.done", done), "rank 1 never finished the handoff");
    cudaFree(dk);
    cudaFree(dv);
    return 0;
  }
  std::vector<char> raw;
  CHILD_CHECK(waitForFile(dir / "kv.handles", raw) && raw.size() == 2 * sizeof(IpcHandle),
              "kv handles");
  IpcHandle hs[2];
  std::memcpy(hs, raw.data(), sizeof(hs));
  auto mk = IpcMapping::open(hs[0]);
  auto mv = IpcMapping::open(hs[1]);
  CHILD_CHECK(mk.isOk() && mv.isOk(), "open kv handles");
  const size_t bytes = static_cast<size_t>(kLayers * kDstBlocks * kBlockBytes);
  void *dk = nullptr, *dv = nullptr;
  CHILD_CHECK(cudaMalloc(&dk, bytes) == cudaSuccess && cudaMalloc(&dv, bytes) == cudaSuccess,
              "cudaMalloc dst kv");
  CHILD_CHECK(
      cudaMemset(dk, 0xAB, bytes) == cudaSuccess && cudaMemset(dv, 0xAB, bytes) == cudaSuccess,
      "sentinel");
  KvPoolView src;
  src.k = static_cast<const char*>(mk.value()->data());
  src.v = static_cast<const char*>(mv.value()->data());
  src.layers = kLayers;
  src.num_blocks = kSrcBlocks;
  src.block_bytes = kBlockBytes;
  const std::vector<int32_t> pairs = {7, 0, 2, 11, 9, 5, 0, 3, 4, 4};  // (src, dst)
  Status st =
      copyKvBlocks(src, static_cast<char*>(dk), static_cast<char*>(dv), kDstBlocks, pairs, stream);
  CHILD_CHECK(st.isOk(), st.toString().c_str());
  const std::vector<int32_t> bad = {1, 2, 3, 12};  // destination block 12 of 12
  const Status refused =
      copyKvBlocks(src, static_cast<char*>(dk), static_cast<char*>(dv), kDstBlocks, bad, stream);
  CHILD_CHECK(refused.code() == StatusCode::kInvalidArgument, "bad pair not refused");
  CHILD_CHECK(cudaStreamSynchronize(stream) == cudaSuccess, "sync kv");
  std::vector<uint8_t> k(bytes), v(bytes);
  CHILD_CHECK(cudaMemcpy(k.data(), dk, bytes, cudaMemcpyDeviceToHost) == cudaSuccess &&
                  cudaMemcpy(v.data(), dv, bytes, cudaMemcpyDeviceToHost) == cudaSuccess,
              "download kv");
  std::vector<int> src_of(kDstBlocks, -1);
  for (size_t i = 0; i < pairs.size(); i += 2) src_of[static_cast<size_t>(pairs[i + 1])] = pairs[i];
  int64_t wrong = 0, checked = 0;
  for (int l = 0; l < kLayers; ++l) {
    for (int b = 0; b < kDstBlocks; ++b) {
      for (int64_t o = 0; o < kBlockBytes; ++o) {
        const size_t at = static_cast<size_t>((l * kDstBlocks + b) * kBlockBytes + o);
        const int s = src_of[static_cast<size_t>(b)];
        const uint8_t wk = s >= 0 ? kvPattern(l, s, o, 0) : 0xAB;
        const uint8_t wv = s >= 0 ? kvPattern(l, s, o, 1) : 0xAB;
        wrong += (k[at] != wk) + (v[at] != wv);
        checked += 2;
      }
    }
  }
  std::printf(
      "[rank 1] kv handoff: %d blocks x %d layers x K/V copied, %lld bytes checked, %lld "
      "wrong bytes\n",
      static_cast<int>(pairs.size() / 2), kLayers, static_cast<long long>(checked),
      static_cast<long long>(wrong));
  mk.value().reset();
  mv.value().reset();
  cudaFree(dk);
  cudaFree(dv);
  const char one = '1';
  CHILD_CHECK(writeFileAtomic(dir / "kv.done", &one, 1), "write kv.done");
  return wrong == 0 ? 0 : 1;
}

int runRank(int rank, const fs::path& dir) {
  CHILD_CHECK(cudaSetDevice(0) == cudaSuccess, "cudaSetDevice");
  cudaStream_t stream;
  CHILD_CHECK(cudaStreamCreate(&stream) == cudaSuccess, "stream");
  auto ar = IpcAllReduce::create(rank, kWorld, size_t{4} << 20, 8);
  CHILD_CHECK(ar.isOk(), ar.status().toString().c_str());
  const IpcHandle mine = ar.value()->handle();
  CHILD_CHECK(writeFileAtomic(dir / ("ar." + std::to_string(rank)), &mine, sizeof(mine)),
              "write handle");
  std::vector<IpcHandle> all(kWorld);
  for (int r = 0; r < kWorld; ++r) {
    std::vector<char> raw;
    CHILD_CHECK(
        waitForFile(dir / ("ar." + std::to_string(r)), raw) && raw.size() == sizeof(IpcHandle),
        "peer handle");
    std::memcpy(&all[static_cast<size_t>(r)], raw.data(), sizeof(IpcHandle));
  }
  const Status c = ar.value()->connect(all);
  CHILD_CHECK(c.isOk(), c.toString().c_str());
  int rc = allReduceCases(rank, *ar.value(), stream);
  rc |= kvHandoff(rank, dir, stream);
  ar.value().reset();
  cudaStreamDestroy(stream);
  return rc;
}

// The child role: run only by the parent below (GARDEN_IPC_RANK / GARDEN_IPC_DIR set).
TEST(GpuIpcChild, DISABLED_Rank) {
  const char* r = std::getenv("GARDEN_IPC_RANK");
  const char* d = std::getenv("GARDEN_IPC_DIR");
  ASSERT_TRUE(r != nullptr && d != nullptr) << "run by GpuIpc.TwoProcessesOnOneGpu only";
  EXPECT_EQ(runRank(std::atoi(r), d), 0);
}

TEST(GpuIpc, TwoProcessesOnOneGpu) {
  const fs::path dir = fs::temp_directory_path() / ("garden_ipc_" + std::to_string(getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  std::vector<pid_t> pids;
  for (int r = 0; r < kWorld; ++r) {
    std::vector<std::string> env_s;
    for (char** e = environ; *e != nullptr; ++e) env_s.emplace_back(*e);
    env_s.push_back("GARDEN_IPC_RANK=" + std::to_string(r));
    env_s.push_back("GARDEN_IPC_DIR=" + dir.string());
    std::vector<char*> envp;
    for (auto& s : env_s) envp.push_back(s.data());
    envp.push_back(nullptr);
    std::string exe = fs::read_symlink("/proc/self/exe").string();
    std::string a1 = "--gtest_also_run_disabled_tests",
                a2 = "--gtest_filter=GpuIpcChild.DISABLED_Rank";
    char* argv[] = {exe.data(), a1.data(), a2.data(), nullptr};
    pid_t pid = 0;
    ASSERT_EQ(posix_spawn(&pid, exe.c_str(), nullptr, nullptr, argv, envp.data()), 0);
    pids.push_back(pid);
  }
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(600);
  std::vector<int> status(pids.size(), -1);
  size_t left = pids.size();
  while (left > 0 && std::chrono::steady_clock::now() < end) {
    for (size_t i = 0; i < pids.size(); ++i) {
      if (status[i] != -1) continue;
      int st = 0;
      if (waitpid(pids[i], &st, WNOHANG) == pids[i]) {
        status[i] = st;
        --left;
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  for (size_t i = 0; i < pids.size(); ++i) {
    if (status[i] == -1) {  // hung: end the ranks this test started
      kill(pids[i], SIGKILL);
      waitpid(pids[i], &status[i], 0);
      ADD_FAILURE() << "rank " << i << " did not finish in 600 s";
      continue;
    }
    EXPECT_TRUE(WIFEXITED(status[i]) && WEXITSTATUS(status[i]) == 0)
        << "rank " << i << " exited with status " << status[i];
  }
  fs::remove_all(dir);
}

}  // namespace
}  // namespace garden::rose::cuda
