// Whether this translation unit is built under a sanitizer that replaces
// operator new (AddressSanitizer, ThreadSanitizer, MemorySanitizer): such
// builds keep the sanitizer's own operators and report running out of
// memory their own way (Note [Operator new that throws] in
// cli/operator_new.cc). Defines HEADROOM_SANITIZER_NEW when they do.
#ifndef HEADROOM_COMMON_SANITIZER_BUILD_H_
#define HEADROOM_COMMON_SANITIZER_BUILD_H_

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define HEADROOM_SANITIZER_NEW 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer) || __has_feature(memory_sanitizer)
#define HEADROOM_SANITIZER_NEW 1
#endif
#endif

#endif  // HEADROOM_COMMON_SANITIZER_BUILD_H_
