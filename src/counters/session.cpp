// Which session a device gets: CUPTI's for a CUDA device in a CUDA build, else one that says why not.
#include <charconv>

#include "counters/counters.h"
#include "counters/cupti_session.h"

namespace ab::counters {

std::unique_ptr<CounterSession> open_session(MetricSet set, const std::string& device_id) {
  constexpr std::string_view kCuda = "cuda:";
  if (device_id.rfind(kCuda, 0) != 0)
    return unavailable_session(set, "device " + device_id +
                                        " has no hardware counters accelbench reads (CUPTI is for "
                                        "CUDA devices)");
  int ordinal = -1;
  const char* digits = device_id.data() + kCuda.size();
  const auto [end, ec] = std::from_chars(digits, device_id.data() + device_id.size(), ordinal);
  if (ec != std::errc() || end != device_id.data() + device_id.size() || ordinal < 0)
    return unavailable_session(set, "device '" + device_id + "' is not cuda:N");
#ifdef ACCELBENCH_WITH_CUPTI
  return make_cupti_session(set, ordinal);
#else
  return unavailable_session(set, "this build has no CUPTI (configured without ACCELBENCH_CUDA)");
#endif
}

}  // namespace ab::counters
