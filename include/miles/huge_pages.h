// HugePageAllocator / LargeVector: std::vector storage for big, long-lived buffers (packed weights,
// parameters and optimizer state, the KV pool), backed by 2 MiB transparent huge pages where the
// kernel offers them.
//
// Why: a decode step streams every weight once (538 MB of float32 for SmolLM2) and a training step
// walks every parameter, gradient and moment. With 4 KiB pages each 4 KiB of a stream is a TLB miss
// and a page walk; with 2 MiB pages one walk covers 512 of them. Many kernels ship transparent huge
// pages as `madvise` (Debian's default), so memory gets them only when asked. Placement only: no
// value depends on it.
//
// Requests of at least kHugePageBytes are mapped on their own (mmap, aligned to 2 MiB, madvise
// MADV_HUGEPAGE); smaller ones go to operator new. MILES_HUGE_PAGES=0 turns the advice off (A/B
// benchmarks); any other value but 1 is refused when the first buffer is made.
#pragma once

#include <cstddef>
#include <new>
#include <vector>

namespace miles {

inline constexpr size_t kHugePageBytes = size_t{2} << 20;

namespace huge_pages {
// `bytes` of uninitialised storage (at least 64-byte aligned); throws std::bad_alloc when the
// system has none.
void* allocate(size_t bytes);
// Gives back what allocate(bytes) returned, with the same `bytes`.
void deallocate(void* p, size_t bytes) noexcept;
// Whether large buffers are advised to use huge pages (MILES_HUGE_PAGES, read once).
bool enabled();
// Advises the 2 MiB pages that lie wholly inside [p, p + bytes) of a buffer allocated elsewhere
// (a std::vector's reserved storage) to be huge pages, before anything is written there: its first
// writes then fault 2 MiB at a time instead of 4 KiB. Advice only, as above; a no-op when disabled.
void advise(void* p, size_t bytes) noexcept;
}  // namespace huge_pages

template <class T>
struct HugePageAllocator {
  using value_type = T;
  HugePageAllocator() = default;
  template <class U>
  HugePageAllocator(const HugePageAllocator<U>&) noexcept {}  // NOLINT: rebinding is implicit
  T* allocate(size_t n) {
    if (n > static_cast<size_t>(-1) / sizeof(T)) throw std::bad_array_new_length();
    return static_cast<T*>(huge_pages::allocate(n * sizeof(T)));
  }
  void deallocate(T* p, size_t n) noexcept { huge_pages::deallocate(p, n * sizeof(T)); }
  template <class U>
  bool operator==(const HugePageAllocator<U>&) const noexcept {
    return true;
  }
};

template <class T>
using LargeVector = std::vector<T, HugePageAllocator<T>>;

}  // namespace miles
