#include "cli/data_commands.h"

#include <CLI/CLI.hpp>

#include <filesystem>
#include <iostream>

#include "core/error.h"
#include "data/data.h"

namespace ab::cli {
namespace {

// "" would name the current folder: refused, as main.cpp refuses empty options.
const CLI::Validator kNotEmpty(
    [](const std::string& value) { return value.empty() ? std::string("must not be empty") : std::string(); }, "", "");

}  // namespace

CLI::App* add_data_command(CLI::App& app, MakeImageFolderOptions& o) {
  auto* data = app.add_subcommand("data", "Data set tools: make a JPEG image folder from IDX or CIFAR files");
  data->require_subcommand(1);
  auto* make = data->add_subcommand("make-imagefolder",
                                    "Write an IDX or CIFAR set as OUT/<class>/<index>.jpg at a chosen size (bilinear, "
                                    "grey to RGB), for measuring the JPEG pipeline at ImageNet-like sizes");
  make->add_option("source", o.source,
                   "fashion-mnist[:train|:test] (Debian's dataset-fashion-mnist, or ACCELBENCH_FASHION_MNIST), an IDX "
                   "image file, cifar10:FILE.bin or cifar100:FILE.bin")
      ->required()
      ->check(kNotEmpty);
  make->add_option("out", o.out, "folder to write")->required()->check(kNotEmpty);
  make->add_option("--labels", o.labels, "the IDX label file of an IDX image file not named like MNIST's")
      ->check(kNotEmpty);
  make->add_option("--size", o.size_px, "side of the written images, pixels (default 224)")->check(CLI::Range(1, 8192));
  make->add_option("--quality", o.quality, "JPEG quality (default 90)")->check(CLI::Range(1, 100));
  make->add_option("--limit", o.limit, "write only the first LIMIT images")->check(CLI::PositiveNumber);
  return data;
}

int make_imagefolder(const MakeImageFolderOptions& o) {
  try {
    std::error_code ec;
    std::filesystem::create_directories(o.out, ec);
    if (ec || !std::filesystem::is_directory(o.out))
      throw UsageError("cannot create the output folder " + o.out + (ec ? ": " + ec.message() : ""));
    const data::ImageSet set = data::load_image_set(o.source, o.labels);
    const std::int64_t n = data::write_image_folder(set, o.out, o.size_px, o.quality, o.limit);
    std::cout << "wrote " << n << " images of " << set.source << " (" << set.classes << " classes, " << set.width << "x"
              << set.height << "x" << set.channels << ") as " << o.size_px << " px JPEG to " << o.out << '\n';
    return 0;
  } catch (const UsageError& e) {
    std::cerr << "accelbench data make-imagefolder: " << e.what() << '\n';
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "accelbench data make-imagefolder: " << e.what() << '\n';
    return 1;
  }
}

}  // namespace ab::cli
