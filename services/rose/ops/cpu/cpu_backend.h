#pragma once
// The CPU backend: the fp32 reference implementation of the rose op interface (see
// services/rose/ops/backend.h). Weights, activations and the residual stream are float32 in
// ordinary host memory. launch() hands work to one compute thread (so the engine's step() never
// waits); inside an op, loops are split over a fork-join ThreadPool of --threads workers.
// Loops are blocked for the vectorizer (GEMM micro-kernel on GCC vector types, compiled for
// AVX2+FMA with a portable fallback chosen at run time).
//
// Threads: as Backend. The compute thread and the pool are owned by the backend and joined on
// destruction (after the queue drains).

#include <memory>

#include "services/rose/ops/backend.h"

namespace garden::rose::cpu {

// The concrete class is private to cpu_backend.cc; tests use the factory.
Result<std::unique_ptr<Backend>> create(const BackendOptions& opts);

}  // namespace garden::rose::cpu
