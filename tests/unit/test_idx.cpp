// The IDX reader on files made here (good and each corrupt case) and on Debian's real files.
#include <gtest/gtest.h>
#include <torch/torch.h>
#include <zlib.h>

#include "ddp/common/error.h"
#include "ddp/data/dataset.h"
#include "ddp/data/idx.h"
#include "errors.h"
#include "subprocess.h"

namespace {

using ddp::testing::input_error_of;

using ddp::InputError;
using ddp::testing::TempDir;

std::string idx_bytes(std::vector<uint32_t> dims, const std::vector<uint8_t>& values,
                      uint8_t type = 0x08) {
  std::string out = {0, 0, static_cast<char>(type), static_cast<char>(dims.size())};
  for (uint32_t d : dims) {
    for (int shift = 24; shift >= 0; shift -= 8)
      out.push_back(static_cast<char>((d >> shift) & 0xff));
  }
  out.append(values.begin(), values.end());
  return out;
}

void write_gz(const std::string& path, const std::string& bytes) {
  gzFile f = gzopen(path.c_str(), "wb");
  gzwrite(f, bytes.data(), static_cast<unsigned>(bytes.size()));
  gzclose(f);
}

// Images 0..n-1 of 2x3 pixels whose pixel values are the image index, labels i % 10.
void write_set(const TempDir& dir, const std::string& prefix, uint32_t images, uint32_t labels) {
  std::vector<uint8_t> pixels, label_values;
  for (uint32_t i = 0; i < images; ++i) pixels.insert(pixels.end(), 6, static_cast<uint8_t>(i));
  for (uint32_t i = 0; i < labels; ++i) label_values.push_back(static_cast<uint8_t>(i % 10));
  write_gz(dir.file(prefix + "-images-idx3-ubyte.gz"), idx_bytes({images, 2, 3}, pixels));
  write_gz(dir.file(prefix + "-labels-idx1-ubyte.gz"), idx_bytes({labels}, label_values));
}

TEST(Idx, ParsesAGoodArray) {
  auto a = ddp::data::parse_idx(idx_bytes({2, 3}, {1, 2, 3, 4, 5, 6}), 2, "mem");
  EXPECT_EQ(a.dims, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(a.values, (std::vector<uint8_t>{1, 2, 3, 4, 5, 6}));
}

TEST(Idx, ReadsGzipAndPlainFiles) {
  TempDir dir;
  const auto bytes = idx_bytes({4}, {7, 8, 9, 10});
  write_gz(dir.file("a.gz"), bytes);
  ddp::testing::write_file(dir.file("a"), bytes);
  EXPECT_EQ(ddp::data::read_idx(dir.file("a.gz"), 1).values, (std::vector<uint8_t>{7, 8, 9, 10}));
  EXPECT_EQ(ddp::data::read_idx(dir.file("a"), 1).values, (std::vector<uint8_t>{7, 8, 9, 10}));
}

// A gzip file may hold several members one after another (two .gz files concatenated): read
// whole, as zlib and gzip read them, though the trailer's size is the last member's only.
TEST(Idx, ReadsAGzipFileOfSeveralMembers) {
  TempDir dir;
  std::vector<uint8_t> values(200000);
  for (size_t i = 0; i < values.size(); ++i) values[i] = static_cast<uint8_t>(i * 13 + i / 97);
  const std::string bytes = idx_bytes({200000}, values);
  const size_t cut = bytes.size() - 1000;  // the last member is small: its size is no guide
  write_gz(dir.file("a.gz"), bytes.substr(0, cut));
  write_gz(dir.file("b.gz"), bytes.substr(cut));
  ddp::testing::write_file(dir.file("ab.gz"), ddp::testing::read_file(dir.file("a.gz")) +
                                                  ddp::testing::read_file(dir.file("b.gz")));
  EXPECT_EQ(ddp::data::read_idx(dir.file("ab.gz"), 1).values, values);
  EXPECT_EQ(ddp::data::read_maybe_gzip(dir.file("ab.gz")), bytes);
}

TEST(Idx, RejectsWrongMagic) {
  const auto msg = input_error_of([] {
    ddp::data::parse_idx(idx_bytes({4}, {1, 2, 3, 4}, 0x0d), 1, "f.gz");
  });
  EXPECT_NE(msg.find("f.gz: wrong IDX magic number 0x00000d01, expected 0x00000801"),
            std::string::npos)
      << msg;
  EXPECT_NE(input_error_of([] {
              ddp::data::parse_idx(idx_bytes({4}, {1, 2, 3, 4}), 3, "f");
            }).find("magic"),
            std::string::npos);
}

TEST(Idx, RejectsShortAndLongPayloads) {
  EXPECT_NE(input_error_of([] {
              ddp::data::parse_idx(idx_bytes({2, 3}, {1, 2, 3}), 2, "f");
            }).find("f: IDX data has 3 bytes, the header's dimensions need 6 (truncated)"),
            std::string::npos);
  EXPECT_NE(input_error_of([] {
              ddp::data::parse_idx(idx_bytes({1}, {1, 2}), 1, "f");
            }).find("need 1"),
            std::string::npos);
  EXPECT_NE(input_error_of([] {
              ddp::data::parse_idx(std::string("\0\0", 2), 1, "f");
            }).find("not an IDX"),
            std::string::npos);
  EXPECT_NE(input_error_of([] {
              ddp::data::parse_idx(idx_bytes({0}, {}), 1, "f");
            }).find("dimension 0 is 0"),
            std::string::npos);
}

// Found by fuzz_idx: the dimensions' product overflowed int64 before the size check.
TEST(Idx, RejectsDimensionsWhoseProductOverflows) {
  EXPECT_EQ(input_error_of([] {
              ddp::data::parse_idx(idx_bytes({0x200, 0xffffffff, 0xffffffff}, {}), 3, "f");
            }),
            "f: IDX dimensions 512 x .. x 4294967295 exceed 8589934592 elements");
}

TEST(Idx, RejectsTruncatedGzip) {
  TempDir dir;
  std::vector<uint8_t> values(100000);
  for (size_t i = 0; i < values.size(); ++i) values[i] = static_cast<uint8_t>(i * 7);
  write_gz(dir.file("full.gz"), idx_bytes({100000}, values));
  const std::string gz = ddp::testing::read_file(dir.file("full.gz"));
  ddp::testing::write_file(dir.file("cut.gz"), gz.substr(0, gz.size() / 2));
  const auto msg = input_error_of([&] { ddp::data::read_idx(dir.file("cut.gz"), 1); });
  EXPECT_NE(msg.find(dir.file("cut.gz") + ": corrupt or truncated gzip data"), std::string::npos)
      << msg;
}

// max_items reads the first items only: a gzip file cut after them still gives them (the rest is
// never gunzipped), one cut before them is truncated; in memory, bytes past them are not kept, and
// too few for them are truncated data.
TEST(Idx, TheFirstItemsAreReadWithoutTheRest) {
  TempDir dir;
  std::vector<uint8_t> values(300000);
  for (size_t i = 0; i < values.size(); ++i) values[i] = static_cast<uint8_t>(i * 7 + i / 251);
  write_gz(dir.file("full.gz"), idx_bytes({100000, 3}, values));
  const std::string gz = ddp::testing::read_file(dir.file("full.gz"));
  ddp::testing::write_file(dir.file("cut.gz"), gz.substr(0, gz.size() / 2));
  const auto head = ddp::data::read_idx(dir.file("cut.gz"), 2, 1000);
  EXPECT_EQ(head.dims, (std::vector<int64_t>{100000, 3}));
  EXPECT_EQ(head.items, 1000);
  EXPECT_EQ(head.values, std::vector<uint8_t>(values.begin(), values.begin() + 3000));
  const auto msg = input_error_of([&] { ddp::data::read_idx(dir.file("cut.gz"), 2, 99000); });
  EXPECT_NE(msg.find(dir.file("cut.gz") + ": corrupt or truncated gzip data"), std::string::npos)
      << msg;

  const auto bytes = idx_bytes({4, 2}, {1, 2, 3, 4, 5, 6, 7, 8});
  EXPECT_EQ(ddp::data::parse_idx(bytes, 2, "m", 3).values, (std::vector<uint8_t>{1, 2, 3, 4, 5, 6}));
  EXPECT_EQ(input_error_of([&] { ddp::data::parse_idx(bytes.substr(0, 13), 2, "m", 3); }),
            "m: IDX data has 1 bytes, its first 3 items need 6 (truncated)");
  // max_items past the count: every item, the payload checked whole.
  EXPECT_EQ(input_error_of([&] { ddp::data::parse_idx(bytes + "x", 2, "m", 9); }),
            "m: IDX data has 9 bytes, the header's dimensions need 8");
}

// The gzip trailer's size is only a hint for the read's allocation: one that claims 4 GiB is
// read as the corrupt file it is.
TEST(Idx, ATrailerClaimingFourGibIsACorruptFileNotAnAllocation) {
  TempDir dir;
  write_gz(dir.file("full.gz"), idx_bytes({6}, {1, 2, 3, 4, 5, 6}));
  std::string gz = ddp::testing::read_file(dir.file("full.gz"));
  gz.replace(gz.size() - 4, 4, std::string(4, '\xff'));
  ddp::testing::write_file(dir.file("claims.gz"), gz);
  const auto msg = input_error_of([&] { ddp::data::read_idx(dir.file("claims.gz"), 1); });
  EXPECT_NE(msg.find(dir.file("claims.gz") + ": corrupt or truncated gzip data"), std::string::npos)
      << msg;
}

TEST(Idx, RejectsMissingFile) {
  EXPECT_NE(input_error_of([] {
              ddp::data::read_idx("/nonexistent/x.gz", 1);
            }).find("/nonexistent/x.gz: no such file"),
            std::string::npos);
}

TEST(FashionMnistLoader, LoadsAGoodSetNormalised) {
  TempDir dir;
  write_set(dir, "train", 12, 12);
  auto set = ddp::data::load_fashion_mnist(dir.path(), ddp::data::Split::kTrain);
  ASSERT_EQ(set.inputs.sizes(), (std::vector<int64_t>{12, 1, 2, 3}));
  EXPECT_EQ(set.targets[11].item<int64_t>(), 1);
  const double expected =
      (5.0 / 255.0 - ddp::data::kFashionMnistMean) / ddp::data::kFashionMnistStd;
  EXPECT_NEAR(set.inputs[5][0][1][2].item<double>(), expected, 1e-6);
}

// Every byte value, normalised as the tensor operations would normalise the whole image tensor,
// bitwise; max_items keeps the first images and their labels.
TEST(FashionMnistLoader, NormalisesEveryByteAsTheTensorOperationsAndKeepsTheFirstItems) {
  TempDir dir;
  write_set(dir, "train", 256, 256);
  auto set = ddp::data::load_fashion_mnist(dir.path(), ddp::data::Split::kTrain);
  const auto bytes = torch::arange(256, torch::kInt64).repeat_interleave(6).to(torch::kUInt8);
  const auto expected = bytes.to(torch::kFloat32)
                            .div_(255.0)
                            .sub_(ddp::data::kFashionMnistMean)
                            .div_(ddp::data::kFashionMnistStd)
                            .reshape({256, 1, 2, 3});
  EXPECT_TRUE(torch::equal(set.inputs, expected));
  auto head = ddp::data::load_fashion_mnist(dir.path(), ddp::data::Split::kTrain, 100);
  EXPECT_TRUE(torch::equal(head.inputs, expected.narrow(0, 0, 100)));
  EXPECT_TRUE(torch::equal(head.targets, set.targets.narrow(0, 0, 100)));
  auto all = ddp::data::load_fashion_mnist(dir.path(), ddp::data::Split::kTrain, 1000);
  EXPECT_EQ(all.inputs.size(0), 256);
}

TEST(FashionMnistLoader, RejectsCountMismatch) {
  TempDir dir;
  write_set(dir, "t10k", 12, 11);
  const auto msg =
      input_error_of([&] { ddp::data::load_fashion_mnist(dir.path(), ddp::data::Split::kTest); });
  EXPECT_NE(msg.find("holds 12 images but"), std::string::npos) << msg;
  EXPECT_NE(msg.find("holds 11 labels"), std::string::npos) << msg;
}

TEST(FashionMnistLoader, RejectsLabelOutOfRange) {
  TempDir dir;
  write_set(dir, "train", 2, 2);
  write_gz(dir.file("train-labels-idx1-ubyte.gz"), idx_bytes({2}, {3, 10}));
  const auto msg =
      input_error_of([&] { ddp::data::load_fashion_mnist(dir.path(), ddp::data::Split::kTrain); });
  EXPECT_NE(msg.find("label 10 of item 1 is outside [0, 10)"), std::string::npos) << msg;
}

TEST(FashionMnistLoader, NamesTheMissingFile) {
  TempDir dir;
  const auto msg =
      input_error_of([&] { ddp::data::load_fashion_mnist(dir.path(), ddp::data::Split::kTrain); });
  EXPECT_NE(msg.find(dir.file("train-images-idx3-ubyte.gz") + ": no such file"), std::string::npos)
      << msg;
}

// Debian's real Fashion-MNIST: 60,000 + 10,000 images of 28x28, 6,000 / 1,000 of each class,
// and the first training image is an ankle boot (9), as in torchvision.
TEST(FashionMnistLoader, ReadsDebiansRealFiles) {
  auto train = ddp::data::load_fashion_mnist(DDP_FASHION_MNIST_DIR, ddp::data::Split::kTrain);
  auto test = ddp::data::load_fashion_mnist(DDP_FASHION_MNIST_DIR, ddp::data::Split::kTest);
  EXPECT_EQ(train.inputs.sizes(), (std::vector<int64_t>{60000, 1, 28, 28}));
  EXPECT_EQ(test.inputs.sizes(), (std::vector<int64_t>{10000, 1, 28, 28}));
  EXPECT_EQ(train.targets[0].item<int64_t>(), 9);
  EXPECT_TRUE(torch::equal(torch::bincount(train.targets), torch::full({10}, 6000, torch::kInt64)));
  EXPECT_TRUE(torch::equal(torch::bincount(test.targets), torch::full({10}, 1000, torch::kInt64)));
  // Normalisation: the training pixels have mean ~0 and std ~1.
  EXPECT_NEAR(train.inputs.mean().item<double>(), 0.0, 0.01);
  EXPECT_NEAR(train.inputs.std().item<double>(), 1.0, 0.01);
}

}  // namespace
