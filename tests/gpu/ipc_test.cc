// The CUDA IPC pieces of the multi-GPU work (services/rose/parallel/cuda/) between TWO PROCESSES
// on ONE GPU (a process cannot open its own IPC handle, so one process cannot test them): the
// test spawns this binary twice as ranks 0 and 1 (the DISABLED_ child test, run explicitly), they
// swap handles through files in a temporary directory and check:
//   - the IPC all-reduce (one-shot and two-shot, f32 and bf16, 1 .. 262,147 elements, out of and
//     in place: 32 calls in a row with fresh data, so both parity halves and the epochs recycle)
//     against a CPU sum in rank order — bit for bit, since the kernel adds in rank order with f32
//     accumulation and rounds once (bf16), like the CPU reference — and the error word clean;
//   - the KV-block handoff as rose runs it [TAG_KV_PULL_CUDA]: rank 0 exports its paged cache (a
//     window pool on two of five layers) by name with CUDA IPC handles, rank 1 opens and maps
//     it and pulls 5 full-pool and 3 window-pool blocks into other block ids of a cache of other
//     sizes; every copied byte equals rank 0's pattern and every other block keeps its sentinel;
//     an unmapped export, a bad pair and a bad window pair are refused.
// On one GPU the two ranks' kernels time-slice instead of running side by side, so the barriers
// wait for the other context's slice: correct, slow, and no measure of speed.
//   - the all-to-all of rows [TAG_IPC_ALLTOALL]: 48 calls (batches of 6 back to back), rows of
//     16 .. 11,520 bytes, 0 .. 64 rows per pair with self-sends; every byte against the sender's
//     pattern, and nothing written past the rows;
// Expected output: two "[rank r] all-reduce: 32 cases, 0 mismatches" lines, two "[rank r]
// all-to-all: 48 calls, ... 0 wrong" lines, "[rank 1] kv handoff:
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

#include "services/rose/ops/backend.h"
#include "services/rose/ops/paged_kv_cache.h"
#include "services/rose/parallel/cuda/ipc_comm.h"
#include "services/rose/parallel/kv_handoff.h"

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

// [TAG_IPC_ALLTOALL] Rows rank `src` sends to rank `dst` in call k: 0..64 of them (some calls none
// at all, some the slot's maximum), the same formula on both ranks, so each knows what it receives.
int64_t a2aRows(int src, int dst, int k) {
  if (k % 7 == 3) return 0;                    // a call that moves nothing still advances
  if (k % 5 == 1 && src != dst) return 64;     // the slot's row limit
  return (src * 7 + dst * 3 + k * 5) % 65;
}
uint8_t a2aByte(int src, int dst, int64_t row, int k, size_t offset) {
  return static_cast<uint8_t>((src * 251 + dst * 241 + row * 13 + k * 29 + offset * 7 + 1) & 0xff);
}

