// TensorBoard event files (controller/tensorboard_log.h): the CRC-32C of TFRecord framing against
// the published check value, the masked form TensorFlow's record writer uses, the histogram
// buckets, and the framing of a written file read back record by record. The file's contents are
// read by TensorBoard's own Python readers in tests/clients/tensorboard_read.py
// (client.tensorboard).
#include "controller/tensorboard_log.h"

#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>

#include "scratch_dir.h"
#include "tensorboard/event.pb.h"

namespace miles::controller {
namespace {

TEST(TensorBoardLog, Crc32cIsCastagnolisCheckValueAndTheMaskIsTfRecords) {
  const char* check = "123456789";
  EXPECT_EQ(crc32c(check, 9), 0xE3069283u);  // RFC 3720's CRC-32C check value
  EXPECT_EQ(crc32c("", 0), 0u);
  const uint32_t c = crc32c(check, 9);
  EXPECT_EQ(masked_crc32c(check, 9), ((c >> 15) | (c << 17)) + 0xA282EAD8u);
}

TEST(TensorBoardLog, HistogramBucketsCountEveryValueOnce) {
  const std::vector<double> v = {0, 1, 2, 3, 4, 4, 10};
  const Histogram h = make_histogram(v, 5);
  ASSERT_EQ(h.limits.size(), 5u);
  EXPECT_EQ(h.limits.back(), 10);
  double total = 0;
  for (double c : h.counts) total += c;
  EXPECT_EQ(total, 7);
  EXPECT_EQ(h.counts[0], 3);  // 0, 1, 2 in [0, 2]
  EXPECT_EQ(h.counts[1], 3);  // 3, 4, 4 in (2, 4]
  EXPECT_EQ(h.counts[4], 1);
  EXPECT_EQ(h.sum, 24);
  EXPECT_EQ(h.sum_squares, 0 + 1 + 4 + 9 + 16 + 16 + 100);
  const Histogram same = make_histogram(std::vector<double>{2, 2, 2});
  ASSERT_EQ(same.counts.size(), 1u);
  EXPECT_EQ(same.counts[0], 3);
}

TEST(TensorBoardLog, RecordsAreFramedWithLengthsAndChecksums) {
  const std::string dir = test::scratch_dir("miles_tb_", "records");
  std::string path;
  {
    auto log = TensorBoardLog::open(dir);
    ASSERT_TRUE(log.ok()) << log.message();
    path = (*log)->path();
    ASSERT_TRUE((*log)->scalar(3, "reward_mean", 0.25).ok());
    ASSERT_TRUE((*log)->text(3, "samples", "| a |\n|---|\n| b |\n").ok());
    ASSERT_TRUE((*log)->flush().ok());
  }
  std::ifstream in(path, std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<tensorboard::Event> events;
  for (size_t at = 0; at < bytes.size();) {
    ASSERT_LE(at + 12, bytes.size());
    uint64_t len = 0;
    uint32_t len_crc = 0, data_crc = 0;
    std::memcpy(&len, bytes.data() + at, 8);
    std::memcpy(&len_crc, bytes.data() + at + 8, 4);
    EXPECT_EQ(len_crc, masked_crc32c(bytes.data() + at, 8));
    ASSERT_LE(at + 12 + len + 4, bytes.size());
    std::memcpy(&data_crc, bytes.data() + at + 12 + len, 4);
    EXPECT_EQ(data_crc, masked_crc32c(bytes.data() + at + 12, len));
    tensorboard::Event e;
    ASSERT_TRUE(e.ParseFromArray(bytes.data() + at + 12, static_cast<int>(len)));
    events.push_back(e);
    at += 12 + len + 4;
  }
  ASSERT_EQ(events.size(), 3u);
  EXPECT_EQ(events[0].file_version(), "brain.Event:2");
  EXPECT_EQ(events[1].step(), 3);
  EXPECT_EQ(events[1].summary().value(0).tag(), "reward_mean");
  EXPECT_EQ(events[1].summary().value(0).simple_value(), 0.25f);
  EXPECT_EQ(events[2].summary().value(0).metadata().plugin_data().plugin_name(), "text");
  EXPECT_EQ(events[2].summary().value(0).tensor().string_val(0), "| a |\n|---|\n| b |\n");
}

}  // namespace
}  // namespace miles::controller
