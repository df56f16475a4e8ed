#pragma once
// [TAG_L2_PREFETCH] A forward's weight-prefetch schedule, shared by the models: over the forward's
// weight GEMMs 0 .. count-1 in the order they are enqueued, start() (before the first op)
// prefetches the first d, beforeGemm() (right before GEMM g is enqueued) prefetches GEMM g + d,
// and finish() joins the branches (a captured graph must end joined). d is
// Backend::weightPrefetchDistance(tokens); with d = 0 every call does nothing.
#include <cstddef>
#include <cstdint>
#include <functional>
#include <utility>

#include "services/rose/ops/backend.h"

namespace garden::rose {

class WeightPrefetchSchedule {
 public:
  // weight(g): GEMM g's weight tensor.
  WeightPrefetchSchedule(Backend& b, int64_t tokens, size_t count,
                         std::function<Tensor(size_t)> weight)
      : b_(b),
        d_(static_cast<size_t>(b.weightPrefetchDistance(tokens))),
        count_(count),
        weight_(std::move(weight)) {}

  void start() {
    for (size_t i = 0; i < d_ && i < count_; ++i) b_.prefetchWeights(weight_(i));
  }
  void beforeGemm() {
    if (d_ > 0 && next_ + d_ < count_) b_.prefetchWeights(weight_(next_ + d_));
    ++next_;
  }
  void finish() { b_.joinPrefetches(); }

 private:
  Backend& b_;
  size_t d_;
  size_t count_;
  std::function<Tensor(size_t)> weight_;
  size_t next_ = 0;  // the next GEMM
};

}  // namespace garden::rose
