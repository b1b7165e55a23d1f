// Named GEMM shape tables, selected on the command line as `--axis m,n,k=@deepbench-train`.
#pragma once

#include <map>
#include <string>
#include <vector>

namespace ab::workloads::micro {

// Table name -> rows of {m, n, k, trans}.
std::map<std::string, std::vector<std::vector<std::string>>> gemm_tables();

}  // namespace ab::workloads::micro
