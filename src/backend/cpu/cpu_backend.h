// The CPU backend: OpenBLAS sgemm, OpenMP STREAM kernels, steady-clock timing.
#pragma once

#include <memory>

#include "backend/backend.h"

namespace ab::backend::cpu {

DeviceInfo device_info();
std::unique_ptr<Backend> make_backend();

}  // namespace ab::backend::cpu
