// TensorBoard event-file framing and encoding against the worked bytes of
// reference/interop-formats.md section 6.4 (checked there with protoc-generated classes from
// TensorBoard's own .proto files and TensorBoard's CRC table). The whole files are read back by an
// independent reader in tests/e2e/tensorboard_test.sh.
#include <gtest/gtest.h>

#include <fstream>
#include <string>

#include "megatron/training/tensorboard_writer.h"
#include "test_util.h"

using namespace megatron;

namespace {
std::string hex(const std::string& bytes) {
  static const char* digits = "0123456789abcdef";
  std::string out;
  for (unsigned char c : bytes) {
    out.push_back(digits[c >> 4]);
    out.push_back(digits[c & 15]);
  }
  return out;
}
}  // namespace

TEST(TensorBoard, MaskedCrc32cKnownAnswers) {
  EXPECT_EQ(tensorboard::masked_crc32c(""), 0xA282EAD8u);
  EXPECT_EQ(tensorboard::masked_crc32c("a"), 0x28E46E78u);
  EXPECT_EQ(tensorboard::masked_crc32c("123456789"), 0xC78AB0E5u);
}

TEST(TensorBoard, FileVersionEventAndRecord) {
  const std::string event = tensorboard::file_version_event(1700000000.0);
  EXPECT_EQ(hex(event), "0900000040fc54d9411a0d627261696e2e4576656e743a32");
  EXPECT_EQ(hex(tensorboard::frame_record(event)), "1800000000000000a37f4b22" + hex(event) + "eced8f9d");
}

TEST(TensorBoard, ScalarEventAndRecord) {
  const std::string event = tensorboard::scalar_event(1700000001.5, 10, "lm loss", 2.5f);
  EXPECT_EQ(hex(event), "0900006040fc54d941100a2a100a0e0a076c6d206c6f73731500002040");
  EXPECT_EQ(hex(tensorboard::frame_record(event)), "1d00000000000000602fdf23" + hex(event) + "7c6a927b");
}

// Nothing reaches the file until the queue is full; then whole records only.
TEST(TensorBoard, QueueIsWrittenWhenFull) {
  megatron::testing::TempDir dir;
  TensorBoardWriter writer(dir.path(), 3);
  const auto size = [&] { return std::ifstream(writer.path(), std::ios::binary | std::ios::ate).tellg(); };
  const std::streamoff header = size();
  EXPECT_EQ(header, 8 + 4 + 4 + 24);  // the file_version record (24-byte event)
  writer.add_scalar("lm loss", 2.5, 1);
  writer.add_scalar("lm loss", 2.4, 2);
  EXPECT_EQ(size(), header);
  writer.add_scalar("lm loss", 2.3, 3);
  EXPECT_EQ(size(), header + 3 * (8 + 4 + 4 + 29));
}
