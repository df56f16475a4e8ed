#pragma once
// What a fake worker reports as Worker::lastFailure(): set when a test takes the fake down.

#include <mutex>
#include <string>

namespace garden::tulip::testing {

class LastFailure {
 public:
  void set(std::string reason) {
    std::lock_guard<std::mutex> l(mu_);
    reason_ = std::move(reason);
  }
  std::string get() const {
    std::lock_guard<std::mutex> l(mu_);
    return reason_;
  }

 private:
  mutable std::mutex mu_;
  std::string reason_;
};

}  // namespace garden::tulip::testing
