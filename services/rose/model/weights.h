#pragma once
// Checkpoint-tensor helpers shared by the model loaders (qwen3.cc, gpt_oss.cc, the gpt-oss shard): shape text for
// error messages, the shape/dtype check every loaded weight gets, and the upload with conversion.
// Header-only (no library dependency beyond safetensors and the op interface). Any thread.

#include <cstdint>
#include <string>
#include <vector>

#include "common/safetensors.h"
#include "services/rose/ops/backend.h"

namespace garden::rose {

inline std::string shapeString(const std::vector<int64_t>& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

// INVALID_ARGUMENT naming the tensor when its shape is not `shape` or its dtype is not a float
// type the backends convert from.
inline Status checkTensor(const TensorView& t, const std::vector<int64_t>& shape) {
  if (t.shape != shape) {
    return invalidArgument("tensor '" + t.name + "' has shape " + shapeString(t.shape) +
                           ", config.json implies " + shapeString(shape));
  }
  if (t.dtype != DType::kF32 && t.dtype != DType::kBF16 && t.dtype != DType::kF16) {
    return invalidArgument("tensor '" + t.name + "' has dtype " + std::string(dtypeName(t.dtype)) +
                           " (want F32, BF16 or F16)");
  }
  return okStatus();
}

// A checkpoint tensor by its Hugging Face name, also found without the leading "model." (some
// re-exports drop it); null when absent.
inline const TensorView* findHfTensor(const SafetensorsCheckpoint& ck, const std::string& name) {
  if (const TensorView* t = ck.find(name)) return t;
  if (name.rfind("model.", 0) == 0) return ck.find(name.substr(6));
  return nullptr;
}

// findHfTensor + checkTensor: INVALID_ARGUMENT naming the tensor when absent or mis-shaped.
inline Result<const TensorView*> requireHfTensor(const SafetensorsCheckpoint& ck,
                                               const std::string& name,
                                               const std::vector<int64_t>& shape) {
  const TensorView* t = findHfTensor(ck, name);
  if (t == nullptr) return invalidArgument("checkpoint has no tensor '" + name + "'");
  RETURN_IF_ERROR(checkTensor(*t, shape));
  return t;
}

inline Status uploadInto(Backend& b, const Tensor& dst, const TensorView& src) {
  return b.uploadConvert(dst, HostView{src.data, src.dtype, src.numel()}).withContext(src.name);
}

}  // namespace garden::rose
