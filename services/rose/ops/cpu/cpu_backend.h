#pragma once
// The CPU backend: the fp32 reference implementation of the rose op interface (see
// services/rose/ops/backend.h). Weights, activations and the residual stream are float32 in
// ordinary host memory. launch() hands work to one compute thread (so the engine's step() never
// waits); inside an op, loops are split over a fork-join ThreadPool of --threads workers.
// Matrix products (linear, and attention's q·kᵀ and p·v) are OpenBLAS sgemm calls, one
// single-threaded call per pool task (services/rose/ops/cpu/gemm.h); the other loops are
// blocked for the vectorizer (GCC vector types, compiled for AVX2+FMA with a portable fallback
// chosen at run time).
//
// Step progress [TAG_STEP_PROGRESS]: reportsProgress() is true; the counter advances at every
// markProgress() (when the compute thread reaches it), after every GEMM task and every attention
// tile, so no stretch of a forward pass without an advance lasts more than a few tens of
// milliseconds on a 0.6B-shaped layer.
//
// Threads: as Backend. The compute thread and the pool are owned by the backend and joined on
// destruction (after the queue drains).

#include <atomic>
#include <cstdint>
#include <memory>

#include "services/rose/ops/backend.h"

namespace garden::rose::cpu {

// The concrete class is private to cpu_backend.cc; tests use the factory.
Result<std::unique_ptr<Backend>> create(const BackendOptions& opts);

// The progress counter set on `backend` (a cpu backend), for the CPU LLM ops that run on their
// own pool's threads; nullptr when none is set or `backend` is not a cpu backend.
std::atomic<uint64_t>* progressCounter(Backend& backend);

}  // namespace garden::rose::cpu
