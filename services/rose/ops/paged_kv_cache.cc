#include "services/rose/ops/paged_kv_cache.h"

#include <string>

namespace garden::rose {

int64_t kvSlot(std::span<const int32_t> block_table, int64_t pos, int32_t block_size) {
  const int64_t idx = pos / block_size;
  CHECK(pos >= 0 && idx < static_cast<int64_t>(block_table.size()));
  return static_cast<int64_t>(block_table[static_cast<size_t>(idx)]) * block_size +
         pos % block_size;
}

Status checkKvCacheShape(const KvCacheShape& shape) {
  if (shape.num_layers <= 0 || shape.num_blocks <= 0 || shape.block_size <= 0 ||
      shape.num_kv_heads <= 0 || shape.head_dim <= 0) {
    return invalidArgument(
        "kv cache: num_layers, num_blocks, block_size, num_kv_heads and "
        "head_dim must all be positive");
  }
  if (shape.num_blocks_window < 0 ||
      (shape.num_blocks_window > 0 &&
       (shape.num_layers > 64 || shape.window_layers == 0 ||
        (shape.num_layers < 64 && (shape.window_layers >> shape.num_layers) != 0)))) {
    return invalidArgument(
        "kv cache: a window pool needs num_blocks_window > 0 and window layers among at most 64");
  }
  return okStatus();
}

Result<std::unique_ptr<PagedKvCache>> PagedKvCache::create(Backend& backend,
                                                           const KvCacheShape& shape, DType dtype) {
  RETURN_IF_ERROR(checkKvCacheShape(shape));
  std::unique_ptr<PagedKvCache> c(new PagedKvCache());
  c->shape_ = shape;
  c->dtype_ = dtype;
  const size_t bytes = poolBytes(shape, dtype);
  ASSIGN_OR_RETURN(c->k_, backend.allocate(bytes));
  ASSIGN_OR_RETURN(c->v_, backend.allocate(bytes));
  return c;
}

Result<std::unique_ptr<PagedKvCache>> PagedKvCache::wrap(const KvCacheShape& shape, DType dtype,
                                                         void* k, void* v) {
  RETURN_IF_ERROR(checkKvCacheShape(shape));
  if (k == nullptr || v == nullptr) return invalidArgument("kv cache: two pools are required");
  std::unique_ptr<PagedKvCache> c(new PagedKvCache());
  c->shape_ = shape;
  c->dtype_ = dtype;
  const size_t bytes = poolBytes(shape, dtype);
  c->k_ = Buffer(nullptr, k, bytes);  // no owner: never released here
  c->v_ = Buffer(nullptr, v, bytes);
  return c;
}

bool PagedKvCache::onDevice() const {
  return k_.owner() != nullptr && k_.owner()->name() != "cpu";
}

Tensor PagedKvCache::layerView(const Buffer& b, int32_t layer) const {
  CHECK(layer >= 0 && layer < shape_.num_layers);
  auto* base = static_cast<std::byte*>(b.data()) +
               static_cast<size_t>(shape_.layerOffset(layer)) * dtypeSize(dtype_);
  return Tensor(base, dtype_,
                {shape_.layerBlocks(layer), shape_.block_size, shape_.num_kv_heads,
                 shape_.head_dim});
}

}  // namespace garden::rose
