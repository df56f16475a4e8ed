#include "common/shm/channel.h"

#include <fcntl.h>
#include <linux/futex.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <dirent.h>
#include <signal.h>
#include <sys/sysmacros.h>

#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <new>
#include <sstream>
#include <type_traits>
#include <vector>

#include "common/logging.h"
#include "common/shm/futex.h"

namespace garden::shm {
namespace {

constexpr size_t kPage = 4096;
constexpr int kSpinIterations = 2000;

size_t alignUp(size_t v, size_t a) { return (v + a - 1) / a * a; }

std::string shmPath(const std::string& name) { return name.starts_with("/") ? name : "/" + name; }

// Control block of one SPSC ring. head = entries published by the producer, tail = entries taken
// by the consumer; both only grow (mod 2^32), so head - tail is the fill even across wrap-around.
struct alignas(64) RingCtl {
  std::atomic<uint32_t> head;
  char pad0[60];
  std::atomic<uint32_t> tail;
  char pad1[60];
  std::atomic<uint32_t> consumer_waiting;
  uint32_t capacity;
  char pad2[56];
};
static_assert(sizeof(RingCtl) == 192);
static_assert(std::atomic<uint32_t>::is_always_lock_free);
static_assert(std::atomic<int64_t>::is_always_lock_free);
static_assert(std::is_trivially_copyable_v<BatchDesc>);
static_assert(std::is_trivially_copyable_v<Completion>);

}  // namespace

struct Header {
  uint64_t magic;
  uint32_t version;
  uint32_t header_bytes;
  uint32_t slots;
  uint32_t desc_bytes;
  uint32_t completion_bytes;
  uint32_t pad0;
  uint64_t input_bytes;
  uint64_t output_bytes;
  uint64_t sub_ring_offset;
  uint64_t comp_ring_offset;
  uint64_t input_offset;
  uint64_t output_offset;
  uint64_t total_bytes;
  std::atomic<int32_t> owner_pid;
  std::atomic<int32_t> worker_pid;
  std::atomic<int64_t> heartbeat_ns;
  std::atomic<uint32_t> state;
  std::atomic<uint32_t> progress_reported;  // [TAG_STEP_PROGRESS]
  std::atomic<uint64_t> progress;
  ModelFacts facts;
};

namespace {

struct Offsets {
  size_t sub_ring, comp_ring, input, output, total;
};

Offsets computeOffsets(const Layout& l) {
  Offsets o{};
  size_t at = alignUp(sizeof(Header), kPage);
  o.sub_ring = at;
  at = alignUp(at + sizeof(RingCtl) + l.slots * sizeof(BatchDesc), kPage);
  o.comp_ring = at;
  at = alignUp(at + sizeof(RingCtl) + l.slots * sizeof(Completion), kPage);
  o.input = at;
  at = alignUp(at + l.slots * l.input_bytes, kPage);
  o.output = at;
  at = alignUp(at + l.slots * l.output_bytes, kPage);
  o.total = at;
  return o;
}

RingCtl* ringAt(void* base, uint64_t off) {
  return reinterpret_cast<RingCtl*>(static_cast<char*>(base) + off);
}

template <typename Entry>
Entry* entries(RingCtl* r) {
  return reinterpret_cast<Entry*>(reinterpret_cast<char*>(r) + sizeof(RingCtl));
}

template <typename Entry>
bool ringPush(RingCtl* r, const Entry& e) {
  uint32_t head = r->head.load(std::memory_order_relaxed);
  uint32_t tail = r->tail.load(std::memory_order_acquire);
  if (head - tail >= r->capacity) return false;
  std::memcpy(&entries<Entry>(r)[head % r->capacity], &e, sizeof(Entry));
  r->head.store(head + 1, std::memory_order_seq_cst);
  if (r->consumer_waiting.load(std::memory_order_seq_cst)) futexWake(&r->head, INT_MAX);
  return true;
}

template <typename Entry>
std::optional<Entry> ringTryPop(RingCtl* r) {
  uint32_t tail = r->tail.load(std::memory_order_relaxed);
  uint32_t head = r->head.load(std::memory_order_acquire);
  if (head == tail) return std::nullopt;
  Entry e;
  std::memcpy(&e, &entries<Entry>(r)[tail % r->capacity], sizeof(Entry));
  r->tail.store(tail + 1, std::memory_order_release);
  return e;
}

// Spin briefly, then sleep on the head futex until something is published or the timeout ends.
template <typename Entry>
std::optional<Entry> ringWaitPop(RingCtl* r, std::chrono::microseconds timeout, bool spin = true) {
  for (int i = 0; spin && i < kSpinIterations; ++i) {
    if (auto e = ringTryPop<Entry>(r)) return e;
#if defined(__x86_64__)
    __builtin_ia32_pause();
#endif
  }
  if (timeout.count() <= 0) return spin ? std::nullopt : ringTryPop<Entry>(r);
  const int64_t deadline = monotonicNowNs() + timeout.count() * 1000;
  while (true) {
    uint32_t head = r->head.load(std::memory_order_acquire);
    if (head != r->tail.load(std::memory_order_relaxed)) return ringTryPop<Entry>(r);
    int64_t left = deadline - monotonicNowNs();
    if (left <= 0) return std::nullopt;
    timespec ts{static_cast<time_t>(left / 1000000000), static_cast<long>(left % 1000000000)};
    r->consumer_waiting.store(1, std::memory_order_seq_cst);
    // Re-check after announcing the wait: a push between the check above and the store would
    // otherwise be missed (the producer reads consumer_waiting after storing head).
    if (r->head.load(std::memory_order_seq_cst) == head) futexWait(&r->head, head, &ts);
    r->consumer_waiting.store(0, std::memory_order_relaxed);
    if (auto e = ringTryPop<Entry>(r)) return e;
    // Woken with nothing to take (wakeAll or a spurious wake-up): let the caller re-check state.
    if (monotonicNowNs() < deadline) return std::nullopt;
  }
}

}  // namespace

int64_t monotonicNowNs() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

namespace {

enum class Maps { kYes, kNo, kUnknown };

// A process that exists and is not a zombie (a zombie holds no mappings and never will again).
bool alive(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  if (!in) return ::kill(pid, 0) == 0 || errno == EPERM;  // no /proc/<pid>: ask the kernel
  std::string stat;
  std::getline(in, stat);
  const size_t paren = stat.rfind(')');  // "pid (comm) S ...": comm may hold spaces and parens
  if (paren == std::string::npos || paren + 2 >= stat.size()) return true;
  const char state = stat[paren + 2];
  return state != 'Z' && state != 'X';
}

// Whether process `pid` maps the file (dev, ino): kUnknown when it lives but its maps cannot be
// read. Lines: "addr perms offset MAJ:MIN inode path".
Maps processMaps(pid_t pid, dev_t dev, ino_t ino) {
  if (!alive(pid)) return Maps::kNo;
  std::ifstream in("/proc/" + std::to_string(pid) + "/maps");
  std::string line;
  bool read_any = false;
  while (in && std::getline(in, line)) {
    read_any = true;
    unsigned maj = 0, min = 0;
    unsigned long long inode = 0;
    if (std::sscanf(line.c_str(), "%*s %*s %*s %x:%x %llu", &maj, &min, &inode) != 3) continue;
    if (inode == static_cast<unsigned long long>(ino) && maj == major(dev) && min == minor(dev))
      return Maps::kYes;
  }
  // A live process always has mappings: nothing read means we may not look (ptrace rules).
  return read_any ? Maps::kNo : Maps::kUnknown;
}

// Every process that maps (dev, ino).
std::vector<pid_t> processesMapping(dev_t dev, ino_t ino) {
  std::vector<pid_t> out;
  DIR* d = opendir("/proc");
  if (d == nullptr) return out;
  while (dirent* e = readdir(d)) {
    char* end = nullptr;
    const long pid = std::strtol(e->d_name, &end, 10);
    if (pid <= 0 || *end != '\0') continue;
    if (processMaps(static_cast<pid_t>(pid), dev, ino) == Maps::kYes) {
      out.push_back(static_cast<pid_t>(pid));
    }
  }
  closedir(d);
  return out;
}

}  // namespace

Result<bool> removeStaleSegment(const std::string& name, uid_t uid) {
  const std::string path = shmPath(name);
  const std::string where = "shm " + path + ": ";
  const std::string by_hand = " (if it is stale, remove it by hand: rm /dev/shm" + path + ")";
  int fd = shm_open(path.c_str(), O_RDONLY | O_NOFOLLOW, 0);
  if (fd < 0) {
    if (errno == ENOENT) return false;
    return failedPrecondition(where + "a segment of this name exists but cannot be opened (" +
                              std::strerror(errno) + ")" + by_hand);
  }
  struct stat st {};
  if (fstat(fd, &st) != 0) {
    const int err = errno;
    close(fd);
    return errnoStatus(where + "fstat", err);
  }
  auto refuse = [&](std::string why) -> Status {
    close(fd);
    return failedPrecondition(where + why);
  };
  if (!S_ISREG(st.st_mode)) return refuse("not a regular file; not removing it" + by_hand);
  if (st.st_uid != uid) {
    return refuse("owned by uid " + std::to_string(st.st_uid) + ", not " + std::to_string(uid) +
                  ": not removing another user's segment" + by_hand);
  }
  if ((st.st_mode & 07777) != 0600) {
    char mode[8];
    std::snprintf(mode, sizeof(mode), "%04o", static_cast<unsigned>(st.st_mode & 07777));
    return refuse(std::string("mode ") + mode +
                  ", not the 0600 garden creates: not removing a file it did not make" + by_hand);
  }
  // The pids a garden header of this version records (read through a private read-only mapping,
  // released before the processes are looked at, so it does not count as a use).
  int32_t owner = 0, worker = 0;
  bool header = false;
  if (static_cast<size_t>(st.st_size) >= sizeof(Header)) {
    void* base = mmap(nullptr, sizeof(Header), PROT_READ, MAP_SHARED, fd, 0);
    if (base != MAP_FAILED) {
      const auto* h = static_cast<const Header*>(base);
      if (__atomic_load_n(&h->magic, __ATOMIC_ACQUIRE) == kMagic && h->version == kVersion &&
          h->header_bytes == sizeof(Header)) {
        header = true;
        owner = h->owner_pid.load();
        worker = h->worker_pid.load();
      }
      munmap(base, sizeof(Header));
    }
  }
  close(fd);
  if (header) {
    for (const auto& [pid, role] : {std::pair{owner, "its owner"}, std::pair{worker, "its worker"}}) {
      if (pid <= 0) continue;
      const Maps m = processMaps(pid, st.st_dev, st.st_ino);
      if (m != Maps::kNo) {
        return failedPrecondition(
            where + "in use by live process " + std::to_string(pid) + " (" + role +
            (m == Maps::kUnknown ? ", whose mappings cannot be read" : "") +
            "): another tulip or rose serves on this shm name; stop it or choose another name");
      }
    }
  } else {
    const std::vector<pid_t> users = processesMapping(st.st_dev, st.st_ino);
    if (!users.empty()) {
      return failedPrecondition(where + "no garden header of this version, and mapped by live "
                                "process " + std::to_string(users.front()) + "; not removing it");
    }
  }
  if (shm_unlink(path.c_str()) != 0 && errno != ENOENT) return errnoStatus(where + "unlink", errno);
  log::info("removed a stale shared-memory segment",
            {{"name", path}, {"owner_pid", owner}, {"worker_pid", worker}, {"header", header}});
  return true;
}

Result<Channel> Channel::create(const std::string& name, const Layout& layout) {
  if (layout.slots == 0 || layout.slots > 1024) return invalidArgument("shm: slots must be 1..1024");
  if (layout.input_bytes == 0 || layout.output_bytes == 0)
    return invalidArgument("shm: arena sizes must be > 0");
  const std::string path = shmPath(name);
  // A segment left under this name is replaced only when it is stale [TAG_SHM_STALE].
  RETURN_IF_ERROR(removeStaleSegment(path, geteuid()).status());
  int fd = shm_open(path.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
  if (fd < 0) {
    if (errno == EEXIST) {
      return failedPrecondition("shm " + path +
                                ": another process created a segment of this name just now");
    }
    return errnoStatus("shm_open " + path, errno);
  }
  // Exactly 0600 whatever the umask: what removeStaleSegment() recognizes as ours.
  if (fchmod(fd, 0600) != 0) {
    const int err = errno;
    close(fd);
    shm_unlink(path.c_str());
    return errnoStatus("fchmod " + path, err);
  }
  Offsets off = computeOffsets(layout);
  if (ftruncate(fd, static_cast<off_t>(off.total)) != 0) {
    int err = errno;
    close(fd);
    shm_unlink(path.c_str());
    return errnoStatus("ftruncate " + path, err);
  }
  void* base = mmap(nullptr, off.total, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  int err = errno;
  close(fd);
  if (base == MAP_FAILED) {
    shm_unlink(path.c_str());
    return errnoStatus("mmap " + path, err);
  }
  auto* h = new (base) Header{};
  h->version = kVersion;
  h->header_bytes = sizeof(Header);
  h->slots = layout.slots;
  h->desc_bytes = sizeof(BatchDesc);
  h->completion_bytes = sizeof(Completion);
  h->input_bytes = layout.input_bytes;
  h->output_bytes = layout.output_bytes;
  h->sub_ring_offset = off.sub_ring;
  h->comp_ring_offset = off.comp_ring;
  h->input_offset = off.input;
  h->output_offset = off.output;
  h->total_bytes = off.total;
  h->owner_pid.store(getpid());
  h->worker_pid.store(0);
  h->heartbeat_ns.store(0);
  h->state.store(static_cast<uint32_t>(WorkerState::kStarting));
  h->progress_reported.store(0);
  h->progress.store(0);
  for (uint64_t ro : {off.sub_ring, off.comp_ring}) {
    auto* r = new (ringAt(base, ro)) RingCtl{};
    r->capacity = layout.slots;
  }
  // Magic last: an attacher that sees it sees a fully initialized header.
  std::atomic_ref<uint64_t>(h->magic).store(kMagic, std::memory_order_release);

  Channel c;
  c.name_ = path;
  c.layout_ = layout;
  c.base_ = base;
  c.size_ = off.total;
  c.owner_ = true;
  return c;
}

Result<Channel> Channel::attach(const std::string& name) {
  const std::string path = shmPath(name);
  int fd = shm_open(path.c_str(), O_RDWR, 0);
  if (fd < 0) return errnoStatus("shm_open " + path, errno);
  struct stat st {};
  if (fstat(fd, &st) != 0) {
    int err = errno;
    close(fd);
    return errnoStatus("fstat " + path, err);
  }
  if (static_cast<size_t>(st.st_size) < sizeof(Header)) {
    close(fd);
    return failedPrecondition("shm " + path + ": segment too small to hold a header");
  }
  size_t size = static_cast<size_t>(st.st_size);
  void* base = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  int err = errno;
  close(fd);
  if (base == MAP_FAILED) return errnoStatus("mmap " + path, err);
  auto* h = static_cast<Header*>(base);
  auto fail = [&](std::string msg) -> Status {
    munmap(base, size);
    return failedPrecondition("shm " + path + ": " + msg);
  };
  if (std::atomic_ref<uint64_t>(h->magic).load(std::memory_order_acquire) != kMagic)
    return fail("bad magic (not a garden channel, or not initialized yet)");
  if (h->version != kVersion)
    return fail("version " + std::to_string(h->version) + ", expected " + std::to_string(kVersion));
  if (h->header_bytes != sizeof(Header) || h->desc_bytes != sizeof(BatchDesc) ||
      h->completion_bytes != sizeof(Completion))
    return fail("layout mismatch (built from different sources)");
  Layout l{h->slots, h->input_bytes, h->output_bytes};
  Offsets off = computeOffsets(l);
  if (off.total != h->total_bytes || off.total > size) return fail("size mismatch");

  Channel c;
  c.name_ = path;
  c.layout_ = l;
  c.base_ = base;
  c.size_ = size;
  c.owner_ = false;
  return c;
}

Channel::Channel(Channel&& o) noexcept { *this = std::move(o); }

Channel& Channel::operator=(Channel&& o) noexcept {
  if (this != &o) {
    reset();
    name_ = std::move(o.name_);
    layout_ = o.layout_;
    base_ = std::exchange(o.base_, nullptr);
    size_ = std::exchange(o.size_, 0);
    owner_ = std::exchange(o.owner_, false);
  }
  return *this;
}

Channel::~Channel() { reset(); }

void Channel::reset() {
  if (base_) {
    munmap(base_, size_);
    if (owner_) shm_unlink(name_.c_str());
  }
  base_ = nullptr;
  size_ = 0;
  owner_ = false;
}

Header* Channel::header() const { return static_cast<Header*>(base_); }

bool Channel::trySubmit(const BatchDesc& d) {
  return ringPush(ringAt(base_, header()->sub_ring_offset), d);
}

std::optional<BatchDesc> Channel::waitSubmission(std::chrono::microseconds timeout) {
  return ringWaitPop<BatchDesc>(ringAt(base_, header()->sub_ring_offset), timeout);
}

bool Channel::tryComplete(const Completion& c) {
  return ringPush(ringAt(base_, header()->comp_ring_offset), c);
}

std::optional<Completion> Channel::waitCompletion(std::chrono::microseconds timeout, bool spin) {
  return ringWaitPop<Completion>(ringAt(base_, header()->comp_ring_offset), timeout, spin);
}

std::optional<Completion> Channel::tryTakeCompletion() {
  return ringTryPop<Completion>(ringAt(base_, header()->comp_ring_offset));
}

void Channel::wakeAll() {
  futexWake(&ringAt(base_, header()->sub_ring_offset)->head, INT_MAX);
  futexWake(&ringAt(base_, header()->comp_ring_offset)->head, INT_MAX);
}

std::span<std::byte> Channel::inputArena(uint32_t slot) {
  CHECK(slot < layout_.slots);
  auto* p = static_cast<std::byte*>(base_) + header()->input_offset + slot * layout_.input_bytes;
  return {p, layout_.input_bytes};
}

std::span<std::byte> Channel::outputArena(uint32_t slot) {
  CHECK(slot < layout_.slots);
  auto* p = static_cast<std::byte*>(base_) + header()->output_offset + slot * layout_.output_bytes;
  return {p, layout_.output_bytes};
}

std::span<std::byte> Channel::outputArenaAll() {
  auto* p = static_cast<std::byte*>(base_) + header()->output_offset;
  return {p, layout_.slots * layout_.output_bytes};
}

void Channel::setWorkerPid(int32_t pid) { header()->worker_pid.store(pid); }
int32_t Channel::workerPid() const { return header()->worker_pid.load(); }
int32_t Channel::ownerPid() const { return header()->owner_pid.load(); }
void Channel::beat() { header()->heartbeat_ns.store(monotonicNowNs(), std::memory_order_release); }
int64_t Channel::lastBeatNs() const { return header()->heartbeat_ns.load(std::memory_order_acquire); }

bool Channel::heartbeatStale(std::chrono::milliseconds threshold) const {
  int64_t last = lastBeatNs();
  if (last == 0) return false;
  return monotonicNowNs() - last > threshold.count() * 1000000;
}

std::atomic<uint64_t>* Channel::progressCounter() { return &header()->progress; }
uint64_t Channel::progress() const { return header()->progress.load(std::memory_order_relaxed); }
void Channel::setProgressReported(bool reported) {
  header()->progress_reported.store(reported ? 1 : 0, std::memory_order_release);
}
bool Channel::progressReported() const {
  return header()->progress_reported.load(std::memory_order_acquire) != 0;
}

void Channel::setState(WorkerState s) {
  header()->state.store(static_cast<uint32_t>(s), std::memory_order_release);
}

WorkerState Channel::state() const {
  return static_cast<WorkerState>(header()->state.load(std::memory_order_acquire));
}

void Channel::setModelFacts(const ModelFacts& f) { header()->facts = f; }
ModelFacts Channel::modelFacts() const { return header()->facts; }

}  // namespace garden::shm
