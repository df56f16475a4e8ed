#pragma once
// Futex wait/wake on a 32-bit word in memory shared by two processes (the channel's ring heads,
// a late-mask ready word). Not FUTEX_PRIVATE: the word is mapped by both sides.
//
// Threads: plain system calls; any thread.

#include <linux/futex.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>

namespace garden::shm {

// Sleeps while *addr == expected, at most `timeout` (nullptr: no limit); returns at a wake-up,
// a spurious wake-up, a signal or when *addr differs already.
inline long futexWait(std::atomic<uint32_t>* addr, uint32_t expected, const timespec* timeout) {
  return syscall(SYS_futex, reinterpret_cast<uint32_t*>(addr), FUTEX_WAIT, expected, timeout,
                 nullptr, 0);
}

inline void futexWake(std::atomic<uint32_t>* addr, int count) {
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(addr), FUTEX_WAKE, count, nullptr, nullptr, 0);
}

}  // namespace garden::shm
