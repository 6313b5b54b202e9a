// Internal: XG_UNDER_ASAN is 1 in a build with AddressSanitizer, whichever compiler made it
// (GCC defines __SANITIZE_ADDRESS__; clang 14 answers __has_feature(address_sanitizer) only).
// The caching allocator hands every block back to ASan then, and memory-flatness tests skip
// their RSS bound (ASan's quarantine holds freed memory on purpose).
#pragma once

#if defined(__SANITIZE_ADDRESS__)
#define XG_UNDER_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define XG_UNDER_ASAN 1
#endif
#endif
#ifndef XG_UNDER_ASAN
#define XG_UNDER_ASAN 0
#endif
