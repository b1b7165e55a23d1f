// `accelbench data ...`: tools for the data sets the pipeline and training read (src/data).
// Exit codes as in commands.h.
#pragma once

#include <cstdint>
#include <string>

namespace CLI {
class App;
}

namespace ab::cli {

struct MakeImageFolderOptions {
  std::string source;  // an image set as data::load_image_set names it
  std::string labels;  // an IDX label file, where the source is an IDX image file not named like MNIST's
  std::string out;     // the folder to write: OUT/<class>/<index>.jpg
  std::int64_t size_px = 224;
  int quality = 90;
  std::int64_t limit = -1;  // the first LIMIT images; all where negative
};

// Adds `data` and its subcommands to `app`; they fill `options`.
CLI::App* add_data_command(CLI::App& app, MakeImageFolderOptions& options);
int make_imagefolder(const MakeImageFolderOptions& options);

}  // namespace ab::cli
