#pragma once
// Thread-safety annotations: concurrency contracts the compiler checks. Under clang they expand
// to the attributes of clang's thread-safety analysis (-Wthread-safety; scripts/test.sh runs a
// clang pass with it as an error), under any other compiler to nothing, so the GCC build is
// unchanged. Names follow clang's documentation and Abseil's thread_annotations.h:
//
//   Mutex mu_;
//   int count_ GUARDED_BY(mu_) = 0;           // read or written only with mu_ held
//   std::unique_ptr<T> p_ PT_GUARDED_BY(mu_);  // the pointee is guarded (the pointer is not)
//   void bumpLocked() REQUIRES(mu_);           // callers hold mu_
//   void bump() EXCLUDES(mu_);                 // callers must not hold mu_ (it takes it)
//
// A member that another thread reads without the lock by design (the supervisor thread owns it
// and is its only writer) is annotated anyway and read through an accessor marked
// NO_THREAD_SAFETY_ANALYSIS whose comment says why; the exemption stays in one place.
//
// std::mutex carries no capability attributes in libstdc++, so annotated state is protected by
// garden::Mutex / MutexLock / CondVar (common/mutex.h). Header-only; any thread.

// Abseil (which gRPC's headers include) still defines its legacy unprefixed GUARDED_BY,
// PT_GUARDED_BY, ACQUIRED_BEFORE/AFTER and NO_THREAD_SAFETY_ANALYSIS, as the same clang
// attributes; those five are defined here only when absent, so either header may come first.

#if defined(__clang__)
#define GARDEN_THREAD_ANNOTATION_(x) __attribute__((x))
#else
#define GARDEN_THREAD_ANNOTATION_(x)
#endif

// A type that is a capability (a mutex): CAPABILITY("mutex").
#define CAPABILITY(x) GARDEN_THREAD_ANNOTATION_(capability(x))
// An RAII type that acquires a capability in its constructor and releases it in its destructor.
#define SCOPED_CAPABILITY GARDEN_THREAD_ANNOTATION_(scoped_lockable)

// Data members: the data (GUARDED_BY) or what a pointer/smart pointer points to (PT_GUARDED_BY)
// may be touched only with the capability held.
#ifndef GUARDED_BY
#define GUARDED_BY(x) GARDEN_THREAD_ANNOTATION_(guarded_by(x))
#endif
#ifndef PT_GUARDED_BY
#define PT_GUARDED_BY(x) GARDEN_THREAD_ANNOTATION_(pt_guarded_by(x))
#endif

// Lock ordering between capabilities (checked only with -Wthread-safety-beta).
#ifndef ACQUIRED_BEFORE
#define ACQUIRED_BEFORE(...) GARDEN_THREAD_ANNOTATION_(acquired_before(__VA_ARGS__))
#endif
#ifndef ACQUIRED_AFTER
#define ACQUIRED_AFTER(...) GARDEN_THREAD_ANNOTATION_(acquired_after(__VA_ARGS__))
#endif

// Functions: the caller must hold the capability (exclusively / shared) on entry and exit.
#define REQUIRES(...) GARDEN_THREAD_ANNOTATION_(requires_capability(__VA_ARGS__))
#define REQUIRES_SHARED(...) GARDEN_THREAD_ANNOTATION_(requires_shared_capability(__VA_ARGS__))

// Functions that acquire / release a capability and hold it past their return.
#define ACQUIRE(...) GARDEN_THREAD_ANNOTATION_(acquire_capability(__VA_ARGS__))
#define ACQUIRE_SHARED(...) GARDEN_THREAD_ANNOTATION_(acquire_shared_capability(__VA_ARGS__))
#define RELEASE(...) GARDEN_THREAD_ANNOTATION_(release_capability(__VA_ARGS__))
#define RELEASE_SHARED(...) GARDEN_THREAD_ANNOTATION_(release_shared_capability(__VA_ARGS__))
#define TRY_ACQUIRE(...) GARDEN_THREAD_ANNOTATION_(try_acquire_capability(__VA_ARGS__))

// Functions: the caller must NOT hold the capability (the function takes it itself). Calling one
// with the capability held is a compile error under -Wthread-safety: the self-deadlock of a
// locked path calling a locking accessor.
#define EXCLUDES(...) GARDEN_THREAD_ANNOTATION_(locks_excluded(__VA_ARGS__))

// A run-time check that the capability is held; the analysis assumes it afterwards.
#define ASSERT_CAPABILITY(x) GARDEN_THREAD_ANNOTATION_(assert_capability(x))

// A function returning a reference to the capability (an accessor of a mutex member).
#define RETURN_CAPABILITY(x) GARDEN_THREAD_ANNOTATION_(lock_returned(x))

// Turns the analysis off for one function. Every use carries a comment saying why it is safe.
#ifndef NO_THREAD_SAFETY_ANALYSIS
#define NO_THREAD_SAFETY_ANALYSIS GARDEN_THREAD_ANNOTATION_(no_thread_safety_analysis)
#endif
