// huge_pages: large buffers mapped on their own, 2 MiB aligned, advised MADV_HUGEPAGE
// (huge_pages.h).
#include "miles/huge_pages.h"

#include <spdlog/spdlog.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "miles/check.h"

#if defined(__linux__)
#include <sys/mman.h>
#include <unistd.h>
#endif

namespace miles::huge_pages {
namespace {

bool read_enabled() {
  const char* env = std::getenv("MILES_HUGE_PAGES");
  if (!env || !std::strcmp(env, "1")) return true;
  if (!std::strcmp(env, "0")) return false;
  spdlog::critical("MILES_HUGE_PAGES must be 0 or 1, got '{}'", env);
  MILES_CHECK(false, "MILES_HUGE_PAGES is 0 or 1");
  return false;
}

}  // namespace

bool enabled() {
  static const bool on = read_enabled();
  return on;
}

#if defined(__linux__)
namespace {
// The mapping's length: whole base pages. Its tail past the last 2 MiB boundary stays in base pages
// (a huge page must lie wholly inside the mapping), so a 2.2 MB buffer costs 2 MiB + 52 pages, not
// 4 MiB.
size_t mapped_length(size_t bytes) {
  static const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  return (bytes + page - 1) / page * page;
}
}  // namespace

// A mapping of mapped_length(bytes) starting on a 2 MiB boundary: map 2 MiB more, unmap the slack
// on either side.
void* allocate(size_t bytes) {
  // enabled() first: the switch is read (and a bad value refused) by the first buffer of any size.
  if (!enabled() || bytes < kHugePageBytes) return ::operator new (bytes, std::align_val_t{64});
  const size_t len = mapped_length(bytes);
  void* raw = mmap(nullptr, len + kHugePageBytes, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (raw == MAP_FAILED) throw std::bad_alloc();
  const auto start = reinterpret_cast<uintptr_t>(raw);
  const uintptr_t aligned = (start + kHugePageBytes - 1) / kHugePageBytes * kHugePageBytes;
  if (aligned > start) munmap(raw, aligned - start);
  const size_t tail = start + len + kHugePageBytes - (aligned + len);
  if (tail > 0) munmap(reinterpret_cast<void*>(aligned + len), tail);
  void* p = reinterpret_cast<void*>(aligned);
  // Advice only: a kernel without transparent huge pages keeps the 4 KiB pages.
  if (madvise(p, len, MADV_HUGEPAGE) != 0) {
    static const bool said = [] {
      spdlog::debug("madvise(MADV_HUGEPAGE) refused: large buffers keep 4 KiB pages");
      return true;
    }();
    (void)said;
  }
  return p;
}

void deallocate(void* p, size_t bytes) noexcept {
  if (!p) return;
  if (bytes < kHugePageBytes || !enabled()) {
    ::operator delete (p, std::align_val_t{64});
    return;
  }
  munmap(p, mapped_length(bytes));
}

void advise(void* p, size_t bytes) noexcept {
  if (!enabled() || bytes < kHugePageBytes) return;
  const auto start = reinterpret_cast<uintptr_t>(p);
  const uintptr_t first = (start + kHugePageBytes - 1) / kHugePageBytes * kHugePageBytes;
  const uintptr_t last = (start + bytes) / kHugePageBytes * kHugePageBytes;
  if (last > first) madvise(reinterpret_cast<void*>(first), last - first, MADV_HUGEPAGE);
}
#else
void* allocate(size_t bytes) { return ::operator new (bytes, std::align_val_t{64}); }
void deallocate(void* p, size_t) noexcept { ::operator delete (p, std::align_val_t{64}); }
void advise(void*, size_t) noexcept {}
#endif

}  // namespace miles::huge_pages
