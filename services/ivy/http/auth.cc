#include "services/ivy/http/auth.h"

namespace garden::ivy {

Result<std::unique_ptr<ApiKeys>> ApiKeys::load(std::string path) {
  ASSIGN_OR_RETURN(std::unique_ptr<TokenFile> keys,
                   TokenFile::load(std::move(path), "--api-keys-file"));
  return std::unique_ptr<ApiKeys>(new ApiKeys(std::move(keys)));
}

ApiKeys::ApiKeys(std::vector<std::string> keys)
    : keys_(std::make_unique<TokenFile>(std::move(keys))) {}

Status ApiKeys::check(const HttpRequest& request) const {
  return checkBearer(request.header("authorization"), *keys_,
                     BearerNames{"API key", "Authorization", "key"});
}

}  // namespace garden::ivy
