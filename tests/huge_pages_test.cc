// LargeVector: large buffers are mapped on their own at a 2 MiB boundary and advised for huge pages
// (the kernel's smaps shows the advice as the mapping's "hg" flag), small ones come from operator
// new; values survive growth, copies and swaps either way.
#include "miles/huge_pages.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

namespace miles {
namespace {

// The VmFlags line of the mapping that holds `p` in /proc/self/smaps ("" when not found).
std::string vm_flags_of(const void* p) {
  std::ifstream smaps("/proc/self/smaps");
  const auto at = reinterpret_cast<uintptr_t>(p);
  bool inside = false;
  for (std::string line; std::getline(smaps, line);) {
    uintptr_t lo = 0, hi = 0;
    char dash = 0;
    std::istringstream head(line);
    if (head >> std::hex >> lo >> dash >> hi && dash == '-' &&
        line.find(' ') != std::string::npos && line.find(':') > line.find(' ')) {
      inside = lo <= at && at < hi;
      continue;
    }
    if (inside && line.rfind("VmFlags:", 0) == 0) return line;
  }
  return "";
}

bool thp_offered() {
  std::ifstream f("/sys/kernel/mm/transparent_hugepage/enabled");
  std::string s;
  std::getline(f, s);
  return s.find("[always]") != std::string::npos || s.find("[madvise]") != std::string::npos;
}

TEST(HugePages, LargeBuffersStartOnA2MiBBoundaryAndAreAdvised) {
  ASSERT_TRUE(huge_pages::enabled());
  LargeVector<float> v(3 * kHugePageBytes / sizeof(float) + 5, 1.5f);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(v.data()) % kHugePageBytes, 0u);
  for (size_t i = 0; i < v.size(); i += 4099) ASSERT_EQ(v[i], 1.5f);
  EXPECT_EQ(v.back(), 1.5f);
#if defined(__linux__)
  const std::string flags = vm_flags_of(v.data());
  ASSERT_FALSE(flags.empty()) << "no mapping holds the buffer";
  if (thp_offered()) EXPECT_NE(flags.find(" hg"), std::string::npos) << flags;
#endif
}

TEST(HugePages, SmallBuffersAreAlignedAndNotMappedOnTheirOwn) {
  LargeVector<float> v(1000, 2.0f);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(v.data()) % 64, 0u);
  EXPECT_EQ(v[999], 2.0f);
}

TEST(HugePages, ValuesSurviveGrowthAcrossTheThresholdCopiesAndSwaps) {
  LargeVector<int32_t> v;
  for (int32_t i = 0; i < (3 << 20); ++i) v.push_back(i);  // regrows from small to mapped
  for (int32_t i = 0; i < (3 << 20); i += 997) ASSERT_EQ(v[i], i);
  LargeVector<int32_t> copy = v;
  LargeVector<int32_t> small(7, -1);
  copy.swap(small);
  EXPECT_EQ(copy.size(), 7u);
  EXPECT_EQ(small.size(), v.size());
  EXPECT_TRUE(small == v);
  v.resize(10);
  v.shrink_to_fit();  // mapped → small: deallocate must take the mapped path for the old block
  EXPECT_EQ(v[9], 9);
  LargeVector<int32_t>().swap(small);
  EXPECT_TRUE(small.empty());
}

// advise: a std::vector's reserved storage (glibc maps a request this large on its own) gets the
// advice on the 2 MiB pages that lie inside it before it is written; the values are untouched.
TEST(HugePages, AdviseMarksAVectorsStorage) {
  std::vector<uint8_t> v;
  v.reserve(5 * kHugePageBytes + 123);
  huge_pages::advise(v.data(), v.capacity());
  v.assign(v.capacity(), 7);
  EXPECT_EQ(v[0], 7);
  EXPECT_EQ(v.back(), 7);
#if defined(__linux__)
  // A byte inside the first whole 2 MiB page of the buffer.
  const auto first = (reinterpret_cast<uintptr_t>(v.data()) + kHugePageBytes - 1) / kHugePageBytes *
                     kHugePageBytes;
  const std::string flags = vm_flags_of(reinterpret_cast<const void*>(first));
  ASSERT_FALSE(flags.empty()) << "no mapping holds the buffer";
  if (thp_offered()) EXPECT_NE(flags.find(" hg"), std::string::npos) << flags;
#endif
  std::vector<uint8_t> small(100, 3);
  huge_pages::advise(small.data(), small.size());  // less than a huge page: nothing to advise
  EXPECT_EQ(small[99], 3);
}

}  // namespace
}  // namespace miles
