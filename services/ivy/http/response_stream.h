#pragma once
// ResponseStream: a response body produced over time, sent with chunked transfer encoding (what
// server-sent events need). A handler creates one, responds with an HttpResponse whose `stream`
// points at it (status and headers go out at once), then write()s body bytes from any thread and
// calls end() exactly once. The server (server.cc) sends whatever has been written as one HTTP
// chunk whenever the connection can take more, so a slow client batches events instead of
// queueing writes.
//
// Client gone: the server calls cancel() when the connection fails or the client closes it before
// end(). The on_cancel callback then runs once (on a server io thread; it must not block) and
// later write()s are dropped (they return false). A stream that ended normally is never cancelled.
//
// Thread-safe. Header-only and free of Beast so route code and tests use it without it.

#include <functional>
#include <string>
#include <string_view>
#include <utility>

#include "common/mutex.h"

namespace garden::ivy {

class ResponseStream {
 public:
  // --- handler side ---
  // Appends body bytes. False (and nothing queued) once cancelled or ended.
  bool write(std::string_view data) EXCLUDES(mu_) {
    std::function<void()> wake;
    {
      MutexLock lock(mu_);
      if (cancelled_ || ended_) return false;
      pending_.append(data);
      wake = wake_;
    }
    if (wake) wake();
    return true;
  }
  // Ends the body (after the bytes already written). Idempotent.
  void end() EXCLUDES(mu_) {
    std::function<void()> wake;
    {
      MutexLock lock(mu_);
      if (ended_ || cancelled_) return;
      ended_ = true;
      wake = wake_;
    }
    if (wake) wake();
  }
  // `fn` runs once when the client goes away before end(); at once if that already happened.
  void setOnCancel(std::function<void()> fn) EXCLUDES(mu_) {
    MutexLock lock(mu_);
    if (cancelled_) {
      lock.unlock();
      fn();
      return;
    }
    on_cancel_ = std::move(fn);
  }
  bool cancelled() const EXCLUDES(mu_) {
    MutexLock lock(mu_);
    return cancelled_;
  }

  // --- server side ---
  // `wake` is called (from the writing thread, without the lock held) whenever bytes or the end
  // become available; it must only schedule work. A writer may still be running a copy of it
  // after detach() returned (or after take() showed the end): what it uses must be kept alive by
  // its own captures (server.cc's holds the connection), not by the caller's stack.
  void attach(std::function<void()> wake) EXCLUDES(mu_) {
    MutexLock lock(mu_);
    wake_ = std::move(wake);
  }
  // Breaks the reference from the stream to the connection (end of the response).
  void detach() EXCLUDES(mu_) {
    MutexLock lock(mu_);
    wake_ = nullptr;
  }
  struct Taken {
    std::string data;
    bool ended = false;  // end() was called and `data` is the last of the body
  };
  Taken take() EXCLUDES(mu_) {
    MutexLock lock(mu_);
    Taken t;
    t.data.swap(pending_);
    t.ended = ended_;
    return t;
  }
  // The client went away. No effect after end().
  void cancel() EXCLUDES(mu_) {
    std::function<void()> fn;
    {
      MutexLock lock(mu_);
      if (cancelled_ || ended_) return;
      cancelled_ = true;
      pending_.clear();
      wake_ = nullptr;
      fn = std::move(on_cancel_);
    }
    if (fn) fn();
  }

 private:
  mutable Mutex mu_;
  std::string pending_ GUARDED_BY(mu_);
  bool ended_ GUARDED_BY(mu_) = false;
  bool cancelled_ GUARDED_BY(mu_) = false;
  std::function<void()> wake_ GUARDED_BY(mu_);
  std::function<void()> on_cancel_ GUARDED_BY(mu_);
};

}  // namespace garden::ivy
