// Errors that cross module boundaries. Each kind maps to one point status or exit code,
// so the sweep can record what happened and go on.
#pragma once

#include <stdexcept>
#include <string>

namespace ab {

// Anything that went wrong; a point that throws it is recorded with status "error".
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Bad command line, axis value, suite file: exit code 2, nothing runs.
class UsageError : public Error {
 public:
  using Error::Error;
};

// The device ran out of memory for this point: status "oom", the sweep goes on.
class OutOfMemory : public Error {
 public:
  using Error::Error;
};

// The device or build cannot run this point (precision missing, layout unsupported):
// status "skipped" with the reason.
class Unsupported : public Error {
 public:
  using Error::Error;
};

}  // namespace ab
