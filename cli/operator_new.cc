// The `headroom` executable's operator new: the standard one's behaviour
// (retry through the new-handler, else throw std::bad_alloc), over whatever
// malloc the process has.
//
// Note [Operator new that throws]
// The executor's host pool links libmimalloc, a shared library that, once
// loaded, serves the whole process's malloc and operator new. Its operator
// new is C: when memory runs out it cannot throw, it aborts, and it never
// sees a new-handler set with std::set_new_handler (it binds its own weak
// std::get_new_handler, which returns none). So under a memory limit (a
// container, `ulimit -v`, a job scheduler) `headroom` died with SIGABRT and
// no message, where the readers catch std::bad_alloc to name the input that
// did not fit (ReadTextFile, ParseJsonDocument; main.cc for the rest).
// Replacing the throwing forms of operator new in the executable, which the
// dynamic linker prefers to any library's, restores the standard behaviour;
// they allocate with malloc and posix_memalign, which are mimalloc's when it
// is loaded, so mimalloc's operator delete (mi_free) frees them, as does
// the standard one (free) where mimalloc is not loaded. The nothrow forms
// return null already. Sanitizer builds keep the sanitizer's own operators,
// which report running out instead, and which must pair with its deletes.
#include <cstddef>
#include <cstdlib>
#include <new>

#include "common/sanitizer_build.h"

#ifndef HEADROOM_SANITIZER_NEW

namespace {

void* Allocate(std::size_t size) {
  if (size == 0) size = 1;  // a distinct pointer for each 0-byte request
  for (;;) {
    if (void* p = std::malloc(size)) return p;
    const std::new_handler handler = std::get_new_handler();
    if (handler == nullptr) throw std::bad_alloc();
    handler();
  }
}

void* AllocateAligned(std::size_t size, std::align_val_t alignment) {
  // A new-extended alignment is a power of two above the default one (16), so
  // a multiple of sizeof(void*) as posix_memalign requires.
  const auto align = static_cast<std::size_t>(alignment);
  if (size == 0) size = 1;
  for (;;) {
    void* p = nullptr;
    if (::posix_memalign(&p, align, size) == 0) return p;
    const std::new_handler handler = std::get_new_handler();
    if (handler == nullptr) throw std::bad_alloc();
    handler();
  }
}

}  // namespace

void* operator new(std::size_t size) { return Allocate(size); }
void* operator new[](std::size_t size) { return Allocate(size); }
void* operator new(std::size_t size, std::align_val_t alignment) { return AllocateAligned(size, alignment); }
void* operator new[](std::size_t size, std::align_val_t alignment) { return AllocateAligned(size, alignment); }

#endif  // HEADROOM_SANITIZER_NEW
