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
#include <mutex>
#include <utility>
#include <vector>

namespace garden::ivy {

class CallCanceller {
 public:
  void cancel();
  bool cancelled() const;
  uint64_t add(std::function<void()> hook);  // returns an id for remove(); 0 when run at once
  void remove(uint64_t id);

 private:
  mutable std::mutex mu_;
  bool cancelled_ = false;                                         // guarded by mu_
  uint64_t next_id_ = 1;                                           // guarded by mu_
  std::vector<std::pair<uint64_t, std::function<void()>>> hooks_;  // guarded by mu_
};

}  // namespace garden::ivy
