// `accelbench inspect MODEL.onnx`: what the importer makes of a user's model (src/onnx), before
// anything runs. Exit 0 where it imports, 1 where ops are unsupported, 2 for a file it cannot read.
#include <iostream>

#include "cli/commands.h"
#include "core/error.h"
#include "workloads/models/models.h"

namespace ab::cli {

int inspect(const std::string& file) {
  try {
    if (!workloads::zoo::is_onnx_model(file))
      throw UsageError("inspect reads ONNX models (FILE.onnx), not '" + file + "'");
    bool importable = false;
    std::cout << workloads::zoo::inspect_onnx(file, &importable);
    return importable ? 0 : 1;
  } catch (const UsageError& e) {
    std::cerr << "accelbench inspect: " << e.what() << '\n';
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "accelbench inspect: " << e.what() << '\n';
    return 1;
  }
}

}  // namespace ab::cli
