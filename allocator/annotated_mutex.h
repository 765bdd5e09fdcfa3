// A plain mutex with thread-safety annotations, for the allocator's hot path.
//
//   Mutex mu;
//   int counter ABSL_GUARDED_BY(mu);
//   { MutexLock lock(&mu); ++counter; }
//
// Why not absl::Mutex: its Lock/Unlock pair costs several times an
// uncontended futex (Debian's build also runs deadlock-detection
// bookkeeping on every acquisition), and an allocate + free pair takes the
// allocator lock twice and a pointer-map shard lock twice (see
// bench/allocator_bench.cc, BM_CachedPair). std::mutex carries no
// annotations in libstdc++, hence this wrapper: clang's -Wthread-safety
// checks ABSL_GUARDED_BY members against it as it would against absl::Mutex.
#ifndef HEADROOM_ALLOCATOR_ANNOTATED_MUTEX_H_
#define HEADROOM_ALLOCATOR_ANNOTATED_MUTEX_H_

#include <atomic>
#include <mutex>
#include <thread>

#include "absl/base/thread_annotations.h"

namespace headroom::internal {

class ABSL_LOCKABLE Mutex {
 public:
  void Lock() ABSL_EXCLUSIVE_LOCK_FUNCTION() { mu_.lock(); }
  void Unlock() ABSL_UNLOCK_FUNCTION() { mu_.unlock(); }

 private:
  std::mutex mu_;
};

// A test-and-test-and-set spin lock for critical sections of a few dozen
// instructions (a pointer-map shard: one hash-table operation). Uncontended,
// Unlock is a plain release store where std::mutex needs a second atomic
// read-modify-write. A waiter yields after a short spin, so a holder that is
// descheduled does not burn the other cores.
class ABSL_LOCKABLE SpinLock {
 public:
  void Lock() ABSL_EXCLUSIVE_LOCK_FUNCTION() {
    while (locked_.exchange(true, std::memory_order_acquire)) {
      for (int spins = 0; locked_.load(std::memory_order_relaxed); ++spins) {
        if (spins >= 64) std::this_thread::yield();
#if defined(__x86_64__) || defined(__i386__)
        __builtin_ia32_pause();
#endif
      }
    }
  }
  void Unlock() ABSL_UNLOCK_FUNCTION() { locked_.store(false, std::memory_order_release); }

 private:
  std::atomic<bool> locked_{false};
};

class ABSL_SCOPED_LOCKABLE SpinLockHolder {
 public:
  explicit SpinLockHolder(SpinLock* mu) ABSL_EXCLUSIVE_LOCK_FUNCTION(mu) : mu_(mu) { mu_->Lock(); }
  ~SpinLockHolder() ABSL_UNLOCK_FUNCTION() { mu_->Unlock(); }
  SpinLockHolder(const SpinLockHolder&) = delete;
  SpinLockHolder& operator=(const SpinLockHolder&) = delete;

 private:
  SpinLock* const mu_;
};

class ABSL_SCOPED_LOCKABLE MutexLock {
 public:
  explicit MutexLock(Mutex* mu) ABSL_EXCLUSIVE_LOCK_FUNCTION(mu) : mu_(mu) { mu_->Lock(); }
  ~MutexLock() ABSL_UNLOCK_FUNCTION() { mu_->Unlock(); }
  MutexLock(const MutexLock&) = delete;
  MutexLock& operator=(const MutexLock&) = delete;

 private:
  Mutex* const mu_;
};

}  // namespace headroom::internal

#endif  // HEADROOM_ALLOCATOR_ANNOTATED_MUTEX_H_
