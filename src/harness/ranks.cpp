#include "harness/ranks.h"

#include "core/error.h"
#include "harness/workload.h"

namespace ab::harness {

void on_all_ranks(dist::Comm& comm, const std::function<void()>& step) {
  enum Code { kOk, kSkip, kCheck, kDiverged, kOom, kUnsupported, kUsage, kError };
  dist::Outcome mine;
  try {
    step();
  } catch (const SkipPoint& e) {
    mine = {kSkip, e.reason};
  } catch (const CheckFailed& e) {
    mine = {kCheck, e.reason};
  } catch (const Diverged& e) {
    mine = {kDiverged, e.reason};
  } catch (const OutOfMemory& e) {
    mine = {kOom, e.what()};
  } catch (const Unsupported& e) {
    mine = {kUnsupported, e.what()};
  } catch (const UsageError& e) {
    mine = {kUsage, e.what()};
  } catch (const std::exception& e) {
    mine = {kError, e.what()};
  }
  const dist::Outcome all = dist::agree(comm, mine);
  switch (all.code) {
    case kOk: return;
    case kSkip: throw SkipPoint{all.message};
    case kCheck: throw CheckFailed{all.message};
    case kDiverged: throw Diverged{all.message};
    case kOom: throw OutOfMemory(all.message);
    case kUnsupported: throw Unsupported(all.message);
    case kUsage: throw UsageError(all.message);
    default: throw Error(all.message);
  }
}

}  // namespace ab::harness
