#pragma once
// Paged KV cache storage on the worker side. Per layer, K and V are each
// [num_blocks, block_size, num_kv_heads, head_dim] (so the whole cache is
// [num_layers][num_blocks][block_size][kv_heads][head_dim] for K and again for V), in backend
// memory. A token at absolute position j of a sequence with block table B lives in slot
// B[j / block_size] · block_size + j % block_size. rose never allocates blocks: tulip's
// scheduler owns block ids and hands block tables in each step (services/rose/model/llm_step.h); this
// class only holds the memory. Contents of never-written slots are unspecified.
//
// [TAG_KV_WINDOW_GROUP] With a window pool (num_blocks_window > 0), the layers marked in
// window_layers (sliding-window layers) hold num_blocks_window blocks each instead of
// num_blocks: their slots are reached through each sequence's window table, whose ids index that
// pool (tulip's second block group). The layers stay in order in each of K and V; a layer's view
// has its own pool's block count.
//
// Threads: created on the loading thread; the views are used by the launching thread.

#include <cstdint>
#include <memory>
#include <span>

#include "common/status.h"
#include "services/rose/ops/backend.h"

namespace garden::rose {

struct KvCacheShape {
  int32_t num_layers = 0;
  int32_t num_blocks = 0;
  int32_t block_size = 0;
  int32_t num_kv_heads = 0;
  int32_t head_dim = 0;
  // [TAG_KV_WINDOW_GROUP] Blocks of the window pool (0: none) and its layers (bit l: layer l;
  // at most 64 layers then).
  int32_t num_blocks_window = 0;
  uint64_t window_layers = 0;

  bool windowLayer(int32_t layer) const {
    return num_blocks_window > 0 && layer < 64 && ((window_layers >> layer) & 1u) != 0;
  }
  int32_t layerBlocks(int32_t layer) const {
    return windowLayer(layer) ? num_blocks_window : num_blocks;
  }
  // Elements of one token slot (kv heads x head_dim).
  int64_t slotElements() const { return static_cast<int64_t>(num_kv_heads) * head_dim; }
  // Elements of one full-pool layer.
  int64_t elementsPerLayer() const {
    return static_cast<int64_t>(num_blocks) * block_size * slotElements();
  }
  // Elements of layer `layer`; of the layers before it (its offset in each of K and V).
  int64_t layerElements(int32_t layer) const {
    return static_cast<int64_t>(layerBlocks(layer)) * block_size * slotElements();
  }
  int64_t layerOffset(int32_t layer) const {
    int64_t off = 0;
    for (int32_t l = 0; l < layer; ++l) off += layerElements(l);
    return off;
  }
  int64_t totalElements() const { return layerOffset(num_layers); }
  int32_t numWindowLayers() const {
    int32_t n = 0;
    for (int32_t l = 0; l < num_layers; ++l) n += windowLayer(l) ? 1 : 0;
    return n;
  }
};

// OK for a shape a cache can have: every dimension positive; a window pool with window layers
// among at most 64 (INVALID_ARGUMENT naming what is wrong).
Status checkKvCacheShape(const KvCacheShape& shape);

// Blocks needed to hold `tokens` tokens.
inline int64_t kvBlocksFor(int64_t tokens, int32_t block_size) {
  return (tokens + block_size - 1) / block_size;
}

// The slot of absolute position `pos` through `block_table` (CHECKs that it is covered).
int64_t kvSlot(std::span<const int32_t> block_table, int64_t pos, int32_t block_size);

class PagedKvCache {
 public:
  // INVALID_ARGUMENT for non-positive dimensions; RESOURCE_EXHAUSTED when memory runs out.
  static Result<std::unique_ptr<PagedKvCache>> create(Backend& backend, const KvCacheShape& shape,
                                                      DType dtype);
  // A cache over memory the caller owns and keeps alive (host memory for the cpu backend, e.g. a
  // shared mapping another process can read: the KV handoff, parallel/kv_handoff.h): K and V
  // each [num_layers][num_blocks][block_size][num_kv_heads][head_dim] of `dtype`.
  static Result<std::unique_ptr<PagedKvCache>> wrap(const KvCacheShape& shape, DType dtype,
                                                    void* k, void* v);
  // Bytes of one of the two pools (K or V).
  static size_t poolBytes(const KvCacheShape& shape, DType dtype) {
    return static_cast<size_t>(shape.totalElements()) * dtypeSize(dtype);
  }

  const KvCacheShape& shape() const { return shape_; }
  DType dtype() const { return dtype_; }
  size_t bytes() const { return k_.bytes() + v_.bytes(); }
  // True when the pools are device memory (allocated by a backend other than cpu); a wrapped
  // cache is host memory.
  bool onDevice() const;
  // [layerBlocks(layer), block_size, num_kv_heads, head_dim] views of one layer.
  Tensor keys(int32_t layer) const { return layerView(k_, layer); }
  Tensor values(int32_t layer) const { return layerView(v_, layer); }

 private:
  PagedKvCache() = default;
  Tensor layerView(const Buffer& b, int32_t layer) const;

  KvCacheShape shape_;
  DType dtype_ = DType::kF32;
  Buffer k_, v_;
};

}  // namespace garden::rose
