// Errors that cross module boundaries: one family under ab::Error. Each kind maps to one point
// status or exit code, so the sweep can record what happened and go on.
#pragma once

#include <cstdint>
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

// A point that does not apply (a workload's State::skip): status "skipped" with the reason.
class SkipPoint : public Error {
 public:
  using Error::Error;
};

// A result that failed its correctness check: status "error" with the reason.
class CheckFailed : public Error {
 public:
  using Error::Error;
};

// A training loss that became non-finite: status "diverged" with the reason.
class Diverged : public Error {
 public:
  using Error::Error;
};

// The kinds above as numbers, so an error can cross to other processes (dist::agree, the
// lock-step exchange) and be rethrown there as itself. 0 is left for "no error".
enum class ErrorKind : std::int64_t {
  error = 1, usage, out_of_memory, unsupported, skip_point, check_failed, diverged
};

// The kind of `e`: its class in the family, `error` for any other exception.
inline ErrorKind error_kind(const std::exception& e) noexcept {
  if (dynamic_cast<const UsageError*>(&e) != nullptr) return ErrorKind::usage;
  if (dynamic_cast<const OutOfMemory*>(&e) != nullptr) return ErrorKind::out_of_memory;
  if (dynamic_cast<const Unsupported*>(&e) != nullptr) return ErrorKind::unsupported;
  if (dynamic_cast<const SkipPoint*>(&e) != nullptr) return ErrorKind::skip_point;
  if (dynamic_cast<const CheckFailed*>(&e) != nullptr) return ErrorKind::check_failed;
  if (dynamic_cast<const Diverged*>(&e) != nullptr) return ErrorKind::diverged;
  return ErrorKind::error;
}

// Throws the family's class for `kind` with `message` (Error for a number that is no kind).
[[noreturn]] inline void throw_error(ErrorKind kind, const std::string& message) {
  switch (kind) {
    case ErrorKind::usage: throw UsageError(message);
    case ErrorKind::out_of_memory: throw OutOfMemory(message);
    case ErrorKind::unsupported: throw Unsupported(message);
    case ErrorKind::skip_point: throw SkipPoint(message);
    case ErrorKind::check_failed: throw CheckFailed(message);
    case ErrorKind::diverged: throw Diverged(message);
    case ErrorKind::error: break;
  }
  throw Error(message);
}

}  // namespace ab