// The all-to-all: 48 calls in batches of 6 enqueued back to back (no host wait between them, so a
// call must wait for the peer's acknowledgement of the call two before it, whose half it reuses),
// rows of 16, 48, 5,760 (gpt-oss-20b's bf16 hidden row) and 11,520 bytes (its f32 row), counts
// 0..64 per pair including self-sends; every received byte checked, bytes past the rows keep
// their poison; bad counts and row sizes refused.
int allToAllCases(int rank, IpcAllToAll& a2a, cudaStream_t stream) {
  constexpr int kBatch = 6, kCalls = 48;
  const size_t row_sizes[] = {16, 5760, 48, 11520};
  int64_t wrong = 0, checked = 0;
  for (int b0 = 0; b0 < kCalls; b0 += kBatch) {
    struct Call {
      void* send = nullptr;
      void* recv = nullptr;
      size_t recv_bytes = 0, row_bytes = 0;
      std::vector<int64_t> recv_rows;
    };
    std::vector<Call> calls(kBatch);
    for (int j = 0; j < kBatch; ++j) {
      const int k = b0 + j;
      Call& c = calls[static_cast<size_t>(j)];
      c.row_bytes = row_sizes[k % 4];
      std::vector<int64_t> send_rows(kWorld);
      c.recv_rows.assign(kWorld, 0);
      int64_t ns = 0, nr = 0;
      for (int q = 0; q < kWorld; ++q) {
        send_rows[static_cast<size_t>(q)] = a2aRows(rank, q, k);
        c.recv_rows[static_cast<size_t>(q)] = a2aRows(q, rank, k);
        ns += send_rows[static_cast<size_t>(q)];
        nr += c.recv_rows[static_cast<size_t>(q)];
      }
      std::vector<uint8_t> host(static_cast<size_t>(ns) * c.row_bytes);
      size_t at = 0;
      for (int q = 0; q < kWorld; ++q)
        for (int64_t i = 0; i < send_rows[static_cast<size_t>(q)]; ++i)
          for (size_t o = 0; o < c.row_bytes; ++o) host[at++] = a2aByte(rank, q, i, k, o);
      c.recv_bytes = static_cast<size_t>(nr) * c.row_bytes;
      CHILD_CHECK(cudaMalloc(&c.send, host.size() + 16) == cudaSuccess, "cudaMalloc send");
      CHILD_CHECK(cudaMalloc(&c.recv, c.recv_bytes + 256) == cudaSuccess, "cudaMalloc recv");
      CHILD_CHECK(cudaMemcpy(c.send, host.data(), host.size(), cudaMemcpyHostToDevice) ==
                      cudaSuccess,
                  "upload");
      CHILD_CHECK(cudaMemset(c.recv, 0xEE, c.recv_bytes + 256) == cudaSuccess, "poison");
    }
    for (int j = 0; j < kBatch; ++j) {  // back to back on the stream
      const int k = b0 + j;
      Call& c = calls[static_cast<size_t>(j)];
      std::vector<int64_t> send_rows(kWorld);
      for (int q = 0; q < kWorld; ++q) send_rows[static_cast<size_t>(q)] = a2aRows(rank, q, k);
      const Status st =
          a2a.allToAllRows(c.send, send_rows, c.recv, c.recv_rows, c.row_bytes, stream);
      CHILD_CHECK(st.isOk(), st.toString().c_str());
    }
    CHILD_CHECK(cudaStreamSynchronize(stream) == cudaSuccess, "sync");
    for (int j = 0; j < kBatch; ++j) {
      const int k = b0 + j;
      Call& c = calls[static_cast<size_t>(j)];
      std::vector<uint8_t> got(c.recv_bytes + 256);
      CHILD_CHECK(cudaMemcpy(got.data(), c.recv, got.size(), cudaMemcpyDeviceToHost) == cudaSuccess,
                  "download");
      size_t at = 0;
      for (int q = 0; q < kWorld; ++q)
        for (int64_t i = 0; i < c.recv_rows[static_cast<size_t>(q)]; ++i)
          for (size_t o = 0; o < c.row_bytes; ++o) wrong += got[at++] != a2aByte(q, rank, i, k, o);
      for (size_t o = 0; o < 256; ++o) wrong += got[at++] != 0xEE;  // nothing past the rows
      checked += static_cast<int64_t>(got.size());
      cudaFree(c.send);
      cudaFree(c.recv);
    }
  }
  const std::vector<int64_t> too_many(kWorld, a2a.maxRows() + 1), one(kWorld, 1);
  CHILD_CHECK(a2a.allToAllRows(nullptr, too_many, nullptr, one, 16, stream).code() ==
                  StatusCode::kInvalidArgument,
              "a count past max_rows was not refused");
  CHILD_CHECK(a2a.allToAllRows(nullptr, one, nullptr, one, 8, stream).code() ==
                  StatusCode::kInvalidArgument,
              "8-byte rows were not refused");
  const Status err = a2a.checkError();
  CHILD_CHECK(err.isOk(), err.toString().c_str());
  std::printf("[rank %d] all-to-all: %d calls, %lld bytes checked, %lld wrong\n", rank, kCalls,
              static_cast<long long>(checked), static_cast<long long>(wrong));
  return wrong == 0 ? 0 : 1;
}

// [TAG_KV_PULL_CUDA] The handoff as rose runs it: rank 0's paged cache (a CudaBackend
// allocation, a window pool on layers 1 and 3) exported by name with its IPC handles
// (SharedKvPools::createNamedDevice), rank 1 opening it (openNamed + mapDevice) and pulling 5
// full-pool and 3 window-pool blocks into other ids of a cache of other sizes
// (copyKvBlocks -> CudaBackend::copyKvBlocks -> one kernel).
KvCacheShape kvShape(int32_t blocks, int32_t window_blocks) {
  KvCacheShape s;
  s.num_layers = 5;
  s.num_blocks = blocks;
  s.block_size = 16;
  s.num_kv_heads = 2;
  s.head_dim = 64;
  s.num_blocks_window = window_blocks;
  s.window_layers = 0b01010;
  return s;
}

