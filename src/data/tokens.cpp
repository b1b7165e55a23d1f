// Token files (llm.c's format), the byte-level tokenizer, and windows of tokens for training.
#include <cstring>
#include <fstream>

#include "core/error.h"
#include "data/data.h"
#include "data/pipeline.h"

namespace ab::data {
namespace fs = std::filesystem;
namespace {

constexpr std::int32_t kTokenMagic = 20240520;
constexpr std::size_t kTokenHeaderInts = 256;

}  // namespace

std::vector<std::uint16_t> read_tokens(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error("cannot open token file " + path.string());
  std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::size_t offset = 0;
  std::int64_t count = -1;
  if (bytes.size() >= kTokenHeaderInts * 4) {
    std::int32_t header[3];
    std::memcpy(header, bytes.data(), sizeof header);
    if (header[0] == kTokenMagic) {
      if (header[1] != 1)
        throw Error(path.string() + ": token file version " + std::to_string(header[1]) + " (1 expected)");
      offset = kTokenHeaderInts * 4;
      count = header[2];
    }
  }
  const std::size_t data = bytes.size() - offset;
  if (count >= 0 && data != static_cast<std::size_t>(count) * 2)
    throw Error(path.string() + ": truncated: the header gives " + std::to_string(count) + " tokens (" +
                std::to_string(count * 2) + " bytes), the file holds " + std::to_string(data) + " bytes after it");
  if (data % 2 != 0)
    throw Error(path.string() + ": an odd number of bytes (" + std::to_string(data) + ") is no uint16 tokens");
  std::vector<std::uint16_t> tokens(data / 2);
  std::memcpy(tokens.data(), bytes.data() + offset, data);  // little-endian files on little-endian hosts
  return tokens;
}

void write_tokens(const fs::path& path, std::span<const std::uint16_t> tokens) {
  std::int32_t header[kTokenHeaderInts] = {kTokenMagic, 1, static_cast<std::int32_t>(tokens.size())};
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(header), sizeof header);
  out.write(reinterpret_cast<const char*>(tokens.data()), static_cast<std::streamsize>(tokens.size_bytes()));
  if (!out) throw Error("cannot write token file " + path.string());
}

std::vector<std::uint16_t> byte_tokens(std::string_view text) {
  std::vector<std::uint16_t> tokens(text.size());
  std::transform(text.begin(), text.end(), tokens.begin(), [](char c) { return static_cast<std::uint8_t>(c); });
  return tokens;
}

std::string byte_text(std::span<const std::uint16_t> tokens) {
  std::string text(tokens.size(), '\0');
  for (std::size_t i = 0; i < tokens.size(); ++i) {
    if (tokens[i] >= kByteVocabulary)
      throw Error("token " + std::to_string(tokens[i]) + " at " + std::to_string(i) + " is no byte (vocabulary 256)");
    text[i] = static_cast<char>(tokens[i]);
  }
  return text;
}

std::vector<std::uint16_t> tokenize_text_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error("cannot open text file " + path.string());
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (text.empty()) throw Error(path.string() + " is empty: no tokens");
  return byte_tokens(text);
}

TokenWindows::TokenWindows(std::vector<std::uint16_t> tokens, std::int64_t seq, std::uint64_t seed, int rank, int ranks)
    : tokens_(std::move(tokens)), seq_(seq), seed_(seed), rank_(rank), ranks_(ranks) {
  if (seq_ < 1) throw UsageError("token windows need seq >= 1");
  windows_ = (static_cast<std::int64_t>(tokens_.size()) - 1) / seq_;
  if (windows_ < ranks_)
    throw UsageError(std::to_string(tokens_.size()) + " tokens make " + std::to_string(windows_) + " windows of " +
                     std::to_string(seq_) + " + 1, fewer than the " + std::to_string(ranks_) + " ranks");
  epoch_order(0, 0, 0, rank_, ranks_, false);  // refuses a bad rank here
}

std::int64_t TokenWindows::batches_per_epoch(std::int64_t batch) const { return windows_ / ranks_ / batch; }

void TokenWindows::fill(std::int64_t index, std::int64_t batch, std::int32_t* inputs, std::int32_t* targets) const {
  const std::int64_t per_epoch = batches_per_epoch(batch);
  if (per_epoch < 1)
    throw UsageError(std::to_string(windows_) + " windows over " + std::to_string(ranks_) + " ranks make no batch of " +
                     std::to_string(batch));
  const std::int64_t epoch = index / per_epoch;
  if (epoch != order_epoch_) {
    order_ = epoch_order(windows_, seed_, epoch, rank_, ranks_, true);
    order_epoch_ = epoch;
  }
  for (std::int64_t s = 0; s < batch; ++s) {
    const std::int64_t start = order_[static_cast<std::size_t>((index % per_epoch) * batch + s)] * seq_;
    for (std::int64_t t = 0; t < seq_; ++t) {
      inputs[s * seq_ + t] = tokens_[static_cast<std::size_t>(start + t)];
      targets[s * seq_ + t] = tokens_[static_cast<std::size_t>(start + t + 1)];
    }
  }
}

}  // namespace ab::data
