#include "services/ivy/api/garden_encoder.h"

namespace garden::ivy {

Result<std::vector<int32_t>> GardenEncoder::encode(std::string_view text) const {
  std::vector<TokenId> ids;
  tok_->encode(text, &ids);
  return std::vector<int32_t>(ids.begin(), ids.end());
}

uint32_t GardenEncoder::vocabSize() const { return static_cast<uint32_t>(tok_->vocabSize()); }

Result<std::unique_ptr<GardenEncoder>> loadGardenEncoder(const std::string& path) {
  ASSIGN_OR_RETURN(std::unique_ptr<Tokenizer> tok, loadTokenizer(path));
  return std::make_unique<GardenEncoder>(std::move(tok));
}

}  // namespace garden::ivy