// The bytes of each pool of `shape` (bf16): pattern(layer, block, offset) or a sentinel.
template <typename F>
std::vector<uint8_t> poolBytes(const KvCacheShape& shape, F&& byte_at) {
  const int64_t bb = shape.block_size * shape.slotElements() * 2;
  std::vector<uint8_t> out(PagedKvCache::poolBytes(shape, DType::kBF16));
  size_t at = 0;
  for (int32_t l = 0; l < shape.num_layers; ++l) {
    for (int32_t b = 0; b < shape.layerBlocks(l); ++b) {
      for (int64_t o = 0; o < bb; ++o) out[at++] = byte_at(l, b, o);
    }
  }
  return out;
}

int kvHandoff(int rank, const fs::path& dir) {
  auto backend = makeBackend("cuda", BackendOptions{});
  CHILD_CHECK(backend.isOk(), backend.status().toString().c_str());
  Backend& be = **backend;
  if (rank == 0) {
    const KvCacheShape shape = kvShape(10, 6);
    auto cache = PagedKvCache::create(be, shape, DType::kBF16);
    CHILD_CHECK(cache.isOk(), cache.status().toString().c_str());
    for (int is_v = 0; is_v < 2; ++is_v) {
      const auto bytes =
          poolBytes(shape, [&](int l, int b, int64_t o) { return kvPattern(l, b, o, is_v); });
      const Tensor t = is_v ? (*cache)->values(0) : (*cache)->keys(0);
      CHILD_CHECK(cudaMemcpy(t.data, bytes.data(), bytes.size(), cudaMemcpyHostToDevice) ==
                      cudaSuccess,
                  "upload kv");
    }
    auto k = be.exportPeerMemory((*cache)->keys(0).data);
    auto v = be.exportPeerMemory((*cache)->values(0).data);
    CHILD_CHECK(k.isOk() && v.isOk(), "export the pools");
    const std::string name = "garden-ipc-test-" + std::to_string(getpid());
    auto exp = SharedKvPools::createNamedDevice(name, shape, DType::kBF16, *k, *v);
    CHILD_CHECK(exp.isOk(), exp.status().toString().c_str());
    const std::string msg = name + " " + std::to_string(getpid());
    CHILD_CHECK(writeFileAtomic(dir / "kv.export", msg.data(), msg.size()), "write kv.export");
    std::vector<char> done;
    CHILD_CHECK(waitForFile(dir / "kv.done", done), "rank 1 never finished the handoff");
    return 0;
  }
  std::vector<char> raw;
  CHILD_CHECK(waitForFile(dir / "kv.export", raw), "kv.export");
  std::istringstream in(std::string(raw.begin(), raw.end()));
  std::string name;
  int32_t pid = 0;
  in >> name >> pid;
  auto src = SharedKvPools::openNamed(name, pid);
  CHILD_CHECK(src.isOk(), src.status().toString().c_str());
  CHILD_CHECK((*src)->onDevice(), "a device export");
  const KvCacheShape dshape = kvShape(9, 4);
  auto dst = PagedKvCache::create(be, dshape, DType::kBF16);
  CHILD_CHECK(dst.isOk(), dst.status().toString().c_str());
  const Status unmapped = copyKvBlocks(be, (*src)->view(), **dst, std::vector<int32_t>{0, 0});
  CHILD_CHECK(unmapped.code() == StatusCode::kFailedPrecondition, "an unmapped export copied");
  const Status mapped = (*src)->mapDevice(be);
  CHILD_CHECK(mapped.isOk(), mapped.toString().c_str());
  const auto sentinel = poolBytes(dshape, [](int, int, int64_t) { return uint8_t{0xAB}; });
  for (const Tensor& t : {(*dst)->keys(0), (*dst)->values(0)}) {
    CHILD_CHECK(cudaMemcpy(t.data, sentinel.data(), sentinel.size(), cudaMemcpyHostToDevice) ==
                    cudaSuccess,
                "sentinel");
  }
  const std::vector<int32_t> pairs = {7, 0, 2, 8, 9, 5, 0, 3, 4, 4};  // (src, dst) full pool
  const std::vector<int32_t> wpairs = {5, 0, 1, 3, 3, 2};              // window pool
  Status st = copyKvBlocks(be, (*src)->view(), **dst, pairs, wpairs);
  CHILD_CHECK(st.isOk(), st.toString().c_str());
  const Status refused =
      copyKvBlocks(be, (*src)->view(), **dst, std::vector<int32_t>{1, 2, 3, 9}, wpairs);
  CHILD_CHECK(refused.code() == StatusCode::kInvalidArgument, "bad pair not refused");
  const Status refused_w =
      copyKvBlocks(be, (*src)->view(), **dst, pairs, std::vector<int32_t>{6, 0});
  CHILD_CHECK(refused_w.code() == StatusCode::kInvalidArgument, "bad window pair not refused");
  CHILD_CHECK(be.synchronize().isOk(), "sync kv");
  std::vector<int> src_of(9, -1), wsrc_of(4, -1);
  for (size_t i = 0; i < pairs.size(); i += 2) src_of[static_cast<size_t>(pairs[i + 1])] = pairs[i];
  for (size_t i = 0; i < wpairs.size(); i += 2) {
    wsrc_of[static_cast<size_t>(wpairs[i + 1])] = wpairs[i];
  }
  int64_t wrong = 0, checked = 0;
  for (int is_v = 0; is_v < 2; ++is_v) {
    const auto want = poolBytes(dshape, [&](int l, int b, int64_t o) {
      const int s = dshape.windowLayer(l) ? wsrc_of[static_cast<size_t>(b)]
                                          : src_of[static_cast<size_t>(b)];
      return s >= 0 ? kvPattern(l, s, o, is_v) : uint8_t{0xAB};
    });
    std::vector<uint8_t> got(want.size());
    const Tensor t = is_v ? (*dst)->values(0) : (*dst)->keys(0);
    CHILD_CHECK(cudaMemcpy(got.data(), t.data, got.size(), cudaMemcpyDeviceToHost) == cudaSuccess,
                "download kv");
    for (size_t i = 0; i < want.size(); ++i) wrong += got[i] != want[i];
    checked += static_cast<int64_t>(want.size());
  }
  std::printf(
      "[rank 1] kv handoff: 5 blocks (full pool) + 3 (window pool, layers 1 and 3) x 5 layers x "
      "K/V pulled through the named device export, %lld bytes checked, %lld wrong bytes\n",
      static_cast<long long>(checked), static_cast<long long>(wrong));
  src->reset();  // unmapped before rank 0 may exit
  const char one = '1';
  CHILD_CHECK(writeFileAtomic(dir / "kv.done", &one, 1), "write kv.done");
  return wrong == 0 ? 0 : 1;
}

