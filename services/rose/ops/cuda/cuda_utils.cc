#include "services/rose/ops/cuda/cuda_utils.h"

#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>

namespace garden::rose::cuda {

namespace {
std::string describe(cudaError_t err, const char* expr, const char* file, int line) {
  std::string m = expr;
  m += " failed at ";
  m += file;
  m += ":";
  m += std::to_string(line);
  m += ": ";
  m += cudaGetErrorString(err);
  m += " (";
  m += cudaGetErrorName(err);
  m += ")";
  return m;
}
}  // namespace

Status cudaStatus(cudaError_t err, const char* expr, const char* file, int line) {
  if (err == cudaErrorMemoryAllocation) return resourceExhausted(describe(err, expr, file, line));
  return internalError(describe(err, expr, file, line));
}

void cudaFatal(cudaError_t err, const char* expr, const char* file, int line) {
  std::string m = "CUDA error: " + describe(err, expr, file, line) + "\n";
  std::fwrite(m.data(), 1, m.size(), stderr);
  std::abort();
}

int smCount() {
  static std::mutex mu;
  static int counts[64] = {};
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= 64) return 132;
  std::lock_guard<std::mutex> lock(mu);
  if (counts[dev] == 0) {
    int n = 0;
    if (cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess || n <= 0)
      n = 132;
    counts[dev] = n;
  }
  return counts[dev];
}

}  // namespace garden::rose::cuda
