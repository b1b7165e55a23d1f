#include "harness/ranks.h"

#include "core/error.h"

namespace ab::harness {

void on_all_ranks(dist::Comm& comm, const std::function<void()>& step) {
  dist::Outcome mine;  // code 0, or the ErrorKind of what this rank threw
  try {
    step();
  } catch (const std::exception& e) {
    mine = {static_cast<int>(error_kind(e)), e.what()};
  }
  const dist::Outcome all = dist::agree(comm, mine);
  if (all.code != 0) throw_error(static_cast<ErrorKind>(all.code), all.message);
}

}  // namespace ab::harness
