#include "services/ivy/balance/call_canceller.h"

namespace garden::ivy {

void CallCanceller::cancel() {
  std::vector<std::pair<uint64_t, std::function<void()>>> hooks;
  {
    MutexLock lock(mu_);
    if (cancelled_) return;
    cancelled_ = true;
    hooks.swap(hooks_);
  }
  for (auto& h : hooks) h.second();
}

bool CallCanceller::cancelled() const {
  MutexLock lock(mu_);
  return cancelled_;
}

uint64_t CallCanceller::add(std::function<void()> hook) {
  {
    MutexLock lock(mu_);
    if (!cancelled_) {
      hooks_.emplace_back(next_id_, std::move(hook));
      return next_id_++;
    }
  }
  hook();
  return 0;
}

void CallCanceller::remove(uint64_t id) {
  if (id == 0) return;
  MutexLock lock(mu_);
  for (size_t i = 0; i < hooks_.size(); ++i) {
    if (hooks_[i].first == id) {
      hooks_.erase(hooks_.begin() + static_cast<std::ptrdiff_t>(i));
      return;
    }
  }
}

}  // namespace garden::ivy