// Each rank writes its handle to dir/<name>.<rank>, reads every rank's, and connects `c` (an
// IpcAllReduce or IpcAllToAll) with them.
template <typename Comm>
int connectThroughFiles(int rank, const fs::path& dir, const std::string& name, Comm& c) {
  const IpcHandle mine = c.handle();
  CHILD_CHECK(writeFileAtomic(dir / (name + "." + std::to_string(rank)), &mine, sizeof(mine)),
              "write handle");
  std::vector<IpcHandle> all(kWorld);
  for (int r = 0; r < kWorld; ++r) {
    std::vector<char> raw;
    CHILD_CHECK(waitForFile(dir / (name + "." + std::to_string(r)), raw) &&
                    raw.size() == sizeof(IpcHandle),
                "peer handle");
    std::memcpy(&all[static_cast<size_t>(r)], raw.data(), sizeof(IpcHandle));
  }
  const Status st = c.connect(all);
  CHILD_CHECK(st.isOk(), st.toString().c_str());
  return 0;
}

int runRank(int rank, const fs::path& dir) {
  CHILD_CHECK(cudaSetDevice(0) == cudaSuccess, "cudaSetDevice");
  cudaStream_t stream;
  CHILD_CHECK(cudaStreamCreate(&stream) == cudaSuccess, "stream");
  auto ar = IpcAllReduce::create(rank, kWorld, size_t{4} << 20, 8);
  CHILD_CHECK(ar.isOk(), ar.status().toString().c_str());
  CHILD_CHECK(connectThroughFiles(rank, dir, "ar", *ar.value()) == 0, "connect the all-reduce");
  int rc = allReduceCases(rank, *ar.value(), stream);
  // [TAG_IPC_ALLTOALL] 64 rows of up to 11,520 bytes per source and call.
  auto a2a = IpcAllToAll::create(rank, kWorld, 64, size_t{64} * 11520);
  CHILD_CHECK(a2a.isOk(), a2a.status().toString().c_str());
  CHILD_CHECK(connectThroughFiles(rank, dir, "a2a", *a2a.value()) == 0, "connect the all-to-all");
  rc |= allToAllCases(rank, *a2a.value(), stream);
  rc |= kvHandoff(rank, dir);
  ar.value().reset();
  a2a.value().reset();
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
