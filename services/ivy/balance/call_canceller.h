#pragma once
// CallCanceller: cancellation shared by whoever started some work and the code doing it. The HTTP
// server gives one to every request (HttpRequest::cancel) and fires it when the client closes the
// connection before the response; route handlers hand it to the TulipClient (EmbedCall::cancel,
// ScoreCall::cancel) or hook their Generate streams to it; the replica pool chains it to the
// canceller of every chunk of a split request (and cancels the other chunks when one fails).
//
// cancel() runs every registered hook once, outside the lock (a hook may complete its call
// inline); a hook added after cancel() runs at once, inside add(). A user removes its hook when its
// work completes; a hook must stay safe to run until remove() returns. Thread-safe.

#include <cstdint>
#include <functional>
#include <utility>
#include <vector>

#include "common/mutex.h"

namespace garden::ivy {

class CallCanceller {
 public:
  void cancel() EXCLUDES(mu_);
  bool cancelled() const EXCLUDES(mu_);
  // Returns an id for remove(); 0 when run at once.
  uint64_t add(std::function<void()> hook) EXCLUDES(mu_);
  void remove(uint64_t id) EXCLUDES(mu_);

 private:
  mutable Mutex mu_;
  bool cancelled_ GUARDED_BY(mu_) = false;
  uint64_t next_id_ GUARDED_BY(mu_) = 1;
  std::vector<std::pair<uint64_t, std::function<void()>>> hooks_ GUARDED_BY(mu_);
};

}  // namespace garden::ivy
